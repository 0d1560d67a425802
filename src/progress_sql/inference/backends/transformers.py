"""The transformers backend: a batched, left-padded, KV-cached sampling loop written here (so
that the logprobs are the raw ones and stop strings end each sequence exactly).

A prompt's n samples share one prefill; finished sequences leave the batch; each sequence
draws from its own seeded stream of uniforms (inverse-CDF sampling, all rows in one kernel),
so a seeded call gives the same samples whatever the batch composition. One device-to-host
copy per decoded position; a stop string is looked for only after a token that can complete
it. Inside ``reusing_prefixes()`` (``generation.transformers.prefix_cache``) it keeps each
sample's KV cache and prefills only the new tokens of a later prompt that extends it: the next
turn of a conversation (a multi-turn rollout would otherwise prefill the whole conversation
again at every turn).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from transformers import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers before 4.56 (vLLM installs pin older ones): caches grow by concatenation
    DynamicLayer = None

from progress_sql.inference.backends.base import (
    FinishReason,
    NonFiniteLogits,
    Sample,
    StopChecker,
    checked_request,
    eos_token_ids,
    sample_seeds,
    sample_text,
)
from progress_sql.inference.lora import base_model
from progress_sql.inference.settings import GenerationSettings


def cache_kwarg(model: Any) -> str:
    """The forward argument that takes a KV cache: ``cache`` from transformers 5.2x on,
    ``past_key_values`` before (vLLM installs pin older transformers)."""
    base = base_model(model)
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


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


def _new_cache(config: Any, grow: bool = True) -> DynamicCache:
    """An empty KV cache for ``config``; with ``grow``, its full-attention layers grow in place."""
    cache = DynamicCache(config=config)
    layers = getattr(cache, "layers", None)  # transformers before 4.56 has no layer objects
    if grow and DynamicLayer is not None and layers is not None:
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


class _PromptColumns(NamedTuple):
    """Where a row's prompt sits among the cache's columns, ``(start, stop)`` each: ``kept``, the
    part a kept cache held, and ``new``, the tokens prefilled now; its decoded tokens follow."""

    kept: tuple[int, int]
    new: tuple[int, int]

    def through(self, decoded: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The columns of the prompt and of its first ``decoded`` decoded tokens."""
        return self.kept, (self.new[0], self.new[1] + decoded)


class _Prefilled(NamedTuple):
    """A batch after its prefill forward, one row per sample."""

    cache: DynamicCache
    attention: torch.Tensor  # [rows, cache columns]
    logits: torch.Tensor  # each row's next-token logits, float32
    prompt_of_row: list[list[int]]
    columns: list[_PromptColumns]  # each row's prompt columns in the cache


