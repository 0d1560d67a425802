"""Multi-turn rollout throughput: kept prefixes (``generation.transformers.prefix_cache``) and the KV cache
grown in place, against the code before them.

One training rollout as ``run_rl`` makes it: ``--questions`` train questions × G
(``rl.group_size``), the ``rl.env`` environment (default ``odt_feedback``, T turns), a
``TokenPolicy`` over ``TransformersBackend`` at ``generation.temperature``, seeded, no
gradient. Each repeat runs it three ways back to back, same questions and seed (the order
rotates between repeats):

- ``before``: every turn prefills the whole conversation; the KV cache grows by ``torch.cat``
  (transformers' plain ``DynamicCache``, ``TransformersBackend(grow_cache=False)``): the
  backend before these two changes;
- ``grow``: every turn prefills the whole conversation; the cache grows in place, into spare
  room doubled when full (``grow_cache``, the default);
- ``kept``: ``grow`` plus kept prefixes (a turn prefills only the tokens added since the
  conversation's last sample): what ``run_rl`` does.

Prints per mode: median rollout seconds, trajectories/s, generated tokens/s, tokens fed to
prefill forwards (padding included), decode forwards, and the median of the per-repeat
speed-ups over ``before``; then how many episodes had identical token ids in all modes.

``--reference generate`` measures the rollout against transformers' own ``generate``: each
repeat runs the ``kept`` rollout (what ``run_rl`` does), then ``model.generate`` on the same
round-1 prompts in the same batches (``generation.batch_size`` rows), with the same
``max_new_tokens``, temperature, top-p, stop strings and eos tokens; a row's tokens count up to
its stop; and ``generate`` again with every row sampled to ``max_new_tokens`` (full batches
throughout: the stricter reference where a batch's rows finish at different times). Prints
generated tokens/s of the whole rollout (environment included), of its time inside the
backend's generate, and of both ``generate`` runs, and the ratios (goal: at least 1.0).

``--backends transformers,vllm`` compares registered generation backends instead (built by
``make_backend`` from ``generation.<name>``), on the same model, questions, seeds, stop
strings, max tokens and temperature: ``transformers`` is the ``kept`` mode (what ``run_rl``
does). Each backend's start is timed apart; one untimed warm-up rollout per backend (on other
questions) comes first; before each timed rollout ``sync_weights(model)`` runs and is timed
apart, as in ``run_rl`` after each update (vLLM's drops its prefix cache, so no rollout reuses
an earlier one's prompts). Prints per backend: median rollout seconds, trajectories/s,
generated tokens/s and its ratio to the transformers backend's; the start; the median weight
sync. Threads: ``--threads`` torch
threads here, and the vLLM CPU worker bound to as many cores (``VLLM_CPU_OMP_THREADS_BIND``,
unless set); vLLM's engine-core and front-end processes run beside that worker.

    python bench/bench_rollout.py [--model outputs/sft] [--corpus data/corpus]
        [--questions 4] [--repeats 3] [--threads 1] [--params params.yaml]
        [--backends transformers,vllm] [--reference generate] [--set generation.max_new_tokens=64]

The model and corpus are the pipeline's (``dvc repro sft`` makes both); any causal LM
directory with its tokenizer works, or a bundled model's name (``smollm2``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from progress_sql import envs, rewards  # noqa: E402
from progress_sql.cli.common import parse_overrides  # noqa: E402
from progress_sql.params import load_settings  # noqa: E402
from progress_sql.corpus.records import CorpusLayout, read_jsonl  # noqa: E402
from progress_sql.envs.db_details import SchemaTexts  # noqa: E402
from progress_sql.formats import stop_strings  # noqa: E402
from progress_sql.inference.backends import (  # noqa: E402
    BackendUnavailable,
    TransformersBackend,
    eos_token_ids,
    make_backend,
    stop_index,
)
from progress_sql.inference.models import BUNDLED_MODELS, chat_prompt_ids, load_policy  # noqa: E402
from progress_sql.inference.policy import TokenPolicy  # noqa: E402
from progress_sql.inference.settings import BACKENDS  # noqa: E402
from progress_sql.train.trajectories import max_sequence_tokens  # noqa: E402
from progress_sql.train.questions import question_indices  # noqa: E402
from progress_sql.train.rl_run import env_factory_for  # noqa: E402


class ForwardCounter:
    """Counts the tokens of prefill forwards (more than one position) and decode forwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.prefill_tokens, self.decode_calls = model, 0, 0

    def __enter__(self) -> "ForwardCounter":
        forward = self.model.forward

        def counting(*args, **kwargs):
            ids = kwargs["input_ids"]
            if ids.shape[1] > 1:
                self.prefill_tokens += ids.numel()
            else:
                self.decode_calls += 1
            return forward(*args, **kwargs)

        self.model.forward = counting
        return self

    def __exit__(self, *exc: object) -> None:
        del self.model.forward


