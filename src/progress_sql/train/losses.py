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

Asynchronous rollouts (``rl.async``) train on episodes sampled with older weights, and pass
``behaviour_logp``, the sampler's log-probabilities of the tokens (None: synchronous, and the
loss is exactly the one above). The decoupled objective of AReaL and NeMo RL: ``old_logp`` is the
*proximal* policy, the trainer's own log-probabilities before the update, against which the ratio
is clipped; each token's term is multiplied by the importance weight to the behaviour policy,
w_t = min(π_prox/π_behaviour, ``is_cap``) (truncated importance sampling; GSPO: one weight per
sequence, exp(mean_t(prox − behaviour)), truncated alike). The KL term is not weighted. With
behaviour = proximal (no staleness) every weight is 1 and the loss is the synchronous one.

Aggregation (how per-token terms become one number):

- ``token_mean`` (DAPO): Σ_{b,t} ℓ / (number of tokens)
- ``seq_mean_token_mean`` (GRPO): mean over sequences of each sequence's token mean
- ``seq_mean_token_sum_norm`` (Dr.GRPO): mean over sequences of Σ_t ℓ / ``max_tokens``

Each is a weighted sum Σ w_t ℓ_t with a weight per token (``token_weights``, a branch per name
of ``params.settings.AGGREGATIONS``, the one list, which ``rl.loss_aggregation`` takes). For gradient
accumulation the trainer passes the *whole batch's* ``num_sequences`` and ``num_tokens``: then
the micro-batch losses add up exactly to the full-batch loss.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from progress_sql.params.settings import AGGREGATIONS

Aggregation = Literal[AGGREGATIONS]  # type: ignore[valid-type]


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


def importance_weights(prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """The decoupled objective's weights from log-probabilities (per token, or per sequence for
    GSPO): min(exp(prox − behaviour), ``cap``), no gradient; and their statistics before the
    truncation: ``is_mean``, ``is_max``, ``is_truncated`` (the share above ``cap``), ``is_count``."""
    if cap < 1.0:
        raise ValueError(f"is_cap must be at least 1 (got {cap}): on-policy tokens keep weight 1")
    with torch.no_grad():
        raw = torch.exp(prox_logp.detach() - behaviour_logp.detach().to(prox_logp.dtype))
        n = raw.numel()
        stats = {"is_mean": float(raw.mean()) if n else 1.0, "is_max": float(raw.max()) if n else 1.0,
                 "is_truncated": float((raw > cap).sum()) / max(n, 1), "is_count": float(n)}
        return raw.clamp(max=cap), stats


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
    behaviour_logp: torch.Tensor | None = None,
    is_cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate (GRPO / Dr.GRPO / DAPO) plus β·k3 KL.

    Per token: max(−A·r_t, −A·clip(r_t, 1 − ε, 1 + ε_high)) + β·KL_t, aggregated by
    ``token_weights``. Stats over the tokens: ``clip_frac``, ``kl`` (0 without a reference),
    ``ratio`` (mean r_t), ``tokens``. With ``behaviour_logp`` (asynchronous rollouts) the
    surrogate term of each token is multiplied by w_t = min(exp(old_logp − behaviour_logp),
    ``is_cap``), ``old_logp`` being the proximal policy, and the stats add ``importance_weights``'.
    """
    ratio = torch.exp(logp - old_logp)
    a = adv.to(logp.dtype)[seq]
    per_token = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high))
    is_stats: dict[str, float] = {}
    if behaviour_logp is not None:
        behaviour_weight, is_stats = importance_weights(old_logp, behaviour_logp, is_cap)
        per_token = per_token * behaviour_weight
    kl = _kl(logp, ref_logp, beta)
    if kl is not None:
        per_token = per_token + beta * kl
    weights = token_weights(seq, adv.shape[0], aggregation, num_sequences, num_tokens, max_tokens)
    loss = (per_token * weights.to(per_token.dtype)).sum()
    return loss, {**_stats(ratio, a, clip_eps, clip_eps_high, kl, logp.numel()), **is_stats}


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
    behaviour_logp: torch.Tensor | None = None,
    is_cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence ratio s = exp(mean_t(logp − old_logp)) over each sequence's tokens, clipped
    per sequence.

    Per sequence: max(−A·s, −A·clip(s, 1 − ε, 1 + ε_high)) + β·mean_t KL_t; summed over the
    sequences that have tokens and divided by ``num_sequences`` (the whole batch's when
    accumulating). Stats: ``clip_frac`` is the share of *sequences* clipped; ``ratio`` the mean s.
    With ``behaviour_logp`` the surrogate term of each sequence is multiplied by
    min(exp(mean_t(old_logp − behaviour_logp)), ``is_cap``) (its statistics over sequences).
    """
    n_seq = adv.shape[0]
    counts = torch.bincount(seq, minlength=n_seq).to(logp.dtype)
    present = counts > 0  # a sequence with no sampled token adds nothing

    def seq_mean(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(n_seq).index_add(0, seq, x) / counts.clamp(min=1.0)

    s = torch.exp(seq_mean(logp - old_logp))
    a = adv.to(logp.dtype)
    per_seq = torch.maximum(-a * s, -a * torch.clamp(s, 1.0 - clip_eps, 1.0 + clip_eps_high))
    is_stats: dict[str, float] = {}
    if behaviour_logp is not None:
        gap = seq_mean(old_logp.detach() - behaviour_logp.detach().to(logp.dtype))
        behaviour_weight, is_stats = importance_weights(gap[present], torch.zeros_like(gap[present]), is_cap)
        per_seq = per_seq * torch.ones_like(per_seq).masked_scatter(present, behaviour_weight)
    kl = _kl(logp, ref_logp, beta)
    if kl is not None:
        per_seq = per_seq + beta * seq_mean(kl)
    sequences = float(num_sequences) if num_sequences is not None else float(n_seq)
    loss = (per_seq * present.to(per_seq.dtype)).sum() / sequences
    return loss, {**_stats(s[present], a[present], clip_eps, clip_eps_high, kl, logp.numel()), **is_stats}
