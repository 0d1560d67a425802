"""The structure of a generated gold query, rendered as an annotator writes SQL and as a short
reasoning trace.

A ``Select`` names its tables in join order; columns point at a table by position, so the
rendering decides the aliases: ``T1``, ``T2``, ... when the query joins, bare column names
otherwise (Spider's convention). Keywords and aggregate names are upper-case, strings are
single-quoted. Patterns build these structures, the robustness variants rewrite their
conditions, and both SQL and trace come from the same object, so they never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from progress_sql.data.domains.spec import DKRule

AGGREGATES = ("COUNT", "SUM", "AVG", "MIN", "MAX")
SET_OPS = ("UNION", "INTERSECT", "EXCEPT")
COMPARISONS = ("=", "!=", ">", "<", ">=", "<=")


@dataclass(frozen=True)
class Col:
    t: int  # position of the table in Select.tables
    name: str


@dataclass(frozen=True)
class Agg:
    fn: str  # one of AGGREGATES
    col: Col | None = None  # None: COUNT(*)
    distinct: bool = False


@dataclass(frozen=True)
class Cond:
    """``left op value``; value is a literal, a tuple (IN, BETWEEN) or a Select (nested)."""

    left: Col | Agg
    op: str  # COMPARISONS, LIKE, IN, NOT IN, BETWEEN, IS NULL, IS NOT NULL
    value: Any = None
    dk: DKRule | None = None  # phrased by this rule's words instead of column and value


@dataclass(frozen=True)
class Join:
    left: Col  # a column of an earlier table
    right: Col  # a column of the table this join brings in


@dataclass(frozen=True)
class Select:
    tables: tuple[str, ...]
    items: tuple[Col | Agg, ...]
    joins: tuple[Join, ...] = ()  # joins[i] brings in tables[i + 1]
    where: tuple[Cond, ...] = ()
    conj: str = "AND"  # between the WHERE conditions
    group_by: tuple[Col, ...] = ()
    having: tuple[Cond, ...] = ()
    order_by: tuple[Col | Agg, ...] = ()
    desc: bool = False
    limit: int | None = None
    distinct: bool = False
    set_op: str = ""  # UNION | INTERSECT | EXCEPT with ``other``
    other: "Select | None" = None

    def table_of(self, col: Col) -> str:
        return self.tables[col.t]


# ----------------------------------------------------------------------------- SQL
def literal(value: Any) -> str:
    """A SQL literal: quoted text, integers without a decimal point, floats as written."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _ref(sel: Select, col: Col) -> str:
    return f"T{col.t + 1}.{col.name}" if len(sel.tables) > 1 else col.name


def _expr(sel: Select, e: Col | Agg) -> str:
    if isinstance(e, Col):
        return _ref(sel, e)
    inner = "*" if e.col is None else _ref(sel, e.col)
    return f"{e.fn}({'DISTINCT ' if e.distinct else ''}{inner})"


def _cond(sel: Select, c: Cond) -> str:
    left = _expr(sel, c.left)
    if c.op in ("IS NULL", "IS NOT NULL"):
        return f"{left} {c.op}"
    if isinstance(c.value, Select):
        return f"{left} {c.op} ({render_sql(c.value)})"
    if c.op == "BETWEEN":
        return f"{left} BETWEEN {literal(c.value[0])} AND {literal(c.value[1])}"
    if c.op in ("IN", "NOT IN"):
        return f"{left} {c.op} ({', '.join(literal(v) for v in c.value)})"
    return f"{left} {c.op} {literal(c.value)}"


