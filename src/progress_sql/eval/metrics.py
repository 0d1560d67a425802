"""Aggregate per-example outcomes into the reported metrics (pure: no I/O, no torch).

A decoding mode (greedy, Vote@k, the multi-turn protocol) yields one ``Outcome`` per example;
``mode_metrics`` turns them into

    {"n", "ex", "ts", "ts_n", "exec_rate", "format_rate", "mean_response_tokens",
     "by_hardness": {"easy": {"n", "ex", "ts"}, ...}, "by_difficulty": {...}}

- ``ex``: execution accuracy over all n examples; ``exec_rate``: the chosen SQL ran without
  error; ``format_rate``: the output followed the format; ``mean_response_tokens``: mean
  generated length (all samples for Vote@k).
- ``ts``: test-suite accuracy over the ``ts_n`` examples whose database has neighbours
  (None when there are none, or TS is off); an example without neighbours has ``ts=None``.
- ``by_hardness``: Spider hardness (every level listed, n=0 with None rates when absent);
  ``by_difficulty``: the dataset's own labels (BIRD: simple/moderate/challenging), only when
  the examples carry them.

Rates are fractions in [0, 1]; the Markdown tables show percentages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from progress_sql.sql.hardness import HARDNESS_LEVELS

# BIRD's difficulty labels, in their natural order; other labels follow alphabetically.
DIFFICULTY_ORDER = ("simple", "moderate", "challenging")


@dataclass(frozen=True)
class Outcome:
    """One example under one decoding mode."""

    ex: bool
    ts: bool | None  # None: not computed (TS off, or no neighbour databases)
    executed: bool
    well_formed: bool
    response_tokens: float  # mean over the mode's generations for this example
    hardness: str
    difficulty: str = ""


def rate(values: Iterable[bool | None]) -> float | None:
    """Share of True among the non-None values; None when there are none."""
    kept = [bool(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def mean(values: Iterable[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def _group(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    return {"n": len(outcomes), "ex": rate(o.ex for o in outcomes), "ts": rate(o.ts for o in outcomes)}


def _difficulty_key(label: str) -> tuple[int, str]:
    return (DIFFICULTY_ORDER.index(label), "") if label in DIFFICULTY_ORDER else (len(DIFFICULTY_ORDER), label)


def mode_metrics(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The metrics of one decoding mode over a split (see the module notes)."""
    out: dict[str, Any] = {
        "n": len(outcomes),
        "ex": rate(o.ex for o in outcomes),
        "ts": rate(o.ts for o in outcomes),
        "ts_n": sum(1 for o in outcomes if o.ts is not None),
        "exec_rate": rate(o.executed for o in outcomes),
        "format_rate": rate(o.well_formed for o in outcomes),
        "mean_response_tokens": mean(o.response_tokens for o in outcomes),
        "by_hardness": {
            level: _group([o for o in outcomes if o.hardness == level]) for level in HARDNESS_LEVELS
        },
    }
    others = sorted({o.hardness for o in outcomes} - set(HARDNESS_LEVELS))
    for label in others:  # a loader's unexpected label is reported, not dropped
        out["by_hardness"][label] = _group([o for o in outcomes if o.hardness == label])
    labels = sorted({o.difficulty for o in outcomes if o.difficulty}, key=_difficulty_key)
    if labels:
        out["by_difficulty"] = {label: _group([o for o in outcomes if o.difficulty == label]) for label in labels}
    return out


def pass_metrics(scores: Sequence[float], hardness: Sequence[str]) -> dict[str, Any]:
    """pass@k over a split: ``scores[i]`` is example i's pass@k estimate in [0, 1]."""
    if len(scores) != len(hardness):
        raise ValueError("pass_metrics: one hardness label per score")
    by_level = {}
    for level in (*HARDNESS_LEVELS, *sorted(set(hardness) - set(HARDNESS_LEVELS))):
        vals = [s for s, h in zip(scores, hardness) if h == level]
        if vals or level in HARDNESS_LEVELS:
            by_level[level] = {"n": len(vals), "ex": mean(vals)}
    return {"n": len(scores), "ex": mean(scores), "by_hardness": by_level}


def flat_metrics(tree: dict[str, Any], sep: str = "/", prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested metrics dict under joined keys (``dev/greedy/ex``); None,
    strings and booleans are left out (the gate, the registry and tracking take numbers).
    Not ``tracking.flat_params``, which turns settings into strings."""
    flat: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flat_metrics(value, sep, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat
