"""SQLite's ``printf``/``format`` with its length limit kept: a result past it is ``too_big``.

SQLite (3.40 and others) builds ``printf``'s result in a string accumulator whose
SQLITE_TOOBIG it swallows: ``printf('%.*c', 20000000, 'x')`` past ``SQLITE_LIMIT_LENGTH``
returns NULL, a silent wrong value, and with a width of 900,000,000 it spends seconds inside
one virtual-machine step before doing so. The sandbox registers ``bounded_printf`` under both
names on every connection it opens. It first adds up the least number of characters the format
must produce (literal text, each conversion's width and precision, each ``%s`` argument's
length), refusing at once when that passes the limit; otherwise the built-in ``printf`` of a
per-thread in-memory side connection (same length limit) formats the values behind one literal
character, and a NULL from it (which then only the accumulator's failure gives) is refused too. A refusal sets
``state.too_big`` (the sandbox reads it, as it reads its deadline flag) and raises, which
SQLite reports as an error of the user function.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from typing import Any

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
    """This thread's in-memory connection whose built-in printf does the formatting."""
    if state.side is None:
        state.side = sqlite3.connect(":memory:", check_same_thread=True)
        # a blob argument's bytes may not be UTF-8: dropped, as the sandbox decodes such text
        state.side.text_factory = lambda raw: raw.decode("utf-8", errors="ignore")
    if state.side_limit != limit:
        state.side.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limit)
        state.side_limit = limit
    return state.side


def _refuse() -> None:
    state.too_big = True
    raise TooBig(f"a printf result passes the length limit of {state.limit:,} bytes")


def bounded_printf(*args: Any) -> Any:
    """``printf(fmt, ...)`` as SQLite computes it, but ``TooBig`` (with ``state.too_big`` set)
    instead of the NULL SQLite returns when the result passes ``state.limit``."""
    if not args or args[0] is None:
        return None  # printf() and printf(NULL) are NULL
    fmt = args[0]
    text = fmt.decode("utf-8", "replace") if isinstance(fmt, bytes) else str(fmt)
    if least_chars(text, args[1:]) > state.limit:
        _refuse()
    # SQLite's printf gives NULL for an empty result too: a leading "x" tells that from a failure
    placeholders = ", ".join("?" * len(args[1:]))
    sql = f"SELECT printf('x' || ?{', ' if placeholders else ''}{placeholders})"
    try:
        out = _side(state.limit + 1).execute(sql, args).fetchone()[0]
    except sqlite3.DataError:  # the format itself was past the limit
        _refuse()
    if out is None:
        _refuse()
    if out == "x":  # empty: NULL or '', as SQLite's printf has it for this format
        return _side(state.limit).execute(f"SELECT printf({', '.join('?' * len(args))})", args).fetchone()[0]
    return out[1:]


def install(con: sqlite3.Connection) -> None:
    """Put ``bounded_printf`` in place of the built-in ``printf`` and ``format`` of ``con``."""
    for name in ("printf", "format"):
        con.create_function(name, -1, bounded_printf, deterministic=True)

