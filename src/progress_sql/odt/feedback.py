"""Verbalised ODT feedback: the round-2+ user message of progress-sql.md, Appendix F.

The text is a function of the tag list alone, so it cannot carry a gold identifier, value or
score. When the prediction does not parse the message is the template with PARSE_ERROR (its
description asks to fix syntax and identifiers first). When the gold query cannot be
profiled, Appendix F's note applies: a generic fallback message without clause-level codes.
"""

from __future__ import annotations

from typing import Iterable

from progress_sql.odt.tags import GOLD_UNAVAILABLE, TAGS, VALUE_MISMATCH, ordered

DB_ENGINE = "SQLite"

# Appendix F, "User Prompt — Round 2+ (ODT Feedback Injection)".
FEEDBACK_TEMPLATE = (
    "Feedback: your previous SQL has structural issues: {error_codes}. {error_descriptions} "
    "Revise your previous answer using these issues. Revise your previous answer for {db_engine}. "
    "Put step-by-step reasoning inside <think>...</think>, then output exactly one corrected "
    "{db_engine} query inside <sql>...</sql>. Do not output any text outside those tags."
)
# A wrong value in a structurally matching query has no structural issue to name.
VALUE_TEMPLATE = FEEDBACK_TEMPLATE.replace("has structural issues", "has issues")
# Appendix F's note: the generic message when no clause-level diagnosis is possible.
FALLBACK_FEEDBACK = (
    "Feedback: your previous SQL is not correct yet. Fix syntax and identifiers first, then check "
    "each clause against the question. Revise your previous answer for {db_engine}. "
    "Put step-by-step reasoning inside <think>...</think>, then output exactly one corrected "
    "{db_engine} query inside <sql>...</sql>. Do not output any text outside those tags."
)


def feedback_text(tags: Iterable[str], db_engine: str = DB_ENGINE) -> str:
    """The feedback message for a tag list ('' for no tags). Tags are de-duplicated and put in
    canonical order; GOLD_UNAVAILABLE gives the generic fallback; an unknown tag is a
    ValueError naming it."""
    tags = ordered(tags)
    if not tags:
        return ""
    if GOLD_UNAVAILABLE in tags:
        return FALLBACK_FEEDBACK.format(db_engine=db_engine)
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        raise ValueError(f"unknown ODT tag(s): {', '.join(unknown)}; known: {', '.join(TAGS)}")
    template = VALUE_TEMPLATE if tags == (VALUE_MISMATCH,) else FEEDBACK_TEMPLATE
    return template.format(
        error_codes=", ".join(tags),
        error_descriptions=" ".join(TAGS[t] for t in tags),
        db_engine=db_engine,
    )
