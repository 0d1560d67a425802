"""The ODT profile tree of a query (progress-sql.md, Appendix D, "ODT Construction").

ROOT has the query's CTEs and its main query as children. A main query is a SELECT node or
a SET_OP node (UNION / UNION ALL / INTERSECT / EXCEPT, a left-deep chain of one operator
flattened into one node, its operands as children). A CTE node holds its query. A nested
query in FROM, WHERE, HAVING, a JOIN condition or a SELECT expression is a SUBQUERY child
of its SELECT node, holding the nested query.

A SELECT node's local profile (normalisation in ``normalize``):

- ``tables``: normalised table names of FROM/JOIN sources (``(derived1)``... for derived
  tables); ``join_count``: number of JOINs, comma joins included;
- ``joins``: join-condition signatures. Conjuncts of inner-join ON clauses and of WHERE are
  pooled; an equality between columns of two different sources of the block is a join
  condition, every other conjunct a WHERE predicate. So ``FROM a JOIN b ON a.x = b.y``,
  ``FROM a, b WHERE a.x = b.y`` and ``FROM a JOIN b WHERE a.x = b.y`` have one profile.
  Conditions of outer joins (LEFT/RIGHT/FULL) stay join conditions, tagged with the side;
  USING(c) is ``prev.c = this.c``, NATURAL is ``natural``;
- ``where``, ``having``: sets of atomic predicates (AND split, ORs kept whole);
- ``select``: projection signatures (aliases ignored), ``select_count`` the item count;
- ``group_by``, ``order_by`` (signature + asc/desc); positions (``ORDER BY 1``) and select
  aliases resolve to the selected expression;
- booleans: where / group by / having / order by (their sets non-empty), limit, distinct,
  aggregation (an aggregate function in this block, not in its subqueries).

ORDER BY / LIMIT written after a set operation belong to the whole set operation; the tree
gives them to its last operand's SELECT node, where they are written, so they are still
compared (the paper's non-SELECT nodes have no local profile).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from progress_sql.odt.normalize import PLACEHOLDER, SUBQUERY_SIG, Scope, flatten, normalize_text, sig
from progress_sql.sql.parse import SQLParseError, parse_one

ROOT, SELECT, CTE, SET_OP, SUBQUERY = "ROOT", "SELECT", "CTE", "SET_OP", "SUBQUERY"

_OUTER_SIDES = ("left", "right", "full")


class NotAQuery(ValueError):
    """The statement parses but is not a query (SELECT / WITH / set operation)."""


@dataclass(frozen=True, slots=True)
class SelectProfile:
    """The local structural profile p = (c, b, T, S, W, J, G, H, O) of one SELECT block."""

    select: frozenset[str]
    select_count: int
    tables: frozenset[str]
    join_count: int
    joins: frozenset[str]
    where: frozenset[str]
    group_by: frozenset[str]
    having: frozenset[str]
    order_by: frozenset[str]
    limit: bool
    distinct: bool
    aggregation: bool


@dataclass(frozen=True, slots=True)
class Node:
    """One ODT node; ``name`` is the CTE name or the set operator, ``profile`` set on SELECT."""

    kind: str
    name: str = ""
    profile: SelectProfile | None = None
    children: tuple[Node, ...] = ()


def _strip_parens(e: exp.Expression) -> exp.Expression:
    # The Subquery wrapper itself is not a level of the tree: the caller has read its alias
    # (FROM) or made it a SUBQUERY node already; a parenthesised set-operation operand is none.
    while type(e) is exp.Subquery or type(e) is exp.Paren:
        e = e.this
    return e


def _set_op_name(q: exp.SetOperation) -> str:
    if type(q) is exp.Union:
        return "union" if q.args.get("distinct") else "union all"
    return q.key  # intersect / except


def _query_nodes(q: exp.Expression, parent: Scope | None, tail: tuple = (None, None)) -> list[Node]:
    """[CTE nodes..., main query node] of one (possibly WITH-prefixed) query. ``tail`` is the
    (ORDER BY, LIMIT) of an enclosing set operation, handed to its last operand."""
    q = _strip_parens(q)
    nodes = []
    with_ = q.args.get("with_")
    if with_ is not None:
        for cte in with_.expressions:
            nodes.append(Node(CTE, cte.alias_or_name.lower(), None, tuple(_query_nodes(cte.this, parent))))
    if type(q) is exp.Select:
        nodes.append(_select_node(q, parent, tail))
    elif isinstance(q, exp.SetOperation):
        nodes.append(_set_op_node(q, parent, tail))
    else:
        raise NotAQuery(f"not a query: {q.key}")
    return nodes


def _set_op_node(q: exp.SetOperation, parent: Scope | None, tail: tuple) -> Node:
    name = _set_op_name(q)
    own_tail = (q.args.get("order") or tail[0], q.args.get("limit") or tail[1])
    operands = [q.expression]
    left = _strip_parens(q.this)
    while (isinstance(left, exp.SetOperation) and _set_op_name(left) == name
           and not any(left.args.get(k) for k in ("order", "limit", "with_"))):
        operands.append(left.expression)
        left = _strip_parens(left.this)
    operands.append(left)
    operands.reverse()
    children: list[Node] = []
    for i, operand in enumerate(operands):
        last = i == len(operands) - 1
        children.extend(_query_nodes(operand, parent, own_tail if last else (None, None)))
    return Node(SET_OP, name, None, tuple(children))


def _select_node(sel: exp.Select, parent: Scope | None, tail: tuple) -> Node:
    children: list[Node] = []

    def on_query(q: exp.Expression) -> str:
        children.append(Node(SUBQUERY, "", None, tuple(_query_nodes(q, scope))))
        return SUBQUERY_SIG

    scope = Scope(parent, on_query)
    args = sel.args
    joins = args.get("joins") or []
    tables = _add_sources(scope, args.get("from_"), joins, children)  # first: columns resolve through them

    # Projection; the aliases are remembered for ORDER BY / GROUP BY / HAVING.
    items = sel.expressions
    select_sigs = []
    for item in items:
        s = sig(item, scope)
        select_sigs.append(s)
        if type(item) is exp.Alias:
            scope.aliases[item.alias.lower()] = s

    join_sigs, where_sigs = _join_and_where(scope, joins, tables, args.get("where"))

    # GROUP BY / HAVING / ORDER BY may name select aliases and positions.
    scope.use_aliases = True
    group = args.get("group")
    group_sigs = {_positional(g, select_sigs, scope) for g in group.expressions} if group else set()
    having = args.get("having")
    having_sigs = {sig(c, scope) for c in flatten(having.this, exp.And)} if having else set()
    order = args.get("order") or tail[0]
    order_sigs = set()
    if order is not None:
        for o in order.expressions:
            desc = bool(o.args.get("desc")) if type(o) is exp.Ordered else False
            target = o.this if type(o) is exp.Ordered else o
            order_sigs.add(_positional(target, select_sigs, scope) + (" desc" if desc else " asc"))
    scope.use_aliases = False

    profile = SelectProfile(
        select=frozenset(select_sigs),
        select_count=len(items),
        tables=frozenset(tables),
        join_count=len(joins),
        joins=frozenset(join_sigs),
        where=frozenset(where_sigs),
        group_by=frozenset(group_sigs),
        having=frozenset(having_sigs),
        order_by=frozenset(order_sigs),
        limit=args.get("limit") is not None or tail[1] is not None,
        distinct=args.get("distinct") is not None,
        aggregation=scope.aggregated,
    )
    return Node(SELECT, "", profile, tuple(children))


def _add_sources(scope: Scope, from_: exp.From | None, joins: list[exp.Join], children: list[Node]) -> list[str]:
    """Register the FROM/JOIN sources in ``scope``; return their normalised table names.
    A derived table becomes ``(derivedN)`` and a SUBQUERY child."""
    tables = []
    for source in ([from_.this] if from_ is not None else []) + [j.this for j in joins]:
        alias = source.alias.lower() if source.alias else ""
        inner = _strip_parens(source)
        if type(inner) is exp.Table and isinstance(inner.this, exp.Identifier):
            table = inner.name.lower()
            scope.add_source(table, *([alias, table] if alias else [table]))
        elif isinstance(inner, exp.Query):
            table = f"(derived{sum(t.startswith('(derived') for t in tables) + 1})"
            children.append(Node(SUBQUERY, "", None, tuple(_query_nodes(inner, scope.parent))))
            scope.add_source(table, *([alias] if alias else []))
        else:  # table-valued function, VALUES, ...
            table = sig(inner, scope)
            scope.add_source(table, *([alias] if alias else []))
        tables.append(table)
    return tables


def _join_and_where(scope: Scope, joins: list[exp.Join], tables: list[str], where: exp.Where | None):
    """(join-condition signatures, WHERE predicate signatures): WHERE and inner-join ON
    conjuncts are pooled and the equalities linking two sources split off as join conditions."""
    pooled = []
    join_sigs = set()
    previous = tables[0] if tables else ""
    for join, table in zip(joins, tables[1:]):
        side = (join.args.get("side") or "").lower()
        prefix = side + ":" if side in _OUTER_SIDES else ""
        on = join.args.get("on")
        if type(on) is exp.Boolean and on.this is True:
            on = None  # sqlglot's SQLite reader writes a bare JOIN as JOIN ... ON TRUE
        if on is not None:
            if prefix:
                join_sigs.update(prefix + sig(c, scope) for c in flatten(on, exp.And))
            else:
                pooled.extend(flatten(on, exp.And))
        for ident in join.args.get("using") or []:
            col = ident.name.lower()
            pair = sorted((previous + "." + col, table + "." + col))
            join_sigs.add(prefix + pair[0] + "=" + pair[1])
        if (join.args.get("method") or "").lower() == "natural":
            join_sigs.add(prefix + "natural")
        previous = table
    if where is not None:
        pooled.extend(flatten(where.this, exp.And))
    where_sigs = set()
    for conjunct in pooled:
        s = sig(conjunct, scope)
        if scope.count > 1 and type(conjunct) is exp.EQ and _links_sources(conjunct, scope):
            join_sigs.add(s)
        else:
            where_sigs.add(s)
    return join_sigs, where_sigs


def _links_sources(eq: exp.EQ, scope: Scope) -> bool:
    """True for ``a.x = b.y`` with both columns from two different sources of this block."""
    left, right = eq.this, eq.expression
    if type(left) is not exp.Column or type(right) is not exp.Column:
        return False
    a, b = scope.local_source(left), scope.local_source(right)
    return a is not None and b is not None and a != b


def _positional(e: exp.Expression, select_sigs: list[str], scope: Scope) -> str:
    """``ORDER BY 2`` / ``GROUP BY 1`` name a select item; other literals stay placeholders."""
    if type(e) is exp.Literal and not e.is_string:
        text = e.this
        if text.isdigit() and 1 <= int(text) <= len(select_sigs):
            return select_sigs[int(text) - 1]
        return PLACEHOLDER
    return sig(e, scope)


def build_tree(sql: str) -> Node:
    """Parse one query and build its ODT: raises SQLParseError when it does not parse,
    NotAQuery when it is another statement, RecursionError on pathological nesting."""
    tree = parse_one(normalize_text(sql))
    return Node(ROOT, "", None, tuple(_query_nodes(tree, None)))


def try_build_tree(sql: object) -> Node | None:
    """The tree, or None for anything that is not one parseable query (never raises)."""
    if not isinstance(sql, str):
        return None
    try:
        return build_tree(sql)
    except (SQLParseError, NotAQuery, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - odd sqlglot trees must not crash a rollout
        return None
