"""Read-only, time-limited execution of one SELECT/WITH statement against a SQLite file.

``execute`` never raises: every failure comes back as an ``ExecResult`` whose ``error`` is one
of ``ERROR_KINDS``. Defences, outermost first:

1. text checks: a ``str`` of at most ``sandbox.max_sql_chars`` characters, valid UTF-8 (no lone
   surrogates), no NUL; the first keyword must be SELECT or WITH;
2. sqlglot (SQLite dialect): exactly one statement and its root is a query, so
   ``WITH x AS (...) DELETE ...`` or ``SELECT 1; DROP TABLE t`` never reach SQLite. Text that
   sqlglot cannot parse is left to SQLite, which is the judge of SQLite syntax;
3. SQLite: the file is opened through a ``mode=ro`` URI (plus ``immutable=1`` for a WAL-mode
   file without a ``-wal`` beside it, so no ``-wal``/``-shm`` is ever created),
   ``PRAGMA query_only``, extension loading off, and an authorizer that allows only reading
   (SELECT, READ, recursive CTEs and functions other than ``load_extension`` and friends);
   Python's sqlite3 itself refuses a second statement before running the first.

The wall-clock limit is enforced by a progress handler that checks ``time.monotonic()`` every
``_VM_STEPS_PER_CHECK`` virtual-machine steps and makes SQLite abandon the statement, so a
runaway query stops within milliseconds of its deadline instead of running on in the
background. A handler runs between steps, not inside one, so the work one step can do is
bounded by SQLite's own limits: no string or blob longer than ``sandbox.max_value_bytes``
(``SQLITE_LIMIT_LENGTH``: ``randomblob(450000000)``, ``zeroblob``, ``replace``, ``hex``, ``||`` or
a string doubled in a recursive CTE fail at once with ``too_big``), and SQLite's heap in the
process capped at ``sandbox.max_memory_mb`` (``PRAGMA hard_heap_limit``; past it:
``out_of_memory``). SQLite's ``printf``/``format`` swallow the length error (NULL, after seconds
for a huge width): every connection here has ``sql/printf.py``'s bounded one instead, which
answers ``too_big`` (``char`` takes at most 127 arguments, 508 bytes, and ``substr`` never
grows a value: neither can pass the limit).

So the in-process ``execute`` returns within one SQLite operation of its deadline, and the
operations left are those whose time grows faster than their output, such as ``instr`` of two
long strings (quadratic: ~1.3 s for 800,000 and 100,000 characters, ~30 s for 4 M and 1 M).
(``printf`` over text that is not UTF-8, which Python cannot hand to the bounded one, runs it
with quoted arguments: ``_run_decoding``.)
Only a process boundary stops those: policy SQL runs through ``sql/worker.py``'s
``execute_isolated`` and ``SQLPool``, which kill a worker that outlives its deadline by
``sandbox.hard_stop_grace_s``.

Connections are cached per thread, keyed by the path and validated against the file's
(device, inode, mtime, size) on every call, so a replaced or rewritten file is reopened and a
deleted one reports ``no_database``. Opening costs about as much as a small query (the schema
is parsed on first use), which is why the cache exists.
"""

from __future__ import annotations

import functools
import os
import re
import sqlite3
import stat
import threading
import time
from collections import OrderedDict
from urllib.parse import quote

from sqlglot import exp
from sqlglot.errors import SqlglotError

from progress_sql.sql import printf
from progress_sql.sql.settings import SandboxSettings, default_sandbox
from progress_sql.sql.parse import parse_sql
from progress_sql.sql.result import ErrorKind, ExecResult

# Implementation constants (not tunables): how often the deadline is checked, how many
# connections one thread keeps open, how many static verdicts are remembered.
_VM_STEPS_PER_CHECK = 1000  # about 10 µs of VM work; measured overhead ~3%
_CONNECTIONS_PER_THREAD = 16
_STATIC_CACHE_SIZE = 4096
_STATIC_CACHE_MAX_CHARS = 4096  # longer texts are checked uncached (keeps the cache small)
_MESSAGE_CHARS = 300

