"""Build time and size of the bundled default corpus, and how often EX and TS accept wrong SQL.

In one run:
- builds the corpus with the settings of ``--params`` (default: params.yaml, i.e. 16
  databases, 3,000 / 400 / 400 examples, 5 neighbours per dev/test database) into a
  temporary folder (or ``--out``), ``--repeats`` times; prints the median wall time against
  the goal of 60 s, and the size on disk;
- prints the hardness distribution of each split, empty-gold and evidence counts, and the
  robustness variants' sizes and coverage;
- mutates every dev gold query into wrong queries (changed comparison, dropped predicate,
  wrong column of the same type) and prints the share EX accepts and the share TS accepts,
  overall and per kind, plus how many golds match themselves under TS (should be all).

    python bench/bench_data.py [--params params.yaml] [--out DIR] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from progress_sql.params import load_settings
from progress_sql.data.build import build_corpus
from progress_sql.data.neighbours import measure_ex_vs_ts

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 60.0


def size_on_disk(folder: Path) -> tuple[int, int]:
    """(bytes, files) under ``folder``."""
    total = files = 0
    for root, _, names in os.walk(folder):
        for name in names:
            total += (Path(root) / name).stat().st_size
            files += 1
    return total, files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(REPO / "params.yaml"))
    parser.add_argument("--out", default=None, help="build here (kept) instead of a temporary folder")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    settings = load_settings(args.params)
    d = settings.data

    with tempfile.TemporaryDirectory(prefix="bench_data_") as scratch:
        out = Path(args.out) if args.out else Path(scratch) / "corpus"
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            manifest = build_corpus(settings, out, progress=False)
            times.append(time.perf_counter() - start)
        build_s = statistics.median(times)
        size, files = size_on_disk(out)

        print(f"bundled corpus: {d.n_databases} databases, train/dev/test {d.train_size}/{d.dev_size}/{d.test_size}, "
              f"{d.neighbours} neighbours per dev/test database, seed {d.seed}, {os.cpu_count()} CPUs")
        print(f"build time: {build_s:.2f} s (median of {len(times)}; goal < {GOAL_S:.0f} s: "
              f"{'met' if build_s < GOAL_S else 'MISSED'})")
        print(f"size on disk: {size / 2**20:.1f} MiB in {files} files")
        for split, info in manifest["splits"].items():
            n = info["examples"]
            levels = "  ".join(f"{k} {v} ({v / n:.0%})" for k, v in info["hardness"].items())
            print(f"  {split:5s} n={n:5d}  {levels}  empty gold {info['empty_gold']} ({info['empty_gold'] / n:.1%}), "
                  f"evidence {info['with_evidence']}")
        for name, info in manifest["variants"].items():
            print(f"  variant {name:9s} {info['examples']:4d} examples, coverage {info['coverage']:.1%} of dev+test")

        start = time.perf_counter()
        report = measure_ex_vs_ts(out, settings, split="dev")
        print(f"EX vs TS on wrong mutants of the dev golds ({time.perf_counter() - start:.1f} s):")
        print(report.summary())
    return 0 if build_s < GOAL_S and report.ts_share < report.ex_share else 1


if __name__ == "__main__":
    sys.exit(main())
