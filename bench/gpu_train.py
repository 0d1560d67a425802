"""GPU throughput of generation and RL training on a ~100M-parameter model built locally.

The Python half of ``bench/gpu_train.sh`` (which sets the offline environment and runs each
section in its own process, so vLLM's and DeepSpeed's process groups never meet). Sections:

- ``check``: exit 2 with a clear message when no CUDA GPU is visible;
- ``prepare``: a small generated corpus (``data.build.build_corpus``), the project tokenizer
  trained on it and a Qwen2-style model from ``--hidden/--layers/--heads/--kv-heads/
  --intermediate/--vocab`` (default 768/12/12/12/2304/8192: ~98M parameters) saved with
  ``build_tiny_model``; no downloads;
- ``generate``: bf16, ``--batch`` distinct round-1 prompts, ``--new-tokens`` sampled each
  (temperature 1): ``TransformersBackend`` and, for reference, transformers' ``generate``
  (forced to the full length); generated tokens/s, median of ``--repeats`` after a warm-up;
- ``vllm``: the same prompts through ``VLLMBackend`` when vLLM imports (otherwise says why);
- ``train``: ``run_rl`` for 1 + ``--steps`` steps with DeepSpeed ZeRO-2 (``rl.deepspeed:
  always``, bf16, one GPU), single-turn ``oneshot``; per timed step: trajectories/s, generated
  tokens/s during the rollout, train tokens/s (sequence tokens / (step − rollout) seconds: the
  old-log-prob forward plus forward+backward) and peak GPU memory.

Each section prints its figures and merges them into ``<work>/gpu_train.json``.

    python bench/gpu_train.py SECTION --work DIR [options]      (normally via gpu_train.sh)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NO_GPU = ("gpu_train: no CUDA GPU is visible (torch.cuda.is_available() is False). This benchmark "
          "needs one NVIDIA GPU (written for an H200, bf16); it has not run here.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("section", choices=("check", "prepare", "generate", "vllm", "train"))
    p.add_argument("--work", default=str(REPO / "outputs" / "gpu_train"), help="corpus, model, results")
    p.add_argument("--params", default=str(REPO / "params.yaml"))
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=12)
    p.add_argument("--intermediate", type=int, default=2304)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--train-size", type=int, default=512, help="train examples of the generated corpus")
    p.add_argument("--batch", type=int, default=64, help="generation: sequences per batch")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--questions", type=int, default=8, help="train: questions per step (× G trajectories)")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=3, help="train: timed steps after one warm-up step")
    p.add_argument("--zero-config", default="configs/deepspeed/zero2.json")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run the sections on CPU (tiny sizes) to check the script itself; no figures of worth")
    return p.parse_args(argv)


def settings_for(args: argparse.Namespace, **extra: Any):
    from progress_sql.config import load_settings  # noqa: PLC0415

    overrides = {
        "data.train_size": args.train_size, "data.dev_size": 16, "data.test_size": 16, "data.neighbours": 0,
        "model.hidden_size": args.hidden, "model.num_layers": args.layers, "model.num_heads": args.heads,
        "model.num_kv_heads": args.kv_heads, "model.intermediate_size": args.intermediate,
        "model.vocab_size": args.vocab, "model.max_position_embeddings": 4096, "model.dtype": "bfloat16",
        "generation.temperature": 1.0, "generation.top_p": 1.0, "generation.max_new_tokens": args.new_tokens,
        "generation.batch_size": args.batch,
    }
    overrides.update(extra)
    return load_settings(args.params, overrides)


def record(work: Path, section: str, figures: dict[str, Any]) -> None:
    """Merge one section's figures into ``<work>/gpu_train.json``."""
    path = work / "gpu_train.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[section] = figures
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def prompts(work: Path, tokenizer: Any, settings: Any, count: int) -> list[list[int]]:
    """``count`` round-1 prompts (train questions in order, wrapping around), as token ids."""
    from progress_sql import envs  # noqa: PLC0415
    from progress_sql.corpus.records import CorpusLayout, read_jsonl  # noqa: PLC0415
    from progress_sql.inference.models import chat_prompt_ids  # noqa: PLC0415

    layout = CorpusLayout(work / "corpus")
    schema = envs.SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    train = list(read_jsonl(layout.split("train")))
    out = []
    for k in range(count):
        ex = train[k % len(train)]
        messages = envs.round1_messages(ex, schema(ex.db_id, layout.database(ex.db_id)), "think_sql", settings.env)
        out.append(chat_prompt_ids(tokenizer, messages))
    return out


