"""Micro-batches of trajectories as the model sees them: packed (no padding) or right-padded.

Packed (``rl.packing: true``): a micro-batch's trajectories are concatenated into one row,
``position_ids`` restart at 0 for each, and attention stays inside each trajectory: the
project's attention function (``inference.attention``, on every policy ``load_policy`` loads)
runs one causal attention per trajectory when the forward carries the trajectories' bounds, and
plain SDPA with transformers' masks otherwise, so generation with the same model is unchanged.

Padded (``rl.packing: false``): each trajectory a row, right-padded to the longest; kept to
measure what packing saves (``bench/bench_packing.py``) and for models whose attention cannot
take the packed form.

Either way only the *scored* tokens leave the model: ``TokenBatch.positions`` are the flat
indices of the hidden states that predict them (``train.logprobs``), so no vocabulary projection
is spent on prompt, feedback, observation or pad positions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from progress_sql.inference import attention
from progress_sql.inference.lora import base_model
from progress_sql.params import RLSettings
from progress_sql.train.trajectories import TokenizedTrajectory

Segment = tuple[int, int, int, int]  # (start, end) in the row, and its shared prefix's (start, end) or (0, 0)
# the defaults of rl.shared_prefix_min_tokens and rl.attention_query_block, where a caller gives none
MIN_SHARED = RLSettings.model_fields["shared_prefix_min_tokens"].default
QUERY_BLOCK = RLSettings.model_fields["attention_query_block"].default


@dataclass
class TokenBatch:
    """One micro-batch: the model inputs and, per scored token (``mask`` 1 in its trajectory),
    where its predicting hidden state is, what it is, its trajectory and the sampler's log-prob.

    ``input_ids``/``position_ids``: ``[rows, width]`` (packed: one row); ``segments``: packed
    only, each attention segment's ``(start, end)`` in the row with the ``(start, end)`` of the
    shared prefix it also attends to (``(0, 0)``: none); ``positions``: ``[N]`` flat indices
    into ``rows × width`` of the positions whose *next* token is scored; ``targets``, ``seq``,
    ``sampler_logp``: ``[N]``; ``lengths``: the real length of each trajectory."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: tuple[Segment, ...] | None
    positions: torch.Tensor
    targets: torch.Tensor
    seq: torch.Tensor
    sampler_logp: torch.Tensor
    lengths: tuple[int, ...]
    query_block: int = 0  # packed: queries per attention call of a continuation (rl.attention_query_block)

    @property
    def packed(self) -> bool:
        return self.segments is not None

    @property
    def model_tokens(self) -> int:
        """Positions the model runs over: pads included (padded), a shared prefix once (packed)."""
        return int(self.input_ids.numel())

    @property
    def real_tokens(self) -> int:
        """The trajectories' tokens, each counted in full."""
        return sum(self.lengths)

    @property
    def pad_tokens(self) -> int:
        return 0 if self.packed else self.model_tokens - self.real_tokens

    def model_inputs(self) -> dict[str, Any]:
        """The forward's keyword arguments. Packed: the segments ride along to the project's
        attention (``inference.attention``), with an all-ones 2-D mask so transformers neither
        looks for packing in the positions nor builds a ``[width, width]`` mask. Padded: no mask
        at all: rows are right-padded, so under the causal mask no real token attends to a pad,
        and SDPA takes its fused causal kernel."""
        inputs: dict[str, Any] = {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}
        if self.segments is not None:
            inputs.update(attention_mask=torch.ones_like(self.input_ids), packed_segments=self.segments,
                          query_block=self.query_block)
        return inputs


def _scored(traj: TokenizedTrajectory) -> list[int]:
    """Indices of the scored tokens of ``traj`` (never its first: nothing predicts it)."""
    return [t for t, m in enumerate(traj.loss_mask) if m and t > 0]


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """The length of the prefix all of ``seqs`` share, leaving each at least one token of its own."""
    limit = min(len(x) for x in seqs) - 1
    first = seqs[0]
    n = 0
    while n < limit and all(x[n] == first[n] for x in seqs):
        n += 1
    return n


def _packed_layout(trajs: Sequence[TokenizedTrajectory], share_prefix: bool, min_shared: int
                   ) -> tuple[list[int], list[int], list[Segment], list[Callable[[int], int]]]:
    """The packed row: token ids, positions, segments, and per trajectory the row index of its
    token ``k`` (a shared prefix's tokens sit once, before the group's continuations)."""
    ids: list[int] = []
    pos: list[int] = []
    segments: list[Segment] = []
    index: list[Callable[[int], int] | None] = [None] * len(trajs)
    groups: dict[int, list[int]] = {}
    for r, t in enumerate(trajs):
        groups.setdefault(t.group_id if share_prefix else -1 - r, []).append(r)
    for members in groups.values():
        shared = common_prefix([trajs[r].input_ids for r in members]) if len(members) > 1 else 0
        shared = shared if shared >= min_shared else 0
        ps = len(ids)
        if shared:
            ids += trajs[members[0]].input_ids[:shared]
            pos += list(range(shared))
            segments.append((ps, ps + shared, 0, 0))
        for r in members:
            tail = trajs[r].input_ids[shared:]
            a = len(ids)
            ids += tail
            pos += list(range(shared, shared + len(tail)))
            segments.append((a, a + len(tail), ps, ps + shared) if shared else (a, a + len(tail), 0, 0))
            index[r] = (lambda k, ps=ps, a=a, n=shared: ps + k if k < n else a + k - n)
    return ids, pos, segments, index  # type: ignore[return-value]


