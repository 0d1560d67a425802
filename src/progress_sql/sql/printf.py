"""SQLite's ``printf``/``format`` with its length limit kept: a result past it is ``too_big``.

SQLite (3.40 and others) builds ``printf``'s result in a string accumulator whose
SQLITE_TOOBIG it swallows: ``printf('%.*c', 20000000, 'x')`` past ``SQLITE_LIMIT_LENGTH``
returns NULL, a silent wrong value, and with a width of 900,000,000 it spends seconds inside
one virtual-machine step before doing so. The sandbox registers ``bounded_printf`` under both
names on every connection it opens. It first adds up the least number of characters the format
must produce (literal text, each conversion's width and precision, each ``%s`` argument's
length), refusing at once when that passes the limit; otherwise the built-in ``printf`` of a
per-thread in-memory side connection (same length limit) formats the values, and a NULL from it
that is not an empty result's (a leading literal character tells them apart) is refused too: the
accumulator fails at the limit, and also a little short of it where a float's conversion buffer
(its width, precision and a few bytes more) would pass it. A refusal sets ``state.too_big`` (the
sandbox reads it, as it reads its deadline flag) and raises, which SQLite reports as an error of
the user function.

Python cannot receive text that is not UTF-8 (``CAST(x'ff' AS TEXT)``, a latin-1 column): such
an argument fails the call before ``bounded_printf`` runs. The sandbox then runs the query
again as ``quoting_arguments`` rewrites it: each printf/format call becomes
``CAST(progress_sql_printf(CAST(quote(arg) AS BLOB), ...) AS TEXT)``, so every argument
arrives as bytes with its type kept (``quote`` evaluates it once; printf reads a text and a
blob argument alike), is bounded the same way, and the result is SQLite's own, byte for byte.
There an argument's quoted form must itself fit the limit (a blob of more than half of it
fails as ``too_big``).
"""

from __future__ import annotations

import re
import sqlite3
import threading
from typing import Any

from sqlglot.dialects.sqlite import SQLite
from sqlglot.tokens import Token, TokenType

# printf.c's grammar: flags, width (digits or *), precision (. then digits or *), l/ll, conversion
_SPEC = re.compile(r"%([-+ #!0,]*)(\*|\d*)(?:\.(\*|\d*))?(l{0,2})(.?)", re.DOTALL)
_CONVERSIONS = frozenset("dsgzqQwcouxXfeEGinp%r")  # the others (T, S, unknown) end the output
_FP_PRECISION_LIMIT = 100_000_000  # SQLITE_FP_PRECISION_LIMIT: larger float precisions are cut to it


class _State(threading.local):
    def __init__(self) -> None:
        self.limit = 1_000_000_000  # SQLITE_LIMIT_LENGTH of the connection running the query
        self.too_big = False  # set when a call was refused; the sandbox clears it before a query
        self.side: sqlite3.Connection | None = None
        self.side_limit = -1


state = _State()


class TooBig(Exception):
    """A printf result past the length limit (reported through ``state.too_big``)."""


def _c_int(value: int) -> int:
    """``(int)`` of a 64-bit value, as printf.c casts a ``*`` argument."""
    return (value + 2**31) % 2**32 - 2**31


def _int_arg(value: Any) -> int:
    """``sqlite3_value_int64`` of an argument, near enough: the leading integer of its text."""
    if isinstance(value, bool) or value is None:
        return int(bool(value))
    if isinstance(value, (int, float)):
        return int(max(min(value, 2**63 - 1), -(2**63)))
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    match = re.match(r"\s*[-+]?\d+", text)
    return int(match.group(0)) if match else 0


def _text_chars(value: Any) -> int:
    """The characters ``%s`` prints of an argument at least (text up to a NUL, as printf.c reads it)."""
    if isinstance(value, str):
        return len(value.split("\0", 1)[0])
    if isinstance(value, bytes):
        return len(value.split(b"\0", 1)[0].decode("utf-8", "ignore"))
    return 0  # a number's text: at least nothing


def least_chars(fmt: str, args: tuple[Any, ...]) -> int:
    """A lower bound on the length of ``printf(fmt, *args)`` in characters (hence in bytes)."""
    total, pos, arg = 0, 0, 0

    def take() -> Any:
        nonlocal arg
        arg += 1
        return args[arg - 1] if arg <= len(args) else None

    while True:
        start = fmt.find("%", pos)
        if start < 0:
            return total + len(fmt) - pos
        total += start - pos
        spec = _SPEC.match(fmt, start)
        _flags, width_s, precision_s, _length, conversion = spec.groups()  # flags only add characters
        pos = spec.end()
        width = abs(_c_int(_int_arg(take()))) if width_s == "*" else (int(width_s) & 0x7FFFFFFF if width_s else 0)
        if precision_s == "*":
            precision = abs(_c_int(_int_arg(take())))
        else:  # a "." without digits is precision 0
            precision = None if precision_s is None else int(precision_s or 0) & 0x7FFFFFFF
        if conversion not in _CONVERSIONS:  # printf.c stops at an unknown (or internal) conversion
            return total
        if conversion == "%":
            total += 1
            continue
        if conversion == "n":  # takes no argument in SQL
            continue
        value = take()
        if conversion in "sqQwz":
            content = _text_chars(value)
            content = content if precision is None else min(content, precision)
        elif conversion == "c":
            content = max(1, precision or 0)
        elif conversion in "feE":
            content = min(precision or 0, _FP_PRECISION_LIMIT)
        elif conversion in "gG":
            content = 1
        else:  # integers: precision is the least number of digits
            content = max(1, precision or 0)
        total += max(width, content)


