"""The update of the default multi-turn RL step, right-padded against packed micro-batches.

Real RL steps first: the bundled corpus (``data`` settings, or ``--corpus``) and the tiny policy
after ``--sft-steps`` SFT steps (or ``--model``: an SFT folder such as the pipeline's
``outputs/sft``), then ``--steps`` steps of ``run_rl`` with the default settings (``progress`` +
``odt_feedback``, G = 8, 4 questions, T = 4), their episodes kept (``rl.save_rollouts``). Then each
step's 32 trajectories are put through the update's forward and backward passes (the trainer's
``micro_batches``, ``token_batch`` and ``micro_batch_loss``; no optimizer step, so every pass
sees the same weights) in each mode, the modes alternating within each repeat:

- ``padded``: ``rl.packing: false``, ``rl.micro_batch_size`` sequences a micro-batch (8), rows
  right-padded to the longest (the trainer before packing);
- ``packed``: ``rl.packing: true``, ``rl.shared_prefix: false``: the same micro-batches, one row
  each, every trajectory in full;
- ``shared``: the default, packed with ``rl.shared_prefix``: micro-batches of whole groups, each
  group's common prompt run once;
- ``shared-T``: shared, micro-batches cut at ``--tokens`` tokens (``rl.micro_batch_tokens``).

Prints the padding share of each step (padded positions / positions run), and per mode the
median seconds of the whole batch's update, its real tokens/s and the ratio to ``padded``
(goal: the default ≥ 1.3×).

    python bench/bench_packing.py [--steps 3] [--sft-steps 300] [--repeats 5] [--tokens 4096] \
        [--threads 2] [--model DIR --corpus DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from progress_sql.params import default_settings  # noqa: E402
from progress_sql.inference.models import load_policy  # noqa: E402
from progress_sql.train.packing import micro_batches, token_batch, use_packed_attention  # noqa: E402
from progress_sql.train.trainer import micro_batch_loss, run_rl  # noqa: E402
from progress_sql.train.trajectories import TokenizedTrajectory  # noqa: E402
from warm_policy import corpus_and_policy  # noqa: E402 - bench/, beside this script


def rollouts(args: argparse.Namespace, work: Path) -> tuple[Path, list[list[TokenizedTrajectory]]]:
    """The policy used and the trajectories of each real RL step."""
    settings = default_settings().model_copy(deep=True)
    corpus, policy = corpus_and_policy(work, args.corpus, args.model, args.sft_steps)
    settings.rl.init_from, settings.rl.steps, settings.rl.max_minutes = str(policy), args.steps, 60.0
    settings.rl.save_rollouts, settings.rl.deepspeed = True, "never"
    started = time.perf_counter()
    result = run_rl(settings, corpus, out_dir=work / "rl", progress=False)
    print(f"RL ({args.steps} steps, default settings) in {time.perf_counter() - started:.0f} s")
    steps = []
    for step in range(1, result.steps + 1):
        rows = [json.loads(line) for line in (result.out_dir / "rollouts" / f"step-{step}.jsonl").read_text().splitlines()]
        steps.append([TokenizedTrajectory(r["input_ids"], r["loss_mask"], [0.0] * len(r["input_ids"]), r["reward"],
                                          r["group"], r["turns"], r["truncated"]) for r in rows])
    return policy, steps


def update_seconds(model, trajs: list[TokenizedTrajectory], *, packed: bool, shared: bool, max_tokens: int,
                   pad_id: int) -> tuple[float, float]:
    """Seconds of one update's forward and backward passes over ``trajs``, and its padding share."""
    rl = default_settings().rl.model_copy(update={"packing": packed, "micro_batch_tokens": max_tokens})
    started = time.perf_counter()
    chunks = micro_batches([len(t.input_ids) for t in trajs], rl.micro_batch_size, rl.micro_batch_tokens, packed=packed,
                           groups=[t.group_id for t in trajs] if shared else None)
    batches = [token_batch([trajs[i] for i in c], packed=packed, pad_id=pad_id, device="cpu", share_prefix=shared,
                           min_shared=rl.shared_prefix_min_tokens, query_block=rl.attention_query_block)
               for c in chunks]
    adv = torch.linspace(-1.0, 1.0, len(trajs))
    tokens = float(sum(sum(t.loss_mask) for t in trajs))
    for c, b in zip(chunks, batches):
        loss, _ = micro_batch_loss(model, b, adv[c], None, None, rl, temperature=1.0, num_sequences=len(trajs),
                                   num_tokens=tokens, max_tokens=1024)
        loss.backward()
    model.zero_grad(set_to_none=True)
    run = sum(b.model_tokens for b in batches)
    return time.perf_counter() - started, sum(b.pad_tokens for b in batches) / run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="")
    parser.add_argument("--corpus", default="")
    parser.add_argument("--keep", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    holder = None if args.keep else tempfile.TemporaryDirectory(prefix="bench-packing-")
    work = Path(args.keep or holder.name)
    work.mkdir(parents=True, exist_ok=True)
    policy, steps = rollouts(args, work)
    model, tokenizer = load_policy(policy, dtype="float32", device="cpu")
    use_packed_attention(model)
    model.train()
    modes = {"padded": (False, False, 0), "packed": (True, False, 0), "shared": (True, True, 0),
             f"shared-{args.tokens}": (True, True, args.tokens)}
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    for k, trajs in enumerate(steps, 1):
        lengths = [len(t.input_ids) for t in trajs]
        _, share = update_seconds(model, trajs, packed=False, shared=False, max_tokens=0, pad_id=tokenizer.pad_token_id)
        print(f"step {k}: {len(trajs)} trajectories, {sum(lengths):,} tokens (min {min(lengths)}, max {max(lengths)}), "
              f"turns {statistics.mean(t.turn_count for t in trajs):.2f}; padded micro-batches: {share:.1%} padding")
    real = [sum(len(t.input_ids) for t in trajs) for trajs in steps]
    for repeat in range(args.repeats):
        order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
        for mode in order:
            packed, shared, max_tokens = modes[mode]
            seconds[mode].append(sum(update_seconds(model, trajs, packed=packed, shared=shared, max_tokens=max_tokens,
                                                    pad_id=tokenizer.pad_token_id)[0] for trajs in steps))
    base = statistics.median(seconds["padded"])
    print(f"update of {len(steps)} steps ({sum(real):,} real tokens), forward + backward, median of {args.repeats}, "
          f"{args.threads} threads")
    print(f"{'mode':>14} {'seconds':>8} {'tokens/s':>9} {'vs padded':>10}")
    for mode, values in seconds.items():
        med = statistics.median(values)
        print(f"{mode:>14} {med:8.2f} {sum(real) / med:9.0f} {base / med:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
