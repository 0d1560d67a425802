"""What every generation backend shares: ``Sample``, the ``GenerationBackend`` protocol, its
errors, and the helpers of the sampling contract (eos ids, stop strings, request checks, seeds).

Training uses the ids a backend sampled, never a re-tokenisation of its text, so every
``Sample`` carries ``token_ids`` (up to and including the token that ended it) and
``logprobs``: per sampled token, the log-softmax of the model's raw logits (temperature 1, no
top-p), i.e. the log-probability the trainer's forward pass on prompt + ``token_ids``
computes for the same tokens. ``text`` is ``token_ids`` decoded (a trailing eos token left
out); it is what the rollout environments read (``Sample`` is a policy output with ``.text``).

A stop string ends a sequence at the token that completes it; that token is kept, so
``text`` may run a few characters past the stop string when a token spans its end (never with
the tiny tokenizer, whose tags are single tokens). The eos tokens (the generation config's and
the tokenizer's) end a sequence too.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, Sequence, runtime_checkable

import torch

from progress_sql.inference.settings import GenerationSettings

# prompt_too_long: the prompt was not generated from (``inference.policy``: empty sample)
FinishReason = Literal["stop", "eos", "length", "prompt_too_long"]


class BackendUnavailable(RuntimeError):
    """A generation backend cannot run here (its optional dependency is missing)."""


class NonFiniteLogits(RuntimeError):
    """The model computed NaN or infinite logits while generating: what it would write is noise."""


@dataclass
class Sample:
    """One sampled continuation.

    ``prompt_ids``: the prompt; ``token_ids``: the sampled ids, up to and including the
    eos or stop-completing token; ``text``: ``token_ids`` decoded (without a trailing eos);
    ``logprobs``: raw-model log-probability (temperature 1) of each sampled id;
    ``finish_reason``: ``stop`` (a stop string), ``eos`` or ``length`` (max_new_tokens).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class GenerationBackend(Protocol):
    """Samples continuations of token-id prompts: one list of ``n`` samples per prompt.

    Everything a caller may use is here (no ``hasattr``); ``inference.settings.BACKENDS``
    registers an implementation under its name, and ``make_backend`` calls its ``create``.
    """

    # True: the backend loads the model from its folder into an engine of its own, so new
    # weights reach it only through ``sync_weights`` (a rollout producer needs no copy of the
    # module) and what the folder cannot hold (an adapter on a head tied to the embedding) is
    # lost; False: it samples with the module it is given, whose weights are its own.
    own_weights: ClassVar[bool]

    @classmethod
    def create(cls, generation: GenerationSettings, model: Any, tokenizer: Any,
               model_path: str | os.PathLike | None, *, seed: int) -> GenerationBackend:
        """The backend for ``generation`` (its own section: ``generation.<name>``), generating
        with ``model`` or loading ``model_path``, seeded with ``seed``."""
        ...

    @classmethod
    def unavailable(cls, generation: GenerationSettings, model: Any, model_path: str | os.PathLike | None
                    ) -> str | None:
        """Why this backend cannot serve ``model`` (or ``model_path``) here, in a few words; None
        when it can. ``generation.backend: auto`` takes the first backend that can
        (``inference.settings.AUTO_ORDER``); cheap: nothing is imported or started."""
        ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples of each prompt (temperature 0: greedy; ``checked_request`` first): the
        sampled ids and their raw log-probabilities; a stop string or an eos id ends a sample,
        its completing token kept; the same ``seed`` gives the same samples."""
        ...

    def sync_weights(self, model: Any) -> None:
        """Generate with ``model``'s current weights from now on. The full weights must be in
        place: under ZeRO-3, call it inside ``engine.gathered()`` (``train.distributed``)."""
        ...

    freed_gib: float  # device memory the last ``asleep()`` freed (0.0 where it frees nothing)

    def asleep(self) -> contextlib.AbstractContextManager:
        """Inside (the trainer's update): the backend holds as little device memory as it can
        (vLLM's sleep mode on a GPU); on exit it is awake, and its weights must be synced before
        it generates again. A no-op where the backend holds nothing of its own."""
        ...

    def reusing_prefixes(self) -> contextlib.AbstractContextManager:
        """Inside (one rollout, fixed weights): a prompt that extends an earlier sample is
        prefilled only past it, where the backend can (a no-op where it caches on its own)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (engine processes, files); a no-op where nothing."""
        ...


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end a generation: the model's generation config eos id(s) and the tokenizer's."""
    ids: set[int] = set()
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (config_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return ids


def decode(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """The text of ``token_ids`` exactly as generated (special tokens kept, no clean-up)."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def sample_text(tokenizer: Any, token_ids: Sequence[int], finish_reason: FinishReason) -> str:
    """``Sample.text``: the decoded ids, without the eos token that ended them."""
    ids = list(token_ids[:-1]) if finish_reason == "eos" else list(token_ids)
    return decode(tokenizer, ids)

def _stop_window(stop: Sequence[str]) -> int:
    # A character can take up to 4 byte-level tokens, so this many trailing tokens always
    # decode to at least the longest stop string's length.
    return 4 * max(len(s) for s in stop) + 4


def completes_stop(tokenizer: Any, token_ids: Sequence[int], stop: Sequence[str]) -> bool:
    """Whether the decoded tail of ``token_ids`` contains a stop string (checked after each new
    token, so a hit means the last token completed it)."""
    if not stop or not token_ids:
        return False
    tail = decode(tokenizer, token_ids[-_stop_window(stop):])
    return any(s in tail for s in stop)


def stop_index(tokenizer: Any, token_ids: Sequence[int], stop: Sequence[str]) -> int | None:
    """The index of the token that completes the first stop string in ``token_ids``, or None:
    a generation with these stop strings keeps ``token_ids[: index + 1]``."""
    for i in range(len(token_ids)):
        if completes_stop(tokenizer, token_ids[: i + 1], stop):
            return i
    return None


class StopChecker:
    """Whether a sequence has just completed a stop string, decoding only when it can have.

    A token can complete a stop string only if its own text holds the string's last character.
    For an ASCII character that is exact: it is one byte in UTF-8, so it lies in one token's
    bytes (byte-level BPE) or is a byte-fallback token of its own (SentencePiece), and decoding
    that token alone shows it. Those tokens (``candidates``) are found once per stop set; after
    any other token the tail is not decoded. A non-ASCII last character: every token is checked.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.candidates: frozenset[int] | None = frozenset()
        lasts = {s[-1] for s in self.stop}
        if lasts and all(c.isascii() for c in lasts):
            texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False,
                                           clean_up_tokenization_spaces=False)
            self.candidates = frozenset(i for i, text in enumerate(texts) if any(c in text for c in lasts))
        elif lasts:
            self.candidates = None

    def completes(self, token_ids: Sequence[int]) -> bool:
        """``completes_stop(tokenizer, token_ids, stop)``, decoding only after a candidate token."""
        if not self.stop or not token_ids:
            return False
        if self.candidates is not None and token_ids[-1] not in self.candidates:
            return False
        return completes_stop(self.tokenizer, token_ids, self.stop)


def checked_request(prompts: Sequence[Sequence[int]], n: int, temperature: float, top_p: float,
                    max_new_tokens: int) -> list[list[int]]:
    """The prompts as lists of ints, after the checks every backend's ``generate`` makes."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError("n and max_new_tokens must be at least 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
    checked = [[int(t) for t in p] for p in prompts]
    if any(not p for p in checked):
        raise ValueError("every prompt needs at least one token")
    return checked


def sample_seeds(seed: int | None, count: int) -> list[int]:
    """``count`` seeds: from ``seed`` when given, else from torch's global generator (so
    torch.manual_seed makes an unseeded call reproducible as well)."""
    if seed is None:
        return [int(x) for x in torch.randint(0, 2**62, (count,), dtype=torch.int64)]
    return [(int(seed) * 1_000_003 + i * 7_919 + 1) % (2**62) for i in range(count)]