class Bench:
    """The model, questions and environment shared by every rollout of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.settings = load_settings(args.params, parse_overrides(args.set))
        self.rl, self.gen = self.settings.rl, self.settings.generation
        self.layout = CorpusLayout(Path(args.corpus))
        self.train = list(read_jsonl(self.layout.split("train")))
        self.model, self.tokenizer = load_policy(args.model, dtype="float32")
        self.model.eval()
        self.recipe = rewards.get(self.rl.recipe)
        schema = SchemaTexts.for_corpus(self.layout, self.settings.env.prompt_style)
        self.env_factory = env_factory_for(self.settings, self.recipe, schema)
        self.turns = self.env_factory().max_turns
        self.max_tokens = max_sequence_tokens(self.gen, self.turns)
        self.n_traj = args.questions * self.rl.group_size

    def examples(self, repeat: int) -> list:
        """Repeat ``repeat``'s questions, each G times (as ``run_rl`` draws a step's)."""
        picked = question_indices(len(self.train), repeat * self.args.questions, self.args.questions, self.rl.seed)
        return [self.train[i] for i in picked for _ in range(self.rl.group_size)]

    def rollout(self, backend, repeat: int, keep_prefixes: bool,
                counter: "ForwardCounter | None" = None) -> tuple[float, list[list[int]], int]:
        """One training rollout of repeat ``repeat``'s questions and seed: (seconds, each
        conversation's token ids, sampled tokens); ``self.generate_s``: its time in generate."""
        policy = TokenPolicy(backend, self.tokenizer, self.gen, stop_strings(self.recipe.fmt),
                             max_tokens=self.max_tokens, seed=repeat)
        start = time.perf_counter()
        kept = backend.reusing_prefixes() if keep_prefixes else contextlib.nullcontext()
        with torch.no_grad(), kept, counter or contextlib.nullcontext():
            episodes = envs.rollout(self.env_factory, policy, self.examples(repeat), self.layout.database)
        seconds = time.perf_counter() - start
        self.generate_s = policy.generate_s
        convs = [ep.tokens for ep in episodes]
        return seconds, [c.input_ids for c in convs], sum(sum(c.loss_mask) for c in convs)

    def round1_prompts(self, repeat: int) -> list[list[int]]:
        """The token ids of repeat ``repeat``'s round-1 conversations (the rollout's first prompts)."""
        env = self.env_factory()
        return [chat_prompt_ids(self.tokenizer, env.reset(ex, Path(self.layout.database(ex.db_id))))
                for ex in self.examples(repeat)]

    def header(self) -> str:
        gen = self.gen
        return (f"{self.args.model}: {self.args.questions} questions x G={self.rl.group_size}, env {self.rl.env}, "
                f"T={self.turns}, temperature {gen.temperature}, max_new_tokens {gen.max_new_tokens}, "
                f"max_prompt_tokens {gen.max_prompt_tokens}, stop {list(stop_strings(self.recipe.fmt))}, "
                f"{self.args.threads} torch thread(s)")


def compare_modes(bench: Bench) -> None:
    """The transformers backend three ways: before / grow / kept (see the module docstring)."""
    args, model = bench.args, bench.model
    modes = ("before", "grow", "kept")
    backends = {mode: TransformersBackend(model, bench.tokenizer, bench.gen.batch_size, grow_cache=mode != "before")
                for mode in modes}

    def one_rollout(repeat: int, mode: str) -> tuple[float, list[list[int]], int, ForwardCounter]:
        counter = ForwardCounter(model)
        seconds, ids, sampled = bench.rollout(backends[mode], repeat, mode == "kept", counter)
        return seconds, ids, sampled, counter

    print(bench.header())
    figures: dict[str, list[tuple[float, int, int, int]]] = {m: [] for m in modes}
    speedups: dict[str, list[float]] = {m: [] for m in modes}
    same = total = 0
    for repeat in range(args.repeats):
        ids: dict[str, list[list[int]]] = {}
        seconds: dict[str, float] = {}
        for mode in modes[repeat % 3:] + modes[:repeat % 3]:
            s, ids[mode], sampled, counter = one_rollout(repeat, mode)
            seconds[mode] = s
            figures[mode].append((s, sampled, counter.prefill_tokens, counter.decode_calls))
            print(f"  repeat {repeat} {mode:6s} {s:6.1f} s  {sampled} sampled tokens  "
                  f"prefill {counter.prefill_tokens} tokens  decode forwards {counter.decode_calls}")
        same += sum(a == b == c for a, b, c in zip(*(ids[m] for m in modes)))
        total += len(ids["before"])
        for mode in modes:
            speedups[mode].append(seconds["before"] / seconds[mode])

    print("\n| mode | median s | trajectories/s | generated tokens/s | prefill tokens | decode forwards "
          "| speed-up over before |")
    print("|---|---|---|---|---|---|---|")
    for mode in modes:
        rows = figures[mode]
        med = statistics.median(r[0] for r in rows)
        print(f"| {mode} | {med:.1f} | {bench.n_traj / med:.2f} | {statistics.median(r[1] / r[0] for r in rows):.0f} "
              f"| {statistics.median(r[2] for r in rows):.0f} | {statistics.median(r[3] for r in rows):.0f} "
              f"| {statistics.median(speedups[mode]):.2f}x |")
    print("\nspeed-up over before, per repeat: " + "; ".join(
        f"{m} " + ", ".join(f"{x:.2f}" for x in speedups[m]) for m in modes[1:]))
    print(f"episodes with identical token ids in all modes: {same}/{total}")


