"""Log-probabilities of chosen tokens without the ``[tokens, vocabulary]`` logits in fp32.

A real vocabulary makes the logits the largest tensor of an update: Qwen2.5's 151,936 tokens
are 0.6 MB of fp32 logits per token, 19.9 GB for a 32k-token micro-batch, before any gradient.
So the model runs with its output head bypassed (it returns the final hidden states), only
the hidden states that predict a scored token are kept, and the head is applied to them a
chunk at a time: each chunk's logits live only while its log-probabilities and log-sum-exp are
taken. With gradients, a chunk is recomputed in the backward pass (activation checkpointing of
the head alone: one more head matmul per chunk, instead of keeping every chunk's logits),
so the head's peak is one chunk's whatever the micro-batch. The chunk is
``rl.logits_chunk_mb`` / ``sft.logits_chunk_mb`` of fp32 logits (0: all scored tokens at once,
the tiny policy's case, where a chunk holds every token anyway).

Values are the full computation's (log-softmax of the temperature-scaled logits, gathered)
within fp32 rounding: tests compare both. Models whose head output is transformed in their
forward (Gemma's final logit soft-capping) are computed from their full logits instead.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
from torch.utils.checkpoint import checkpoint

from progress_sql.train.packing import TokenBatch

FP32_BYTES = 4


def unwrapped(model: Any) -> torch.nn.Module:
    """The ``nn.Module`` behind a training engine (``.module``) or the module itself."""
    return model if isinstance(model, torch.nn.Module) else model.module


class _HiddenStates(torch.nn.Module):
    """Stands in for the output head: the model's ``logits`` are then its final hidden states."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


