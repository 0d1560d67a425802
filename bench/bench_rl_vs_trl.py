"""RL step throughput: this project's trainer (``run_rl``) against TRL's ``GRPOTrainer``.

Both train the same untrained tiny model (``build_tiny_model`` from the ``model`` settings,
or the ``--hidden-size/--num-layers/...`` overrides) on the same prompts in the same order, single
turn (TRL's native case), one run each per pair, back to back in this process:

- prompts: the round-1 chat messages ``envs.single_turn`` builds (think_sql format) for the
  questions ``run_rl`` draws (``train.questions.question_indices``), fed to TRL in that order
  (``shuffle_dataset=False``): step k of both sees the same ``--questions`` questions;
- G = ``--group-size``, ``--max-new-tokens``, temperature 1.0, top-p 1.0, AdamW at ``rl.lr``,
  constant schedule, clipping ``rl.grad_clip``, no KL (β = 0: no reference model), fp32,
  ``--micro-batch`` sequences per forward/backward (default: the whole step, TRL's
  ``gradient_accumulation_steps`` 1), one optimizer update per step;
- reward: the ``oneshot`` recipe on a turn made by ``rewards.turns.make_turn`` (parse,
  execute read-only, ``sql.verdict`` against the gold): the code ``run_rl`` runs;
- ``--sft-minutes M`` (default 0) first runs ``run_sft`` on the base model for M minutes and
  starts both from it, so completions end at eos or ``</sql>`` instead of the length limit.

Both stop a completion at ``</sql>``: TRL stops on token ids only, so the ``</sql>`` token of
the tiny tokenizer joins its eos ids (``trl_trainer``). Differences the table does not hide:
ours drops finished rows from the decoding batch (the mean completion lengths are printed, and
the ratio of generated tokens/s is the one to quote); TRL skips the old-log-prob forward when
it updates once per generation, as ours does.

Step 1 is a warm-up; steps 2..N+1 are timed (ours: ``step_s`` of its metrics, TRL: a callback
from ``on_step_begin`` to ``on_step_end``; both include generation, reward and update). Prints
per pair: trajectories/s, generated tokens/s (completion tokens / step seconds), mean
completion tokens, median step seconds, median rollout seconds (ours: generation + env
scoring; TRL: ``_generate``), and the ratio ours/TRL.

    python bench/bench_rl_vs_trl.py [--params params.yaml] [--group-size 8] [--questions 4]
        [--steps 4] [--max-new-tokens 64] [--repeats 1] [--threads 1] [--sft-minutes 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from progress_sql import envs, rewards  # noqa: E402
from progress_sql.params import Settings, load_settings  # noqa: E402
from progress_sql.data.build import build_corpus  # noqa: E402
from progress_sql.corpus.records import CorpusLayout, Example, read_jsonl  # noqa: E402
from progress_sql.envs.db_details import SchemaTexts  # noqa: E402
from progress_sql.rewards.turns import make_turn  # noqa: E402
from progress_sql.rewards.types import Trajectory  # noqa: E402
from progress_sql.sql.pool import default_gold_cache  # noqa: E402
from progress_sql.train.sft import run_sft  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.questions import question_indices  # noqa: E402
from progress_sql.train.trainer import run_rl  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Figures:
    """One framework's timed steps: seconds, trajectories and completion tokens per step."""

    name: str
    step_s: list[float] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    trajectories: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def trajectories_per_s(self) -> float:
        return sum(self.trajectories) / sum(self.step_s)

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.step_s)

    @property
    def mean_completion(self) -> float:
        return sum(self.tokens) / sum(self.trajectories)


