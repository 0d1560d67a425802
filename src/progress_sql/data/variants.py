"""The robustness suite: Syn, Realistic and DK variants of the dev and test examples.

Each variant re-words an original example the way the published suite it mirrors was made
(Spider-Syn, Spider-Realistic, Spider-DK); ids are the original's plus ``-syn``,
``-realistic`` or ``-dk``, ``meta`` names the original (``of``) and what changed.

Rules
-----
- **Syn** (Spider-Syn): every table and column noun the question uses is replaced by a synonym
  from the domain catalogue (``students`` → ``pupils``, ``salary`` → ``pay``), one synonym per
  noun within a question; values and structure are untouched. Gold SQL unchanged. Produced
  when at least one noun has a synonym (``meta.swaps`` lists the pairs).
- **Realistic** (Spider-Realistic): explicit column mentions are removed where the column is
  implied: a projected name column ("the names of students" → "the students") and
  conditions on columns that declare an implicit wording ("whose age is above 20" →
  "older than 20", "whose city is Paris" → "from Paris", "whose genre is Comedy" →
  "Comedy movies"). Conditions joined by OR keep their explicit form. Gold SQL unchanged.
  Produced when at least one mention was removed (``meta.implicit`` lists them).
- **DK** (Spider-DK): a condition on a column that has a domain-knowledge rule is replaced by
  the rule's condition and worded by the rule alone ("age >= 65" ↔ "elderly", "balance < 0"
  ↔ "overdrawn", "return_date IS NULL" ↔ "outstanding"), with no evidence: the model has to
  know what the word means. Gold SQL is rewritten to the rule's condition and re-checked
  (executes, non-empty, hardness recomputed); an original that already carried the rule with
  BIRD-style evidence becomes a DK variant by dropping the evidence. Produced only where a
  rule applies (conditions under OR and comparisons with a subquery are not rewritten);
  coverage is reported in the manifest.

Originals whose gold result is empty get no variants: every variant gold returns rows.
"""

from __future__ import annotations

from dataclasses import replace

from progress_sql.params import Settings
from progress_sql.data.drafting import Draft, apply_dk_rules, make_example, run_gold
from progress_sql.data.patterns import ask
from progress_sql.data.phrasing import mentions
from progress_sql.data.query import render_sql
from progress_sql.corpus.records import Example
from progress_sql.sources import VARIANTS
from progress_sql.sql import hardness


def syn_variant(draft: Draft) -> Example | None:
    """The Syn variant of ``draft``, or None when no noun of its question has a synonym."""
    original = draft.example.question
    question, ph = ask(draft.fam, draft.ctx.domain, draft.select, draft.salt, "syn")
    # Only swaps that show: the schema noun was in the question and its synonym now is.
    swaps = [[w, s] for w, s in ph.swaps if mentions(original, w) and mentions(question, s)]
    if not swaps or question == original:
        return None
    return _variant(draft.example, "syn", question=question, meta={"swaps": swaps})


def realistic_variant(draft: Draft) -> Example | None:
    """The Realistic variant of ``draft``, or None when no column mention can be left out."""
    original = draft.example.question
    question, ph = ask(draft.fam, draft.ctx.domain, draft.select, draft.salt, "realistic")
    # Only mentions that really went: the noun occurs fewer times than in the original.
    implicit = sorted({n for n in ph.implicit if mentions(question, n) < mentions(original, n)})
    if not implicit or question == original:
        return None
    return _variant(draft.example, "realistic", question=question, meta={"implicit": implicit})


def dk_variant(draft: Draft, settings: Settings) -> Example | None:
    """The DK variant of ``draft``, or None when no domain-knowledge rule applies (or the
    rewritten gold is empty, ambiguous at a LIMIT, or too slow)."""
    ex = draft.example
    if ex.evidence:  # already phrased by its rule: the variant withholds the definition
        return _variant(ex, "dk", evidence="", meta={"rules": ex.evidence.split("; ")})
    sel, rules = apply_dk_rules(draft.select, draft.ctx.domain)
    if not rules:
        return None
    why, res = run_gold(draft.ctx, sel, settings)
    if why or not res.rows:
        return None
    base = make_example(ex.id, draft.ctx, draft.fam, sel, draft.salt, hardness(render_sql(sel)), [])
    return _variant(base, "dk", meta={"rules": [r.evidence for r in rules]})


def _variant(ex: Example, name: str, meta: dict, **changes: object) -> Example:
    return replace(ex, id=f"{ex.id}-{name}", meta={**ex.meta, "variant": name, "of": ex.id, **meta}, **changes)


def build_variants(drafts: list[Draft], settings: Settings) -> tuple[dict[str, list[Example]], dict[str, float]]:
    """Every variant of ``drafts`` (the dev and test examples) and each variant's coverage:
    the share of originals that got one."""
    out: dict[str, list[Example]] = {v: [] for v in VARIANTS}
    for draft in drafts:
        if draft.empty:
            continue
        for name, made in (("syn", syn_variant(draft)), ("realistic", realistic_variant(draft)),
                           ("dk", dk_variant(draft, settings))):
            if made is not None:
                out[name].append(made)
    coverage = {v: (len(out[v]) / len(drafts) if drafts else 0.0) for v in VARIANTS}
    return out, coverage


__all__ = ["build_variants", "dk_variant", "mentions", "realistic_variant", "syn_variant"]
