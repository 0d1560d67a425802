"""Canonical signatures of SQL expressions: the ODT's normalisation (progress-sql.md, App. D).

A signature is a short string that is equal for two expressions exactly when the ODT treats
them as the same structure:

- identifiers lower-cased (sqlglot already dropped their quotes); a column is written
  ``table.column`` with its table alias resolved through the scope chain (``T1.x`` →
  ``student.x``); an unqualified column gets the table of a single-source scope, or a
  select alias's expression in ORDER BY / GROUP BY / HAVING;
- literals (strings, numbers, booleans, negated numbers, IN lists of them) → ``?``;
  a double-quoted unqualified name compared with a column is a literal (SQLite's fallback
  for ``"text"`` that names no column, the usual Spider spelling of a string value);
- operators canonical (``<>`` and ``!=`` are one NEQ node already); ``=`` and ``<>`` put a
  literal on the right and sort two non-literal operands; ``>``/``<``/``>=``/``<=`` are turned
  around the same way with the operator mirrored, so ``a > b`` == ``b < a`` and
  ``5 < x`` == ``x > 5``; NOT LIKE / NOT IN / NOT BETWEEN / IS NOT NULL / NOT EXISTS keep NOT;
- OR and nested AND become sorted, de-duplicated operand sets; aliases (``AS x``) vanish;
- a nested query becomes ``(subquery)`` in the text and a SUBQUERY child in the tree
  (the scope's ``on_query`` callback builds it).

Deep expressions are signed recursively; pathological nesting raises RecursionError, which
the caller treats as "does not parse".
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

PLACEHOLDER = "?"
SUBQUERY_SIG = "(subquery)"

_COMPARISONS = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}
_MIRROR = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}
_PATTERN = {exp.Like: " like ", exp.ILike: " ilike ", exp.Glob: " glob "}
_LITERALS = (exp.Literal, exp.Boolean, exp.Placeholder)


class Scope:
    """Name resolution for one SELECT block: its FROM/JOIN sources and its select aliases.

    ``sources`` maps every name a column may be qualified with (the alias, and the table's
    own name unless that is taken) to ``(source number, normalised table name)``; the number
    tells whether ``a.x = b.y`` links two different sources of this block (a self-join too).
    """

    __slots__ = ("parent", "sources", "count", "default", "aliases", "use_aliases", "on_query",
                 "aggregated")

    def __init__(self, parent: Scope | None, on_query: Callable[[exp.Expression], str]):
        self.parent = parent
        self.sources: dict[str, tuple[int, str]] = {}
        self.count = 0  # number of sources
        self.default: str | None = None  # the table of a single-source block
        self.aliases: dict[str, str] = {}  # select alias → signature of its expression
        self.use_aliases = False  # True while signing ORDER BY / GROUP BY / HAVING
        self.on_query = on_query
        self.aggregated = False  # an aggregate function was signed in this block

    def add_source(self, table: str, *names: str) -> None:
        """Register one FROM/JOIN source under the names that may qualify its columns."""
        number = self.count
        self.count += 1
        for name in names:
            self.sources.setdefault(name, (number, table))
        self.default = table if self.count == 1 else None

    def table_of(self, qualifier: str) -> str:
        scope: Scope | None = self
        while scope is not None:
            found = scope.sources.get(qualifier)
            if found is not None:
                return found[1]
            scope = scope.parent
        return qualifier  # unknown qualifier: kept as written (lower-cased)

    def local_source(self, col: exp.Column) -> int | None:
        """The number of the source of *this* block the column belongs to, if known."""
        qualifier = col.args.get("table")
        if qualifier is not None:
            found = self.sources.get(qualifier.this.lower())
            return None if found is None else found[0]
        return 0 if self.count == 1 else None


def column_sig(col: exp.Column, scope: Scope) -> str:
    ident = col.this
    name = "*" if isinstance(ident, exp.Star) else ident.this.lower()
    qualifier = col.args.get("table")
    if qualifier is not None:
        return scope.table_of(qualifier.this.lower()) + "." + name
    if scope.use_aliases and name in scope.aliases:
        return scope.aliases[name]
    if scope.default is not None:
        return scope.default + "." + name
    return name


def _is_value_name(e: exp.Expression) -> bool:
    """An unqualified quoted name: in SQLite "text" is a string when it names no column."""
    return type(e) is exp.Column and e.this.args.get("quoted") is True and e.args.get("table") is None


def _operand(e: exp.Expression, other: exp.Expression, scope: Scope) -> str:
    if _is_value_name(e) and not (_is_value_name(other) or isinstance(other, _LITERALS)):
        return PLACEHOLDER
    return sig(e, scope)


def _comparison(e: exp.Expression, scope: Scope) -> str:
    left, right = e.this, e.expression
    ls, rs = _operand(left, right, scope), _operand(right, left, scope)
    op = _COMPARISONS[type(e)]
    # A literal goes right, two other operands in sorted order; the operator is mirrored.
    if ls == PLACEHOLDER or (rs != PLACEHOLDER and ls > rs):
        ls, rs, op = rs, ls, _MIRROR[op]
    return ls + op + rs


def _pattern(e: exp.Expression, scope: Scope) -> str:
    left, right = e.this, e.expression
    text = _operand(left, right, scope) + _PATTERN[type(e)] + _operand(right, left, scope)
    # sqlglot writes ``a NOT LIKE b`` as Like(negate=True), ``NOT a LIKE b`` as Not(Like).
    return "not " + text if e.args.get("negate") else text


def _in(e: exp.In, scope: Scope) -> str:
    target = e.this
    query = e.args.get("query")
    if query is not None:
        return sig(target, scope) + " in " + sig(query, scope)
    items = {_operand(x, target, scope) for x in e.expressions}
    return sig(target, scope) + " in (" + ",".join(sorted(items)) + ")"


def _between(e: exp.Between, scope: Scope) -> str:
    target = e.this
    return (sig(target, scope) + " between " + _operand(e.args["low"], target, scope)
            + " and " + _operand(e.args["high"], target, scope))


def _is(e: exp.Is, scope: Scope) -> str:
    op = " is not " if e.args.get("negate") else " is "
    return sig(e.this, scope) + op + sig(e.expression, scope)


def _not(e: exp.Not, scope: Scope) -> str:
    inner = e.this
    while type(inner) is exp.Paren:
        inner = inner.this
    if type(inner) is exp.Is and not inner.args.get("negate"):
        return sig(inner.this, scope) + " is not " + sig(inner.expression, scope)
    return "not " + sig(inner, scope)


def flatten(e: exp.Expression, kind: type) -> list[exp.Expression]:
    """Operands of a chain of one connector (AND or OR), parentheses removed; iterative,
    because sqlglot nests long chains deeply."""
    out: list[exp.Expression] = []
    stack = [e]
    while stack:
        node = stack.pop()
        while type(node) is exp.Paren:
            node = node.this
        if type(node) is kind:
            stack.append(node.expression)
            stack.append(node.this)
        else:
            out.append(node)
    return out


def _connector(e: exp.Expression, scope: Scope) -> str:
    parts = sorted({sig(x, scope) for x in flatten(e, type(e))})
    return e.key + "(" + "|".join(parts) + ")"


def _placeholder(e: exp.Expression, scope: Scope) -> str:
    return PLACEHOLDER


def _neg(e: exp.Neg, scope: Scope) -> str:
    return PLACEHOLDER if isinstance(e.this, _LITERALS) else "-" + sig(e.this, scope)


def _unwrap(e: exp.Expression, scope: Scope) -> str:
    return sig(e.this, scope)


def _nested(e: exp.Expression, scope: Scope) -> str:
    return scope.on_query(e)


def _identifier(e: exp.Identifier, scope: Scope) -> str:
    return e.this.lower()


def _datatype(e: exp.DataType, scope: Scope) -> str:
    return str(getattr(e.this, "value", e.this)).lower()


def _star(e: exp.Star, scope: Scope) -> str:
    return "*"


def _generic(e: exp.Expression, scope: Scope) -> str:
    """Any other node: its kind and its arguments in sqlglot's declared order."""
    parts = []
    args = e.args
    for key in type(e).arg_types:
        value = args.get(key)
        if value is None or value is False:
            continue
        if isinstance(value, exp.Expression):
            parts.append(sig(value, scope))
        elif isinstance(value, list):
            parts.append(",".join(sig(v, scope) if isinstance(v, exp.Expression) else str(v).lower()
                                  for v in value))
        elif value is True:
            parts.append(key)
        else:
            parts.append(str(value).lower())
    return e.key + "(" + ";".join(parts) + ")"


