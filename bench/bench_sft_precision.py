"""SFT step time and loss with fp32 against bf16 autocast (``sft.autocast``) on this CPU.

The same SFT batches (``run_sft``'s: one database per batch, the shared prompt prefix run
once) from the same starting weights, trained ``--steps`` AdamW steps in each mode, the modes
alternating step by step so the machine's load falls on both alike. Prints the median seconds
per step of each mode, their ratio, and each mode's mean loss over the last quarter of the
steps (the two runs train apart, so the losses show whether bf16 learns as fp32 does).

    python bench/bench_sft_precision.py [--model outputs/tiny-base] [--corpus data/corpus]
        [--steps 40] [--threads 2] [--params params.yaml]
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from progress_sql import rewards  # noqa: E402
from progress_sql.params import load_settings  # noqa: E402
from progress_sql.corpus.records import CorpusLayout  # noqa: E402
from progress_sql.envs import SchemaTexts  # noqa: E402
from progress_sql.inference.models import load_policy  # noqa: E402
from progress_sql.train.sft import (  # noqa: E402
    _batches,
    build_sft_examples,
    encode_conversation,
    load_train_examples,
    token_loss,
)
from progress_sql.inference.models import cpu_has_bf16  # noqa: E402
from progress_sql.train.precision import training_autocast  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="outputs/tiny-base")
    parser.add_argument("--corpus", default="data/corpus")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for path in (Path(args.model), Path(args.corpus) / "train.jsonl"):
        if not path.exists():
            print(f"skipped: {path} not found (`dvc repro init_model` builds the corpus and the tiny model)")
            return 0
    torch.set_num_threads(args.threads)
    settings = load_settings(args.params)
    sft = settings.sft
    layout = CorpusLayout(Path(args.corpus))
    base, tokenizer = load_policy(args.model, dtype="float32", device="cpu")
    conversations = build_sft_examples(load_train_examples(args.corpus, settings), settings, database=layout.database,
                                       schema_texts=SchemaTexts.for_corpus(layout, settings.env.prompt_style),
                                       fmt=rewards.get(settings.rl.recipe).fmt)
    encoded = [encode_conversation(tokenizer, c.messages, c.targets) for c in conversations]
    batches = _batches([len(ids) for ids, _ in encoded], [c.db_id for c in conversations], sft.batch_size,
                       random.Random(f"{settings.seed}:sft-batches"))[: args.steps]

    modes = {"fp32": "off", "bf16": "bf16"}
    models = {m: copy.deepcopy(base).train() for m in modes}
    optimizers = {m: torch.optim.AdamW(models[m].parameters(), lr=sft.lr) for m in modes}
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    losses: dict[str, list[float]] = {m: [] for m in modes}
    print(f"{args.model}: {len(batches)} steps of {sft.batch_size} conversations, lr {sft.lr}, "
          f"{args.threads} thread(s), CPU bf16 instructions: {cpu_has_bf16()}")
    for step, batch in enumerate(batches):
        rows = [encoded[i] for i in batch]
        for mode in (list(modes) if step % 2 == 0 else list(modes)[::-1]):
            model, optimizer = models[mode], optimizers[mode]
            start = time.perf_counter()
            with training_autocast(modes[mode], model.device, torch.float32):
                loss, _ = token_loss(model, rows, tokenizer.pad_token_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), sft.grad_clip)
            optimizer.step()
            seconds[mode].append(time.perf_counter() - start)
            losses[mode].append(float(loss.detach()))

    tail = max(1, len(batches) // 4)
    print("\n| mode | median s/step | mean loss, last quarter |")
    print("|---|---|---|")
    for mode in modes:
        print(f"| {mode} | {statistics.median(seconds[mode][1:] or seconds[mode]):.3f} "
              f"| {statistics.mean(losses[mode][-tail:]):.3f} |")
    ratio = statistics.median(a / b for a, b in zip(seconds["fp32"][1:], seconds["bf16"][1:]))
    print(f"\nbf16 speed-up over fp32 (median of per-step ratios): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
