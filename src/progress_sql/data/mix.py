"""How many training examples each loaded corpus gives to a mix with fixed shares (``data.mix``).

The paper samples 20,000 training examples at random from the union of BIRD + Spider + SynSQL;
``data.importing`` does that by default (``data.import_sampling: random``) and uses
``plan_mix`` for the fixed-shares option (``shares``). Shares are renormalised over the sources
actually given; a source with fewer examples than its share gives all it has and the others
fill the difference in their own proportions.
"""

from __future__ import annotations

import math
from typing import Mapping


def _as_mapping(ratios: object) -> dict[str, float]:
    if hasattr(ratios, "model_dump"):  # config.MixRatios
        ratios = ratios.model_dump()
    if not isinstance(ratios, Mapping):
        raise TypeError(f"ratios must be a mapping of source → share, got {type(ratios).__name__}")
    out = {str(k): float(v) for k, v in ratios.items()}
    bad = {k: v for k, v in out.items() if not math.isfinite(v) or v < 0}
    if bad:
        raise ValueError(f"mix ratios must be finite and non-negative, got {bad}")
    return out


def _largest_remainder(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Integer shares of ``total`` proportional to ``weights`` that sum to ``total`` exactly."""
    norm = sum(weights.values())
    exact = {k: total * w / norm for k, w in weights.items()}
    shares = {k: math.floor(v) for k, v in exact.items()}
    leftover = total - sum(shares.values())
    # Ties go to the name that sorts first, so the plan never depends on dict order.
    for k in sorted(exact, key=lambda k: (shares[k] - exact[k], k))[:leftover]:
        shares[k] += 1
    return shares


def plan_mix(available: Mapping[str, int], ratios: object, total: int) -> dict[str, int]:
    """How many examples to take from each source: the shares of ``total`` by ``ratios``.

    Sources without a positive ratio or without examples contribute nothing; a source whose
    share exceeds what it has gives everything, and the rest is re-split among the others.
    """
    if total < 0:
        raise ValueError(f"total must be non-negative, got {total}")
    weights = _as_mapping(ratios)
    unknown = sorted(set(available) - set(weights))
    if unknown:
        raise ValueError(f"no mix ratio for source(s) {unknown}; ratios are given for {sorted(weights)}")
    plan = {name: 0 for name in available}
    active = {name: weights[name] for name, n in available.items() if n > 0 and weights[name] > 0}
    if not active:
        if total and any(available.values()):
            raise ValueError("every source with examples has mix ratio 0")
        return plan
    remaining = min(total, sum(available[name] for name in active))
    while active:
        shares = _largest_remainder(remaining, active)
        short = [name for name in active if shares[name] > available[name]]
        if not short:
            plan.update(shares)
            break
        for name in short:  # take all of it; the others share what is left
            plan[name] = available[name]
            remaining -= available[name]
            del active[name]
    return plan
