"""The database a family samples from: rows in memory, join paths, conditions whose values
come from the data (so filters hit rows)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from progress_sql.data.domains.spec import Column, Domain
from progress_sql.data.generate_db import Rows
from progress_sql.data.mess import allows, sorts
from progress_sql.data.query import Agg, Col, Cond, Join, Select

_FILTER_KINDS = ("category", "number", "year", "date", "flag", "label")
_MEASURE_KINDS = ("number", "year")
_OPS = {  # operator weights by column kind
    "category": (("=", 5), ("!=", 1), ("IN", 2)),
    "label": (("=", 2), ("LIKE", 3)),
    "number": ((">", 3), ("<", 3), (">=", 1), ("<=", 1), ("BETWEEN", 2)),
    "year": ((">", 3), ("<", 3), ("=", 2), (">=", 1), ("<=", 1), ("BETWEEN", 1)),
    "date": ((">", 3), ("<", 3), ("BETWEEN", 2)),
    "flag": (("=", 1),),
}
_FEW_DISTINCT = 12  # a number column with at most this many values is also filtered with "="
_MAX_GROUPS = 40  # a text column with more distinct values is not grouped by (names, codes)
_DK_WEIGHT = 3  # columns with a domain-knowledge rule are filtered this many times as often


@dataclass(frozen=True)
class Step:
    """One join: ``src.src_col = dst.dst_col``; ``forward`` when src holds the foreign key."""

    src: str
    dst: str
    src_col: str
    dst_col: str
    forward: bool
    rel: str  # the foreign key's phrase (child → parent)


@dataclass(frozen=True)
class JoinPath:
    tables: tuple[str, ...]
    steps: tuple[Step, ...]

    @property
    def forward(self) -> bool:
        return all(s.forward for s in self.steps)

    def joins(self) -> tuple[Join, ...]:
        return tuple(Join(Col(i, s.src_col), Col(i + 1, s.dst_col)) for i, s in enumerate(self.steps))


def join_paths(domain: Domain, max_hops: int = 3) -> list[JoinPath]:
    """Every simple path of 1..max_hops foreign-key joins, in catalogue order."""
    edges: dict[str, list[Step]] = {t.name: [] for t in domain.tables}
    for t in domain.tables:
        for fk in t.foreign_keys:
            pk = domain.table(fk.ref).primary_key[0]
            edges[t.name].append(Step(t.name, fk.ref, fk.name, pk, True, fk.rel))
            edges[fk.ref].append(Step(fk.ref, t.name, pk, fk.name, False, fk.rel))
    paths: list[JoinPath] = []

    def walk(tables: tuple[str, ...], steps: tuple[Step, ...]) -> None:
        if steps:
            paths.append(JoinPath(tables, steps))
        if len(steps) == max_hops:
            return
        for step in edges[tables[-1]]:
            if step.dst not in tables:
                walk(tables + (step.dst,), steps + (step,))

    for t in domain.tables:
        walk((t.name,), ())
    return paths


@dataclass
class DbContext:
    """One database while its examples are drawn: schema, rows in memory, file path."""

    db_id: str
    domain: Domain
    rows: Rows
    path: Path
    _values: dict = field(default_factory=dict, repr=False)

    @cached_property
    def paths(self) -> list[JoinPath]:
        return join_paths(self.domain)

    def values(self, table: str, column: str) -> list:
        """Non-null values of a column, in row order."""
        key = (table, column)
        if key not in self._values:
            t = self.domain.table(table)
            i = [c.name for c in t.columns].index(column)
            self._values[key] = [r[i] for r in self.rows[table] if r[i] is not None]
        return self._values[key]

    def sorted_values(self, table: str, column: str) -> list:
        key = (table, column, "sorted")
        if key not in self._values:
            self._values[key] = sorted(self.values(table, column))
        return self._values[key]

    def has_nulls(self, table: str, column: str) -> bool:
        return len(self.values(table, column)) < len(self.rows[table])

    def columns(self, table: str, kinds: tuple[str, ...], exclude: tuple[str, ...] = (),
                not_null: bool = False) -> list[Column]:
        return [c for c in self.domain.table(table).columns
                if c.kind in kinds and c.name not in exclude and not (not_null and c.nulls)]

    def labelled(self) -> list[str]:
        return [t.name for t in self.domain.tables if t.label is not None and not t.distractor]

    def asked(self) -> list[str]:
        """The tables questions are asked about: all but the distractors (archives, logs)."""
        return [t.name for t in self.domain.tables if not t.distractor]


def quantile(values: list, rng: random.Random, lo: float, hi: float):
    """A value of sorted ``values`` at a random quantile in [lo, hi]."""
    return values[int(rng.uniform(lo, hi) * (len(values) - 1))]


def make_cond(ctx: DbContext, rng: random.Random, t: int, table: str, column: Column,
              op: str | None = None) -> Cond | None:
    """A condition on ``column`` whose value comes from the data; None when none fits."""
    values = ctx.values(table, column.name)
    if not values or (op is not None and not allows(column, op)):
        return None
    if op is None:
        ops = list(_OPS[column.kind])
        if column.kind == "number" and len(set(values)) <= _FEW_DISTINCT:
            ops.append(("=", 2))
        if column.nulls and ctx.has_nulls(table, column.name):
            ops += [("IS NULL", 1), ("IS NOT NULL", 1)]
        ops = [(o, w) for o, w in ops if allows(column, o)]  # what a messy column leaves answerable
        if column.kind == "date" and not sorts(column):
            ops.append(("=", 3))  # a day written 15/03/2021 is asked for as written
        if not ops:
            return None
        op = rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
    left = Col(t, column.name)
    if op in ("IS NULL", "IS NOT NULL"):
        return Cond(left, op)
    if op in ("=", "!="):
        return Cond(left, op, rng.choice(values))
    if op in (">", "<", ">=", "<="):
        return Cond(left, op, quantile(ctx.sorted_values(table, column.name), rng, 0.15, 0.85))
    if op == "BETWEEN":
        sv = ctx.sorted_values(table, column.name)
        a, b = quantile(sv, rng, 0.1, 0.4), quantile(sv, rng, 0.6, 0.9)
        return Cond(left, op, (a, b)) if a < b else None
    if op == "IN":
        distinct = sorted(set(values))
        k = rng.choice((2, 2, 3))
        if len(distinct) <= k:
            return None
        return Cond(left, op, tuple(sorted(rng.sample(distinct, k))))
    if op == "LIKE":
        value = str(rng.choice(values))
        words = [w for w in value.split() if len(w) >= 4 and w.isalpha()]
        if not words:
            return None
        word = rng.choice(words)
        if sum(word.lower() in str(v).lower() for v in values) > len(values) // 2:
            return None  # a word most values share ("Arena") filters nothing
        starts = value.startswith(word) and rng.random() < 0.3 and not column.noise  # a stray space defeats a prefix
        return Cond(left, op, f"{word}%" if starts else f"%{word}%")
    raise ValueError(f"unknown operator {op}")


def pick_filter(ctx: DbContext, rng: random.Random, t: int, table: str, exclude: tuple[str, ...] = (),
                label_eq: bool = True) -> Cond | None:
    """A condition on a random value column of ``table``; columns with a domain-knowledge
    rule are drawn more often (_DK_WEIGHT), so the DK variant and the evidence have material."""
    cols = ctx.columns(table, _FILTER_KINDS, exclude)
    if not cols:
        return None
    weights = [_DK_WEIGHT if ctx.domain.dk_rule(table, c.name) else 1 for c in cols]
    for _ in range(3):
        col = rng.choices(cols, weights)[0]
        op = "LIKE" if col.kind == "label" and not label_eq else None
        cond = make_cond(ctx, rng, t, table, col, op)
        if cond is not None:
            return cond
    return None


def pick_filters(ctx: DbContext, rng: random.Random, t: int, table: str, n: int,
                 exclude: tuple[str, ...] = (), label_eq: bool = True) -> tuple[Cond, ...] | None:
    """``n`` conditions on distinct columns of ``table``."""
    conds: list[Cond] = []
    used = list(exclude)
    for _ in range(n):
        c = pick_filter(ctx, rng, t, table, tuple(used), label_eq)
        if c is None:
            return None
        conds.append(c)
        used.append(c.left.name)
    return tuple(conds)


def label_of(ctx: DbContext, table: str) -> str:
    """The name column of ``table`` (callers only pass tables that have one)."""
    return ctx.domain.table(table).label.name  # type: ignore[union-attr]


def pick_measure(ctx: DbContext, rng: random.Random, table: str, not_null: bool = False,
                 additive: bool = False) -> Column | None:
    """A random number or year column of ``table`` (None when it has none)."""
    cols = [c for c in ctx.columns(table, _MEASURE_KINDS, not_null=not_null) if c.additive or not additive]
    return rng.choice(cols) if cols else None


def pick_category(ctx: DbContext, rng: random.Random, table: str) -> Column | None:
    """A random text column of ``table`` with few distinct values: one to group by."""
    cols = [c for c in ctx.columns(table, ("category",)) if len(set(ctx.values(table, c.name))) <= _MAX_GROUPS]
    return rng.choice(cols) if cols else None


def any_table(ctx: DbContext, rng: random.Random) -> str:
    """A random table of the database that questions ask about, labelled or not."""
    return rng.choice(ctx.asked())


def filtered_by(ctx: DbContext, rng: random.Random, table: str, column: Column | None,
                counts: tuple[int, ...]) -> tuple[Cond, ...] | None:
    """The preamble of the families over one column of ``table`` (a category to group by, a
    measure to aggregate): ``rng.choice(counts)`` filters on its other columns; None when
    ``column`` is None (nothing fits) or the filters cannot be drawn."""
    if column is None:
        return None
    return pick_filters(ctx, rng, 0, table, rng.choice(counts), exclude=(column.name,))


def over_one_table(pick: Callable[[DbContext, random.Random, str], Column | None], counts: tuple[int, ...] = ()):
    """A family over one table: the decorated ``build(ctx, rng, table, column, conds)`` gets a
    random table, the column ``pick`` chose there and, given ``counts``, ``filtered_by``'s
    filters on its other columns (else none: ``()``). The sampler is None when nothing fits."""

    def decorate(build: Callable[..., Select | None]) -> Callable[[DbContext, random.Random], Select | None]:
        def sample(ctx: DbContext, rng: random.Random) -> Select | None:
            table = any_table(ctx, rng)
            column = pick(ctx, rng, table)
            conds = filtered_by(ctx, rng, table, column, counts) if counts else ()
            return None if column is None or conds is None else build(ctx, rng, table, column, conds)
        return sample
    return decorate


def agg_fns(measure: Column, fns: tuple[str, ...] = ("AVG", "MAX", "MIN")) -> list[str]:
    """The aggregate functions a question may ask of ``measure``: ``fns``, and SUM when it adds up."""
    return [*fns] + (["SUM"] if measure.additive else [])


def measure_or_count(rng: random.Random, measure: Column | None, share: float,
                     fns: tuple[str, ...] = ("AVG", "MAX", "MIN")) -> Agg:
    """An aggregate of ``measure`` (column 0) with probability ``share`` when there is one, else COUNT(*)."""
    if measure is not None and rng.random() < share:
        return Agg(rng.choice(agg_fns(measure, fns)), Col(0, measure.name))
    return Agg("COUNT")


def pick_path(ctx: DbContext, rng: random.Random, hops: int, **kw: bool | None) -> JoinPath | None:
    """A random join path of ``paths_of(ctx, hops, **kw)``; None when there is none."""
    paths = paths_of(ctx, hops, **kw)
    return rng.choice(paths) if paths else None


def paths_of(ctx: DbContext, hops: int, forward: bool | None = None, start_label: bool = True,
             end_label: bool = False) -> list[JoinPath]:
    """Join paths of ``hops`` joins; only child → parent ones when ``forward``; whose first /
    last table has a name column when asked."""
    out = []
    for p in ctx.paths:
        if len(p.steps) != hops or (forward is not None and p.forward != forward):
            continue
        if start_label and ctx.domain.table(p.tables[0]).label is None:
            continue
        if end_label and ctx.domain.table(p.tables[-1]).label is None:
            continue
        out.append(p)
    return out
