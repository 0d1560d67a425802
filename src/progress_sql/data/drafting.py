"""Drawing a split's examples: sample pattern families, check each gold query on its database,
fill the hardness quotas.

A candidate is kept when its gold SQL is new for its database, its computed Spider hardness
still has room in the split's quota (``data.hardness_mix``), it executes within
``data.gold_timeout_s``, a top-k answer is not decided by a tie, it matches itself under EX
(whose DISTINCT stripping must not overflow the row cap), and its result is non-empty
(empty results are kept only up to ``data.empty_gold_share`` of the split: on toy data
``[] == []`` would reward wrong SQL).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Callable

from progress_sql.params import Settings
from progress_sql.data.domains.spec import Domain, DKRule
from progress_sql.data.patterns import FAMILY_BY_NAME, LEVELS, DbContext, Family, ask, families_for
from progress_sql.data.query import Col, Cond, Select, map_conds, reasoning, render_sql
from progress_sql.corpus.records import CorpusError, Example, question_key
from progress_sql.sql import ExecResult, GoldCache, execute, execution_match, hardness, strip_distinct

_ATTEMPTS_PER_EXAMPLE = 60  # a safety bound: give up (with a message) after this many tries each
_ROW_HEADROOM = 4  # a DISTINCT gold's row bag stays under max_rows / this (neighbours grow)


@dataclass
class Draft:
    """An accepted example and what it was built from (the variants re-word it)."""

    example: Example
    family: str
    select: Select
    ctx: DbContext
    empty: bool  # the gold result is empty
    salt: str  # seeds the example's wording choices

    @property
    def fam(self) -> Family:
        return FAMILY_BY_NAME[self.family]


@dataclass
class DrawStats:
    attempts: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1


def level_quotas(size: int, settings: Settings) -> dict[str, int]:
    """Examples per hardness level: ``size`` split by ``data.hardness_mix`` (largest remainder)."""
    mix = settings.data.hardness_mix.model_dump()
    total = sum(mix.values())
    exact = {k: size * mix[k] / total for k in LEVELS}
    quotas = {k: int(v) for k, v in exact.items()}
    for k in sorted(LEVELS, key=lambda k: exact[k] - quotas[k], reverse=True)[: size - sum(quotas.values())]:
        quotas[k] += 1
    return quotas


def apply_dk_rules(sel: Select, domain: Domain) -> tuple[Select, list[DKRule]]:
    """Rewrite every plain condition on a column with a domain-knowledge rule into the rule's
    condition (phrased by the rule). Conditions under OR and comparisons with a subquery are
    left alone; returns the rewritten query and the rules used (empty: nothing applied)."""
    used: list[DKRule] = []

    def rewrite(holder: Select, cond: Cond) -> Cond:
        if cond.dk is not None or not isinstance(cond.left, Col) or isinstance(cond.value, Select):
            return cond
        if holder.conj != "AND":
            return cond
        rule = domain.dk_rule(holder.table_of(cond.left), cond.left.name)
        if rule is None:
            return cond
        if rule not in used:
            used.append(rule)
        value = tuple(rule.value) if isinstance(rule.value, (list, tuple)) else rule.value
        return Cond(cond.left, rule.op, value, dk=rule)

    new = map_conds(sel, rewrite)
    return (new, used) if used else (sel, [])


def _tie_probe(sel: Select) -> Select | None:
    """The query's ORDER BY keys for limit+1 rows: a tie at the cut makes the answer arbitrary."""
    if sel.limit is None or not sel.order_by or sel.set_op:
        return None
    return replace(sel, items=sel.order_by, distinct=False, limit=sel.limit + 1)


def run_gold(ctx: DbContext, sel: Select, settings: Settings) -> tuple[str, ExecResult]:
    """Render and execute a gold query: ("", result) when it may be kept, else (reason, result).
    A gold that fails to execute is a generator bug and raises CorpusError."""
    sql = render_sql(sel)
    timeout = settings.data.gold_timeout_s

    def run(query: str) -> ExecResult:
        return execute(ctx.path, query, timeout_s=timeout, settings=settings.sandbox)

    res = run(sql)
    if res.error == "timeout":
        return "timeout", res
    if not res.ok:
        raise CorpusError(f"generated gold query fails on {ctx.db_id} ({res.error}: {res.message}): {sql}")
    # EX compares results with DISTINCT stripped (as Spider's evaluator does): a gold whose
    # stripped form overflows the row cap could not even match itself, here or on a
    # neighbour database (which may hold more rows), so it must stay well below the cap.
    if sel.distinct or res.truncated:
        bag = run(strip_distinct(sql))
        if not bag.ok or bag.truncated or len(bag.rows) * _ROW_HEADROOM > settings.sandbox.max_rows:
            return "too many rows", res
    if not execution_match(ctx.path, sql, sql, timeout_s=timeout, gold_cache=GoldCache(0)):
        return "not self-matching", res
    probe = _tie_probe(sel)
    if probe is not None:
        keys, cut = run(render_sql(probe)), probe.limit - 1  # type: ignore[operator]
        if keys.ok and len(keys.rows) > cut and keys.rows[cut - 1] == keys.rows[cut]:
            return "tie", res
    return "", res


