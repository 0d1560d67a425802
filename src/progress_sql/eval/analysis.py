"""The paper's Table 8 analysis: ODT structural-mismatch rates of single-turn greedy predictions.

progress-sql.md, Appendix E.4: after generation, each predicted SQL is compared with the gold
by ODT offline (never shown to the model) and the fine-grained tags are mapped to four
coarse categories; a category's rate is the share of predictions with at least one of its
tags, and Avg. Err. is the mean of the four. The paper does not list its mapping; ours:

    SELECT  SELECT_ERROR, SELECT_COUNT_MISMATCH, DISTINCT_MISMATCH   (the projection)
    JOIN    FROM_OR_JOIN_TABLE_MISMATCH, JOIN_MISSING, JOIN_REDUNDANT, JOIN_KEY_MISMATCH
    WHERE   WHERE_MISSING, WHERE_REDUNDANT, WHERE_ERROR
    GROUP   GROUP_BY_MISSING, GROUP_BY_REDUNDANT, GROUP_BY_ERROR, HAVING_*   (grouping and its filter)

Other tags (ORDER BY, LIMIT, aggregation, set operations, subqueries, CTEs) fall outside the
four categories, as in the paper. The rates are over the predictions ODT can profile: an
output without SQL or with SQL that does not parse (PARSE_ERROR) has no clause structure to
compare, so it is counted in ``parse_error_rate`` instead; examples whose gold cannot be
profiled are left out and counted in ``gold_unavailable``.
"""

from __future__ import annotations

from typing import Any, Iterable

from progress_sql.params import ODTSettings
from progress_sql.odt import GOLD_UNAVAILABLE, PARSE_ERROR, diagnose

CATEGORIES: dict[str, frozenset[str]] = {
    "select": frozenset({"SELECT_ERROR", "SELECT_COUNT_MISMATCH", "DISTINCT_MISMATCH"}),
    "join": frozenset({"FROM_OR_JOIN_TABLE_MISMATCH", "JOIN_MISSING", "JOIN_REDUNDANT", "JOIN_KEY_MISMATCH"}),
    "where": frozenset({"WHERE_MISSING", "WHERE_REDUNDANT", "WHERE_ERROR"}),
    "group": frozenset({"GROUP_BY_MISSING", "GROUP_BY_REDUNDANT", "GROUP_BY_ERROR",
                        "HAVING_MISSING", "HAVING_REDUNDANT", "HAVING_ERROR"}),
}


def categories_of(tags: Iterable[str]) -> set[str]:
    """The coarse categories (select / join / where / group) that ``tags`` touch."""
    tags = set(tags)
    return {name for name, members in CATEGORIES.items() if tags & members}


def prediction_tags(pred_sql: str | None, gold_sql: str, settings: ODTSettings | None = None) -> tuple[str, ...]:
    """ODT's tags for one prediction (``(PARSE_ERROR,)`` when there is no SQL)."""
    if pred_sql is None:
        return (PARSE_ERROR,)
    return diagnose(pred_sql, gold_sql, settings).tags


def mismatch_rates(tag_lists: Iterable[Iterable[str]]) -> dict[str, Any]:
    """Table 8's row from the ODT tags of each prediction of a split.

    Returns ``{"n", "n_profiled", "select", "join", "where", "group", "avg", "parse_error_rate",
    "gold_unavailable"}``; rates are None when no prediction could be profiled.
    """
    n = profiled = parse_errors = gold_missing = 0
    counts = dict.fromkeys(CATEGORIES, 0)
    for tags in tag_lists:
        tags = tuple(tags)
        n += 1
        if GOLD_UNAVAILABLE in tags:
            gold_missing += 1
            continue
        if PARSE_ERROR in tags:
            parse_errors += 1
            continue
        profiled += 1
        for name in categories_of(tags):
            counts[name] += 1
    rates: dict[str, Any] = {name: (counts[name] / profiled if profiled else None) for name in CATEGORIES}
    rates["avg"] = sum(rates[name] for name in CATEGORIES) / len(CATEGORIES) if profiled else None
    scored = n - gold_missing
    return {
        "n": n,
        "n_profiled": profiled,
        **rates,
        "parse_error_rate": parse_errors / scored if scored else None,
        "gold_unavailable": gold_missing,
    }
