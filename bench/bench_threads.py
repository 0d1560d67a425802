"""RL steps of one torch process alone and of two at once on the same cores, under each OpenMP
wait policy: what spinning threads cost a process that shares its cores (two pytest workers,
``rl.async``'s producer beside the trainer, DeepSpeed ranks on a CPU).

The school corpus of ``tests/corpora.py``, its 64-wide tiny policy after the 80-step SFT of
``half_right_sft``, then ``run_rl`` with the learning tests' settings (G 8 × 4 questions, eight
passes a batch, plain torch) for ``--steps`` steps at ``--autocast``. Each run is a process of
its own started with the policy's variables (OpenMP reads them when torch loads it):

- ``spin``: the default (threads spin a while before they sleep);
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (they sleep at once);
- ``spin1000``: ``GOMP_SPINCOUNT=1000`` (libgomp's spin shortened).

Per policy: the seconds of the run alone, then of each of two started together, and the ratio
of the pair's slower run to the lone run: two CPU-bound runs on the same cores should take up to
twice as long as one (2×); far above that is time lost to threads waiting on a busy core.

    python bench/bench_threads.py [--steps 4] [--autocast bf16] [--policies spin,passive,spin1000] \
        [--threads 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

POLICIES = {"spin": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin1000": {"GOMP_SPINCOUNT": "1000"}}


def build(work: Path) -> tuple[Path, Path]:
    """(corpus, policy) in ``work``, reused when there."""
    from corpora import half_right_sft, school_corpus, school_settings  # noqa: PLC0415

    from progress_sql.train.sft import run_sft  # noqa: PLC0415
    from progress_sql.train.tiny import build_tiny_model  # noqa: PLC0415

    corpus, policy = work / "corpus", work / "sft"
    if not (policy / "config.json").exists():
        school_corpus(corpus)
        base = build_tiny_model(corpus, school_settings(), work / "base")
        run_sft(half_right_sft(school_settings(), base), corpus, out_dir=policy, progress=False)
    return corpus, policy


def child(args: argparse.Namespace) -> None:
    """One RL run; prints its seconds as JSON."""
    import torch  # noqa: PLC0415

    from corpora import school_settings  # noqa: PLC0415

    from progress_sql.train.trainer import run_rl  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    s = school_settings(args.policy)
    s.rl.deepspeed, s.rl.save_rollouts, s.rl.checkpoint_every, s.rl.autocast = "never", False, 100, args.autocast
    s.rl.steps, s.rl.questions_per_step, s.rl.group_size, s.rl.micro_batch_size = args.steps, 4, 8, 16
    s.rl.lr, s.rl.updates_per_batch, s.rl.max_minutes = 3e-4, 8, 60.0
    started = time.perf_counter()
    run_rl(s, args.corpus, out_dir=args.out, progress=False)
    print(json.dumps({"seconds": time.perf_counter() - started}))


def runs(args: argparse.Namespace, work: Path, corpus: Path, policy: Path, name: str, n: int) -> list[float]:
    """Seconds of ``n`` runs started together under policy ``name``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[name])
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "--corpus", str(corpus), "--policy", str(policy),
                               "--out", str(work / f"{name}-{n}-{i}"), "--steps", str(args.steps),
                               "--autocast", args.autocast, "--threads", str(args.threads)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a {name} run failed (exit {p.returncode}):\n{stderr[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1])["seconds"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--autocast", default="bf16", choices=("auto", "bf16", "off"))
    ap.add_argument("--policies", default="spin,passive,spin1000")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    ap.add_argument("--keep", default="", help="work folder to keep (and reuse)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", default="", help=argparse.SUPPRESS)
    ap.add_argument("--policy", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    names = args.policies.split(",")
    if unknown := set(names) - set(POLICIES):
        raise SystemExit(f"unknown policies {sorted(unknown)}; choose from {sorted(POLICIES)}")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-threads-"))
    corpus, policy = build(work)
    print(f"{args.steps} RL steps at autocast {args.autocast}, {args.threads} torch threads a run, "
          f"{os.cpu_count()} cores")
    print("| policy | alone (s) | two at once (s each) | slower of the pair / alone |\n|---|---:|---:|---:|")
    for name in names:
        (alone,) = runs(args, work, corpus, policy, name, 1)
        pair = runs(args, work, corpus, policy, name, 2)
        print(f"| {name} | {alone:.1f} | {pair[0]:.1f}, {pair[1]:.1f} | {max(pair) / alone:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
