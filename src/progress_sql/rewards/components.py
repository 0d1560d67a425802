"""Reward components shared by the recipes: format, lexical and schema similarity, execution.

Every function here is total: any text (unparsable SQL, garbage, None for "no SQL") gives a
value, never an exception.
"""

from __future__ import annotations

from sqlglot import exp

from progress_sql.formats import FormatName, parse_output
from progress_sql.rewards.types import Turn
from progress_sql.sql.parse import SQLParseError, jaccard, ngram_jaccard, parse_one


def format_ok(text: str, fmt: FormatName) -> bool:
    """True when ``text`` is a well-formed output of format ``fmt`` (see formats.py)."""
    return parse_output(text, fmt).well_formed


def ngram_similarity(pred_sql: str | None, gold_sql: str, n: int = 2) -> float:
    """Jaccard of SQL-token n-grams; a missing prediction counts as empty text (→ 0)."""
    return ngram_jaccard(pred_sql or "", gold_sql or "", n)


def executable(turn: Turn) -> bool:
    """E(y): the turn has SQL and it executed without error."""
    return turn.sql is not None and turn.result is not None and turn.result.ok


def exec_match(turn: Turn) -> bool:
    """The turn's execution matched the gold's (decided by the environment)."""
    return bool(turn.correct)


# ----------------------------------------------------------------------------- schema items
def _owner(node: exp.Expression) -> exp.Select | None:
    """The nearest SELECT enclosing ``node`` (the scope its names resolve in)."""
    parent = node.parent
    while parent is not None and not isinstance(parent, exp.Select):
        parent = parent.parent
    return parent


def _items(tree: exp.Expression) -> set[str]:
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    # Per SELECT: alias → table, and how many sources (tables, CTE references, derived tables).
    aliases: dict[int, dict[str, str]] = {}
    sources: dict[int, list[str | None]] = {}
    items: set[str] = set()
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if not name:
            continue
        real = name not in cte_names
        scope = id(_owner(table))
        aliases.setdefault(scope, {})[table.alias_or_name.lower()] = name if real else ""
        sources.setdefault(scope, []).append(name if real else None)
        if real:
            items.add(name)
    for sub in tree.find_all(exp.Subquery):
        if isinstance(sub.parent, (exp.From, exp.Join)):
            sources.setdefault(id(_owner(sub)), []).append(None)
    every_alias = {a: t for scoped in aliases.values() for a, t in scoped.items()}

    for column in tree.find_all(exp.Column):
        if isinstance(column.this, exp.Star) or not column.name:
            continue
        col = column.name.lower()
        owner = _owner(column)
        qualifier = column.table.lower()
        if qualifier:
            # The owner's aliases first, then any (a correlated reference to an outer query).
            table = aliases.get(id(owner), {}).get(qualifier, every_alias.get(qualifier, ""))
        else:
            if owner is not None and col in {s.alias.lower() for s in owner.expressions if s.alias}:
                continue  # ORDER BY cnt where cnt is a projection alias: not a schema item
            scope_sources = sources.get(id(owner), [])
            table = scope_sources[0] if len(scope_sources) == 1 and scope_sources[0] else ""
        items.add(f"{table}.{col}" if table else col)
    return items


def _schema_items_or_none(sql: str | None) -> set[str] | None:
    if not sql:
        return None
    try:
        tree = parse_one(sql)
    except SQLParseError:
        return None
    try:
        return _items(tree)
    except RecursionError:  # absurdly deep nesting: treat like an unparsable query
        return None


def schema_items(sql: str | None) -> set[str]:
    """Schema items the query uses: its table names and qualified ``table.column`` names.

    Aliases resolve to their tables; an unqualified column is qualified by the only source of
    its SELECT when there is exactly one table there, else kept bare; CTE and derived-table
    names are not tables of the schema. Lower-cased. Empty when the SQL does not parse.
    Table names are items too (an extension of the brief's table.column set) so that
    ``COUNT(*)`` over two different tables does not score as a perfect match.
    """
    return _schema_items_or_none(sql) or set()


def schema_linking(pred_sql: str | None, gold_sql: str) -> float:
    """Jaccard of schema items; 0 when the prediction is missing or does not parse."""
    pred = _schema_items_or_none(pred_sql)
    if pred is None:
        return 0.0
    return jaccard(pred, schema_items(gold_sql))