_SQLITE_MAGIC = b"SQLite format 3\x00"
_ALLOWED_FIRST_WORDS = frozenset({"select", "with"})
# Every other statement SQLite knows; text starting with one of them is refused as forbidden,
# anything else that does not start with SELECT/WITH cannot be SQL and is a syntax error.
_STATEMENT_WORDS = frozenset(
    {
        "alter", "analyze", "attach", "begin", "commit", "create", "delete", "detach", "drop",
        "end", "explain", "insert", "pragma", "reindex", "release", "replace", "rollback",
        "savepoint", "update", "upsert", "vacuum", "values",
    }
)
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)
_FIRST_WORD = re.compile(r"[A-Za-z_]+")

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
# Functions that reach outside the database (or have been used to attack SQLite).
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})

_UNDECODABLE_TEXT = "could not decode to utf-8"
_FUNCTION_FAILED = "user-defined function raised exception"  # sqlite3 could not pass printf its text


def _fail(kind: ErrorKind, message: str, started: float) -> ExecResult:
    line = " ".join(str(message).split())
    if len(line) > _MESSAGE_CHARS:
        line = line[: _MESSAGE_CHARS - 1] + "…"
    return ExecResult(error=kind, message=line, elapsed_s=time.monotonic() - started)


# ----------------------------------------------------------------------------- static checks
def _check_text(sql: object, max_chars: int) -> tuple[ErrorKind, str] | None:
    if not isinstance(sql, str):
        return "forbidden", f"SQL must be text (str), got {type(sql).__name__}"
    if len(sql) > max_chars:
        return "forbidden", f"SQL text has {len(sql)} characters, more than the limit of {max_chars}"
    if "\x00" in sql:
        return "forbidden", "SQL text contains a NUL character"
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as err:
        return "forbidden", f"SQL text is not valid UTF-8 (undecodable byte at position {err.start})"
    return None


def _check_statement(sql: str) -> tuple[ErrorKind, str] | None:
    """Verdict on well-formed text: None when it may go to SQLite."""
    if len(sql) > _STATIC_CACHE_MAX_CHARS:
        return _statement_verdict(sql)
    return _cached_statement_verdict(sql)


