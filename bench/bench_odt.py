"""ODT throughput on the conformance corpus.

Measures in one run, each the median of ``--repeats`` passes:
- raw sqlglot parse throughput: ``parse_one`` of the prediction and the gold of every pair
  (queries per second);
- ODT comparisons per second with the gold profiles cached (cache warmed first), so each
  comparison parses one SQL (the prediction) and profiles and scores it.
Goal: comparisons/s at least 50% of the raw parse throughput.

Pairs: dev_predict.txt against dev_gold.txt (aligned lines) and every classical_gold.txt
query against itself. Corpus folder: --conformance, else $PROGRESS_SQL_CONFORMANCE, else
../shared/conformance/spider relative to the repository.

    python bench/bench_odt.py [--conformance DIR] [--repeats 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

from progress_sql.params import default_settings
from progress_sql.odt import diagnose, gold_profile
from progress_sql.sql.parse import SQLParseError, parse_one, sqlglot_compiled

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.5


def load_pairs(folder: Path) -> list[tuple[str, str]]:
    """(pred, gold) pairs of the conformance corpus."""
    golds = (folder / "dev_gold.txt").read_text(encoding="utf-8").split("\n")
    preds = (folder / "dev_predict.txt").read_text(encoding="utf-8").split("\n")
    pairs = [(p.strip(), g.split("\t")[0].strip()) for g, p in zip(golds, preds) if g.strip()]
    classical = (folder / "classical_gold.txt").read_text(encoding="utf-8").split("\n")
    pairs += [(q.strip(), q.strip()) for q in classical if q.strip()]
    return pairs


def parse_pass(pairs: list[tuple[str, str]]) -> float:
    start = time.perf_counter()
    for pred, gold in pairs:
        for sql in (pred, gold):
            try:
                parse_one(sql)
            except SQLParseError:
                pass
    return 2 * len(pairs) / (time.perf_counter() - start)


def odt_pass(pairs: list[tuple[str, str]], settings) -> float:
    start = time.perf_counter()
    for pred, gold in pairs:
        diagnose(pred, gold, settings)
    return len(pairs) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("PROGRESS_SQL_CONFORMANCE") or str(REPO.parent / "shared" / "conformance" / "spider")
    parser.add_argument("--conformance", default=default, help="folder with dev_gold.txt etc.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one ODT pass")
    args = parser.parse_args(argv)

    folder = Path(args.conformance)
    if not (folder / "dev_gold.txt").exists():
        print(f"error: conformance corpus not found in {folder}", file=sys.stderr)
        return 2
    pairs = load_pairs(folder)
    settings = default_settings().odt.model_copy(update={"profile_cache_size": max(8192, 2 * len(pairs))})
    for _, gold in pairs:  # warm the gold-profile cache
        gold_profile(gold, settings)
    fallbacks = sum(1 for pred, gold in pairs if not diagnose(pred, gold, settings).parsed)

    parse_qps = statistics.median(parse_pass(pairs) for _ in range(args.repeats))
    odt_cps = statistics.median(odt_pass(pairs, settings) for _ in range(args.repeats))
    ratio = odt_cps / parse_qps

    print(f"pairs: {len(pairs)} (predictions not parsing: {fallbacks}); sqlglot compiled: {sqlglot_compiled()}")
    print(f"raw parse throughput:      {parse_qps:9.0f} queries/s (median of {args.repeats})")
    print(f"ODT comparisons (cached):  {odt_cps:9.0f} comparisons/s (median of {args.repeats})")
    print(f"ratio: {ratio:.2f} (goal >= {GOAL:.2f}: {'met' if ratio >= GOAL else 'NOT met'})")
    print(f"gold cache: {gold_profile.cache_info()}")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(odt_pass, pairs, settings)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
