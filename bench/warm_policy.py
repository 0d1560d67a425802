"""The bundled corpus and the tiny policy after a short SFT, where the RL benches start: built in
their work folder (kept there with ``--keep``, and then reused), or given (``--corpus``, ``--model``)."""

from __future__ import annotations

import time
from pathlib import Path


def corpus_and_policy(work: Path, corpus_arg: str, model_arg: str, sft_steps: int) -> tuple[Path, Path]:
    """(corpus, policy): the default settings' corpus, and the tiny policy after ``sft_steps`` SFT
    steps (batches of ``sft.batch_size``) on it."""
    from progress_sql.data.build import build_corpus  # noqa: PLC0415 - torch only when used
    from progress_sql.params import default_settings  # noqa: PLC0415
    from progress_sql.train.sft import run_sft  # noqa: PLC0415
    from progress_sql.train.tiny import build_tiny_model  # noqa: PLC0415

    settings = default_settings().model_copy(deep=True)
    corpus = Path(corpus_arg) if corpus_arg else work / "corpus"
    if not corpus_arg and not (corpus / "train.jsonl").exists():
        started = time.perf_counter()
        build_corpus(settings, corpus, progress=False)
        print(f"corpus built in {time.perf_counter() - started:.0f} s", flush=True)
    policy = Path(model_arg) if model_arg else work / "sft"
    if not model_arg and not (policy / "config.json").exists():
        settings.sft.init_from = str(build_tiny_model(corpus, settings, work / "base"))
        # epochs of sft_steps steps (the split holds train_size examples plus revision dialogues)
        examples = settings.data.train_size * (1 + settings.sft.revision_share)
        settings.sft.epochs = sft_steps * settings.sft.batch_size / examples
        started = time.perf_counter()
        run_sft(settings, corpus, out_dir=policy, progress=False)
        print(f"SFT ({sft_steps} steps) in {time.perf_counter() - started:.0f} s", flush=True)
    return corpus, policy