def _side(limit: int) -> sqlite3.Connection:
    """This thread's in-memory connection whose built-in printf does the formatting (its text
    read as bytes: a blob argument's may not be UTF-8)."""
    if state.side is None:
        state.side = sqlite3.connect(":memory:", check_same_thread=True)
        state.side.text_factory = bytes
    if state.side_limit != limit:
        state.side.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
        state.side_limit = limit
    return state.side


def _refuse() -> None:
    state.too_big = True
    raise TooBig(f"a printf result passes the length limit of {state.limit:,} bytes")


def _formatted(args: tuple[Any, ...]) -> bytes | None:
    """The bytes of ``printf(*args)`` as SQLite's own gives them (None for NULL), or ``TooBig``
    (with ``state.too_big`` set) instead of the NULL SQLite returns past ``state.limit``."""
    if not args or args[0] is None:
        return None  # printf() and printf(NULL) are NULL
    fmt = args[0]
    text = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else str(fmt)
    if least_chars(text, args[1:]) > state.limit:
        _refuse()
    calls = ", ".join("?" * len(args))
    try:
        out = _side(state.limit).execute(f"SELECT printf({calls})", args).fetchone()[0]  # SQLite's own, at the limit
        if out is not None:
            return out
        # NULL: SQLite's printf of an empty result, or its accumulator's failure at the limit; a
        # leading "x", with one byte more allowed, tells them apart
        marked = _side(state.limit + 1).execute(f"SELECT printf('x' || {calls})", args).fetchone()[0]
    except sqlite3.DataError:  # the format itself was past the limit
        _refuse()
    if marked == b"x":
        return None
    _refuse()


def bounded_printf(*args: Any) -> str | None:
    """``printf(fmt, ...)`` as SQLite computes it, but ``TooBig`` (with ``state.too_big`` set)
    instead of the NULL SQLite returns when the result passes ``state.limit``; bytes that
    are not UTF-8 (from a blob argument) dropped, as the sandbox reads such text."""
    out = _formatted(args)
    return None if out is None else out.decode("utf-8", errors="ignore")


def _unquoted(quoted: bytes) -> Any:
    """The value whose ``quote()`` is ``quoted``, text as bytes."""
    if quoted.startswith(b"'"):
        return quoted[1:-1].replace(b"''", b"'")
    if quoted.startswith(b"X'"):
        return bytes.fromhex(quoted[2:-1].decode("ascii"))
    if quoted == b"NULL":
        return None
    number = quoted.decode("ascii")
    try:
        return int(number)
    except ValueError:
        return float(number)  # quote() writes a real so that it reads back exactly ("Inf" too)


QUOTED_PRINTF = "progress_sql_printf"  # the bounded printf of quoted arguments


def quoted_printf(*quoted: bytes) -> bytes | None:
    """``bounded_printf`` of arguments given as ``CAST(quote(arg) AS BLOB)``, its result the
    bytes of SQLite's own (the caller casts them back to text)."""
    return _formatted(tuple(_unquoted(q) for q in quoted))


def install(con: sqlite3.Connection) -> None:
    """Put ``bounded_printf`` in place of the built-in ``printf`` and ``format`` of ``con``,
    and ``quoted_printf`` beside them for ``quoting_arguments``'s rewrite."""
    for name in ("printf", "format"):
        con.create_function(name, -1, bounded_printf, deterministic=True)
    con.create_function(QUOTED_PRINTF, -1, quoted_printf, deterministic=True)


def _is_call(tokens: list[Token], i: int) -> bool:
    return (tokens[i].text.lower() in ("printf", "format") and i + 1 < len(tokens)
            and tokens[i + 1].token_type == TokenType.L_PAREN)


def _arguments(tokens: list[Token], open_at: int) -> tuple[list[tuple[int, int]], int]:
    """The token ranges [lo, hi) of a call's arguments, its ``(`` at ``open_at``, and the index
    of its ``)``."""
    depth, start, spans = 0, open_at + 1, []
    for i in range(open_at, len(tokens)):
        kind = tokens[i].token_type
        depth += (kind == TokenType.L_PAREN) - (kind == TokenType.R_PAREN)
        if depth == 1 and kind == TokenType.COMMA or depth == 0:
            if i > start:
                spans.append((start, i))
            start = i + 1
        if depth == 0:
            return spans, i
    raise ValueError("a printf call without its closing parenthesis")


def quoting_arguments(sql: str) -> str:
    """``sql`` with every ``printf``/``format`` call a call of ``quoted_printf`` (module notes)."""
    tokens = list(SQLite().tokenize(sql))

    def text(lo: int, hi: int) -> str:  # the SQL of tokens [lo, hi), its calls rewritten
        out, pos, i = [], tokens[lo].start, lo
        while i < hi:
            if not _is_call(tokens, i):
                i += 1
                continue
            spans, close = _arguments(tokens, i + 1)
            out.append(sql[pos:tokens[i].start])
            quoted = ", ".join(f"CAST(quote({text(a, b)}) AS BLOB)" for a, b in spans)
            out.append(f"CAST({QUOTED_PRINTF}({quoted}) AS TEXT)")
            pos, i = tokens[close].end + 1, close + 1
        out.append(sql[pos:tokens[hi - 1].end + 1])
        return "".join(out)

    return text(0, len(tokens)) if tokens else sql