def render_sql(sel: Select) -> str:
    """One line of SQL, written the way Spider's annotators write it."""
    parts = ["SELECT " + ("DISTINCT " if sel.distinct else "") + ", ".join(_expr(sel, i) for i in sel.items)]
    if len(sel.tables) == 1:
        parts.append(f"FROM {sel.tables[0]}")
    else:
        parts.append(f"FROM {sel.tables[0]} AS T1")
        for k, j in enumerate(sel.joins, start=2):
            parts.append(f"JOIN {sel.tables[k - 1]} AS T{k} ON {_ref(sel, j.left)} = {_ref(sel, j.right)}")
    if sel.where:
        parts.append("WHERE " + f" {sel.conj} ".join(_cond(sel, c) for c in sel.where))
    if sel.group_by:
        parts.append("GROUP BY " + ", ".join(_ref(sel, c) for c in sel.group_by))
    if sel.having:
        parts.append("HAVING " + " AND ".join(_cond(sel, c) for c in sel.having))
    if sel.order_by:
        parts.append("ORDER BY " + ", ".join(_expr(sel, e) for e in sel.order_by) + (" DESC" if sel.desc else ""))
    if sel.limit is not None:
        parts.append(f"LIMIT {sel.limit}")
    sql = " ".join(parts)
    if sel.set_op and sel.other is not None:
        sql += f" {sel.set_op} {render_sql(sel.other)}"
    return sql


# ----------------------------------------------------------------------------- reasoning trace
def reasoning(sel: Select) -> str:
    """A short trace of the query's structure: tables and joins, filter, grouping, output."""
    lines = []
    if len(sel.tables) == 1:
        lines.append(f"Tables: {sel.tables[0]}.")
    else:
        tables = ", ".join(f"{t} AS T{i + 1}" for i, t in enumerate(sel.tables))
        on = " and ".join(f"{_ref(sel, j.left)} = {_ref(sel, j.right)}" for j in sel.joins)
        lines.append(f"Tables: {tables}, joined on {on}.")
    if sel.where:
        conds = f" {sel.conj} ".join(_trace_cond(sel, c) for c in sel.where)
        lines.append(f"Filter: {conds}.")
    if sel.group_by:
        lines.append("Group by: " + ", ".join(_ref(sel, c) for c in sel.group_by) + ".")
    if sel.having:
        lines.append("Keep groups with: " + " AND ".join(_cond(sel, c) for c in sel.having) + ".")
    if sel.order_by:
        order = ", ".join(_expr(sel, e) for e in sel.order_by)
        lines.append(f"Order by: {order} {'descending' if sel.desc else 'ascending'}.")
    if sel.limit is not None:
        lines.append("Keep the first row." if sel.limit == 1 else f"Keep the first {sel.limit} rows.")
    output = ", ".join(_expr(sel, i) for i in sel.items)
    lines.append(f"Output: {'distinct ' if sel.distinct else ''}{output}.")
    trace = " ".join(lines)
    if sel.set_op and sel.other is not None:
        trace += f" {sel.set_op} with: {reasoning(sel.other)}"
    return trace


def _trace_cond(sel: Select, c: Cond) -> str:
    if isinstance(c.value, Select):
        return f"{_expr(sel, c.left)} {c.op} (subquery: {reasoning(c.value)})"
    return _cond(sel, c)


# ----------------------------------------------------------------------------- rewriting
def map_conds(sel: Select, fn: Callable[[Select, Cond], Cond]) -> Select:
    """A copy of ``sel`` whose WHERE conditions (at every nesting level, both sides of a set
    operation) are replaced by ``fn(select_holding_it, cond)``."""
    where = []
    for c in sel.where:
        if isinstance(c.value, Select):
            c = replace(c, value=map_conds(c.value, fn))
        where.append(fn(sel, c))
    other = map_conds(sel.other, fn) if sel.other is not None else None
    return replace(sel, where=tuple(where), other=other)


def tables_of(sel: Select) -> set[str]:
    """Every table the query reads, nested queries and both sides of a set operation included."""
    found = set(sel.tables)
    for _, cond in all_conds(sel):
        if isinstance(cond.value, Select):
            found |= tables_of(cond.value)
    if sel.other is not None:
        found |= tables_of(sel.other)
    return found


def all_conds(sel: Select) -> list[tuple[Select, Cond]]:
    """Every WHERE condition with the Select that holds it, outer query first."""
    out: list[tuple[Select, Cond]] = []
    for c in sel.where:
        out.append((sel, c))
        if isinstance(c.value, Select):
            out += all_conds(c.value)
    if sel.other is not None:
        out += all_conds(sel.other)
    return out