def generate_reference(model, tokenizer, prompts: list[list[int]], *, batch_size: int, max_new_tokens: int,
                       temperature: float, top_p: float, stop: list[str], full_length: bool = False
                       ) -> tuple[float, int]:
    """transformers' ``model.generate`` on ``prompts`` in batches of ``batch_size`` (left-padded),
    sampling as the rollout does, stopping at ``stop`` and the eos tokens (``full_length``: every
    row to ``max_new_tokens``): (seconds, generated tokens, each row's counted up to its stop)."""
    eos = eos_token_ids(model, tokenizer)
    seconds, tokens = 0.0, 0
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(batch):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        ids, mask = ids.to(model.device), mask.to(model.device)
        kwargs = ({"min_new_tokens": max_new_tokens} if full_length else
                  {"stop_strings": list(stop), "tokenizer": tokenizer} if stop else {})
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=temperature > 0,
                                 temperature=temperature or None, top_p=top_p, top_k=0,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=sorted(eos), **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        for row in out[:, width:].tolist():
            if full_length:
                tokens += len(row)
                continue
            end = next((i for i, t in enumerate(row) if t in eos), None)
            hit = stop_index(tokenizer, row[:end], stop) if stop else None
            tokens += (hit + 1) if hit is not None else (end + 1 if end is not None else len(row))
    return seconds, tokens


def compare_generate(bench: Bench) -> None:
    """The in-RL rollout (``kept``) against ``model.generate`` on its round-1 prompts."""
    args, gen = bench.args, bench.gen
    backend = TransformersBackend(bench.model, bench.tokenizer, gen.batch_size)
    stop = list(stop_strings(bench.recipe.fmt))
    print(bench.header() + f", batch_size {gen.batch_size}")
    bench.rollout(backend, args.repeats, True)  # warm-up on other questions (and the stop table)
    generate_reference(bench.model, bench.tokenizer, bench.round1_prompts(args.repeats), batch_size=gen.batch_size,
                       max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p, stop=stop)
    rows = []
    for repeat in range(args.repeats):
        seconds, _, sampled = bench.rollout(backend, repeat, True)
        in_generate = bench.generate_s
        prompts = bench.round1_prompts(repeat)
        refs = [generate_reference(bench.model, bench.tokenizer, prompts, batch_size=gen.batch_size,
                                   max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p,
                                   stop=stop, full_length=full) for full in (False, True)]
        rows.append((sampled / seconds, sampled / in_generate, *(tokens / s for s, tokens in refs)))
        print(f"  repeat {repeat}: rollout {seconds:.1f} s ({in_generate:.1f} s in generate), {sampled} sampled tokens; "
              f"generate {refs[0][0]:.1f} s, {refs[0][1]} tokens to the stops; full length {refs[1][0]:.1f} s, "
              f"{refs[1][1]} tokens")
    med = [statistics.median(r[k] for r in rows) for k in range(4)]
    print("\n| | generated tokens/s (median) | / generate to the stops | / generate at full length |")
    print("|---|---|---|---|")
    for k, name in enumerate(("in-RL rollout, environment included", "in-RL rollout, time in generate",
                              "model.generate, stopping as the rollout", "model.generate, full length")):
        ratios = [f"{statistics.median(r[k] / r[j] for r in rows):.2f}x" for j in (2, 3)]
        print(f"| {name} | {med[k]:.0f} | {ratios[0]} | {ratios[1]} |")


