"""``diagnose``: the ODT comparison of a predicted SQL with the gold SQL (never raises)."""

from __future__ import annotations

from dataclasses import dataclass, field

from progress_sql.odt.settings import ODTSettings, default_odt
from progress_sql.odt.cache import gold_profile
from progress_sql.odt.feedback import feedback_text
from progress_sql.odt.profile import try_build_tree
from progress_sql.odt.score import Scorer
from progress_sql.odt.tags import GOLD_UNAVAILABLE, PARSE_ERROR, ordered


@dataclass(frozen=True)
class Diagnosis:
    """What ODT says about one prediction.

    score: F_struct in [0, 1] (0.0 when the prediction or the gold cannot be profiled);
    tags: diagnostic tags in canonical order (GOLD_UNAVAILABLE is internal, see feedback);
    feedback: the round-2+ user message ('' when there are no tags);
    features: feature similarities of the outermost matched SELECT pair (for analysis only,
    never shown to the model); parsed: the prediction parsed as one query.
    """

    score: float
    tags: tuple[str, ...]
    feedback: str
    features: dict[str, float] = field(default_factory=dict)
    parsed: bool = True


def _fallback(tag: str, parsed: bool) -> Diagnosis:
    return Diagnosis(0.0, (tag,), feedback_text((tag,)), {}, parsed)


def diagnose(pred_sql: str, gold_sql: str, settings: ODTSettings | None = None) -> Diagnosis:
    """Compare ``pred_sql`` with ``gold_sql``: score, tags and feedback. Any input is
    accepted; a prediction that is not one parseable query gives PARSE_ERROR, a gold that is
    not gives GOLD_UNAVAILABLE, both with score 0.0."""
    settings = settings or default_odt()
    pred = try_build_tree(pred_sql)
    gold = gold_profile(gold_sql, settings)
    if pred is None:
        return _fallback(PARSE_ERROR, parsed=False)
    if gold is None:
        return _fallback(GOLD_UNAVAILABLE, parsed=True)
    try:
        result = Scorer(settings).compare(pred, gold)
    except Exception:  # noqa: BLE001 - e.g. RecursionError on a pathologically deep tree;
        return _fallback(PARSE_ERROR, parsed=False)  # a rollout must get an answer regardless
    tags = ordered(result.tags)
    score = min(1.0, max(0.0, result.score))
    return Diagnosis(score, tags, feedback_text(tags), result.features or {}, True)


def structural_score(pred_sql: str, gold_sql: str, settings: ODTSettings | None = None) -> float:
    """F_struct(pred, gold) = diagnose(...).score."""
    return diagnose(pred_sql, gold_sql, settings).score