@dataclass
class _Decoded:
    """One sample as decoded so far: its token ids, their raw log-probabilities and why it
    finished (None: still running)."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None


class TransformersBackend:
    """Batched sampling with a transformers causal LM and its KV cache.

    ``batch_size``: sequences decoded together (a prompt's n samples count n); ``prefix_cache``:
    whether ``reusing_prefixes()`` keeps caches; ``grow_cache``: whether the KV cache grows in
    place, into spare room doubled when full (else transformers' plain ``DynamicCache``, which
    copies the whole cache at every decoded position: only to measure what growing saves). The
    model is put in eval mode while generating and restored afterwards.
    """

    own_weights: ClassVar[bool] = False  # the training module itself

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 32, *, prefix_cache: bool = True,
                 grow_cache: bool = True) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.prefix_cache = prefix_cache
        self.grow_cache = grow_cache
        self.eos_ids = eos_token_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer needs a pad or eos token")
        self.pad_id = int(pad)
        self._cache_kwarg = cache_kwarg(model)
        # reusing_prefixes(): ids a sample's forward passes covered -> per-layer (keys, values)
        self._prefixes: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._stoppers: dict[tuple[str, ...], StopChecker] = {}  # one per stop set (its candidates cost a pass)

    @classmethod
    def create(cls, generation: GenerationSettings, model: Any, tokenizer: Any,
               model_path: str | os.PathLike | None = None, *, seed: int = 0) -> TransformersBackend:
        """Generates with ``model`` itself (no copy: ``sync_weights`` of it is free)."""
        return cls(model, tokenizer, generation.batch_size, prefix_cache=generation.transformers.prefix_cache)

    @classmethod
    def unavailable(cls, generation: GenerationSettings, model: Any, model_path: str | os.PathLike | None
                    ) -> str | None:
        """None: it generates with any loaded model."""
        return None

    @contextlib.contextmanager
    def reusing_prefixes(self) -> Iterator[None]:
        """Inside: every sample's KV cache (its prompt and sampled ids but the last) is kept, and
        a prompt that extends a kept sequence prefills only its new tokens; a kept cache is
        dropped once a prompt has used it. Only valid while the weights stay the same (one
        rollout): everything kept is dropped on exit. Nothing is kept without ``prefix_cache``."""
        if not self.prefix_cache:
            yield
            return
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

    freed_gib = 0.0  # asleep() frees nothing

    def asleep(self) -> contextlib.AbstractContextManager:
        """Nothing to free: the generating model is the trainer's own."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Nothing to release: the model is the caller's."""

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
        prompts = checked_request(prompts, n, temperature, top_p, max_new_tokens)
        if not prompts:
            return []
        seeds = sample_seeds(seed, len(prompts) * n)
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

    def _prefill(self, prompts: list[list[int]], copies: list[int],
                 prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None]) -> _Prefilled:
        """One forward over the prompts' tokens past their kept caches, then one row per sample
        (each prompt's cache, mask and logits repeated for its ``copies``)."""
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
        cache = _new_cache(model.config, self.grow_cache)
        if c_width:
            for layer, (keys, values) in enumerate(_padded_layers(prefixes, cached, c_width)):
                cache.update(keys, values, layer)
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                    use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        expand = torch.repeat_interleave(torch.arange(len(prompts), device=device), torch.tensor(copies, device=device))
        cache.batch_select_indices(expand)
        rows, end = expand.tolist(), c_width + n_width
        return _Prefilled(
            cache, attention[expand], out.logits[expand, -1, :].float(), [prompts[r] for r in rows],
            [_PromptColumns((c_width - cached[r], c_width), (end - (len(prompts[r]) - cached[r]), end)) for r in rows],
        )

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
        pre = self._prefill(prompts, copies, prefixes)
        cache, logits, total = pre.cache, pre.logits, len(seeds)
        uniforms = _uniform_streams(seeds, max_new_tokens, device) if temperature > 0 else None
        stopper = self._stop_checker(stop)
        # The mask of every position a row can reach (later columns are all ones: a view per step).
        width = pre.attention.shape[1]
        attention = torch.cat([pre.attention, pre.attention.new_ones((total, max_new_tokens))], dim=1)
        positions = attention[:, :width].sum(-1)  # the position of each row's next token
        decoded = [_Decoded() for _ in range(total)]
        rows = list(range(total))  # batch row -> sample index
        row_index = torch.arange(total, device=device)
        finished_in_batch = 0
        for step in range(max_new_tokens):
            chosen, chosen_logp = _draw(logits, temperature, top_p,
                                        None if uniforms is None else uniforms[row_index, step])
            draws = self._to_host(chosen, chosen_logp, step)
            for row in self._take(draws, rows, decoded, stopper, last=step == max_new_tokens - 1):
                finished_in_batch += 1
                s = rows[row]
                if self._prefixes is not None:  # the cache holds everything but the last token
                    self._keep_prefix(pre.prompt_of_row[s] + decoded[s].tokens[:-1], cache, row, width,
                                      *pre.columns[s].through(step))
            if finished_in_batch == len(rows):
                break
            # Finished rows leave the batch once they are an eighth of it: each leave copies the
            # whole cache, each row left in costs a row of every forward until then.
            if finished_in_batch * 8 >= len(rows):
                keep = [row for row, s in enumerate(rows) if decoded[s].finish is None]
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attention, positions, chosen, row_index = attention[index], positions[index], chosen[index], row_index[index]
                rows, finished_in_batch = [rows[row] for row in keep], 0
            width += 1
            out = model(input_ids=chosen[:, None], attention_mask=attention[:, :width], position_ids=positions[:, None],
                        use_cache=True, **{self._cache_kwarg: cache})
            positions = positions + 1
            logits = out.logits[:, -1, :].float()
        return [self._sample(prompt, sample) for prompt, sample in zip(pre.prompt_of_row, decoded)]

    def _take(self, draws: tuple[list[float], list[float]], rows: list[int], decoded: list[_Decoded],
              stopper: StopChecker, *, last: bool) -> list[int]:
        """Append each running row's drawn token and its log-probability to its sample; the rows
        whose sample that token finished (an eos token, a completed stop string, or ``last``:
        the length limit)."""
        host_ids, host_logp = draws
        finished = []
        for row, s in enumerate(rows):
            sample = decoded[s]
            if sample.finish is not None:
                continue
            token = int(host_ids[row])
            sample.tokens.append(token)
            sample.logprobs.append(host_logp[row])
            if token in self.eos_ids:
                sample.finish = "eos"
            elif stopper.completes(sample.tokens):
                sample.finish = "stop"
            elif last:
                sample.finish = "length"
            else:
                continue
            finished.append(row)
        return finished

    def _sample(self, prompt: list[int], decoded: _Decoded) -> Sample:
        finish = decoded.finish or "length"
        return Sample(prompt_ids=list(prompt), token_ids=decoded.tokens, text=sample_text(self.tokenizer, decoded.tokens, finish),
                      logprobs=decoded.logprobs, finish_reason=finish)

    def _to_host(self, chosen: torch.Tensor, chosen_logp: torch.Tensor, step: int) -> tuple[list[float], list[float]]:
        """A position's drawn ids and log-probabilities in one device-to-host copy (ids below
        2**53 are exact in float64); ``NonFiniteLogits`` where a logit was NaN or infinite."""
        host_ids, host_logp = torch.stack((chosen.to(torch.float64), chosen_logp.to(torch.float64))).tolist()
        if not all(map(math.isfinite, host_logp)):  # a NaN or inf logit makes its row's logsumexp NaN
            raise NonFiniteLogits(
                f"the model computed NaN or infinite logits (generated token {step + 1}): weights that "
                f"diverged, or activations that overflow {next(self.model.parameters()).dtype}; its output "
                "would be noise, so generation stops")
        return host_ids, host_logp

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


BACKEND = TransformersBackend  # generation.backend: transformers (inference.backends.BACKEND_CLASSES)
