"""Peak memory and tokens/s of one update micro-batch with a real vocabulary: the sampled tokens'
log-probabilities from full fp32 logits (as the trainer computed them before ``train.logprobs``)
against the hidden states projected a chunk at a time (``rl.logits_chunk_mb``).

A one-layer Qwen2-shaped model with Qwen2.5's vocabulary (151,936 tokens, tied embeddings as
Qwen2.5-0.5B has; ``--hidden``), ``--rows`` × ``--length`` tokens, every position after the
first scored (the worst case for the logits). Each variant runs in a process of its own; peak
memory is the rise of the process's resident high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) over its resident size once the model and inputs are built, through
``--repeats`` forward + backward passes; tokens/s is the median pass. Variants:

- ``full``: ``model(...).logits`` of every position, upcast to fp32, ``logsumexp`` (the code of
  3c43403's ``token_logprobs``, reproduced here as the baseline);
- ``chunk-0``: ``train.logprobs.token_logprobs`` with ``chunk_mb: 0`` (one chunk, no recompute);
- ``chunk-N``: the same with ``chunk_mb: N`` (``--chunks``, default: params.yaml's 256).

``--no-grad`` scores without gradients instead (the old and reference log-probabilities).

    python bench/bench_logprobs.py [--rows 4] [--length 512] [--hidden 896] [--repeats 5] \
        [--chunks 256,64] [--threads 2] [--no-grad]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

QWEN25_VOCAB = 151_936


def _status(field: str) -> int:
    """A ``/proc/self/status`` size, in bytes."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _full_logits_logprobs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """The baseline: 3c43403's ``token_logprobs`` (every position's fp32 logits at once)."""
    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1, :].float()
    picked = torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def run_variant(variant: str, args: argparse.Namespace) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from progress_sql.train.logprobs import token_logprobs
    from progress_sql.train.packing import token_batch, use_packed_attention
    from progress_sql.train.trajectories import TokenizedTrajectory

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=QWEN25_VOCAB, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=1, num_attention_heads=args.hidden // 64, num_key_value_heads=2,
                         tie_word_embeddings=True, max_position_embeddings=max(2048, args.length))
    model = Qwen2ForCausalLM(config)
    use_packed_attention(model)
    ids = torch.randint(0, QWEN25_VOCAB, (args.rows, args.length))
    trajs = [TokenizedTrajectory(row.tolist(), [0] + [1] * (args.length - 1), [0.0] * args.length, 0.0, 0, 1)
             for row in ids]
    batch = token_batch(trajs, packed=True, pad_id=0, device="cpu")

    def step() -> None:
        with torch.set_grad_enabled(not args.no_grad):
            if variant == "full":
                logp = _full_logits_logprobs(model, ids)
            else:
                logp = token_logprobs(model, batch, chunk_mb=float(variant.split("-")[1]))
        if not args.no_grad:
            logp.mean().backward()
            model.zero_grad(set_to_none=True)

    step()  # warm-up: allocator, kernels, gradients' buffers
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # resets VmHWM to the current resident size
    base = _status("VmRSS")
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    tokens = args.rows * (args.length - 1)
    return {"variant": variant, "peak_gib": (_status("VmHWM") - base) / 2**30,
            "seconds": statistics.median(times), "tokens_per_s": tokens / statistics.median(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=896)  # Qwen2.5-0.5B's
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunks", default="")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-grad", action="store_true", help="score without gradients (old / reference log-probs)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the child process's one variant
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args)))
        return 0
    if not args.chunks:
        from progress_sql.params import default_settings

        args.chunks = str(default_settings().rl.logits_chunk_mb)
    variants = ["full", "chunk-0"] + [f"chunk-{float(c):g}" for c in args.chunks.split(",") if c]
    common = [f"--rows={args.rows}", f"--length={args.length}", f"--hidden={args.hidden}",
              f"--repeats={args.repeats}", f"--threads={args.threads}", *(["--no-grad"] if args.no_grad else [])]
    fp32_logits = args.rows * (args.length - 1) * QWEN25_VOCAB * 4 / 2**30
    print(f"one micro-batch: {args.rows} x {args.length} tokens, vocabulary {QWEN25_VOCAB:,}, hidden {args.hidden}, "
          f"1 layer, tied embeddings; fp32 logits of every position: {fp32_logits:.2f} GiB; "
          f"{'forward only (no grad)' if args.no_grad else 'forward + backward'}, median of {args.repeats}, "
          f"{args.threads} threads")
    rows = []
    for variant in variants:
        out = subprocess.run([sys.executable, __file__, f"--variant={variant}", *common], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full = rows[0]
    print(f"{'variant':>12} {'peak GiB':>9} {'vs full':>8} {'s/pass':>8} {'tokens/s':>9} {'vs full':>8}")
    for r in rows:
        print(f"{r['variant']:>12} {r['peak_gib']:9.2f} {r['peak_gib'] / full['peak_gib']:8.2f} {r['seconds']:8.2f} "
              f"{r['tokens_per_s']:9.0f} {r['tokens_per_s'] / full['tokens_per_s']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
