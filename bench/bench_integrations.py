"""Reward latency of the framework adapters (progress_sql.integrations), gold results cached.

Inside a framework's loop the reward is on the critical path (verl's reward loop calls
``compute_score`` once per response), so this measures what one call costs. On a generated
corpus (``--databases`` databases at the default row scale, ``--examples`` train questions, in a
temporary folder), each question gets three completions: its gold query, a wrong query (the gold
as a subquery cut to one row), and text without tags. Every adapter is called once per
completion to warm the gold cache, then timed call by call:

- ``trl reward_function``: TRL's single-turn reward function, one completion per call;
- ``verl compute_score``: verl's custom reward function;
- ``skyrl_gym step``: one ``step`` of a fresh ``progress-sql-odt`` environment (its first turn:
  judge, then the ODT feedback or the episode's reward);
- ``trl submit_answer``: one tool call of TRL's ``ODTFeedbackEnvironment``;
- ``verl generate_response``: one turn of the ODT interaction (needs verl's
  ``verl.interactions.base``; loaded from the installed file when ``import verl`` fails, as it
  does without Ray).

Each line: median and p99 milliseconds per call over ``--repeats`` passes of all completions.
Then batch throughput: TRL's reward function on batches of ``--batch`` completions, one batch
per call, in this thread and through an ``SQLPool`` of ``--workers`` processes (each distinct
query once per batch): completions/s, median of ``--repeats`` passes.

    python bench/bench_integrations.py [--examples 100] [--databases 6] [--rows-scale 1] [--batch 64] \
        [--workers 2] [--repeats 3] [--recipe progress]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from progress_sql.params import settings_from_dict
from progress_sql.data.build import build_corpus
from progress_sql.formats import answer_text
from progress_sql.integrations import skyrl_gym as skyrl_adapter
from progress_sql.integrations import trl as trl_adapter
from progress_sql.integrations import verl as verl_adapter
from progress_sql.integrations.scoring import resolve_recipe
from progress_sql.integrations.tasks import task_rows
from progress_sql.sql import SQLPool


def completions(rows: list[dict], fmt: str) -> list[tuple[dict, str]]:
    """(row, completion) pairs: the gold, a wrong query, no tags, for every row."""
    out = []
    for row in rows:
        gold = row["gold_sql"]
        out += [(row, answer_text(fmt, "r", gold)), (row, answer_text(fmt, "r", f"SELECT * FROM ({gold}) LIMIT 1")),
                (row, "the answer is probably the first table")]
    return out


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def per_call(items: list[tuple[dict, str]], call, repeats: int) -> list[float]:
    """Seconds of each call over ``repeats`` passes (after one warm pass)."""
    for row, text in items:
        call(row, text)
    seconds = []
    for _ in range(repeats):
        for row, text in items:
            start = time.perf_counter()
            call(row, text)
            seconds.append(time.perf_counter() - start)
    return seconds


def base_interaction() -> str:
    """How verl's BaseInteraction is reached: imported, or loaded from the installed file."""
    try:
        import verl.interactions.base  # noqa: F401
        return "imported"
    except ImportError:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            return ""
        path = Path(next(iter(spec.submodule_search_locations))) / "interactions" / "base.py"
        module_spec = importlib.util.spec_from_file_location("verl.interactions.base", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules["verl.interactions.base"] = module
        module_spec.loader.exec_module(module)
        return "loaded from its file (import verl needs Ray)"


def adapters(recipe: str) -> dict[str, object]:
    """name -> call(row, text) for every adapter."""
    import skyrl_gym

    reward = trl_adapter.reward_function(recipe)
    skyrl_adapter.register()

    def trl_call(row, text):
        return reward([row["prompt"]], [[{"role": "assistant", "content": text}]], db_path=[row["db_path"]],
                      gold_sql=[row["gold_sql"]])

    def verl_call(row, text):
        return verl_adapter.compute_score("progress_sql", text, row["gold_sql"], {"db_path": row["db_path"]},
                                          recipe=recipe)

    calls = {"trl reward_function": trl_call, "verl compute_score": verl_call}
    if recipe == "progress":  # the ODT protocol's recipe

        def fresh_skyrl(row):
            extras = {"reward_spec": {"ground_truth": row["gold_sql"]}, "extra_info": {"db_path": row["db_path"]}}
            return skyrl_gym.make("progress-sql-odt", env_config={}, extras=extras)

        def skyrl_call(row, text, env=None):
            return env.step(text)

        def trl_tool(row, text, env=None):
            return env.submit_answer(text)

        calls["skyrl_gym step"] = (skyrl_call, fresh_skyrl)
        calls["trl submit_answer"] = (trl_tool, _trl_env)
        how = base_interaction()
        if how:
            from progress_sql.integrations.verl_interaction import ProtocolInteraction  # noqa: PLC0415 - on the base above

            interaction = ProtocolInteraction({"name": "progress_sql_odt", "protocol": "odt"})
            loop = asyncio.new_event_loop()

            def fresh_interaction(row):
                return loop.run_until_complete(interaction.start_interaction(
                    None, db_path=row["db_path"], gold_sql=row["gold_sql"]))

            def interaction_call(row, text, env=None):
                messages = [{"role": "assistant", "content": text}]
                out = loop.run_until_complete(interaction.generate_response(env, messages))
                loop.run_until_complete(interaction.finalize_interaction(env))
                return out

            calls["verl generate_response"] = (interaction_call, fresh_interaction)
            print(f"verl's BaseInteraction: {how}")
    return calls


def _trl_env(row):
    env = trl_adapter.ODTFeedbackEnvironment()
    env.reset(db_path=row["db_path"], gold_sql=row["gold_sql"])
    return env


def time_adapter(call, items, repeats: int) -> list[float]:
    """Per-call seconds; a (call, fresh) pair gets a fresh episode per call, made untimed."""
    if not isinstance(call, tuple):
        return per_call(items, call, repeats)
    step, fresh = call
    seconds = []
    for round_ in range(repeats + 1):
        for row, text in items:
            env = fresh(row)
            start = time.perf_counter()
            step(row, text, env=env)
            if round_:  # the first pass warms the caches
                seconds.append(time.perf_counter() - start)
    return seconds


def batch_throughput(items, recipe: str, batch: int, workers: int, repeats: int) -> dict[str, float]:
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]

    def run(reward) -> float:
        start = time.perf_counter()
        for chunk in batches:
            reward([r["prompt"] for r, _ in chunk], [t for _, t in chunk], db_path=[r["db_path"] for r, _ in chunk],
                   gold_sql=[r["gold_sql"] for r, _ in chunk])
        return len(items) / (time.perf_counter() - start)

    serial = trl_adapter.reward_function(recipe)
    figures = {"this thread": statistics.median([run(serial) for _ in range(repeats + 1)][1:])}
    with SQLPool(workers) as pool:
        pooled = trl_adapter.reward_function(recipe, pool=pool)
        figures[f"SQLPool, {workers} processes"] = statistics.median([run(pooled) for _ in range(repeats + 1)][1:])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100, help="train questions (3 completions each)")
    parser.add_argument("--databases", type=int, default=6)
    parser.add_argument("--rows-scale", type=float, default=1.0, help="data.rows_scale: bigger tables, slower queries")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipe", default="progress", help="a single-turn recipe (progress also times the ODT protocol)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_integrations_") as tmp:
        data = {"n_databases": args.databases, "n_dev_databases": 1, "n_test_databases": 1,
                "train_size": args.examples, "dev_size": 4, "test_size": 4, "neighbours": 0, "renamed_copies": 0,
                "rows_scale": args.rows_scale}
        build_corpus(settings_from_dict({"data": data}), Path(tmp) / "corpus", progress=False)
        rows = task_rows(Path(tmp) / "corpus", "train", args.recipe, limit=args.examples)
        items = completions(rows, resolve_recipe(args.recipe).fmt)
        print(f"{len(rows)} questions on {len({r['db_id'] for r in rows})} databases, {len(items)} completions "
              f"(gold, wrong, no tags); recipe {args.recipe}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
              f"gold results cached; {args.repeats} timed passes")
        calls = adapters(args.recipe)
        print(f"{'per call (ms)':<34}{'median':>9}{'p99':>9}{'calls':>8}")
        for name, call in calls.items():
            seconds = time_adapter(call, items, args.repeats)
            print(f"  {name:<32}{statistics.median(seconds) * 1e3:>9.2f}{percentile(seconds, 99) * 1e3:>9.2f}"
                  f"{len(seconds):>8}")
        print(f"batch throughput, TRL reward function, batches of {args.batch} (completions/s, median of "
              f"{args.repeats}):")
        figures = batch_throughput(items, args.recipe, args.batch, args.workers, args.repeats)
        base = next(iter(figures.values()))
        for name, value in figures.items():
            print(f"  {name:<32}{value:>9.0f} ({value / base:4.2f}x)")


if __name__ == "__main__":
    main()