# ----------------------------------------------------------------------------- setup
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", default=str(REPO / "params.yaml"))
    p.add_argument("--group-size", type=int, default=8, help="G, completions per prompt")
    p.add_argument("--questions", type=int, default=4, help="prompts per step")
    p.add_argument("--steps", type=int, default=4, help="timed steps (after one warm-up step)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=0, help="sequences per forward/backward; 0: the whole step")
    p.add_argument("--repeats", type=int, default=1, help="pairs (ours, TRL) to run, to show the noise")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: on a shared 2-core box, 2 threads thrash when another process is busy)")
    p.add_argument("--sft-minutes", type=float, default=0.0, help="SFT the base model first (0: untrained)")
    p.add_argument("--train-size", type=int, default=64, help="train examples of the generated corpus")
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"model.{name} override")
    p.add_argument("--keep", default=None, help="keep the scratch folder here (default: a deleted temp dir)")
    args = p.parse_args(argv)
    args.micro_batch = args.micro_batch or args.questions * args.group_size
    if (args.questions * args.group_size) % args.micro_batch:
        p.error("--micro-batch must divide questions × group size")
    return args


def bench_settings(args: argparse.Namespace, init_from: Path | None = None) -> Settings:
    """params.yaml with the benchmark's overrides (small corpus, the shared RL/generation knobs)."""
    n = args.questions * args.group_size
    overrides = {
        "data.train_size": args.train_size, "data.dev_size": 8, "data.test_size": 8, "data.neighbours": 0,
        "rl.env": "single_turn", "rl.recipe": "oneshot", "rl.deepspeed": "never", "rl.algorithm": "grpo",
        "rl.group_size": args.group_size, "rl.questions_per_step": args.questions, "rl.steps": args.steps + 1,
        "rl.micro_batch_size": args.micro_batch, "rl.updates_per_batch": 1, "rl.kl_beta": 0.0,
        "rl.save_rollouts": False, "rl.checkpoint_every": args.steps + 1, "rl.max_minutes": 600.0,
        "rl.schedule": "constant", "rl.warmup_steps": 0,
        "generation.backend": "transformers", "generation.temperature": 1.0, "generation.top_p": 1.0,
        "generation.max_new_tokens": args.max_new_tokens, "generation.batch_size": n,
        "model.dtype": "float32",
    }
    for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
        if getattr(args, name) is not None:
            overrides[f"model.{name}"] = getattr(args, name)
    if init_from is not None:
        overrides["rl.init_from"] = str(init_from)
    return load_settings(args.params, overrides)


def prepare(args: argparse.Namespace, scratch: Path) -> tuple[Settings, Path]:
    """Corpus, tiny model (and SFT when asked): the settings both runs start from, the corpus."""
    settings = bench_settings(args)
    corpus = scratch / "corpus"
    build_corpus(settings, corpus, progress=False)
    base = build_tiny_model(corpus, settings, scratch / "base")
    init = base
    if args.sft_minutes > 0:
        # epochs high enough that the time budget is what ends it
        sft = load_settings(args.params, {"sft.init_from": str(base), "sft.max_minutes": args.sft_minutes,
                                          "sft.epochs": 100.0, "model.dtype": "float32"})
        t0 = time.perf_counter()
        init = scratch / "sft"
        run_sft(sft, corpus, out_dir=init, progress=False)
        print(f"SFT: {time.perf_counter() - t0:.0f} s", flush=True)
    return bench_settings(args, init_from=init), corpus


def step_questions(settings: Settings, train: list[Example]) -> list[Example]:
    """The questions ``run_rl`` draws, step after step, in its order."""
    rl = settings.rl
    return [train[i] for i in question_indices(len(train), 0, rl.questions_per_step * rl.steps, rl.seed)]


# ----------------------------------------------------------------------------- ours
def run_ours(settings: Settings, corpus: Path, out_dir: Path) -> Figures:
    figures = Figures("ours (run_rl)")

    def on_step(step: int, m: dict) -> None:
        if step == 1:
            return  # warm-up
        n = settings.rl.questions_per_step * settings.rl.group_size
        figures.step_s.append(m["step_s"])
        figures.rollout_s.append(m["rollout_s"])
        figures.trajectories.append(n)
        figures.tokens.append(round(m["response_tokens/mean"] * n))

    run_rl(settings, corpus, out_dir=out_dir, progress=False, on_step=on_step)
    return figures


# ----------------------------------------------------------------------------- TRL
@dataclass
class TrlCalls:
    """What the TRL reward function saw, one entry per generation batch (one per step)."""

    tokens: list[int] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)  # mean total reward
    ex: list[float] = field(default_factory=list)  # share of completions judged right