def make_example(ex_id: str, ctx: DbContext, fam: Family, sel: Select, salt: str, level: str,
                 evidence: list[DKRule]) -> Example:
    """The record of an accepted query: question, gold SQL, hardness, evidence, reasoning."""
    question, _ = ask(fam, ctx.domain, sel, salt)
    return Example(
        id=ex_id,
        db_id=ctx.db_id,
        question=question,
        gold_sql=render_sql(sel),
        hardness=level,
        evidence="; ".join(r.evidence for r in evidence),
        reasoning=reasoning(sel),
        source="bundled",
        meta={"pattern": fam.name},
    )


@dataclass
class _Draw:
    """A split's draw so far: examples taken per hardness level and per database, the golds
    (and, for the in-domain split, the questions) a new example may not repeat, its empty golds."""

    quotas: dict[str, int]
    max_empty: int
    per_db: dict[str, int]
    seen: set[tuple[str, str]]  # (db_id, gold SQL)
    seen_questions: set[tuple[str, str]] | None  # question_key; None: questions may repeat
    taken: dict[str, int] = field(default_factory=lambda: {k: 0 for k in LEVELS})
    n_empty: int = 0

    def attempt(self, rng: random.Random, contexts: list[DbContext], settings: Settings, ex_id: str) -> Draft | str:
        """One candidate: the accepted draft (counted), or why it was rejected."""
        level = rng.choices(LEVELS, weights=[self.quotas[k] - self.taken[k] for k in LEVELS])[0]
        fam = rng.choice(families_for(level))
        ctx = min(contexts, key=lambda c: (self.per_db[c.db_id], rng.random()))
        sel = fam.sample(ctx, rng)
        if sel is None:
            return "no sample"
        rules: list[DKRule] = []
        if rng.random() < settings.data.evidence_share:
            sel, rules = apply_dk_rules(sel, ctx.domain)
        sql = render_sql(sel)
        if (ctx.db_id, sql) in self.seen:
            return "duplicate"
        level_got = hardness(sql)
        if self.taken[level_got] >= self.quotas[level_got]:
            return f"quota {level_got}"
        why, res = run_gold(ctx, sel, settings)
        if why:
            return why
        empty = not res.rows
        if empty and self.n_empty >= self.max_empty:
            return "empty"
        salt = f"{settings.data.seed}:{ctx.db_id}:{sql}"
        ex = make_example(ex_id, ctx, fam, sel, salt, level_got, rules)
        question = question_key(ctx.db_id, ex.question)
        if self.seen_questions is not None and question in self.seen_questions:
            return "duplicate question"
        self.n_empty += empty
        self.seen.add((ctx.db_id, sql))
        if self.seen_questions is not None:
            self.seen_questions.add(question)
        self.taken[level_got] += 1
        self.per_db[ctx.db_id] += 1
        return Draft(ex, fam.name, sel, ctx, empty, salt)

    def shortfall(self, split: str, size: int, drawn: int, stats: DrawStats) -> CorpusError:
        short = {k: self.quotas[k] - self.taken[k] for k in LEVELS if self.taken[k] < self.quotas[k]}
        return CorpusError(f"{split}: drew only {drawn} of {size} examples in {stats.attempts - 1} attempts "
                           f"(levels short: {short}; rejected: {stats.rejected}); lower the split size or "
                           f"change data.hardness_mix")


def draw_examples(split: str, contexts: list[DbContext], size: int, settings: Settings,
                  on_accept: Callable[[], None] = lambda: None,
                  exclude: list[Example] | None = None) -> tuple[list[Draft], DrawStats]:
    """``size`` examples over ``contexts`` (balanced across databases), ids ``bundled-<split>-NNNNN``.
    ``exclude``: examples (train's) whose gold SQL or question (``question_key``) on the same
    database a drawn example may not repeat (the in-domain split)."""
    rng = random.Random(f"{settings.data.seed}:examples:{split}")
    draw = _Draw(level_quotas(size, settings), int(size * settings.data.empty_gold_share),
                 per_db={c.db_id: 0 for c in contexts}, seen={(ex.db_id, ex.gold_sql) for ex in exclude or ()},
                 seen_questions=None if exclude is None else {question_key(ex.db_id, ex.question) for ex in exclude})
    drafts: list[Draft] = []
    stats = DrawStats()
    while len(drafts) < size:
        stats.attempts += 1
        if stats.attempts > size * _ATTEMPTS_PER_EXAMPLE:
            raise draw.shortfall(split, size, len(drafts), stats)
        draft = draw.attempt(rng, contexts, settings, f"bundled-{split}-{len(drafts):05d}")
        if isinstance(draft, str):
            stats.reject(draft)
            continue
        drafts.append(draft)
        on_accept()
    return drafts, stats


__all__ = ["Draft", "DrawStats", "apply_dk_rules", "draw_examples", "level_quotas", "make_example", "run_gold"]
