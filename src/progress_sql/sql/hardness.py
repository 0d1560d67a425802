"""Spider hardness (easy / medium / hard / extra) of a gold query.

Reference: ``evaluation.py`` of the Spider evaluator (taoyds/spider, taoyds/test-suite-sql-eval):
``count_component1``, ``count_component2``, ``count_others`` and ``Evaluator.eval_hardness``,
over the parse of ``process_sql.py``. The counts are taken from a sqlglot parse the way that
parser would fill its dict, including its quirks, so that Spider queries get Spider's labels:

- Only the outermost query is counted. For a set operation that is the left-most branch; the
  rest of the chain is one nested query (``sql['union']`` etc. hold the right branch, whose
  own set operations nest inside it). ORDER BY / LIMIT written after the last branch belong to
  that branch in Spider's parse, so they are not counted either.
- component1: WHERE, GROUP BY, ORDER BY, LIMIT (one each), joins = table units - 1 (a FROM
  subquery is a table unit), one per OR and one per LIKE in ON / WHERE / HAVING conditions.
- component2: subqueries that are operands of ON / WHERE / HAVING conditions (``IN``,
  comparisons, ``EXISTS``), plus one for a set operation. A subquery in FROM is *not* nested
  for Spider (``get_nestedSQL`` skips table units), only a table unit.
- others: more than one aggregation, more than one SELECT item, more than one WHERE
  condition, more than one GROUP BY column. The aggregation count follows ``count_agg``
  literally: aggregates in SELECT, GROUP BY and ORDER BY items; for WHERE conditions it tests
  the condition's first field, which is its NOT flag, so ``x NOT IN (...)`` /
  ``NOT LIKE`` count as an aggregation and ``count(*) > 1`` in WHERE does not; for HAVING it
  walks the raw condition list, so every AND/OR between HAVING conditions and every negated
  HAVING condition counts, and an aggregate inside a HAVING condition does not.
- Aggregates are Spider's five: COUNT, SUM, AVG, MIN, MAX.

Like Spider's tokenizer, ``! =`` / ``> =`` / ``< =`` are read as one operator (Spider's dev gold
has them). Beyond Spider's grammar (choices of ours): conditions grouped by parentheses are flattened
(each atom is one condition, each OR one OR); ``IS NOT NULL`` / ``NOT (...)`` count as
negated conditions; each CTE of a WITH clause counts as one nested query; comma joins count
like JOIN.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from sqlglot import exp

from progress_sql.sql.equivalence import spider_postprocess
from progress_sql.sql.parse import SQLParseError, parse_one

Hardness = Literal["easy", "medium", "hard", "extra"]
HARDNESS_LEVELS: tuple[Hardness, ...] = ("easy", "medium", "hard", "extra")

_SPIDER_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
_QUERY_NODES = (exp.Subquery, exp.Query)
_HARDNESS_CACHE_SIZE = 8192  # gold queries of a corpus repeat across epochs and rollouts


@dataclass(frozen=True)
class HardnessCounts:
    """The three counts of the Spider rules for one query."""

    component1: int
    component2: int
    others: int


@dataclass
class _Condition:
    atoms: list[exp.Expression]
    n_or: int
    n_and: int


def _flatten(cond: exp.Expression | None) -> _Condition:
    out = _Condition([], 0, 0)

    def walk(node: exp.Expression) -> None:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, (exp.And, exp.Or)):
            if isinstance(node, exp.Or):
                out.n_or += 1
            else:
                out.n_and += 1
            walk(node.this)
            walk(node.expression)
        else:
            out.atoms.append(node)

    if cond is not None:
        walk(cond)
    return out


def _is_negated(atom: exp.Expression) -> bool:
    return isinstance(atom, exp.Not)


def _is_like(atom: exp.Expression) -> bool:
    inner = atom.this if isinstance(atom, exp.Not) else atom
    return isinstance(inner, exp.Like)


def _outside_subqueries(node: exp.Expression):
    """Nodes under ``node`` (itself included), not descending into nested queries."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for child in cur.iter_expressions():
            if not isinstance(child, _QUERY_NODES):
                stack.append(child)


