"""Multi-turn rollout throughput: kept prefixes (``generation.prefix_cache``) and the KV cache
grown in place, against the code before them.

One training rollout as ``run_rl`` makes it: ``--questions`` train questions × G
(``rl.group_size``), the ``rl.env`` environment (default ``odt_feedback``, T turns), a
``TokenPolicy`` over ``TransformersBackend`` at ``generation.temperature``, seeded, no
gradient. Each repeat runs it three ways back to back, same questions and seed (the order
rotates between repeats):

- ``before``: every turn prefills the whole conversation; the KV cache grows by ``torch.cat``
  (transformers' plain ``DynamicCache``): the backend before these two changes;
- ``grow``: every turn prefills the whole conversation; the cache grows in place
  (``generation._GrowingLayer``);
- ``kept``: ``grow`` plus kept prefixes (a turn prefills only the tokens added since the
  conversation's last sample): what ``run_rl`` does.

Prints per mode: median rollout seconds, trajectories/s, generated tokens/s, tokens fed to
prefill forwards (padding included), decode forwards, and the median of the per-repeat
speed-ups over ``before``; then how many episodes had identical token ids in all modes.

    python bench/bench_rollout.py [--model outputs/sft] [--corpus data/corpus]
        [--questions 4] [--repeats 3] [--threads 1] [--params params.yaml]

The model and corpus are the pipeline's (``dvc repro sft`` makes both); any causal LM
directory with its tokenizer works.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from progress_sql import envs, rewards  # noqa: E402
from progress_sql.config import load_settings  # noqa: E402
from progress_sql.corpus.records import CorpusLayout, read_jsonl  # noqa: E402
from progress_sql.envs.db_details import SchemaTexts  # noqa: E402
from progress_sql.formats import stop_strings  # noqa: E402
from progress_sql.inference import backends as generation  # noqa: E402
from progress_sql.inference.backends import TransformersBackend, reusing_prefixes  # noqa: E402
from progress_sql.inference.models import load_policy  # noqa: E402
from progress_sql.inference.policy import TokenPolicy  # noqa: E402
from progress_sql.train.trajectories import max_sequence_tokens  # noqa: E402
from progress_sql.train.trainer import _env_factory, question_indices  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="outputs/sft")
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    for path in (Path(args.model), Path(args.corpus) / "train.jsonl"):
        if not path.exists():
            # `make bench` runs every script: say why this one has nothing to measure
            print(f"skipped: {path} not found (`dvc repro sft` builds the corpus and the SFT model)")
            return 0
    torch.set_num_threads(args.threads)
    settings = load_settings(args.params)
    rl, gen = settings.rl, settings.generation
    layout = CorpusLayout(Path(args.corpus))
    train = list(read_jsonl(layout.split("train")))
    model, tokenizer = load_policy(args.model, dtype="float32")
    model.eval()
    recipe = rewards.get(rl.recipe)
    env_factory = _env_factory(settings, recipe, SchemaTexts.for_corpus(layout, settings.env.prompt_style))
    max_tokens = max_sequence_tokens(gen, env_factory().max_turns)
    backend = TransformersBackend(model, tokenizer, gen.batch_size)

    modes = ("before", "grow", "kept")
    grown_cache = generation._new_cache

    def one_rollout(repeat: int, mode: str) -> tuple[float, list[list[int]], int, ForwardCounter]:
        picked = question_indices(len(train), repeat * args.questions, args.questions, rl.seed)
        examples = [train[i] for i in picked for _ in range(rl.group_size)]
        policy = TokenPolicy(backend, tokenizer, gen, stop_strings(recipe.fmt), max_tokens=max_tokens, seed=repeat)
        if mode == "before":  # the plain DynamicCache the backend used before _GrowingLayer
            generation._new_cache = lambda config: DynamicCache(config=config)
        start = time.perf_counter()
        try:
            with torch.no_grad(), reusing_prefixes(backend, mode == "kept"), ForwardCounter(model) as counter:
                episodes = envs.rollout(env_factory, policy, examples, layout.database)
        finally:
            generation._new_cache = grown_cache
        seconds = time.perf_counter() - start
        convs = [ep.generations[-1].conversation for ep in episodes]
        return seconds, [c.input_ids for c in convs], sum(sum(c.loss_mask) for c in convs), counter

    print(f"{args.model}: {args.questions} questions x G={rl.group_size}, env {rl.env}, "
          f"T={env_factory().max_turns}, temperature {gen.temperature}, {args.threads} thread(s)")
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
    n_traj = args.questions * rl.group_size
    for mode in modes:
        rows = figures[mode]
        med = statistics.median(r[0] for r in rows)
        print(f"| {mode} | {med:.1f} | {n_traj / med:.2f} | {statistics.median(r[1] / r[0] for r in rows):.0f} "
              f"| {statistics.median(r[2] for r in rows):.0f} | {statistics.median(r[3] for r in rows):.0f} "
              f"| {statistics.median(speedups[mode]):.2f}x |")
    print("\nspeed-up over before, per repeat: " + "; ".join(
        f"{m} " + ", ".join(f"{x:.2f}" for x in speedups[m]) for m in modes[1:]))
    print(f"episodes with identical token ids in all modes: {same}/{total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
