"""Micro-batches of trajectories as the model sees them: packed (no padding) or right-padded.

Packed (``rl.packing: true``): a micro-batch's trajectories are concatenated into one row,
``position_ids`` restart at 0 for each, and attention stays inside each trajectory: the
attention function ``PACKED_ATTENTION`` (registered with transformers, installed on the policy
by ``use_packed_attention``) runs one causal attention per trajectory, through flash-attention's
variable-length kernel on a GPU that has it (``torch.nn.attention.varlen``) and one fused SDPA
call per trajectory elsewhere (the fastest correct path on a CPU: a block-diagonal mask over the
whole row would cost the square of the row's length). Without the packing arguments it is plain
SDPA with transformers' masks, so generation with the same model is unchanged.

Padded (``rl.packing: false``): each trajectory a row, right-padded to the longest; kept to
measure what packing saves (``bench/bench_packing.py``) and for models whose attention cannot
take the packed form.

Either way only the *scored* tokens leave the model: ``TokenBatch.positions`` are the flat
indices of the hidden states that predict them (``train.logprobs``), so no vocabulary projection
is spent on prompt, feedback, observation or pad positions.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from progress_sql.train.trajectories import TokenizedTrajectory

PACKED_ATTENTION = "progress_sql_packed"


@dataclass
class TokenBatch:
    """One micro-batch: the model inputs and, per scored token (``mask`` 1 in its trajectory),
    where its predicting hidden state is, what it is, its trajectory and the sampler's log-prob.

    ``input_ids``/``position_ids``: ``[rows, width]`` (packed: one row); ``bounds``: packed only,
    each trajectory's ``(start, end)`` in the row; ``positions``: ``[N]`` flat indices into
    ``rows × width`` of the positions whose *next* token is scored; ``targets``, ``seq``,
    ``sampler_logp``: ``[N]``; ``lengths``: the real length of each trajectory."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    bounds: tuple[tuple[int, int], ...] | None
    positions: torch.Tensor
    targets: torch.Tensor
    seq: torch.Tensor
    sampler_logp: torch.Tensor
    lengths: tuple[int, ...]

    @property
    def packed(self) -> bool:
        return self.bounds is not None

    @property
    def padded_tokens(self) -> int:
        """Positions the model runs over (packed: the real tokens only)."""
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    def model_inputs(self) -> dict[str, Any]:
        """The forward's keyword arguments. Packed: the trajectories' bounds ride along as
        flash-attention's ``cu_seq_lens`` (``PACKED_ATTENTION`` reads them), with an all-ones
        2-D mask so transformers neither looks for packing in the positions nor builds a
        ``[width, width]`` mask. Padded: no mask at all: rows are right-padded, so under the
        causal mask no real token attends to a pad, and SDPA takes its fused causal kernel."""
        inputs: dict[str, Any] = {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}
        if self.bounds is not None:
            starts = [a for a, _ in self.bounds] + [self.bounds[-1][1]]
            cu = torch.tensor(starts, dtype=torch.int32, device=self.input_ids.device)
            longest = max(b - a for a, b in self.bounds)
            inputs.update(attention_mask=torch.ones_like(self.input_ids), cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                          max_length_q=longest, max_length_k=longest)
        return inputs


def _scored(traj: TokenizedTrajectory) -> list[int]:
    """Indices of the scored tokens of ``traj`` (never its first: nothing predicts it)."""
    return [t for t, m in enumerate(traj.loss_mask) if m and t > 0]


def token_batch(trajs: Sequence[TokenizedTrajectory], *, packed: bool, pad_id: int,
                device: torch.device | str) -> TokenBatch:
    """The micro-batch of ``trajs``, packed into one row or right-padded (see the module)."""
    lengths = tuple(len(t.input_ids) for t in trajs)
    positions, targets, seq, sampler = [], [], [], []
    if packed:
        ids = [i for t in trajs for i in t.input_ids]
        pos = [p for n in lengths for p in range(n)]
        bounds, start = [], 0
        for n in lengths:
            bounds.append((start, start + n))
            start += n
        input_ids, position_ids = torch.tensor([ids]), torch.tensor([pos])
        offsets = [a for a, _ in bounds]
    else:
        width = max(lengths)
        input_ids = torch.full((len(trajs), width), pad_id, dtype=torch.long)
        for r, t in enumerate(trajs):
            input_ids[r, :len(t.input_ids)] = torch.tensor(t.input_ids)
        position_ids = torch.arange(width).expand(len(trajs), -1)
        bounds, offsets = None, [r * width for r in range(len(trajs))]
    for r, (t, offset) in enumerate(zip(trajs, offsets)):
        for k in _scored(t):
            positions.append(offset + k - 1)  # the hidden state at k - 1 predicts token k
            targets.append(t.input_ids[k])
            seq.append(r)
            sampler.append(t.old_logprobs[k])
    return TokenBatch(
        input_ids=input_ids.to(device), position_ids=position_ids.to(device),
        bounds=tuple(bounds) if bounds is not None else None,
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        seq=torch.tensor(seq, dtype=torch.long, device=device),
        sampler_logp=torch.tensor(sampler, dtype=torch.float32, device=device),
        lengths=lengths,
    )