# ----------------------------------------------------------------------------- sections
def check() -> int:
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name(0)}, bf16 {torch.cuda.is_bf16_supported()}, torch {torch.__version__}")
    return 0


def prepare(args: argparse.Namespace, work: Path) -> int:
    from progress_sql.data.build import build_corpus  # noqa: PLC0415
    from progress_sql.train.tiny import build_tiny_model  # noqa: PLC0415

    settings = settings_for(args)
    t0 = time.perf_counter()
    build_corpus(settings, work / "corpus", progress=False)
    model_dir = build_tiny_model(work / "corpus", settings, work / "model")
    info = json.loads((model_dir / "tiny_model.json").read_text())
    figures = {"parameters": info["parameters"], "model": info["model"], "seconds": time.perf_counter() - t0}
    print(f"prepare: corpus + tokenizer + model in {figures['seconds']:.0f} s; "
          f"{info['parameters'] / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers, "
          f"{args.heads} heads / {args.kv_heads} kv, intermediate {args.intermediate}, vocab {args.vocab} asked)")
    record(work, "prepare", figures)
    return 0


def _device() -> str:
    import torch  # noqa: PLC0415

    return "cuda" if torch.cuda.is_available() else "cpu"  # cpu only under --cpu-smoke


def _sync() -> None:
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gib() -> float:
    import torch  # noqa: PLC0415

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def _timed(fn, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def generate(args: argparse.Namespace, work: Path) -> int:
    import torch  # noqa: PLC0415

    from progress_sql.inference.backends import TransformersBackend  # noqa: PLC0415
    from progress_sql.inference.models import load_policy  # noqa: PLC0415

    settings = settings_for(args)
    model, tokenizer = load_policy(work / "model", dtype="bfloat16", device=_device())
    ids = prompts(work, tokenizer, settings, args.batch)
    backend = TransformersBackend(model, tokenizer, batch_size=args.batch)

    def ours():
        return backend.generate(ids, n=1, temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=0)

    backend.generate(ids[:8], n=1, temperature=1.0, max_new_tokens=16, seed=0)  # warm-up (kernels, allocator)
    seconds, samples = _timed(ours, args.repeats)
    tokens = sum(len(s[0].token_ids) for s in samples)
    figures = {"transformers_backend": {"batch": args.batch, "new_tokens": args.new_tokens, "seconds": seconds,
                                        "generated_tokens": tokens, "tokens_per_s": tokens / seconds,
                                        "mean_prompt_tokens": statistics.mean(len(p) for p in ids)}}
    print(f"generate/TransformersBackend: batch {args.batch}, {tokens} tokens in {seconds:.2f} s "
          f"(median of {args.repeats}) = {tokens / seconds:,.0f} tokens/s; mean prompt "
          f"{figures['transformers_backend']['mean_prompt_tokens']:.0f} tokens")

    # transformers' own generate on the same left-padded batch, every row to the full length
    width = max(len(p) for p in ids)
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for r, p in enumerate(ids):
        input_ids[r, width - len(p):] = torch.tensor(p)
        attention[r, width - len(p):] = 1
    input_ids, attention = input_ids.to(model.device), attention.to(model.device)

    def hf():
        with torch.no_grad():
            return model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                  pad_token_id=tokenizer.pad_token_id)

    seconds, out = _timed(hf, args.repeats)
    tokens = (out.shape[1] - width) * out.shape[0]
    figures["hf_generate"] = {"seconds": seconds, "generated_tokens": tokens, "tokens_per_s": tokens / seconds}
    print(f"generate/transformers.generate (reference): {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tokens/s")
    record(work, "generate", figures)
    return 0


