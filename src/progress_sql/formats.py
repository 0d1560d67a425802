"""Output formats: the one home of their tags, stop strings, parsing and answer templates.

Everything that depends on how a model's answer is written reads it from here: the prompts
(``envs.prompts``), the environments, the rewards, generation's stop strings (training,
evaluation, serving) and the SFT / oracle answers. Three formats:

- ``think_sql`` (Progress-SQL, one-shot): ``<think>…</think><sql>…</sql>``.
- ``reasoning_answer`` (Reasoning-SQL): ``<reasoning>…</reasoning><answer>…</answer>``.
- ``trail`` (SQL-Trail, SkyRL-SQL): ``<think>…</think>`` then exactly one of ``<sql>…</sql>``
  (a tool call) or ``<solution>…</solution>`` (the final answer). ``<observation>`` is written
  by the environment, so model text that contains it is malformed.

Well-formedness is strict: each tag of the format appears exactly once, in order, with nothing
but whitespace outside the blocks, and the SQL block is not empty. Extraction is lenient, so
that an output with a bad format still gets its SQL scored: the last complete block wins; an
opened but never closed block (a truncated generation) yields the text after its opening tag.
Tags are matched case-sensitively, as the prompts spell them.

Only ``str.find``/``rfind`` and one anchored regex are used: linear time on any input, so a
megabyte of garbage cannot trigger catastrophic backtracking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

FormatName = Literal["think_sql", "reasoning_answer", "trail"]
FORMATS: tuple[FormatName, ...] = ("think_sql", "reasoning_answer", "trail")
OutputKind = Literal["sql", "solution", "answer"]
# Every tag a model or environment writes, in a fixed order (the tiny tokenizer gives each one
# token, in this order).
ALL_TAGS = ("think", "sql", "reasoning", "answer", "solution", "observation")


@dataclass(frozen=True)
class ParsedOutput:
    """``well_formed``: the output follows its format; ``sql``: the extracted SQL (None when
    there is none); ``kind``: which block it came from; ``reason``: why it is malformed ('' if not).
    """

    well_formed: bool
    sql: str | None
    kind: OutputKind | None
    reason: str


# (reasoning tag, answer tags with the kind each yields) per format. The first answer tag is
# the final answer's (for ``trail`` it is looked for first, as SkyRL-SQL's environment does);
# ``trail``'s second is the tool call.
_LAYOUT: dict[str, tuple[str, tuple[tuple[str, OutputKind], ...]]] = {
    "think_sql": ("think", (("sql", "sql"),)),
    "reasoning_answer": ("reasoning", (("answer", "answer"),)),
    "trail": ("think", (("solution", "solution"), ("sql", "sql"))),
}
_FORBIDDEN = {"trail": ("observation",)}
# Formats of one answer block (no tool call): what the single-turn environment accepts.
SINGLE_ANSWER_FORMATS: tuple[FormatName, ...] = tuple(f for f in FORMATS if len(_LAYOUT[f][1]) == 1)


def _layout(fmt: str) -> tuple[str, tuple[tuple[str, OutputKind], ...]]:
    try:
        return _LAYOUT[fmt]
    except (KeyError, TypeError):
        raise KeyError(f"unknown output format {fmt!r}; known: {', '.join(FORMATS)}") from None


def answer_tags(fmt: FormatName) -> tuple[str, str]:
    """``(reasoning tag, final-answer tag)`` of ``fmt``: what its prompt asks for."""
    reasoning, answers = _layout(fmt)
    return reasoning, answers[0][0]


def stop_strings(fmt: FormatName) -> tuple[str, ...]:
    """Where a generation in ``fmt`` stops besides eos: right after an answer block, so nothing
    trails the answer (and a tool call never writes its own ``<observation>``)."""
    return tuple(sorted(f"</{tag}>" for tag, _ in _layout(fmt)[1]))


def answer_text(fmt: FormatName, reasoning: str, sql: str) -> str:
    """A well-formed final answer in ``fmt``: ``reasoning`` and ``sql`` in its tags (the SFT
    targets and the oracle's answers)."""
    reason, answer = answer_tags(fmt)
    return f"<{reason}>{reasoning.strip()}</{reason}>\n<{answer}>{sql.strip()}</{answer}>"

_FENCE_LANG = re.compile(r"(?:sqlite|sql)(?![A-Za-z0-9_])", re.IGNORECASE)


def strip_fences(sql: str) -> str:
    """Remove a Markdown code fence (```sql … ```) around SQL, and surrounding whitespace."""
    text = sql.strip()
    if text.startswith("```"):
        text = text[3:]
        lang = _FENCE_LANG.match(text)
        if lang:
            text = text[lang.end():]
        if text.rstrip().endswith("```"):
            text = text.rstrip()[:-3]
    return text.strip()


def _block_content(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>…</tag>`` block, else of an unclosed ``<tag>``."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    close_at = text.rfind(closing)
    if close_at != -1:
        open_at = text.rfind(opening, 0, close_at)
        if open_at != -1:
            return text[open_at + len(opening) : close_at]
    open_at = text.rfind(opening)
    if open_at != -1 and open_at > close_at:
        return text[open_at + len(opening) :]
    return None


def _extract(text: str, fmt: str) -> tuple[str | None, OutputKind | None]:
    for tag, kind in _LAYOUT[fmt][1]:
        content = _block_content(text, tag)
        if content is not None:
            sql = strip_fences(content)
            return (sql or None), kind
    return None, None


def _layout_error(text: str, fmt: str, kind: OutputKind | None) -> str:
    """'' when ``text`` is exactly ws <R>…</R> ws <A>…</A> ws for the format, else the reason."""
    reasoning_tag, answers = _LAYOUT[fmt]
    for tag in _FORBIDDEN.get(fmt, ()):
        if f"<{tag}>" in text or f"</{tag}>" in text:
            return f"model text contains <{tag}>, which only the environment writes"
    answer_tag = next((t for t, k in answers if k == kind), answers[0][0])
    expected = [f"<{reasoning_tag}>", f"</{reasoning_tag}>", f"<{answer_tag}>", f"</{answer_tag}>"]
    every_tag = {f"<{t}>" for t, _ in answers} | {f"</{t}>" for t, _ in answers}
    every_tag |= {f"<{reasoning_tag}>", f"</{reasoning_tag}>"}
    for tag in sorted(every_tag):
        if text.count(tag) > 1:
            return f"{tag} appears more than once"
    seen = sorted((text.find(tag), tag) for tag in every_tag if tag in text)
    if [tag for _, tag in seen] != expected:
        shown = " ".join(tag for _, tag in seen) or "none"
        return f"expected tags {' '.join(expected)}, found {shown}"
    (p0, t0), (p1, t1), (p2, t2), (p3, t3) = seen
    outside = (text[:p0], text[p1 + len(t1) : p2], text[p3 + len(t3) :])
    if any(part.strip() for part in outside):
        return "text outside the tags"
    return ""


def parse_output(text: str, fmt: FormatName) -> ParsedOutput:
    """Parse a raw model output in format ``fmt``; never raises for any text."""
    if fmt not in _LAYOUT:
        raise ValueError(f"unknown output format {fmt!r}; known: {', '.join(FORMATS)}")
    if not isinstance(text, str):
        return ParsedOutput(False, None, None, f"output is {type(text).__name__}, not text")
    sql, kind = _extract(text, fmt)
    reason = _layout_error(text, fmt, kind)
    if not reason and sql is None:
        reason = "empty SQL block"
    return ParsedOutput(well_formed=not reason, sql=sql, kind=kind, reason=reason)