def micro_batches(lengths: list[int], max_sequences: int, max_tokens: int, *, packed: bool) -> list[list[int]]:
    """Indices of the micro-batches of one batch, sequences sorted by length. ``max_tokens`` > 0:
    each holds as many as fit in that many tokens (packed: real tokens; padded: rows × the
    longest), at least one; else ``max_sequences`` each. The loss is a sum over micro-batches, so
    how the batch is cut does not change the gradient, only the memory and the speed."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if max_tokens <= 0:
        return [order[i:i + max_sequences] for i in range(0, len(order), max_sequences)]
    chunks: list[list[int]] = [[]]
    used = 0
    for i in order:  # ascending lengths: the newest is the longest of its chunk
        cost = used + lengths[i] if packed else (len(chunks[-1]) + 1) * lengths[i]
        if chunks[-1] and cost > max_tokens:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += lengths[i]
    return chunks


# ----------------------------------------------------------------------------- attention
def _segments(cu_seq_lens: torch.Tensor) -> list[tuple[int, int]]:
    bounds = cu_seq_lens.tolist()
    return list(zip(bounds[:-1], bounds[1:]))


_varlen_state = threading.local()


def _varlen_kernel(query: torch.Tensor) -> Any:
    """torch's flash-attention variable-length kernel where this device runs it, else None
    (tried once per process: a torch without it, a CPU, an unsupported GPU)."""
    if not query.is_cuda:
        return None
    if not hasattr(_varlen_state, "kernel"):
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415 - torch >= 2.9, CUDA only
        except ImportError:
            varlen_attn = None
        _varlen_state.kernel = varlen_attn
    return _varlen_state.kernel


def packed_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, cu_seq_lens_q: torch.Tensor | None = None,
                             max_length_q: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``PACKED_ATTENTION``: causal attention inside each packed trajectory (``cu_seq_lens_q``),
    or transformers' SDPA when the call is not packed (generation, a padded batch). Shapes as
    transformers passes them: ``query`` ``[1, heads, tokens, dim]``, ``key``/``value`` with the
    KV heads; returns ``[1, tokens, heads, dim]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: PLC0415

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError("a packed forward has one row")
    gqa = query.shape[1] != key.shape[1]
    kernel = _varlen_kernel(query)
    if kernel is not None:
        try:
            longest = int(max_length_q) if max_length_q is not None else int((cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).max())
            out = kernel(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                         cu_seq_lens_q, cu_seq_lens_q, longest, longest, scale=scaling, window_size=(-1, 0),
                         enable_gqa=gqa)
            return out.unsqueeze(0), None
        except (RuntimeError, TypeError, ValueError):  # this GPU or dtype has no such kernel: the per-trajectory path
            _varlen_state.kernel = None
    parts = [torch.nn.functional.scaled_dot_product_attention(
        query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True, scale=scaling, enable_gqa=gqa)
        for a, b in _segments(cu_seq_lens_q)]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface  # noqa: PLC0415
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask  # noqa: PLC0415

    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
    # SDPA's masks when the call is not packed (left-padded generation batches need them)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, sdpa_mask)


def use_packed_attention(model: torch.nn.Module) -> None:
    """Give ``model`` (and its copies: the reference, the sampler) the packed attention. Its
    config keeps the choice only in memory: a saved model loads with its usual attention."""
    _register()
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner.config._attn_implementation = PACKED_ATTENTION


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Any:
    """``model`` with attention ``name`` for the duration (tests and benches compare kernels)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    before = inner.config._attn_implementation
    inner.config._attn_implementation = name
    try:
        yield model
    finally:
        inner.config._attn_implementation = before
