"""Steps per minute of the default multi-turn RL step, synchronous against asynchronous rollouts
(``rl.async``, ``max_staleness`` 1), in one run.

The bundled corpus (``data`` settings, or ``--corpus``) and the tiny policy after
``--sft-steps`` SFT steps (or ``--model``: an SFT folder such as the pipeline's
``outputs/sft``); then ``run_rl`` with the default settings (``progress`` + ``odt_feedback``,
GRPO, G = 8, 4 questions a step, T = 4, plain torch) for ``--steps`` steps, once in each mode,
the same questions in the same order, the same seeds:

- ``sync``: the synchronous loop, one process with ``--sync-threads`` torch threads (2: both
  cores; a second figure with ``--sync-threads 2,1``);
- ``async``: the trainer with one thread, the rollout producer with ``rl.async.threads`` 1
  (one core each), ``rl.async.max_staleness`` ``--max-staleness``.

Per mode: the wall-clock of the whole run (the producer's start and the first rollout, which
nothing overlaps, included) and of the steady steps (every step after the first, from one
step's end to the next: ``step_s``), steps per minute of each, the mean rollout and update
seconds; for async, the staleness (mean, max over steps) and the importance weights (mean, max,
share truncated at ``rl.async.is_cap``), the seconds the trainer waited for a batch and the
weight publish (``sync_s``); and the ratio async / sync of both rates (goal ≥ 1.3×). With a
one-thread synchronous run beside a wider one (``--sync-threads 2,1``), the most overlap alone
could give: the wider loop's rollout + update over the longer of the one-thread phases.
``--rounds`` repeats the pair, alternating which mode goes first (a shared machine's load moves).

    python bench/bench_async.py [--steps 8] [--sft-steps 300] [--max-staleness 1] \
        [--sync-threads 2] [--rounds 1] [--model DIR --corpus DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """The corpus and the SFT policy the runs start from."""
    from warm_policy import corpus_and_policy  # noqa: PLC0415 - bench/, beside this script

    return corpus_and_policy(work, args.corpus, args.model, args.sft_steps)


def run_mode(args: argparse.Namespace, corpus: Path, policy: Path, work: Path, mode: str, threads: int
             ) -> dict[str, Any]:
    """One RL run of ``args.steps`` default steps in ``mode``; its figures."""
    import torch  # noqa: PLC0415

    from progress_sql.params import default_settings  # noqa: PLC0415
    from progress_sql.train.trainer import run_rl  # noqa: PLC0415

    torch.set_num_threads(threads)
    s = default_settings().model_copy(deep=True)
    rl = s.rl
    rl.init_from, rl.steps, rl.max_minutes = str(policy), args.steps, 120.0
    rl.deepspeed, rl.save_rollouts, rl.checkpoint_every, rl.log_episodes = "never", False, args.steps, 0
    s.generation.backend = "transformers"  # the sampler of the measurements (auto may take vLLM)
    if mode == "async":
        rl.async_ = rl.async_.model_copy(update={"enabled": True, "max_staleness": args.max_staleness, "threads": 1})
    started = time.perf_counter()
    result = run_rl(s, corpus, out_dir=work / f"rl-{mode}-{threads}", progress=False)
    wall = time.perf_counter() - started
    m = result.metrics
    steady = [x["step_s"] for x in m[1:]] or [m[0]["step_s"]]
    out = {"mode": mode, "threads": threads, "steps": len(m), "wall_s": wall, "loop_s": sum(x["step_s"] for x in m),
           "steady_s": sum(steady), "steady_steps": len(steady),
           "rollout_s": statistics.mean(x["rollout_s"] for x in m), "update_s": statistics.mean(x["update_s"] for x in m),
           "reward": statistics.mean(x["reward/mean"] for x in m), "ex": statistics.mean(x["ex"] for x in m)}
    if mode == "async":
        out.update({key: [x[f"async/{key}"] for x in m] for key in
                    ("staleness_mean", "staleness_max", "is_mean", "is_max", "is_truncated", "wait_s")})
        out["sync_s"] = [x["sync_s"] for x in m]
    return out


def report(row: dict[str, Any]) -> str:
    per_min = 60 * row["steps"] / row["wall_s"]
    steady = 60 * row["steady_steps"] / row["steady_s"]
    who = f"{row['threads']} thread{'s' * (row['threads'] > 1)}{' + producer 1' * (row['mode'] == 'async')}"
    text = (f"{row['mode']:>5} ({who}): "
            f"{row['steps']} steps in {row['wall_s']:.0f} s = {per_min:.2f} steps/min; steady (steps 2..) "
            f"{steady:.2f} steps/min; mean rollout {row['rollout_s']:.1f} s, update {row['update_s']:.1f} s; "
            f"reward {row['reward']:.3f}, rollout EX {row['ex']:.3f}")
    if row["mode"] == "async":
        text += (f"\n       staleness mean {statistics.mean(row['staleness_mean']):.2f}, max {max(row['staleness_max']):.0f}"
                 f" (per step {[int(x) for x in row['staleness_max']]}); importance weight mean "
                 f"{statistics.mean(row['is_mean']):.4f}, max {max(row['is_max']):.3f}, truncated "
                 f"{statistics.mean(row['is_truncated']):.2%}; trainer waited {sum(row['wait_s']):.1f} s for batches, "
                 f"weight publish {statistics.mean(row['sync_s']):.3f} s a step")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--sync-threads", default="2", help="comma-separated: one sync run per value")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--model", default="")
    parser.add_argument("--corpus", default="")
    parser.add_argument("--keep", default="")
    args = parser.parse_args()
    holder = None if args.keep else tempfile.TemporaryDirectory(prefix="bench-async-")
    work = Path(args.keep or holder.name)
    work.mkdir(parents=True, exist_ok=True)
    corpus, policy = prepare(args, work)
    sync_threads = [int(t) for t in args.sync_threads.split(",")]
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = [("sync", t) for t in sync_threads] + [("async", 1)]
        for mode, threads in (order if r % 2 == 0 else list(reversed(order))):
            row = run_mode(args, corpus, policy, work, mode, threads)
            rows.append(row)
            print(report(row), flush=True)
    print(f"\n{args.steps} default RL steps (G 8 × 4 questions, T 4, progress + odt_feedback), "
          f"max_staleness {args.max_staleness}, {args.rounds} round(s); load average {os.getloadavg()[0]:.1f}")
    asyncs = [r for r in rows if r["mode"] == "async"]
    for t in sync_threads:
        syncs = [r for r in rows if r["mode"] == "sync" and r["threads"] == t]
        whole = statistics.median(60 * a["steps"] / a["wall_s"] for a in asyncs) / statistics.median(
            60 * s["steps"] / s["wall_s"] for s in syncs)
        steady = statistics.median(60 * a["steady_steps"] / a["steady_s"] for a in asyncs) / statistics.median(
            60 * s["steady_steps"] / s["steady_s"] for s in syncs)
        print(f"async / sync ({t} thread{'s' * (t > 1)}): {whole:.2f}x steps/min over the whole run, "
              f"{steady:.2f}x over the steady steps (goal >= 1.3x)")
    ones = [r for r in rows if r["mode"] == "sync" and r["threads"] == 1]
    for t in (t for t in sync_threads if t > 1 and ones):
        syncs = [r for r in rows if r["mode"] == "sync" and r["threads"] == t]
        phases = statistics.median(s["rollout_s"] + s["update_s"] for s in syncs)
        longer = statistics.median(max(o["rollout_s"], o["update_s"]) for o in ones)
        # what overlap alone can buy: a step as long as the longer one-thread phase, nothing lost
        print(f"perfect overlap of the one-thread phases: (rollout + update at {t} threads) / max(rollout, update "
              f"at 1 thread) = {phases:.1f} s / {longer:.1f} s = {phases / longer:.2f}x the {t}-thread loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