def oneshot_reward_fn(settings: Settings, layout: CorpusLayout, examples: list[Example], calls: TrlCalls):
    """A TRL reward function computing the ``oneshot`` recipe exactly as the single-turn env
    does (parse, execute, compare with the gold result); it records each call's completion
    tokens, mean reward and EX in ``calls`` (one call per generation batch)."""
    recipe = rewards.get("oneshot")
    sandbox = settings.sandbox

    def oneshot(prompts, completions, completion_ids, example_index, **_):
        out, right = [], []
        for completion, i in zip(completions, example_index):
            ex = examples[i]
            turn = make_turn(completion[-1]["content"], recipe.fmt, layout.database(ex.db_id), ex.gold_sql, sandbox)
            out.append(recipe(Trajectory(turns=(turn,), gold_sql=ex.gold_sql, db_id=ex.db_id), settings).total)
            right.append(turn.correct)
        calls.tokens.append(sum(len(ids) for ids in completion_ids))
        calls.reward.append(sum(out) / len(out))
        calls.ex.append(sum(right) / len(right))
        return out

    return oneshot


def trl_trainer(settings: Settings, corpus: Path, out_dir: Path, calls: TrlCalls):
    """TRL's ``GRPOTrainer`` set up as ``run_rl`` runs single turn: the same round-1 prompts in
    ``run_rl``'s question order, G, lengths, sampling, optimizer, lr, clipping, loss (``grpo``:
    per-sequence token mean), passes per batch (TRL's ``num_iterations``), no KL, and the same
    stop: the tiny tokenizer holds ``</sql>`` as one token, which joins the eos ids, so TRL ends
    (and masks) a completion there as ours does."""
    from datasets import Dataset  # noqa: PLC0415 - TRL's stack, only for this run
    from trl import GRPOConfig, GRPOTrainer  # noqa: PLC0415

    from progress_sql.formats import stop_strings  # noqa: PLC0415
    from progress_sql.inference.models import load_policy  # noqa: PLC0415

    rl, gen = settings.rl, settings.generation
    layout = CorpusLayout(corpus)
    questions = step_questions(settings, list(read_jsonl(layout.split("train"))))
    recipe = rewards.get(rl.recipe)
    schema_texts = SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    env = envs.get("single_turn")(settings, fmt=recipe.fmt, schema_texts=schema_texts)
    rows = []
    for k, ex in enumerate(questions):
        env.reset(ex, layout.database(ex.db_id))  # the exact round-1 messages ours prompts with
        rows.append({"prompt": [dict(m) for m in env.messages], "example_index": k})

    n = rl.questions_per_step * rl.group_size
    config = GRPOConfig(
        # μ passes over each generation batch: TRL counts optimizer steps, ours batches
        output_dir=str(out_dir), max_steps=rl.steps * rl.updates_per_batch, seed=rl.seed,
        num_iterations=rl.updates_per_batch,
        per_device_train_batch_size=rl.micro_batch_size, gradient_accumulation_steps=n // rl.micro_batch_size,
        num_generations=rl.group_size, max_completion_length=gen.max_new_tokens,
        temperature=gen.temperature, top_p=gen.top_p, beta=rl.kl_beta, loss_type="grpo", epsilon=rl.clip_eps,
        epsilon_high=rl.clip_eps_high, scale_rewards="group" if rl.spec.scale_std else "none",
        learning_rate=rl.lr, weight_decay=rl.weight_decay, max_grad_norm=rl.grad_clip,
        lr_scheduler_type="constant", warmup_steps=0, use_vllm=False, bf16=False, fp16=False,
        use_cpu=not torch.cuda.is_available(), shuffle_dataset=False, disable_dropout=True,
        report_to="none", logging_strategy="no", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )
    model, tokenizer = load_policy(rl.init_from, dtype="float32", device="cuda" if torch.cuda.is_available() else "cpu")
    stops = []
    for text in stop_strings(recipe.fmt):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"stop string {text!r} is {len(ids)} tokens for this tokenizer; TRL stops on token ids only")
        stops += ids
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    model.generation_config.eos_token_id = eos + [i for i in stops if i not in eos]
    return GRPOTrainer(model=model, reward_funcs=oneshot_reward_fn(settings, layout, questions, calls),
                       args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer)