def _count_subqueries(atom: exp.Expression) -> int:
    count, stack = 0, [atom]
    while stack:
        cur = stack.pop()
        for child in cur.iter_expressions():
            if isinstance(child, _QUERY_NODES):
                count += 1
            else:
                stack.append(child)
    return count


def _count_aggregates(node: exp.Expression) -> int:
    return sum(1 for n in _outside_subqueries(node) if isinstance(n, _SPIDER_AGGREGATES))


def _outermost_select(tree: exp.Expression) -> tuple[exp.Select, int]:
    """The query Spider counts and the number of nested queries its wrapping contributes."""
    nested = 0
    node = tree
    while True:
        if isinstance(node, exp.Subquery):
            node = node.this
            continue
        with_ = node.args.get("with_")
        if with_ is not None:
            nested += len(with_.expressions)
        if isinstance(node, exp.SetOperation):
            nested += 1  # the right branch, with any further set operations inside it
            left = node.this
            while isinstance(left, (exp.SetOperation, exp.Subquery)):
                left = left.this
            node = left
            continue
        if isinstance(node, exp.Select):
            return node, nested
        raise SQLParseError(f"not a query: {type(node).__name__.upper()}")


def hardness_counts(gold_sql: str) -> HardnessCounts:
    """component1, component2 and others of the Spider rules; SQLParseError if unparsable."""
    select, nested = _outermost_select(parse_one(spider_postprocess(gold_sql)))
    from_ = select.args.get("from_")
    joins = select.args.get("joins") or []
    where = _flatten(select.args.get("where").this if select.args.get("where") else None)
    having = _flatten(select.args.get("having").this if select.args.get("having") else None)
    on = [_flatten(j.args.get("on")) for j in joins]
    group = select.args.get("group")
    group_items = list(group.expressions) if group is not None else []
    order = select.args.get("order")
    order_items = list(order.expressions) if order is not None else []
    select_items = list(select.expressions)

    conditions = [where, having, *on]
    atoms = [a for c in conditions for a in c.atoms]
    table_units = (1 if from_ is not None else 0) + len(joins)

    component1 = (
        (1 if where.atoms else 0)
        + (1 if group_items else 0)
        + (1 if order_items else 0)
        + (1 if select.args.get("limit") is not None else 0)
        + max(0, table_units - 1)
        + sum(c.n_or for c in conditions)
        + sum(1 for a in atoms if _is_like(a))
    )
    component2 = nested + sum(_count_subqueries(a) for a in atoms)

    aggregations = (
        sum(_count_aggregates(item) for item in select_items)
        + sum(1 for a in where.atoms if _is_negated(a))
        + sum(_count_aggregates(item) for item in group_items)
        + sum(_count_aggregates(item) for item in order_items)
        + having.n_and + having.n_or + sum(1 for a in having.atoms if _is_negated(a))
    )
    others = (
        (1 if aggregations > 1 else 0)
        + (1 if len(select_items) > 1 else 0)
        + (1 if len(where.atoms) > 1 else 0)
        + (1 if len(group_items) > 1 else 0)
    )
    return HardnessCounts(component1, component2, others)


def level_of(counts: HardnessCounts) -> Hardness:
    """Spider's thresholds (``Evaluator.eval_hardness``)."""
    c1, c2, others = counts.component1, counts.component2, counts.others
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if (
        (others > 2 and c1 <= 2 and c2 == 0)
        or (2 < c1 <= 3 and others <= 2 and c2 == 0)
        or (c1 <= 1 and others == 0 and c2 <= 1)
    ):
        return "hard"
    return "extra"


@lru_cache(maxsize=_HARDNESS_CACHE_SIZE)
def hardness(gold_sql: str) -> Hardness:
    """Spider hardness of ``gold_sql``; raises SQLParseError when it does not parse."""
    return level_of(hardness_counts(gold_sql))
