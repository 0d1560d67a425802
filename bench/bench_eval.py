"""Evaluation throughput and the cost of TS relative to EX.

On the bundled default corpus (``data.out_dir`` when it is built, else built with the
settings of ``--params`` into a temporary folder), median of ``--repeats`` runs each:

1. generation excluded: ``run_eval`` with the oracle (gold SQL as the output, so every
   query runs and matches) on dev, greedy + Vote@k + pass@k as in params.yaml; examples/s
   end to end (execution in the pool, voting, TS, ODT analysis, reports, plots);
2. TS vs EX: the same predictions judged by ``sql.verdict.BatchVerdicts`` with a cold gold cache,
   EX only versus EX + TS over the neighbour databases; prints both times and the ratio;
3. generation included: an untrained tiny model built from ``model`` settings (greedy,
   ``generation.max_new_tokens``) on the first ``--gen-examples`` dev examples; examples/s.

    python bench/bench_eval.py [--params params.yaml] [--repeats 3] [--gen-examples 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from progress_sql.params import load_settings
from progress_sql.data.build import build_corpus
from progress_sql.corpus.records import CorpusLayout, read_jsonl
from progress_sql.eval import ORACLE, run_eval
from progress_sql.sql import BatchVerdicts, Candidate, GoldCache, SQLPool

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def corpus_dir(settings, scratch: Path) -> Path:
    built = REPO / settings.data.out_dir
    if (built / "dev.jsonl").exists():
        return built
    print(f"building the default corpus into {scratch / 'corpus'} ...", flush=True)
    build_corpus(settings, scratch / "corpus", progress=False)
    return scratch / "corpus"


def bench_ts_vs_ex(settings, corpus: Path, repeats: int) -> None:
    layout = CorpusLayout(corpus)
    examples = list(read_jsonl(layout.split("dev")))
    cands = [Candidate(str(layout.database(ex.db_id)), ex.gold_sql, ex.gold_sql) for ex in examples]
    suites = [(c, layout.test_suite(ex.db_id)[1:]) for c, ex in zip(cands, examples)]
    n_dbs = 1 + statistics.mean(len(neighbours) for _, neighbours in suites)
    with SQLPool(settings=settings.sandbox) as pool:
        pool.map([(c.db_path, "SELECT 1") for c in cands[: 2 * pool.workers]])  # start the workers

        def ex_only():
            return BatchVerdicts(settings.sandbox, pool=pool, gold_cache=GoldCache(settings=settings.sandbox)).judge(cands)

        def ex_and_ts():
            judge = BatchVerdicts(settings.sandbox, pool=pool, gold_cache=GoldCache(settings=settings.sandbox))
            judge.judge(cands)
            return judge.test_suite(suites)

        t_ex, verdicts = timed(ex_only, repeats)
        t_ts, passed = timed(ex_and_ts, repeats)
    assert all(v.correct for v in verdicts) and all(passed), "the gold must match itself"
    print(f"judge, {len(cands)} dev predictions, {n_dbs:.1f} databases per test suite, cold gold cache:")
    print(f"  EX only      {t_ex:7.3f} s   {len(cands) / t_ex:8.1f} examples/s")
    print(f"  EX + TS      {t_ts:7.3f} s   {len(cands) / t_ts:8.1f} examples/s")
    print(f"  TS / EX time ratio: {t_ts / t_ex:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(REPO / "params.yaml"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gen-examples", type=int, default=8)
    args = parser.parse_args(argv)
    settings = load_settings(args.params)

    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        scratch = Path(tmp)
        corpus = corpus_dir(settings, scratch)
        n_dev = sum(1 for _ in read_jsonl(CorpusLayout(corpus).split("dev")))
        cfg = settings.eval
        print(f"corpus {corpus}: {n_dev} dev examples; sandbox.workers {settings.sandbox.workers}; "
              f"greedy {cfg.greedy}, Vote@{cfg.vote_k}, pass@{cfg.pass_k}, TS {cfg.ts}")

        oracle_settings = settings.model_copy(update={"eval": cfg.model_copy(update={"splits": ["dev"]})})
        t, result = timed(lambda: run_eval(oracle_settings, ORACLE, corpus, None, scratch / "oracle", progress=False),
                          args.repeats)
        assert result.flat["dev/greedy/ex"] == 1.0
        print(f"generation excluded (oracle), end to end: {t:.2f} s, {n_dev / t:.1f} examples/s "
              f"({n_dev * (1 + max(cfg.vote_k, cfg.pass_k)) / t:.0f} predictions/s)")

        no_ts = settings.model_copy(update={"eval": cfg.model_copy(update={"splits": ["dev"], "ts": False})})
        t_nots, _ = timed(lambda: run_eval(no_ts, ORACLE, corpus, None, scratch / "oracle-nots", progress=False),
                          args.repeats)
        print(f"  same without TS: {t_nots:.2f} s, {n_dev / t_nots:.1f} examples/s (end-to-end TS cost "
              f"{t / t_nots:.2f}x)")

        bench_ts_vs_ex(settings, corpus, args.repeats)

        from progress_sql.train.tiny import build_tiny_model  # torch only for this part

        model_dir = build_tiny_model(corpus, settings, scratch / "tiny")
        gen_cfg = cfg.model_copy(update={"splits": ["dev"], "vote_k": 0, "pass_k": 0, "greedy": True,
                                         "max_examples": args.gen_examples})
        gen_settings = settings.model_copy(update={"eval": gen_cfg})
        t, result = timed(lambda: run_eval(gen_settings, str(model_dir), corpus, None, scratch / "tiny-eval",
                                           progress=False), args.repeats)
        m = result.metrics["dev"]["greedy"]
        print(f"generation included (untrained tiny model {settings.model.hidden_size}x{settings.model.num_layers}, "
              f"greedy, max_new_tokens {settings.generation.max_new_tokens}, "
              f"mean {m['mean_response_tokens']:.0f} tokens): {args.gen_examples} examples in {t:.2f} s, "
              f"{args.gen_examples / t:.2f} examples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
