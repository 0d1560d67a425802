"""The project's attention function, installed on every policy it loads (``install``).

Transformers' SDPA path with two changes where they pay:

- **packed rows** (``packed_segments`` among the forward's arguments: ``train.packing``): causal
  attention inside each packed segment, over the shared prefix it continues where it has one
  (a GRPO group's prompt, run once); through torch's flash-attention variable-length kernel on a
  GPU that runs it when no segment shares a prefix (``torch.nn.attention.varlen``), and fused
  SDPA per segment otherwise, a continuation's queries in blocks (``_segment``; on a CPU the
  fastest correct path: a block-diagonal mask over the whole row would cost the square of its
  length);
- **grouped-query attention with a mask on a CPU** (a left-padded generation batch): SDPA reads
  the shared KV heads in place (``enable_gqa``), where transformers repeats them first, a copy
  of the whole KV cache per layer and decoded token (SmolLM2's 3 KV heads for 9 query heads).
  On a GPU a mask with ``enable_gqa`` falls back to SDPA's math kernel, so there the repeat stays.

Everything else is transformers' own ``sdpa_attention_forward``. The choice lives only in the
loaded model's config (``_attn_implementation`` is not saved): a saved model loads with its usual
attention anywhere.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from progress_sql.inference.lora import base_model

ATTENTION = "progress_sql"

_varlen_state = threading.local()


def _varlen_kernel(query: torch.Tensor) -> Any:
    """torch's flash-attention variable-length kernel where this device runs it, else None."""
    if not query.is_cuda:
        return None
    if not hasattr(_varlen_state, "kernel"):
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415 - torch >= 2.9, CUDA only
        except ImportError:
            varlen_attn = None
        _varlen_state.kernel = varlen_attn
    return _varlen_state.kernel


def _segment(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             prefix: tuple[torch.Tensor, torch.Tensor] | None, scaling: float | None, block: int) -> torch.Tensor:
    """Causal attention of one packed segment's queries, keys and values, over the keys and values
    of the shared prefix it continues (if any) and its own: query j sees the whole prefix and the
    segment's positions up to j.

    With a prefix, in blocks of ``block`` queries (0: all), each over the keys it may see (the
    prefix and the segment up to the block's end) with its mask: one call over the whole segment
    would compute the full [segment, prefix + segment] rectangle, since a fused kernel cannot skip
    the masked-out blocks of an arbitrary mask (17-25 % more time forward and backward, CPU)."""
    gqa = query.shape[1] != key.shape[1]
    if prefix is None:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                                                enable_gqa=gqa)
    n = prefix[0].shape[2]
    key, value = torch.cat([prefix[0], key], dim=2), torch.cat([prefix[1], value], dim=2)
    if gqa and query.is_cuda:  # a mask with enable_gqa takes the math kernel on CUDA: repeat the KV heads instead
        key, value = (t.repeat_interleave(query.shape[1] // key.shape[1], dim=1) for t in (key, value))
        gqa = False
    parts, done = [], 0
    for queries in query.split(block or query.shape[2], dim=2):
        end = done + queries.shape[2]
        mask = torch.ones(queries.shape[2], n + end, dtype=torch.bool, device=query.device).tril(diagonal=n + done)
        parts.append(torch.nn.functional.scaled_dot_product_attention(
            queries, key[:, :, :n + end], value[:, :, :n + end], attn_mask=mask, scale=scaling, enable_gqa=gqa))
        done = end
    return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]


def _packed(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: tuple[tuple[int, int, int, int], ...],
            scaling: float | None, block: int) -> torch.Tensor:
    if query.shape[0] != 1:
        raise ValueError("a packed forward has one row")
    kernel = _varlen_kernel(query) if all(pe <= ps for _, _, ps, pe in segments) else None
    if kernel is not None:  # no shared prefixes: one variable-length call
        try:
            bounds = [a for a, _, _, _ in segments] + [segments[-1][1]]
            cu = torch.tensor(bounds, dtype=torch.int32, device=query.device)
            longest = max(b - a for a, b, _, _ in segments)
            out = kernel(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu, cu,
                         longest, longest, scale=scaling, window_size=(-1, 0), enable_gqa=query.shape[1] != key.shape[1])
            return out.unsqueeze(0)
        except (RuntimeError, TypeError, ValueError):  # no such kernel for this GPU or dtype: the per-segment path
            _varlen_state.kernel = None
    # One split of the row into its segments (they tile it in order): its backward is one
    # concatenation, where a slice per segment would zero-fill a row-sized gradient each.
    sizes = [b - a for a, b, _, _ in segments]
    qs, ks, vs = (t.split(sizes, dim=2) for t in (query, key, value))
    first = {a: i for i, (a, _, _, _) in enumerate(segments)}
    parts = [_segment(qs[i], ks[i], vs[i], (ks[first[ps]], vs[first[ps]]) if pe > ps else None, scaling, block)
             for i, (_, _, ps, pe) in enumerate(segments)]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous()


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      packed_segments: tuple[tuple[int, int, int, int], ...] | None = None, query_block: int = 0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``ATTENTION`` (see the module): shapes as transformers passes them, ``query``
    ``[batch, heads, tokens, dim]``, ``key``/``value`` with the KV heads; returns
    ``[batch, tokens, heads, dim]``. ``query_block``: packed, queries per call of a continuation
    of a shared prefix (``rl.attention_query_block``; 0: one call)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

    if packed_segments is not None:
        return _packed(query, key, value, packed_segments, scaling, query_block), None
    if query.device.type == "cpu" and attention_mask is not None and key.shape[1] != query.shape[1]:
        mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask.dim() == 4 else attention_mask
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling,
            enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


@functools.cache
def _register() -> None:
    """Name ``ATTENTION`` in transformers' registries, once a process (they are process-wide)."""
    from transformers import AttentionInterface  # noqa: PLC0415
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask  # noqa: PLC0415

    AttentionInterface.register(ATTENTION, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # SDPA's masks when not packed


def install(model: torch.nn.Module) -> torch.nn.Module:
    """Give ``model`` (and its later copies: the reference, the sampler) the project's attention,
    where it runs SDPA today (a model loaded with another implementation keeps it)."""
    _register()
    inner = base_model(model)
    if inner.config._attn_implementation in ("sdpa", ATTENTION):
        inner.config._attn_implementation = ATTENTION
    return model