@contextlib.contextmanager
def head_bypassed(model: Any) -> Iterator[torch.nn.Module | None]:
    """Inside, ``model``'s forward returns hidden states as ``logits``; yields the real head
    (None, and nothing bypassed, for a model whose forward transforms the head's output)."""
    inner = unwrapped(model)
    config = getattr(inner, "config", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if head is None or getattr(config, "final_logit_softcapping", None):
        yield None
        return
    parent, name = next((m, n) for m in inner.modules() for n, child in m.named_children() if child is head)
    setattr(parent, name, _HiddenStates())
    try:
        yield head
    finally:
        setattr(parent, name, head)


def chunk_tokens(vocab_size: int, chunk_mb: float) -> int:
    """Tokens whose fp32 logits fit in ``chunk_mb`` MiB (0: no limit)."""
    if chunk_mb <= 0:
        return 2**62
    return max(1, int(chunk_mb * 2**20) // (vocab_size * FP32_BYTES))


def _chunk_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 → fp32; fp64 stays
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits.div_(temperature) if temperature > 0 and temperature != 1.0 else logits


class _ChunkedLinearLogprobs(torch.autograd.Function):
    """log softmax(hidden @ weightᵀ + bias)[targets] a chunk of tokens at a time, forward and
    backward. The forward keeps each token's log-sum-exp (not its logits); the backward
    recomputes one chunk's logits, turns them into the gradient in place ((onehot − softmax) ·
    upstream / T) and adds the chunk's share of the weight's gradient into one buffer. Peak: one
    chunk's logits and the weight's gradient, whatever the number of tokens."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, size: int, dtype: torch.dtype) -> torch.Tensor:
        acc = torch.promote_types(dtype, torch.float32)
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        out = hidden.new_empty(hidden.shape[0], dtype=acc)
        lse = torch.empty_like(out)
        for a in range(0, hidden.shape[0], size):
            logits = _scale(torch.nn.functional.linear(hidden[a:a + size].to(dtype), w, b).to(acc), temperature)
            picked = logits.gather(-1, targets[a:a + size, None]).squeeze(-1)
            top = logits.amax(dim=-1)
            total = logits.sub_(top[:, None]).exp_().sum(dim=-1)  # in place: one chunk buffer
            lse[a:a + size] = total.log_() + top
            out[a:a + size] = picked - lse[a:a + size]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature, ctx.size, ctx.dtype = temperature, size, dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        dtype, size, temperature = ctx.dtype, ctx.size, ctx.temperature
        acc = lse.dtype
        w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if want_b else None
        scale = 1.0 / temperature if temperature > 0 and temperature != 1.0 else 1.0
        for a in range(0, hidden.shape[0], size):
            h = hidden[a:a + size].to(dtype)
            logits = _scale(torch.nn.functional.linear(h, w, b).to(acc), temperature)
            g = grad_out[a:a + size].to(acc) * scale
            dlogits = logits.sub_(lse[a:a + size, None]).exp_().mul_(-g[:, None])  # −g·softmax, in place
            dlogits.scatter_add_(1, targets[a:a + size, None], g[:, None])  # + g·onehot
            d = dlogits.to(dtype)
            if want_h:
                grad_h[a:a + size] = (d @ w).to(hidden.dtype)
            if want_w:
                if d.dtype == acc:
                    grad_w.addmm_(d.t(), h)
                else:
                    grad_w.add_(d.t() @ h)
            if want_b:
                grad_b.add_(dlogits.sum(dim=0))
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                  chunk_mb: float = 0.0) -> torch.Tensor:
    """log softmax(head(hidden) / temperature)[targets], ``[N]``, fp32 (fp64 for an fp64 model),
    a chunk at a time. A linear head is computed by ``_ChunkedLinearLogprobs`` in the precision
    the forward runs in (bf16 under autocast); one whose weight DeepSpeed ZeRO-3 partitions is
    called as a module, so its hooks gather the weight, a chunk at a time and recomputed in the
    backward pass (activation checkpointing)."""
    weight = getattr(head, "weight", None)
    vocab = getattr(weight, "ds_shape", getattr(weight, "shape", (1,)))[0]  # ZeRO-3 holds a partition: its full shape
    size = chunk_tokens(vocab, chunk_mb)
    if isinstance(head, torch.nn.Linear) and not hasattr(weight, "ds_id"):
        device = hidden.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else torch.promote_types(hidden.dtype, weight.dtype))
        with torch.autocast(device, enabled=False):
            return _ChunkedLinearLogprobs.apply(hidden, weight, head.bias, targets, temperature, size, dtype)
    if hidden.shape[0] <= size:
        return _chunk_logprobs(head, hidden, targets, temperature)
    run = functools.partial(_chunk_logprobs, head, temperature=temperature)
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = [checkpoint(run, hidden[a:a + size], targets[a:a + size], use_reentrant=False) if recompute
             else run(hidden[a:a + size], targets[a:a + size]) for a in range(0, hidden.shape[0], size)]
    return torch.cat(parts)


def selected_logprobs(out: torch.Tensor, head: torch.nn.Module | None, positions: torch.Tensor,
                      targets: torch.Tensor, *, temperature: float = 1.0, chunk_mb: float = 0.0) -> torch.Tensor:
    """``[N]`` log-probabilities of ``targets`` predicted at the flat ``positions`` of ``out``, the
    ``logits`` of a forward inside ``head_bypassed``: hidden states to project with ``head``, or
    (``head`` None) the model's own logits."""
    flat = out.reshape(-1, out.shape[-1]).index_select(0, positions)
    if head is not None:
        return head_logprobs(head, flat, targets, temperature=temperature, chunk_mb=chunk_mb)
    return _chunk_logprobs(lambda logits: logits, flat, targets, temperature)


def token_logprobs(model: Any, batch: TokenBatch, *, temperature: float = 1.0, chunk_mb: float = 0.0) -> torch.Tensor:
    """log π(token | context) of every scored token of ``batch`` (``[N]``, fp32), at the
    sampler's ``temperature`` (1.0 and 0, greedy, leave the logits as they are). ``model`` is a
    module or a training engine (called, so its precision and hooks apply)."""
    precision = getattr(model, "autocast", contextlib.nullcontext)
    with precision():
        with head_bypassed(model) as head:
            out = model(**batch.model_inputs()).logits
        return selected_logprobs(out, head, batch.positions, batch.targets, temperature=temperature,
                                 chunk_mb=chunk_mb)
