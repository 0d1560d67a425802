"""Corruptions of a gold SQL query: the wrong first answers of SFT revision dialogues.

Each corruption is one typical Text-to-SQL mistake made on the sqlglot tree of the gold query
(SQLite dialect): drop a WHERE predicate, flip a comparison, swap an aggregate, drop GROUP BY,
drop a JOIN, pick a wrong column, drop or flip ORDER BY, change LIMIT, toggle DISTINCT, drop a
selected item. A corruption that does not apply to a query gives None. Whether the result
really differs from the gold is decided by executing it (``sft.build_sft_examples`` runs the
dialogue through the real environment); here only a textual difference is guaranteed.
"""

from __future__ import annotations

import random
from typing import Callable, Mapping, Sequence

import sqlglot
from sqlglot import exp

from progress_sql.corpus.schema import parse_ddl
from progress_sql.sql.parse import SQLParseError, parse_one

Schema = Mapping[str, Sequence[str]]  # lower-case table name -> column names
Corruption = Callable[[exp.Expression, Schema, random.Random], exp.Expression | None]


def schema_from_ddl(ddl: str) -> dict[str, list[str]]:
    """Table → column names from CREATE TABLE statements (``corpus.schema.parse_ddl``);
    statements sqlglot cannot read are skipped."""
    return {t.name.lower(): [c.name for c in t.columns] for t in parse_ddl(ddl).tables}


def _selects(tree: exp.Expression) -> list[exp.Select]:
    return list(tree.find_all(exp.Select))


def _pick(rng: random.Random, items: Sequence):
    return items[rng.randrange(len(items))] if items else None


