"""Diagnostic tags (docs/design.md, "ODT tags and thresholds") and the rule that emits them from feature similarities.

A tag is emitted when its feature similarity falls below its threshold
(``settings.odt.thresholds``). For the clause sets (WHERE, GROUP BY, HAVING, ORDER BY) the
variant says which side is empty: the gold has the clause and the prediction not →
``_MISSING``; the reverse → ``_REDUNDANT``; both have it and differ → ``_ERROR``. The join
count gives JOIN_MISSING / JOIN_REDUNDANT; JOIN_KEY_MISMATCH is for two queries that both
join but on different conditions (a query without any join is already JOIN_MISSING or
JOIN_REDUNDANT). Nested-structure tags come from unmatched children (``score``).

Descriptions name the kind of clause only: never an identifier, a value or a score.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

from progress_sql.odt.settings import ODTThresholds

PARSE_ERROR = "PARSE_ERROR"
VALUE_MISMATCH = "VALUE_MISMATCH"
# Internal: the gold query could not be profiled. Logged in Diagnosis.tags, never named to
# the model (it gets the generic fallback feedback instead).
GOLD_UNAVAILABLE = "GOLD_UNAVAILABLE"

# The model-facing tags in their canonical (output) order, one short description each.
TAGS: Mapping[str, str] = MappingProxyType({
    PARSE_ERROR: "The query could not be parsed: fix syntax and identifiers first.",
    "SELECT_ERROR": "The SELECT projection differs from the reference.",
    "SELECT_COUNT_MISMATCH": "The number of selected items differs from the reference.",
    "FROM_OR_JOIN_TABLE_MISMATCH": "The FROM/JOIN tables differ from the expected ones.",
    "JOIN_MISSING": "A needed join is missing.",
    "JOIN_REDUNDANT": "The query introduces redundant joins.",
    "JOIN_KEY_MISMATCH": "The join conditions are not aligned with the reference.",
    "WHERE_MISSING": "A needed WHERE filter is missing.",
    "WHERE_REDUNDANT": "The WHERE filter is not needed.",
    "WHERE_ERROR": "The WHERE predicates differ from the reference.",
    "GROUP_BY_MISSING": "A needed GROUP BY is missing.",
    "GROUP_BY_REDUNDANT": "The GROUP BY is not needed.",
    "GROUP_BY_ERROR": "The GROUP BY columns are not aligned with the reference.",
    "HAVING_MISSING": "A needed HAVING condition is missing.",
    "HAVING_REDUNDANT": "The HAVING condition is not needed.",
    "HAVING_ERROR": "The HAVING condition differs from the reference.",
    "ORDER_BY_MISSING": "A needed ORDER BY is missing.",
    "ORDER_BY_REDUNDANT": "The ORDER BY is not needed.",
    "ORDER_BY_ERROR": "The ORDER BY keys or directions differ from the reference.",
    "LIMIT_MISMATCH": "LIMIT usage differs from the reference.",
    "DISTINCT_MISMATCH": "DISTINCT usage differs from the reference.",
    "AGGREGATION_MISMATCH": "Aggregate function usage differs from the reference.",
    "SUBQUERY_MISSING": "A needed nested query is missing.",
    "SUBQUERY_REDUNDANT": "The query contains an unnecessary nested query.",
    "SET_OP_MISMATCH": "The set operation (UNION / INTERSECT / EXCEPT) structure differs from the reference.",
    "CTE_MISSING": "A needed common table expression (WITH) is missing.",
    "CTE_REDUNDANT": "The query defines an unnecessary common table expression (WITH).",
    VALUE_MISMATCH: "The structure matches; check the values and conditions.",
})

_ORDER = {tag: i for i, tag in enumerate([*TAGS, GOLD_UNAVAILABLE])}


def ordered(tags: Iterable[str]) -> tuple[str, ...]:
    """De-duplicated tags in canonical order (unknown tags, if any, last and sorted)."""
    return tuple(sorted(set(tags), key=lambda t: (_ORDER.get(t, len(_ORDER)), t)))


def _clause_tag(clause: str, sim: float, threshold: float, pred_has: bool, gold_has: bool) -> str | None:
    if sim >= threshold:
        return None
    if gold_has and not pred_has:
        return clause + "_MISSING"
    if pred_has and not gold_has:
        return clause + "_REDUNDANT"
    return clause + "_ERROR"


def select_tags(sims: Mapping[str, float], pred, gold, th: ODTThresholds) -> list[str]:
    """Tags of one matched SELECT pair from its feature similarities (``sims``) and the two
    profiles (``pred``, ``gold``: ``SelectProfile``), which say which side is empty."""
    tags = []
    if sims["select"] < th.select:
        tags.append("SELECT_ERROR")
    if sims["select_count"] < th.select_count:
        tags.append("SELECT_COUNT_MISMATCH")
    if sims["tables"] < th.tables:
        tags.append("FROM_OR_JOIN_TABLE_MISMATCH")
    if sims["join_count"] < th.join_count:
        tags.append("JOIN_MISSING" if pred.join_count < gold.join_count else "JOIN_REDUNDANT")
    if sims["joins"] < th.joins and pred.join_count and gold.join_count:
        tags.append("JOIN_KEY_MISMATCH")
    for clause, key, threshold in (("WHERE", "where", th.where), ("GROUP_BY", "group_by", th.group_by),
                                   ("HAVING", "having", th.having), ("ORDER_BY", "order_by", th.order_by)):
        tag = _clause_tag(clause, sims[key], threshold, bool(getattr(pred, key)), bool(getattr(gold, key)))
        if tag:
            tags.append(tag)
    if sims["limit"] < th.limit:
        tags.append("LIMIT_MISMATCH")
    if sims["distinct"] < th.distinct:
        tags.append("DISTINCT_MISMATCH")
    if sims["aggregation"] < th.aggregation:
        tags.append("AGGREGATION_MISMATCH")
    return tags