def run_trl(settings: Settings, corpus: Path, out_dir: Path) -> Figures:
    from transformers import TrainerCallback  # noqa: PLC0415

    rl = settings.rl
    calls = TrlCalls()
    trainer = trl_trainer(settings, corpus, out_dir, calls)
    step_s: list[float] = []
    rollout_s: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_s.append(time.perf_counter() - self.t0)

    generate = trainer._generate  # time TRL's generation (tokenise, sample, decode) on its own

    def timed_generate(prompts):
        t0 = time.perf_counter()
        try:
            return generate(prompts)
        finally:
            rollout_s.append(time.perf_counter() - t0)

    trainer._generate = timed_generate
    trainer.add_callback(StepTimer())
    trainer.train()
    if len(step_s) != rl.steps or len(calls.tokens) != rl.steps:
        raise RuntimeError(f"TRL ran {len(step_s)} steps and {len(calls.tokens)} generations, expected {rl.steps}")
    n = rl.questions_per_step * rl.group_size
    return Figures("TRL GRPOTrainer", step_s[1:], rollout_s[1:], [n] * (rl.steps - 1), calls.tokens[1:])


# ----------------------------------------------------------------------------- report
def print_pair(ours: Figures, trl: Figures) -> None:
    rows = [
        ("trajectories/s", lambda f: f.trajectories_per_s, "{:.2f}"),
        ("generated tokens/s", lambda f: f.tokens_per_s, "{:.1f}"),
        ("mean completion tokens", lambda f: f.mean_completion, "{:.1f}"),
        ("step s (median)", lambda f: statistics.median(f.step_s), "{:.2f}"),
        ("rollout s (median)", lambda f: statistics.median(f.rollout_s), "{:.2f}"),
    ]
    print(f"  {'':24s}{ours.name:>16s}{trl.name:>18s}{'ours/TRL':>10s}")
    for label, get, fmt in rows:
        a, b = get(ours), get(trl)
        print(f"  {label:24s}{fmt.format(a):>16s}{fmt.format(b):>18s}{a / b:>10.2f}")
    print(f"  step s, each: ours {[round(s, 2) for s in ours.step_s]}  TRL {[round(s, 2) for s in trl.step_s]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; torch threads {args.threads}; "
          f"G={args.group_size} questions/step={args.questions} max_new_tokens={args.max_new_tokens} "
          f"micro-batch={args.micro_batch} timed steps={args.steps} (+1 warm-up)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_rl_") as tmp:
        scratch = Path(args.keep) if args.keep else Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        settings, corpus = prepare(args, scratch)
        params = json.loads((scratch / "base" / "tiny_model.json").read_text())["parameters"]
        print(f"model {settings.rl.init_from}: {params / 1e6:.2f}M parameters ({settings.model.arch}, hidden "
              f"{settings.model.hidden_size}, {settings.model.num_layers} layers)", flush=True)
        layout = CorpusLayout(corpus)
        cache, sandbox = default_gold_cache(), settings.sandbox
        for ex in step_questions(settings, list(read_jsonl(layout.split("train")))):  # both start warm
            cache.get(layout.database(ex.db_id), ex.gold_sql, sandbox.timeout_s, sandbox.max_rows)
        pairs = []
        for r in range(args.repeats):
            torch.manual_seed(settings.rl.seed)
            ours = run_ours(settings, corpus, scratch / f"ours-{r}")
            torch.manual_seed(settings.rl.seed)
            trl = run_trl(settings, corpus, scratch / f"trl-{r}")
            print(f"\npair {r + 1}/{args.repeats}:")
            print_pair(ours, trl)
            pairs.append((ours, trl))
        ratios = [o.tokens_per_s / t.tokens_per_s for o, t in pairs]
        print(f"\nours/TRL generated tokens/s: median {statistics.median(ratios):.2f} over {len(ratios)} pair(s) "
              f"{[round(x, 2) for x in ratios]} -> ours is {'at least as fast' if statistics.median(ratios) >= 1 else 'SLOWER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