def _statement_verdict(sql: str) -> tuple[ErrorKind, str] | None:
    start = _LEADING_NOISE.match(sql).end()
    if start >= len(sql):
        return "syntax", "empty SQL: no statement"
    word_match = _FIRST_WORD.match(sql, start)
    word = word_match.group(0).lower() if word_match else ""
    if word not in _ALLOWED_FIRST_WORDS:
        if word in _STATEMENT_WORDS:
            return "forbidden", f"only a SELECT or WITH query is allowed, not {word.upper()}"
        shown = sql[start : start + 20].split("\n")[0]
        return "syntax", f"SQL must start with SELECT or WITH, found {shown!r}"
    try:
        parsed = parse_sql(sql)
        statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]  # "; -- note"
    except (SqlglotError, RecursionError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # sqlglot's grammar is not SQLite's: SQLite decides, under the authorizer
    if len(statements) > 1:
        return "forbidden", f"only one statement is allowed, found {len(statements)}"
    if statements and not isinstance(statements[0], exp.Query):
        return "forbidden", f"only a query is allowed, found {type(statements[0]).__name__.upper()}"
    return None


# Gold SQL and the rollouts of one question repeat: remember their verdicts.
_cached_statement_verdict = functools.lru_cache(maxsize=_STATIC_CACHE_SIZE)(_statement_verdict)


# ----------------------------------------------------------------------------- connections
def _authorize(action: int, arg1: str | None, arg2: str | None, db_name: str | None, source: str | None) -> int:
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _lenient_text(raw: bytes) -> str:
    # The Spider evaluator decodes text the same way (errors="ignore").
    return raw.decode("utf-8", errors="ignore")


class _NoDatabase(Exception):
    """The path is not a readable SQLite file."""


def _signature(path: str) -> tuple[int, int, int, int]:
    """(device, inode, mtime_ns, size) of a regular file, or raise _NoDatabase."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _NoDatabase(f"database file not found: {path}") from None
    except (OSError, ValueError) as err:
        raise _NoDatabase(f"cannot access database {path}: {getattr(err, 'strerror', None) or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _NoDatabase(f"not a database file (a directory or special file): {path}")
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def _needs_immutable(path: str) -> bool:
    """Check the SQLite header; True for a WAL-mode file with no ``-wal`` beside it."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
    except OSError as err:
        raise _NoDatabase(f"cannot read database {path}: {err.strerror or err}") from None
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise _NoDatabase(f"not a SQLite database file: {path}")
    wal_mode = header[18] == 2 or header[19] == 2
    # mode=ro on a WAL-mode file would create -wal/-shm files; when no -wal exists there is
    # nothing to replay, so the file can be opened as immutable instead.
    return wal_mode and not os.path.exists(path + "-wal")


_heap_limit = [-1]  # the process-wide SQLite heap limit last set here, in bytes


def _limit_heap(megabytes: int) -> None:
    """Cap SQLite's heap in this process (the pragma is global to the library: any connection sets it)."""
    limit = int(megabytes) * 2**20
    if _heap_limit[0] != limit:
        con = sqlite3.connect(":memory:")
        try:
            con.execute(f"PRAGMA hard_heap_limit = {limit}")
        finally:
            con.close()
        _heap_limit[0] = limit


def _connect(path: str, immutable: bool) -> sqlite3.Connection:
    uri = "file:" + quote(os.path.abspath(path)) + "?mode=ro" + ("&immutable=1" if immutable else "")
    con = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        if hasattr(con, "enable_load_extension"):
            con.enable_load_extension(False)
        con.execute("PRAGMA query_only = ON")  # before the authorizer, which denies PRAGMA
        con.set_authorizer(_authorize)
        printf.install(con)  # SQLite's own printf turns a too long result into NULL
    except BaseException:
        con.close()
        raise
    return con


class _ThreadConnections(threading.local):
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.entries: OrderedDict[str, tuple[tuple[int, int, int, int], sqlite3.Connection]] = OrderedDict()


_local = _ThreadConnections()


def _drop_connection(path: str) -> None:
    cached = _local.entries.pop(path, None)
    if cached is not None:
        cached[1].close()


def _connection(path: str) -> sqlite3.Connection:
    """This thread's open connection to ``path``, reopened when the file changed."""
    if _local.pid != os.getpid():  # a forked child must not reuse its parent's handles
        _local.pid, _local.entries = os.getpid(), OrderedDict()
    entries = _local.entries
    cached = entries.get(path)
    try:
        signature = _signature(path)
        if cached is not None and cached[0] == signature:
            entries.move_to_end(path)
            return cached[1]
        immutable = _needs_immutable(path)  # the header is read only when (re)opening
    except _NoDatabase:
        _drop_connection(path)
        raise
    if cached is not None:
        _drop_connection(path)
    con = _connect(path, immutable)
    entries[path] = (signature, con)
    while len(entries) > _CONNECTIONS_PER_THREAD:
        _, (_, old) = entries.popitem(last=False)
        old.close()
    return con


def clear_connection_cache() -> None:
    """Close this thread's cached connections (the next call reopens them)."""
    while _local.entries:
        _, (_, con) = _local.entries.popitem()
        con.close()


# ----------------------------------------------------------------------------- execution
def _classify(err: Exception, timed_out: bool) -> ErrorKind:
    text = str(err).lower()
    if timed_out:
        return "timeout"
    if "string or blob too big" in text:
        return "too_big"
    if "out of memory" in text:
        return "out_of_memory"
    if "one statement at a time" in text:
        return "forbidden"
    if any(m in text for m in ("not authorized", "authorization denied", "readonly database", "attempt to write")):
        return "forbidden"
    if any(m in text for m in ("syntax error", "incomplete input", "unrecognized token")):
        return "syntax"
    if any(m in text for m in ("file is not a database", "malformed", "unable to open database")):
        return "no_database"
    return "runtime"


def _run(con: sqlite3.Connection, sql: str, deadline: float, max_rows: int) -> tuple[tuple, tuple, bool]:
    """(rows, columns, truncated); sqlite3 errors carry ``timed_out``."""
    fired = [False]

    def past_deadline() -> bool:
        if time.monotonic() > deadline:
            fired[0] = True
            return True
        return False

    con.set_progress_handler(past_deadline, _VM_STEPS_PER_CHECK)
    printf.state.too_big = False
    cur = con.cursor()
    try:
        cur.execute(sql)
        rows = cur.fetchmany(max_rows + 1)
        columns = tuple(d[0] for d in cur.description or ())
    except sqlite3.Error as err:
        err.timed_out = fired[0]  # type: ignore[attr-defined]
        err.too_big = printf.state.too_big  # type: ignore[attr-defined]
        raise
    finally:
        cur.close()  # resets the statement, releasing its read lock
        con.set_progress_handler(None, 0)
    return tuple(rows[:max_rows]), columns, len(rows) > max_rows


def _run_decoding(con: sqlite3.Connection, sql: str, deadline: float, max_rows: int) -> tuple[tuple, tuple, bool]:
    """``_run``, again when the file's text is not UTF-8: results decoded leniently, and a call
    of printf with a text argument Python cannot receive run with its arguments quoted
    (``printf.quoting_arguments``: bounded all the same)."""
    quoted = False
    for _ in range(2):
        try:
            return _run(con, sql, deadline, max_rows)
        except sqlite3.OperationalError as err:
            text = str(err).lower()
            if _UNDECODABLE_TEXT in text and con.text_factory is not _lenient_text:
                con.text_factory = _lenient_text  # this file holds non-UTF-8 text: stay lenient
            elif _FUNCTION_FAILED in text and not getattr(err, "too_big", False) and not quoted:
                sql, quoted = printf.quoting_arguments(sql), True
            else:
                raise
    return _run(con, sql, deadline, max_rows)


def _as_path(db_path: object) -> tuple[str, str]:
    """The database path as text, and '' (else '' and why it is not a path)."""
    if db_path is None:
        return "", "no database path given"
    try:
        path = os.fspath(db_path)  # type: ignore[call-overload]
    except TypeError:
        return "", f"database path must be a path, got {type(db_path).__name__}"
    return (os.fsdecode(path) if isinstance(path, bytes) else path), ""


def _stopped(err: sqlite3.Error | sqlite3.Warning, path: str, timeout: float, cfg: SandboxSettings) -> tuple[str, str]:
    """The error kind and message of a query that SQLite stopped (a dead file's connection dropped)."""
    kind = "too_big" if getattr(err, "too_big", False) else _classify(err, getattr(err, "timed_out", False))
    if kind == "timeout":
        return kind, f"query stopped after exceeding the {timeout:g} s time limit"
    if kind == "too_big":
        return kind, f"a string or blob grew past the limit of {cfg.max_value_bytes:,} bytes (sandbox.max_value_bytes)"
    if kind == "out_of_memory":
        return kind, f"SQLite needed more than {cfg.max_memory_mb} MB (sandbox.max_memory_mb)"
    if kind == "no_database":
        _drop_connection(path)
    return kind, str(err) or type(err).__name__


def execute(
    db_path: str | os.PathLike | None,
    sql: object,
    timeout_s: float | None = None,
    max_rows: int | None = None,
    *,
    settings: SandboxSettings | None = None,
) -> ExecResult:
    """Run one read-only SELECT/WITH query; never raises.

    ``timeout_s`` and ``max_rows`` default to ``settings`` (or ``default_sandbox()``).
    Values are returned as SQLite gives them (BLOBs stay ``bytes``); text that is not valid
    UTF-8 is decoded leniently, dropping the bad bytes, as the Spider evaluator does.
    """
    started = time.monotonic()
    try:
        cfg = settings if settings is not None else default_sandbox()
        timeout = cfg.timeout_s if timeout_s is None else float(timeout_s)
        limit = cfg.max_rows if max_rows is None else int(max_rows)
        if not timeout > 0:
            return _fail("runtime", f"timeout_s must be positive, got {timeout_s!r}", started)
        if limit < 1:
            return _fail("runtime", f"max_rows must be at least 1, got {max_rows!r}", started)

        verdict = _check_text(sql, cfg.max_sql_chars) or _check_statement(sql)  # type: ignore[arg-type]
        if verdict is not None:
            return _fail(verdict[0], verdict[1], started)

        path, problem = _as_path(db_path)
        if problem:
            return _fail("no_database", problem, started)
        try:
            con = _connection(path)
        except _NoDatabase as err:
            return _fail("no_database", str(err), started)
        con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, cfg.max_value_bytes)
        printf.state.limit = cfg.max_value_bytes
        _limit_heap(cfg.max_memory_mb)

        deadline = started + timeout
        try:
            rows, columns, truncated = _run_decoding(con, sql, deadline, limit)  # type: ignore[arg-type]
        except (sqlite3.Error, sqlite3.Warning) as err:
            return _fail(*_stopped(err, path, timeout, cfg), started)
        return ExecResult(rows=rows, columns=columns, elapsed_s=time.monotonic() - started, truncated=truncated)
    except MemoryError:  # sqlite3 raises it for SQLITE_NOMEM: the heap limit, or the process's own memory
        return _fail("out_of_memory", "out of memory while executing the query (sandbox.max_memory_mb)", started)
    except Exception as err:  # the contract: nothing escapes
        return _fail("runtime", f"{type(err).__name__}: {err}", started)


__all__ = ["execute", "clear_connection_cache"]
