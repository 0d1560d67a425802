"""Policy-gradient losses of the RL trainer: pure torch functions of per-token tensors.

Shapes: ``logp``, ``old_logp``, ``ref_logp`` and ``mask`` are ``[B, L]`` (position ``t`` holds
log π(x_t | x_<t); ``mask`` is 1 where the policy sampled the token, 0 on prompt, feedback,
observation and padding tokens); ``adv`` is ``[B]``, one advantage per sequence.

- GRPO: token-level ratio r_t = π/π_old, clipped to [1 − ε, 1 + ε_high] (DAPO clip-higher when
  ε_high > ε), advantages (r − mean)/(std + ε) per group.
- Dr.GRPO: no std scaling of advantages, and each sequence's token *sum* divided by a constant
  (the generation budget) instead of its own length.
- GSPO: one ratio per sequence, exp(mean_t(logp − old_logp)) (length-normalised), clipped per
  sequence.
- KL to a frozen reference, the k3 estimator exp(ref − logp) − (ref − logp) − 1 (≥ 0), added
  per token with weight β.

Aggregation (how per-token terms become one number):

- ``token_mean`` (DAPO): Σ_{b,t} ℓ·m / Σ m
- ``seq_mean_token_mean`` (GRPO): mean over sequences of each sequence's token mean
- ``seq_mean_token_sum_norm`` (Dr.GRPO): mean over sequences of Σ_t ℓ·m / ``max_tokens``

For gradient accumulation the trainer passes the *whole batch's* ``num_sequences`` and
``num_tokens``: then the micro-batch losses add up exactly to the full-batch loss.
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


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    temperature: float = 1.0,
    loss_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """log π(x_t | x_<t) of every token, ``[B, L]`` (position 0, which has no context, is 0).

    ``temperature`` divides the logits as the sampler did, so the trained distribution is the
    sampled one (1.0 and 0 = greedy leave them as they are). With ``loss_mask``, positions
    before the first scored one are left at 0 and their logits are never computed: the
    vocabulary projection of a long prompt is most of a forward pass, and none of it is trained.
    """
    length = input_ids.shape[1]
    start = 1
    if loss_mask is not None and bool(loss_mask[:, 1:].any()):
        start = 1 + int(loss_mask[:, 1:].any(dim=0).nonzero()[0])
    kwargs = {} if start == 1 else {"logits_to_keep": length - start + 1}  # positions start-1 .. L-1
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).logits[:, :-1, :]
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, start:]
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    out = picked - torch.logsumexp(logits, dim=-1)
    return torch.cat([out.new_zeros(out.shape[0], start), out], dim=1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(π ‖ π_ref) per token: exp(ref − logp) − (ref − logp) − 1 ≥ 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def _aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation,
    num_sequences: float | None,
    num_tokens: float | None,
    max_tokens: int | None,
) -> torch.Tensor:
    n_seq = float(num_sequences) if num_sequences is not None else float(mask.shape[0])
    masked = per_token * mask
    if aggregation == "token_mean":
        n_tok = float(num_tokens) if num_tokens is not None else float(mask.sum().clamp(min=1.0))
        return masked.sum() / max(n_tok, 1.0)
    if aggregation == "seq_mean_token_mean":
        return (masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).sum() / n_seq
    if aggregation == "seq_mean_token_sum_norm":
        if not max_tokens or max_tokens < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_tokens (the generation budget)")
        return (masked.sum(dim=1) / float(max_tokens)).sum() / n_seq
    raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
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

    Per token: max(−A·r_t, −A·clip(r_t, 1 − ε, 1 + ε_high)) + β·KL_t. Returns the loss and
    stats over the mask: ``clip_frac`` (share of tokens where the clipped term is the active
    one), ``kl`` (mean k3, 0 without a reference), ``ratio`` (mean r_t), ``tokens``.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    a = adv.to(logp.dtype).unsqueeze(1)
    unclipped = -a * ratio
    clipped = -a * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps_high)
    per_token = torch.maximum(unclipped, clipped)
    kl = None
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probabilities)")
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + beta * kl
    loss = _aggregate(per_token, mask, aggregation, num_sequences, num_tokens, max_tokens)
    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - clip_eps) & (a < 0)) | ((ratio > 1.0 + clip_eps_high) & (a > 0))
        stats = {
            "clip_frac": _masked_mean(is_clipped.to(mask.dtype), mask),
            "kl": _masked_mean(kl, mask) if kl is not None else 0.0,
            "ratio": _masked_mean(ratio, mask),
            "tokens": float(mask.sum()),
        }
    return loss, stats


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float,
    beta: float,
    *,
    num_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: sequence ratio s = exp(mean_t(logp − old_logp)) over the mask, clipped per sequence.

    Per sequence: max(−A·s, −A·clip(s, 1 − ε, 1 + ε_high)) + β·mean_t KL_t; averaged over
    sequences (``num_sequences`` of the whole batch when accumulating). Stats: ``clip_frac`` is
    the share of *sequences* clipped; ``ratio`` the mean s.
    """
    mask = mask.to(logp.dtype)
    lengths = mask.sum(dim=1).clamp(min=1.0)
    s = torch.exp(((logp - old_logp) * mask).sum(dim=1) / lengths)
    a = adv.to(logp.dtype)
    per_seq = torch.maximum(-a * s, -a * torch.clamp(s, 1.0 - clip_eps, 1.0 + clip_eps_high))
    kl = None
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probabilities)")
        kl = k3_kl(logp, ref_logp)
        per_seq = per_seq + beta * (kl * mask).sum(dim=1) / lengths
    n_seq = float(num_sequences) if num_sequences is not None else float(mask.shape[0])
    has_tokens = (mask.sum(dim=1) > 0).to(logp.dtype)  # a sequence with no sampled token adds nothing
    loss = (per_seq * has_tokens).sum() / n_seq
    with torch.no_grad():
        is_clipped = ((s < 1.0 - clip_eps) & (a < 0)) | ((s > 1.0 + clip_eps_high) & (a > 0))
        n = has_tokens.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float((is_clipped.to(has_tokens.dtype) * has_tokens).sum() / n),
            "kl": _masked_mean(kl, mask) if kl is not None else 0.0,
            "ratio": float((s * has_tokens).sum() / n),
            "tokens": float(mask.sum()),
        }
    return loss, stats
