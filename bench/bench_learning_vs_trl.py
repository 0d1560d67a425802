"""Does the trainer learn what it is paid for? This project's ``run_rl`` against TRL's
``GRPOTrainer`` on the same task, several learning rates × seeds.

The task is the learning test's (``tests/test_trainer.py``), on its corpus: the school corpus
(``tests/corpora.py``: one database, four train questions), the 64-wide 2-layer tiny policy
after 80 SFT steps (``half_right_sft``: about half of its temperature-1 rollouts right), single
turn, the ``oneshot`` reward computed by the same code (``rewards.turns.make_turn`` + the
recipe). Both sides: the same starting weights, G, prompts in the same order (each step sees
the four questions), temperature 1, max new tokens, stop at ``</sql>`` (TRL through the eos
ids, see ``bench_rl_vs_trl.trl_trainer``), AdamW at the same lr, constant schedule, clipping,
the ``grpo`` loss (per-sequence token mean), no KL, ``--updates-per-batch`` passes over each
batch (1: TRL's default; GRPO's μ), and ``rl.negative_advantage_scale`` 1.0 (GRPO as
published). Seeds seed the sampling of both (the two draw different samples, hence several
seeds).

Prints per lr and side: the mean reward and rollout EX of every step (mean over seeds), then
the mean reward over the last third of the steps and the rollout EX over the first and the
last third, each with its spread (min-max over seeds), and the same with no update (lr 1e-12:
what the seeded sampling alone gives). The two sides draw different samples from the same
weights, so compare each side's last third with its own first third and its own no-update row.

With ``--multi-turn`` it then runs ours only, same budget and questions: ``progress`` with
``odt_feedback`` (2 turns) against single-turn ``oneshot``, and prints first-turn EX (ex@1)
and final EX per step.

    python bench/bench_learning_vs_trl.py [--lrs 3e-4,1e-3,3e-3] [--seeds 1,2,3] [--steps 30]
        [--group-size 8] [--threads 1] [--multi-turn] [--no-trl]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rl_vs_trl import TrlCalls, trl_trainer  # noqa: E402

# The school corpus lives with the learning test it serves; the bench runs from a checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from corpora import half_right_sft, school_corpus, school_settings  # noqa: E402

from progress_sql.params import Settings  # noqa: E402
from progress_sql.train.sft import run_sft  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.trainer import run_rl  # noqa: E402

Curve = dict[str, list[float]]  # "reward", "ex" (and "ex@1" for ours): one value per step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lrs", default="3e-4,1e-3,3e-3")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--negative-advantage-scale", type=float, default=1.0)
    p.add_argument("--updates-per-batch", type=int, default=1, help="μ: passes over each batch (TRL: num_iterations)")
    p.add_argument("--aggregation", default="auto", help="ours: rl.loss_aggregation (TRL runs grpo)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-trl", action="store_true", help="ours only")
    p.add_argument("--no-baseline", action="store_true", help="skip the lr 1e-12 run")
    p.add_argument("--multi-turn", action="store_true", help="also progress/odt_feedback vs oneshot (ours)")
    p.add_argument("--keep", default=None, help="keep the scratch folder here")
    return p.parse_args(argv)


def task_settings(args: argparse.Namespace, policy: Path, lr: float, seed: int, *,
                  recipe: str = "oneshot", env: str = "single_turn") -> Settings:
    s = school_settings(policy)
    rl = s.rl
    rl.recipe, rl.env, rl.deepspeed, rl.algorithm, rl.loss_aggregation = recipe, env, "never", "grpo", args.aggregation
    rl.steps, rl.questions_per_step, rl.group_size, rl.micro_batch_size = (args.steps, args.questions,
                                                                          args.group_size, args.micro_batch)
    rl.lr, rl.seed, rl.negative_advantage_scale, rl.kl_beta = lr, seed, args.negative_advantage_scale, 0.0
    rl.schedule, rl.warmup_steps, rl.updates_per_batch, rl.max_minutes = "constant", 0, args.updates_per_batch, 600.0
    rl.save_rollouts, rl.checkpoint_every = False, args.steps + 1
    s.generation.temperature, s.generation.top_p = 1.0, 1.0
    s.generation.max_new_tokens, s.generation.batch_size = args.max_new_tokens, args.questions * args.group_size
    return s


def run_ours(s: Settings, corpus: Path, out: Path) -> Curve:
    metrics = run_rl(s, corpus, out_dir=out, progress=False).metrics
    return {"reward": [m["reward/mean"] for m in metrics], "ex": [m["ex"] for m in metrics],
            "ex@1": [m["ex@1"] for m in metrics]}


def run_trl(s: Settings, corpus: Path, out: Path) -> Curve:
    calls = TrlCalls()
    torch.manual_seed(s.rl.seed)
    trl_trainer(s, corpus, out, calls).train()
    return {"reward": calls.reward, "ex": calls.ex}


# ----------------------------------------------------------------------------- report
def last_third(curve: list[float]) -> float:
    tail = curve[len(curve) - max(1, len(curve) // 3):]
    return sum(tail) / len(tail)


def first_third(curve: list[float]) -> float:
    head = curve[:max(1, len(curve) // 3)]
    return sum(head) / len(head)


def summary(runs: list[Curve], key: str, part=last_third) -> str:
    values = [part(r[key]) for r in runs]
    return f"{statistics.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def mean_curve(runs: list[Curve], key: str) -> list[float]:
    return [statistics.mean(v) for v in zip(*(r[key] for r in runs))]


def print_curves(label: str, runs: list[Curve], keys: tuple[str, ...]) -> None:
    for key in keys:
        print(f"  {label:34s} {key:7s} " + " ".join(f"{v:.2f}" for v in mean_curve(runs, key)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    lrs = [float(x) for x in args.lrs.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; torch threads {args.threads}; "
          f"G={args.group_size} questions/step={args.questions} steps={args.steps} max_new_tokens={args.max_new_tokens} "
          f"updates_per_batch={args.updates_per_batch} negative_advantage_scale={args.negative_advantage_scale} "
          f"aggregation={args.aggregation}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_learning_") as tmp:
        scratch = Path(args.keep) if args.keep else Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        corpus = school_corpus(scratch / "corpus") if not (scratch / "corpus").exists() else scratch / "corpus"
        policy = scratch / "sft"
        if not (policy / "config.json").exists():
            s = school_settings()
            base = build_tiny_model(corpus, s, scratch / "base")
            run_sft(half_right_sft(s, base), corpus, out_dir=policy, progress=False)

        table: list[tuple[str, ...]] = []
        ours_runs: dict[float, list[Curve]] = {}  # the single-turn runs, reused by --multi-turn
        grid = ([] if args.no_baseline else [1e-12]) + lrs
        for lr in grid:
            sides = {"ours": [], "TRL": []}
            for seed in seeds:
                s = task_settings(args, policy, lr, seed)
                t0 = time.perf_counter()
                sides["ours"].append(run_ours(s, corpus, scratch / f"ours-{lr}-{seed}"))
                t1 = time.perf_counter()
                if not args.no_trl:
                    sides["TRL"].append(run_trl(s, corpus, scratch / f"trl-{lr}-{seed}"))
                print(f"lr {lr:g} seed {seed}: ours {t1 - t0:.0f} s, TRL {time.perf_counter() - t1:.0f} s; "
                      f"last-third EX ours {last_third(sides['ours'][-1]['ex']):.3f}"
                      + ("" if args.no_trl else f", TRL {last_third(sides['TRL'][-1]['ex']):.3f}"), flush=True)
            ours_runs[lr] = sides["ours"]
            print(f"\nlr {lr:g}, per step (mean over seeds {seeds}):")
            for side, runs in sides.items():
                if runs:
                    print_curves(side, runs, ("reward", "ex"))
                    table.append((f"{lr:g}" if lr > 1e-9 else "none (1e-12)", side, summary(runs, "reward"),
                                  summary(runs, "ex", first_third), summary(runs, "ex")))
            print(flush=True)

        third = max(1, args.steps // 3)
        print(f"mean [min, max] over seeds {seeds}; thirds of {args.steps} steps ({third} steps each):")
        print(f"  {'lr':14s}{'side':6s}{'reward, last third':>26s}{'EX, first third':>26s}{'EX, last third':>26s}")
        for row in table:
            print(f"  {row[0]:14s}{row[1]:6s}" + "".join(f"{cell:>26s}" for cell in row[2:]))

        if args.multi_turn:
            print("\nmulti-turn (ours): progress + odt_feedback (2 turns) vs oneshot + single_turn, same questions")
            for lr in lrs:
                multi = [run_ours(task_settings(args, policy, lr, seed, recipe="progress", env="odt_feedback"),
                                  corpus, scratch / f"multi-{lr}-{seed}") for seed in seeds]
                single = ours_runs[lr]
                print(f"lr {lr:g}, per step (mean over seeds):")
                print_curves("progress/odt_feedback", multi, ("ex@1", "ex"))
                print_curves("oneshot/single_turn", single, ("ex",))
                print(f"  last third: progress ex@1 {summary(multi, 'ex@1')}, final ex {summary(multi, 'ex')}; "
                      f"oneshot ex {summary(single, 'ex')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