def drop_where_predicate(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Remove one conjunct of a WHERE (the whole WHERE when it has one predicate)."""
    wheres = list(tree.find_all(exp.Where))
    where = _pick(rng, wheres)
    if where is None:
        return None
    conjuncts = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    if len(conjuncts) == 1:
        where.pop()
    else:
        victim = _pick(rng, conjuncts)
        rest = [c for c in conjuncts if c is not victim]
        where.set("this", exp.and_(*[c.copy() for c in rest]))
    return tree


_FLIPS: dict[type, type] = {exp.GT: exp.LT, exp.LT: exp.GT, exp.GTE: exp.LTE, exp.LTE: exp.GTE, exp.EQ: exp.NEQ, exp.NEQ: exp.EQ}


def flip_comparison(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Turn one comparison against a literal around (> ↔ <, = ↔ !=, ...)."""
    candidates = [
        node for node in tree.find_all(*_FLIPS)
        if isinstance(node.expression, exp.Literal) or isinstance(node.this, exp.Literal)
    ]
    node = _pick(rng, candidates)
    if node is None:
        return None
    node.replace(_FLIPS[type(node)](this=node.this.copy(), expression=node.expression.copy()))
    return tree


_AGGREGATES = (exp.Max, exp.Min, exp.Avg, exp.Sum, exp.Count)


def wrong_aggregate(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Replace one aggregate by another (COUNT(*) is left alone: no other aggregate takes *)."""
    candidates = [n for n in tree.find_all(*_AGGREGATES) if not isinstance(n.this, exp.Star)]
    node = _pick(rng, candidates)
    if node is None:
        return None
    others = [cls for cls in _AGGREGATES if cls is not type(node)]
    node.replace(_pick(rng, others)(this=node.this.copy()))
    return tree


def drop_group_by(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Remove a GROUP BY (its HAVING with it)."""
    select = _pick(rng, [s for s in _selects(tree) if s.args.get("group")])
    if select is None:
        return None
    select.set("group", None)
    select.set("having", None)
    return tree


def drop_join(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Remove the last JOIN of a query (references to its table are left dangling, as a model
    that forgets a join leaves them)."""
    select = _pick(rng, [s for s in _selects(tree) if s.args.get("joins")])
    if select is None:
        return None
    select.args["joins"][-1].pop()
    return tree


def wrong_column(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Replace one selected column by another column of the same table."""
    if not schema:
        return None
    candidates = []
    for select in _selects(tree):
        aliases = {}
        for table in select.find_all(exp.Table):
            if table.find_ancestor(exp.Select) is select:
                aliases[(table.alias or table.name).lower()] = table.name.lower()
        for item in select.expressions:
            for column in item.find_all(exp.Column):
                if column.find_ancestor(exp.Select) is not select:
                    continue
                owner = aliases.get(column.table.lower()) if column.table else (
                    next(iter(aliases.values())) if len(aliases) == 1 else None)
                others = [c for c in schema.get(owner or "", ()) if c.lower() != column.name.lower()]
                if others:
                    candidates.append((column, others))
    picked = _pick(rng, candidates)
    if picked is None:
        return None
    column, others = picked
    column.set("this", exp.to_identifier(_pick(rng, others)))
    return tree


def change_order(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Flip the direction of an ORDER BY key, or drop the ORDER BY when it has no LIMIT."""
    select = _pick(rng, [s for s in _selects(tree) if s.args.get("order")])
    if select is None:
        return None
    if not select.args.get("limit") and rng.random() < 0.5:
        select.set("order", None)
        return tree
    key = _pick(rng, select.args["order"].expressions)
    desc = not key.args.get("desc")
    key.set("desc", desc)
    key.set("nulls_first", not desc)  # SQLite's default placement: no NULLS clause is printed
    return tree


def change_limit(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Drop a LIMIT, or change its number."""
    select = _pick(rng, [s for s in _selects(tree) if s.args.get("limit")])
    if select is None:
        return None
    limit = select.args["limit"]
    value = limit.expression
    if isinstance(value, exp.Literal) and value.is_int and rng.random() < 0.5:
        limit.set("expression", exp.Literal.number(int(value.this) + rng.choice((1, 2, 3))))
    else:
        select.set("limit", None)
    return tree


def toggle_distinct(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Add DISTINCT to a query without it, or remove it."""
    select = _pick(rng, _selects(tree))
    if select is None:
        return None
    select.set("distinct", None if select.args.get("distinct") else exp.Distinct())
    return tree


def drop_select_item(tree: exp.Expression, schema: Schema, rng: random.Random) -> exp.Expression | None:
    """Remove one item of a multi-item SELECT list."""
    select = _pick(rng, [s for s in _selects(tree) if len(s.expressions) > 1])
    if select is None:
        return None
    items = list(select.expressions)
    del items[rng.randrange(len(items))]
    select.set("expressions", items)
    return tree


CORRUPTIONS: dict[str, Corruption] = {
    "drop_where_predicate": drop_where_predicate,
    "flip_comparison": flip_comparison,
    "wrong_aggregate": wrong_aggregate,
    "drop_group_by": drop_group_by,
    "drop_join": drop_join,
    "wrong_column": wrong_column,
    "change_order": change_order,
    "change_limit": change_limit,
    "toggle_distinct": toggle_distinct,
    "drop_select_item": drop_select_item,
}


def corrupt(gold_sql: str, rng: random.Random, schema: Schema | None = None) -> list[tuple[str, str]]:
    """Every applicable corruption of ``gold_sql`` as ``(name, sql)``, in a random order; each
    SQL differs from the gold's text. ``[]`` when the gold does not parse."""
    try:
        gold = parse_one(gold_sql)
    except SQLParseError:
        return []
    gold_text = gold.sql(dialect="sqlite")
    names = list(CORRUPTIONS)
    rng.shuffle(names)
    out = []
    for name in names:
        changed = CORRUPTIONS[name](gold.copy(), schema or {}, rng)
        if changed is None:
            continue
        try:
            text = changed.sql(dialect="sqlite")
        except sqlglot.errors.SqlglotError:
            continue
        if text != gold_text and text.strip():
            out.append((name, text))
    return out
