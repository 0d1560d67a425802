"""Policy-gradient losses of the RL trainer: pure torch functions of per-token tensors.

Shapes: ``logp``, ``old_logp`` and ``ref_logp`` are ``[N]``, one entry per *scored* token of a
micro-batch (a token the policy sampled; prompt, feedback, observation and padding tokens are
never scored: ``train.packing``); ``seq`` is ``[N]``, the sequence (trajectory) of each token,
``0 .. B-1``; ``adv`` is ``[B]``, one advantage per sequence.

- GRPO: token-level ratio r_t = π/π_old, clipped to [1 − ε, 1 + ε_high] (DAPO clip-higher when
  ε_high > ε), advantages (r − mean)/(std + ε) per group.
- Dr.GRPO: no std scaling of advantages, and each sequence's token *sum* divided by a constant
  (the generation budget) instead of its own length.
- GSPO: one ratio per sequence, exp(mean_t(logp − old_logp)) (length-normalised), clipped per
  sequence.
- KL to a frozen reference, the k3 estimator exp(ref − logp) − (ref − logp) − 1 (≥ 0), added
  per token with weight β.

Aggregation (how per-token terms become one number):

- ``token_mean`` (DAPO): Σ_{b,t} ℓ / (number of tokens)
- ``seq_mean_token_mean`` (GRPO): mean over sequences of each sequence's token mean
- ``seq_mean_token_sum_norm`` (Dr.GRPO): mean over sequences of Σ_t ℓ / ``max_tokens``

Each is a weighted sum Σ w_t ℓ_t with a weight per token (``token_weights``). For gradient
accumulation the trainer passes the *whole batch's* ``num_sequences`` and ``num_tokens``: then
the micro-batch losses add up exactly to the full-batch loss.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AGGREGATIONS: tuple[Aggregation, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[int],
    eps: float,
    scale_std: bool = True,
    negative_scale: float = 1.0,
) -> torch.Tensor:
    """Per-episode advantages r − mean(group), divided by (std(group) + eps) when ``scale_std``,
    negative ones then multiplied by ``negative_scale`` (1.0: unchanged).

    The std is the unbiased one (as TRL's GRPO); a group of one episode has advantage 0.
    Dr.GRPO passes ``scale_std=False``.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    g = torch.as_tensor(group_ids)
    if r.ndim != 1 or g.shape != r.shape:
        raise ValueError("rewards and group_ids must be 1-D of equal length, "
                         f"got {tuple(r.shape)} and {tuple(g.shape)}")
    adv = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = g == gid
        if int(idx.sum()) < 2:
            continue
        centred = r[idx] - r[idx].mean()
        std = r[idx].std()
        if scale_std:
            # equal rewards: no signal (and no 0/0 when eps is 0)
            centred = centred / (std + eps) if std > 0 else torch.zeros_like(centred)
        adv[idx] = centred
    if negative_scale != 1.0:
        adv = torch.where(adv < 0, adv * negative_scale, adv)
    return adv.to(torch.float32)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(π ‖ π_ref) per token: exp(ref − logp) − (ref − logp) − 1 ≥ 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def token_weights(
    seq: torch.Tensor,
    n_seq: int,
    aggregation: Aggregation,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """``[N]``: each token's weight w_t in the loss Σ w_t ℓ_t under ``aggregation``
    (``num_sequences``/``num_tokens`` default to this micro-batch's own)."""
    counts = torch.bincount(seq, minlength=n_seq).to(torch.float32)
    sequences = float(num_sequences) if num_sequences is not None else float(n_seq)
    if aggregation == "token_mean":
        tokens = float(num_tokens) if num_tokens is not None else float(seq.numel())
        return torch.full(seq.shape, 1.0 / max(tokens, 1.0), device=seq.device)
    if aggregation == "seq_mean_token_mean":
        return (1.0 / (counts.clamp(min=1.0) * sequences))[seq]
    if aggregation == "seq_mean_token_sum_norm":
        if not max_tokens or max_tokens < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_tokens (the generation budget)")
        return torch.full(seq.shape, 1.0 / (float(max_tokens) * sequences), device=seq.device)
    raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")


def _stats(ratio: torch.Tensor, adv: torch.Tensor, clip_eps: float, clip_eps_high: float, kl: torch.Tensor | None,
           tokens: int) -> dict[str, float]:
    """``clip_frac`` (share of ``ratio``'s entries whose clipped term is the active one: tokens,
    or GSPO's sequences), ``ratio`` (their mean), ``kl`` (mean k3 per token), ``tokens``."""
    with torch.no_grad():
        clipped = ((ratio < 1.0 - clip_eps) & (adv < 0)) | ((ratio > 1.0 + clip_eps_high) & (adv > 0))
        n = max(ratio.numel(), 1)
        return {"clip_frac": float(clipped.sum()) / n, "ratio": float(ratio.sum()) / n,
                "kl": float(kl.mean()) if kl is not None and kl.numel() else 0.0, "tokens": float(tokens)}


def _kl(logp: torch.Tensor, ref_logp: torch.Tensor | None, beta: float) -> torch.Tensor | None:
    if beta <= 0:
        return None
    if ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probabilities)")
    return k3_kl(logp, ref_logp)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    seq: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
    beta: float,
    aggregation: Aggregation = "seq_mean_token_mean",
    *,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate (GRPO / Dr.GRPO / DAPO) plus β·k3 KL.

    Per token: max(−A·r_t, −A·clip(r_t, 1 − ε, 1 + ε_high)) + β·KL_t, aggregated by
    ``token_weights``. Stats over the tokens: ``clip_frac``, ``kl`` (0 without a reference),
    ``ratio`` (mean r_t), ``tokens``.
    """
    ratio = torch.exp(logp - old_logp)
    a = adv.to(logp.dtype)[seq]
    per_token = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high))
    kl = _kl(logp, ref_logp, beta)
    if kl is not None:
        per_token = per_token + beta * kl
    weights = token_weights(seq, adv.shape[0], aggregation, num_sequences, num_tokens, max_tokens)
    loss = (per_token * weights.to(per_token.dtype)).sum()
    return loss, _stats(ratio, a, clip_eps, clip_eps_high, kl, logp.numel())


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    seq: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
    beta: float,
    *,
    num_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence ratio s = exp(mean_t(logp − old_logp)) over each sequence's tokens, clipped
    per sequence.

    Per sequence: max(−A·s, −A·clip(s, 1 − ε, 1 + ε_high)) + β·mean_t KL_t; summed over the
    sequences that have tokens and divided by ``num_sequences`` (the whole batch's when
    accumulating). Stats: ``clip_frac`` is the share of *sequences* clipped; ``ratio`` the mean s.
    """
    n_seq = adv.shape[0]
    counts = torch.bincount(seq, minlength=n_seq).to(logp.dtype)
    present = counts > 0  # a sequence with no sampled token adds nothing

    def seq_mean(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(n_seq).index_add(0, seq, x) / counts.clamp(min=1.0)

    s = torch.exp(seq_mean(logp - old_logp))
    a = adv.to(logp.dtype)
    per_seq = torch.maximum(-a * s, -a * torch.clamp(s, 1.0 - clip_eps, 1.0 + clip_eps_high))
    kl = _kl(logp, ref_logp, beta)
    if kl is not None:
        per_seq = per_seq + beta * seq_mean(kl)
    sequences = float(num_sequences) if num_sequences is not None else float(n_seq)
    loss = (per_seq * present.to(per_seq.dtype)).sum() / sequences
    return loss, _stats(s[present], a[present], clip_eps, clip_eps_high, kl, logp.numel())