def token_batch(trajs: Sequence[TokenizedTrajectory], *, packed: bool, pad_id: int,
                device: torch.device | str, share_prefix: bool = False,
                min_shared: int = MIN_SHARED, query_block: int = QUERY_BLOCK) -> TokenBatch:
    """The micro-batch of ``trajs``, packed into one row or right-padded (see the module). With
    ``share_prefix`` (packed only) the trajectories of one group (``group_id``) run their common
    prefix, the question's prompt, once when it has ``min_shared`` tokens or more: each
    continuation attends to it and to itself, ``query_block`` queries a call."""
    lengths = tuple(len(t.input_ids) for t in trajs)
    positions, targets, seq, sampler = [], [], [], []
    if packed:
        ids, pos, segments, index = _packed_layout(trajs, share_prefix, min_shared)
        input_ids, position_ids = torch.tensor([ids]), torch.tensor([pos])
    else:
        width = max(lengths)
        input_ids = torch.full((len(trajs), width), pad_id, dtype=torch.long)
        for r, t in enumerate(trajs):
            input_ids[r, :len(t.input_ids)] = torch.tensor(t.input_ids)
        position_ids = torch.arange(width).expand(len(trajs), -1)
        segments, index = None, [(lambda k, o=r * width: o + k) for r in range(len(trajs))]
    for r, t in enumerate(trajs):
        for k in _scored(t):
            positions.append(index[r](k - 1))  # the hidden state at k - 1 predicts token k
            targets.append(t.input_ids[k])
            seq.append(r)
            sampler.append(t.old_logprobs[k])
    return TokenBatch(
        input_ids=input_ids.to(device), position_ids=position_ids.to(device),
        segments=tuple(segments) if segments is not None else None,
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        seq=torch.tensor(seq, dtype=torch.long, device=device),
        sampler_logp=torch.tensor(sampler, dtype=torch.float32, device=device),
        lengths=lengths,
        query_block=query_block,
    )


def micro_batches(lengths: Sequence[int], max_sequences: int, max_tokens: int, *, packed: bool,
                  groups: Sequence[int] | None = None) -> list[list[int]]:
    """Indices of the micro-batches of one batch, sequences sorted by length. ``max_tokens`` > 0:
    each holds as many as fit in that many tokens (packed: real tokens; padded: rows × the
    longest), at least one; else ``max_sequences`` each. With ``groups`` (each sequence's group:
    a shared prefix runs once per micro-batch) a group's sequences stay together, cut only when
    they alone exceed the budget. The loss is a sum over micro-batches, so how the batch is cut
    does not change the gradient, only the memory and the speed."""
    def cut(order: list[int]) -> list[list[int]]:
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

    by_length = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if groups is None:
        return cut(by_length)
    members: dict[int, list[int]] = {}
    for i in by_length:
        members.setdefault(groups[i], []).append(i)
    units = sorted((unit for group in members.values() for unit in cut(group)), key=lambda u: sum(lengths[i] for i in u))
    out: list[list[int]] = []
    for unit in units:  # whole units into micro-batches, by the same budget
        fits = out and (len(out[-1]) + len(unit) <= max_sequences if max_tokens <= 0
                        else sum(lengths[i] for i in out[-1] + unit) <= max_tokens)
        if fits:
            out[-1] += unit
        else:
            out.append(list(unit))
    return out


# ----------------------------------------------------------------------------- attention
def use_packed_attention(model: torch.nn.Module) -> None:
    """Make sure ``model`` runs the attention that takes packed rows (``inference.attention``,
    which ``load_policy`` installs on every policy it loads; a model built otherwise needs this)."""
    if attention.install(model).config._attn_implementation != attention.ATTENTION:
        raise ValueError(f"packed micro-batches need SDPA attention; this model runs "
                         f"{model.config._attn_implementation!r} (set rl.packing: false)")


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Any:
    """``model`` with attention ``name`` for the duration (tests and benches compare kernels)."""
    inner = base_model(model)
    before = inner.config._attn_implementation
    inner.config._attn_implementation = name
    try:
        yield model
    finally:
        inner.config._attn_implementation = before