def _aggregate(e: exp.Expression, scope: Scope) -> str:
    scope.aggregated = True
    return _generic(e, scope)


_HANDLERS: dict[type, Callable[[exp.Expression, Scope], str]] = {
    exp.Column: column_sig,
    exp.Literal: _placeholder,
    exp.Boolean: _placeholder,
    exp.Placeholder: _placeholder,
    exp.Neg: _neg,
    exp.Null: lambda e, scope: "null",
    exp.Star: _star,
    exp.Alias: _unwrap,
    exp.Paren: _unwrap,
    exp.Identifier: _identifier,
    exp.DataType: _datatype,
    exp.In: _in,
    exp.Between: _between,
    exp.Is: _is,
    exp.Not: _not,
    exp.And: _connector,
    exp.Or: _connector,
    exp.Subquery: _nested,
    **{t: _comparison for t in _COMPARISONS},
    **{t: _pattern for t in _PATTERN},
}


def _handler(kind: type) -> Callable[[exp.Expression, Scope], str]:
    if issubclass(kind, exp.Query):
        handler = _nested
    elif issubclass(kind, exp.AggFunc):
        handler = _aggregate
    else:
        handler = _generic
    _HANDLERS[kind] = handler  # memoised per node class
    return handler


def sig(e: exp.Expression, scope: Scope) -> str:
    """The canonical signature of one expression in ``scope``."""
    handler = _HANDLERS.get(type(e))
    if handler is None:
        handler = _handler(type(e))
    return handler(e, scope)


def normalize_text(sql: str) -> str:
    """The text the ODT parses (and the gold-profile cache key): surrounding whitespace and
    trailing semicolons removed. Inner whitespace is left to the tokenizer, because
    collapsing newlines would swallow code after a ``--`` comment."""
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    return text
