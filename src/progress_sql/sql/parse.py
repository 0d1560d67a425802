"""Parsing SQL with sqlglot (SQLite dialect) and tokenising it for lexical similarity.

sqlglot's compiled extension (``sqlglot[c]``, package ``sqlglotc``) installs into the
``sqlglot`` package itself; when it is missing, the same calls run in pure Python.

``parse_sql`` is the one call of ``sqlglot.parse`` on SQL the task module judges: sqlglot logs a
warning for a statement it parses as a mere command (``VACUUM``, ``REPLACE``, ``EXPLAIN``), and
a model's SQL is no news for the user's stderr; the verdict does not change.
"""

from __future__ import annotations

import logging
import re
import threading

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

DIALECT = "sqlite"


class _WhileParsing(logging.Filter):
    """Drops sqlglot's log records while this thread is inside ``parse_sql``."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.local, "parsing", False)


_QUIET = _WhileParsing()
logging.getLogger("sqlglot").addFilter(_QUIET)  # only this module's own calls are affected


def parse_sql(sql: str) -> list[exp.Expression | None]:
    """``sqlglot.parse(sql)`` in the SQLite dialect, its logged warnings kept off stderr."""
    _QUIET.local.parsing = True
    try:
        return sqlglot.parse(sql, read=DIALECT)
    finally:
        _QUIET.local.parsing = False


class SQLParseError(ValueError):
    """The text is not one SQL statement that sqlglot can parse."""


def sqlglot_compiled() -> bool:
    """True when sqlglot runs its mypyc-compiled parser (``sqlglot[c]``)."""
    import sqlglot.parser as parser_module

    return not str(parser_module.__file__).endswith(".py")


def parse_one(sql: str) -> exp.Expression:
    """Parse exactly one statement; raise SQLParseError with sqlglot's message otherwise."""
    if not isinstance(sql, str):
        raise SQLParseError(f"SQL must be text, got {type(sql).__name__}")
    text = sql.strip().rstrip(";").strip()
    if not text:
        raise SQLParseError("empty SQL")
    try:
        statements = [s for s in parse_sql(text) if s is not None]
    except (SqlglotError, RecursionError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
        # sqlglot raises ParseError/TokenError for bad SQL; a few odd inputs surface as
        # other exceptions from deep inside the parser: all mean "does not parse".
        raise SQLParseError(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    if len(statements) != 1:
        raise SQLParseError(f"expected one statement, found {len(statements)}")
    return statements[0]


# Tokens for lexical similarity: quoted strings, numbers, identifiers/keywords, operators.
_TOKEN_RE = re.compile(
    r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\]|\d+(?:\.\d+)?|[A-Za-z_][A-Za-z_0-9$]*(?:\.[A-Za-z_*][A-Za-z_0-9$]*)?|<>|!=|>=|<=|==|\|\||[^\sA-Za-z_0-9]""",
)


def sql_tokens(sql: str) -> list[str]:
    """Lower-cased SQL tokens. Works on any text, parseable or not (the lexical fallback)."""
    if not isinstance(sql, str):
        return []
    return [t.lower() for t in _TOKEN_RE.findall(sql.strip().rstrip(";"))]


def ngrams(tokens: list[str], n: int = 2) -> set[tuple[str, ...]]:
    """The set of token n-grams; a sequence shorter than n yields itself as one gram."""
    if n <= 0:
        raise ValueError("n must be positive")
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def jaccard(a: set, b: set) -> float:
    """|A∩B| / |A∪B|; both empty → 1.0, one empty → 0.0 (the ODT convention)."""
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def ngram_jaccard(pred_sql: str, gold_sql: str, n: int = 2) -> float:
    """Jaccard of SQL-token n-grams (F_lex of Progress-SQL with n = 2)."""
    return jaccard(ngrams(sql_tokens(pred_sql), n), ngrams(sql_tokens(gold_sql), n))