def compare_backends(bench: Bench, names: list[str]) -> None:
    """The registered backends ``names`` (transformers: kept prefixes), same rollouts."""
    args = bench.args
    print(bench.header())
    backends: dict = {}
    started: dict[str, float] = {}
    syncs: dict[str, list[float]] = {}
    # a vLLM engine's worker gets as many cores as torch has threads here (unless told otherwise)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")

    def timed_sync(name: str) -> None:  # as run_rl after each update
        start = time.perf_counter()
        backends[name].sync_weights(bench.model)
        syncs[name].append(time.perf_counter() - start)

    try:
        for name in names:
            gen = bench.gen.model_copy()
            gen.backend = name  # validated: a registered name
            start = time.perf_counter()
            try:
                backends[name] = make_backend(gen, bench.model, bench.tokenizer, args.model, seed=bench.rl.seed)
            except BackendUnavailable as err:
                print(f"{name}: skipped ({err})")
                continue
            started[name], syncs[name] = time.perf_counter() - start, []
            print(f"{name}: started in {started[name]:.1f} s ({getattr(gen, name)}; "
                  f"VLLM_CPU_OMP_THREADS_BIND={os.environ['VLLM_CPU_OMP_THREADS_BIND']})")
        if not backends:
            return
        warm = args.repeats  # questions no timed repeat draws
        for name, backend in backends.items():
            seconds, _, sampled = bench.rollout(backend, warm, True)
            print(f"  warm-up  {name:12s} {seconds:6.1f} s  {sampled} sampled tokens (untimed)")
        rows: dict[str, list[tuple[float, int]]] = {name: [] for name in backends}
        order = list(backends)
        same = total = 0
        for repeat in range(args.repeats):
            ids = {}
            for name in order[repeat % len(order):] + order[:repeat % len(order)]:
                timed_sync(name)
                seconds, ids[name], sampled = bench.rollout(backends[name], repeat, True)
                rows[name].append((seconds, sampled))
                print(f"  repeat {repeat} {name:12s} {seconds:6.1f} s  {sampled} sampled tokens")
            if len(ids) == 2:
                same += sum(a == b for a, b in zip(*ids.values()))
                total += len(next(iter(ids.values())))
        for name in backends:  # at least 5 timed syncs each
            while len(syncs[name]) < 5:
                timed_sync(name)
    finally:
        for backend in backends.values():
            backend.close()

    def rate(name: str) -> float:
        return statistics.median(tokens / seconds for seconds, tokens in rows[name])

    print("\n| backend | median rollout s | generated tokens (median) | generated tokens/s | trajectories/s "
          "| tokens/s vs transformers |")
    print("|---|---|---|---|---|---|")
    for name in backends:
        med = statistics.median(s for s, _ in rows[name])
        ratio = f"{rate(name) / rate('transformers'):.2f}x" if "transformers" in backends else "-"
        print(f"| {name} | {med:.2f} | {statistics.median(t for _, t in rows[name]):.0f} | {rate(name):.0f} "
              f"| {bench.n_traj / med:.2f} | {ratio} |")
    for name, seconds in started.items():
        print(f"\n{name}: start {seconds:.1f} s; sync_weights median {statistics.median(syncs[name]):.3f} s "
              f"over {len(syncs[name])} calls (min {min(syncs[name]):.3f}, max {max(syncs[name]):.3f})")
    if total:
        print(f"episodes with identical token ids in both backends: {same}/{total} "
              "(at temperature > 0 the backends draw different samples)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="outputs/sft")
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting, e.g. generation.max_new_tokens=64 (repeatable)")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reference", choices=("generate",), default=None,
                        help="generate: the in-RL rollout against transformers' model.generate")
    parser.add_argument("--backends", default="transformers",
                        help="transformers: its before/grow/kept modes; a list of registered backends, "
                             "e.g. transformers,vllm: the backends compared")
    args = parser.parse_args()
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    if not names or set(names) - set(BACKENDS):
        parser.error(f"--backends: a list of {', '.join(BACKENDS)}; got {args.backends!r}")
    needed = [Path(args.corpus) / "train.jsonl"] + ([] if args.model in BUNDLED_MODELS else [Path(args.model)])
    for path in needed:
        if not path.exists():
            # `make bench` runs every script: say why this one has nothing to measure
            print(f"skipped: {path} not found (`dvc repro sft` builds the corpus and the SFT model)")
            return 0
    torch.set_num_threads(args.threads)
    bench = Bench(args)
    if args.reference == "generate":
        compare_generate(bench)
    elif names == ["transformers"]:
        compare_modes(bench)
    else:
        compare_backends(bench, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