def vllm_generate(args: argparse.Namespace, work: Path) -> int:
    from progress_sql.inference.backends import BackendUnavailable, VLLMBackend  # noqa: PLC0415
    from progress_sql.inference.models import load_policy  # noqa: PLC0415

    settings = settings_for(args, **{"generation.backend": "vllm"})
    try:
        backend = VLLMBackend(work / "model", settings.generation, seed=settings.seed)
    except BackendUnavailable as err:
        print(f"vllm: skipped, {err}")
        record(work, "vllm", {"skipped": str(err)})
        return 0
    _, tokenizer = load_policy(work / "model", dtype="bfloat16", device="cpu")
    ids = prompts(work, tokenizer, settings, args.batch)

    def run():
        return backend.generate(ids, n=1, temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=0)

    backend.generate(ids[:8], n=1, temperature=1.0, max_new_tokens=16, seed=0)
    seconds, samples = _timed(run, args.repeats)
    tokens = sum(len(s[0].token_ids) for s in samples)
    print(f"vllm/VLLMBackend: batch {args.batch}, {tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tokens/s")
    record(work, "vllm", {"seconds": seconds, "generated_tokens": tokens, "tokens_per_s": tokens / seconds})
    return 0


def train(args: argparse.Namespace, work: Path) -> int:
    from progress_sql.train.trainer import run_rl  # noqa: PLC0415

    n = args.group_size * args.questions
    settings = settings_for(args, **{
        "rl.init_from": str(work / "model"), "rl.env": "single_turn", "rl.recipe": "oneshot",
        "rl.deepspeed": "always", "rl.deepspeed_config": args.zero_config, "rl.group_size": args.group_size,
        "rl.questions_per_step": args.questions, "rl.micro_batch_size": args.micro_batch,
        "rl.steps": args.steps + 1, "rl.checkpoint_every": args.steps + 1, "rl.save_rollouts": False,
        "rl.max_minutes": 60.0, "generation.batch_size": n,
    })
    rows: list[dict[str, Any]] = []

    def on_step(step: int, m: dict[str, Any]) -> None:
        seq = m["sequence_tokens/mean"] * n
        row = {"step": step, "step_s": m["step_s"], "rollout_s": m["rollout_s"],
               "trajectories_per_s": m["trajectories_per_s"], "rollout_tokens_per_s": m["tokens_per_s"],
               "train_tokens_per_s": seq / max(m["step_s"] - m["rollout_s"], 1e-9),
               "response_tokens_mean": m["response_tokens/mean"], "sequence_tokens_mean": m["sequence_tokens/mean"],
               "peak_gib": _peak_gib()}
        rows.append(row)
        print(f"train step {step}{' (warm-up)' if step == 1 else ''}: {row['step_s']:.2f} s (rollout "
              f"{row['rollout_s']:.2f} s), {row['trajectories_per_s']:.2f} trajectories/s, rollout "
              f"{row['rollout_tokens_per_s']:,.0f} tokens/s, train {row['train_tokens_per_s']:,.0f} tokens/s, "
              f"mean response {row['response_tokens_mean']:.0f} / sequence {row['sequence_tokens_mean']:.0f} tokens, "
              f"peak {row['peak_gib']:.1f} GiB", flush=True)

    result = run_rl(settings, work / "corpus", out_dir=work / "rl", progress=False, on_step=on_step)
    timed = rows[1:]
    summary = {key: statistics.median(r[key] for r in timed)
               for key in ("step_s", "rollout_s", "trajectories_per_s", "rollout_tokens_per_s", "train_tokens_per_s")}
    engine = json.loads((result.final_dir / "rl_run.json").read_text())
    summary.update(engine=engine["engine"], zero_stage=engine["zero_stage"], trajectories_per_step=n,
                   micro_batch=args.micro_batch, peak_gib=max(r["peak_gib"] for r in rows))
    print(f"train (engine {summary['engine']}, ZeRO-{summary['zero_stage']}, median of {len(timed)} steps): "
          f"{summary['trajectories_per_s']:.2f} trajectories/s, rollout {summary['rollout_tokens_per_s']:,.0f} "
          f"tokens/s, train {summary['train_tokens_per_s']:,.0f} tokens/s, step {summary['step_s']:.2f} s")
    record(work, "train", {"summary": summary, "steps": rows})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.section == "check":
        return check()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.section == "prepare":
        return prepare(args, work)
    if not args.cpu_smoke and check() != 0:
        return 2
    return {"generate": generate, "vllm": vllm_generate, "train": train}[args.section](args, work)


if __name__ == "__main__":
    sys.exit(main())
