"""The SQL sandbox, the pool and the gold cache, on real SQLite files."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from progress_sql.params import SandboxSettings
from progress_sql.sql import ERROR_KINDS, ExecResult, GoldCache, SQLPool, execute, gold_result
from progress_sql.sql import sandbox
from progress_sql.sql.pool import default_gold_cache

RUNAWAY_TIMEOUT_S = 0.5
LATENESS_BOUND_S = 0.2  # the bound: a runaway query stops within timeout + 0.2 s


def _snapshot(folder: Path) -> dict[str, str]:
    """Name → SHA-256 of every file in the folder (the listing is the key set)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture()
def numbers_db(tmp_path: Path) -> Path:
    """A 1000-row table for runaway queries, plus text, blob and NULL values."""
    path = tmp_path / "numbers.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE n (i INTEGER PRIMARY KEY, label TEXT, payload BLOB)")
    con.executemany("INSERT INTO n VALUES (?,?,?)", [(i, f"n{i}", bytes([i % 256, 0, 255])) for i in range(1000)])
    con.execute("INSERT INTO n VALUES (1000, NULL, NULL)")
    con.commit()
    con.close()
    return path


# ----------------------------------------------------------------------------- hostile input
HOSTILE: list[tuple[object, str]] = [
    ("DROP TABLE student", "forbidden"),
    ("DELETE FROM student", "forbidden"),
    ("INSERT INTO department VALUES (9, 'x', 1.0)", "forbidden"),
    ("UPDATE student SET age = 0", "forbidden"),
    ("CREATE TABLE z (a INTEGER)", "forbidden"),
    ("CREATE TEMP TABLE z (a INTEGER)", "forbidden"),
    ("ATTACH 'x.db' AS other", "forbidden"),
    ("DETACH other", "forbidden"),
    ("PRAGMA writable_schema=1", "forbidden"),
    ("PRAGMA journal_mode=WAL", "forbidden"),
    ("PRAGMA table_info(student)", "forbidden"),
    ("VACUUM", "forbidden"),
    ("VACUUM INTO 'copy.sqlite'", "forbidden"),
    ("REINDEX", "forbidden"),
    ("ANALYZE", "forbidden"),
    ("BEGIN IMMEDIATE", "forbidden"),
    ("SELECT load_extension('libevil')", "forbidden"),
    ("SELECT * FROM pragma_table_info('student')", "forbidden"),
    ("WITH x AS (SELECT 1) DELETE FROM student", "forbidden"),
    ("WITH x AS (SELECT 1) INSERT INTO department SELECT 7, 'y', 2.0", "forbidden"),
    ("SELECT 1; DROP TABLE student", "forbidden"),
    ("SELECT * FROM student; DELETE FROM student;", "forbidden"),
    ("SELECT 1; SELECT 2", "forbidden"),
    ("", "syntax"),
    ("   \n\t ", "syntax"),
    ("-- only a comment", "syntax"),
    ("SELEC name FROM student", "syntax"),
    ("SELECT name FROM WHERE", "syntax"),
    ("SELECT " + "x" * 1_000_000, "forbidden"),
    (b"\xff\xfe".decode("utf-8", "surrogateescape"), "forbidden"),
    ("SELECT 'a\x00b'", "forbidden"),
    (None, "forbidden"),
    (b"SELECT 1", "forbidden"),
    ("SELECT no_such_column FROM student", "runtime"),
    ("SELECT * FROM no_such_table", "runtime"),
    ("SELECT name FROM student WHERE age = ?", "runtime"),
]


@pytest.mark.parametrize(("sql", "kind"), HOSTILE, ids=[repr(s)[:40] for s, _ in HOSTILE])
def test_hostile_statement_gets_its_error_kind(school_db: Path, sql: object, kind: str) -> None:
    result = execute(school_db, sql)
    assert result.error == kind, result.message
    assert result.message and "\n" not in result.message
    assert result.rows == ()


def test_hostile_battery_leaves_every_file_untouched(school_db: Path) -> None:
    folder = school_db.parent
    (folder / "fake.sqlite").write_text("a text file pretending to be a database\n" * 10)
    (folder / "a_directory.sqlite").mkdir()
    before = _snapshot(folder)
    for sql, _ in HOSTILE:
        assert execute(school_db, sql).error in ERROR_KINDS
    for bad in ("fake.sqlite", "a_directory.sqlite", "missing.sqlite"):
        assert execute(folder / bad, "SELECT 1").error == "no_database"
    assert _snapshot(folder) == before  # same files (no -wal/-journal), same bytes
    assert sorted(p.name for p in folder.iterdir()) == ["a_directory.sqlite", "fake.sqlite", "school.sqlite"]
    assert execute(school_db, "SELECT count(*) FROM student").rows == ((30,),)


def test_sqlite_layer_stops_writes_when_the_static_check_is_bypassed(school_db: Path, monkeypatch) -> None:
    """The authorizer, mode=ro and query_only are a real backstop, not decoration."""
    monkeypatch.setattr(sandbox, "_check_statement", lambda sql: None)
    folder = school_db.parent
    before = _snapshot(folder)
    for sql in [
        "DROP TABLE student", "DELETE FROM student", "UPDATE student SET age = 0", "CREATE TABLE z (a)",
        "ATTACH 'x.db' AS other", "PRAGMA writable_schema=1", "PRAGMA query_only=0", "VACUUM",
        "VACUUM INTO 'copy.sqlite'", "REINDEX", "WITH x AS (SELECT 1) DELETE FROM student",
        "SELECT 1; DROP TABLE student", "SELECT load_extension('libevil')",
    ]:
        result = execute(school_db, sql)
        assert result.error == "forbidden", (sql, result)
    assert _snapshot(folder) == before


@pytest.mark.parametrize("kind", ["missing", "directory", "text", "empty", "truncated"])
def test_bad_database_paths(tmp_path: Path, school_db: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.sqlite"
    if kind == "directory":
        path.mkdir()
    elif kind == "text":
        path.write_text("SQLite? no, a text file pretending to be one\n" * 10)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(school_db.read_bytes()[:50])
    result = execute(path, "SELECT 1")
    assert result.error == "no_database", result.message
    assert str(path) in result.message


def test_no_database_for_a_missing_path_argument() -> None:
    assert execute(None, "SELECT 1").error == "no_database"
    assert execute(12345, "SELECT 1").error == "no_database"


@hsettings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_random_text_never_raises(school_db_path: Path, text: str) -> None:
    result = execute(school_db_path, text, timeout_s=0.5)
    assert isinstance(result, ExecResult)
    assert result.error is None or result.error in ERROR_KINDS


@pytest.fixture(scope="module")
def school_db_path(tmp_path_factory) -> Path:
    """A module-wide copy of a small database (hypothesis forbids function-scoped fixtures)."""
    path = tmp_path_factory.mktemp("hyp") / "db.sqlite"
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE t (a INTEGER, b TEXT); INSERT INTO t VALUES (1, 'x'), (2, 'y');")
    con.close()
    return path


# ----------------------------------------------------------------------------- results
def test_rows_columns_and_values_come_back_as_sqlite_gives_them(numbers_db: Path) -> None:
    result = execute(numbers_db, "SELECT i, label, payload, i * 0.5 AS half FROM n WHERE i IN (3, 1000) ORDER BY i")
    assert result.ok and result.error is None and not result.truncated
    assert result.columns == ("i", "label", "payload", "half")
    assert result.rows == ((3, "n3", bytes([3, 0, 255]), 1.5), (1000, None, None, 500.0))
    assert isinstance(result.rows[0][2], bytes)
    assert result.elapsed_s >= 0


@pytest.mark.parametrize(
    "sql",
    ["SELECT 1;", "SELECT 1; -- a trailing comment", "/* lead */ -- line\n SELECT 1", "  with x AS (SELECT 1) SELECT * FROM x"],
)
def test_harmless_decorations_are_accepted(school_db: Path, sql: str) -> None:
    assert execute(school_db, sql).rows == ((1,),)


def test_max_rows_truncates(numbers_db: Path) -> None:
    result = execute(numbers_db, "SELECT i FROM n ORDER BY i", max_rows=5)
    assert result.rows == tuple((i,) for i in range(5)) and result.truncated
    exact = execute(numbers_db, "SELECT i FROM n WHERE i < 5", max_rows=5)
    assert len(exact.rows) == 5 and not exact.truncated


def test_settings_supply_the_defaults(numbers_db: Path) -> None:
    tight = SandboxSettings(max_rows=3, max_sql_chars=40, timeout_s=0.3)
    assert len(execute(numbers_db, "SELECT i FROM n", settings=tight).rows) == 3
    assert execute(numbers_db, "SELECT i FROM n WHERE i > 1 AND label IS NOT NULL", settings=tight).error == "forbidden"
    started = time.monotonic()
    assert execute(numbers_db, "SELECT count(*) FROM n a, n b, n c", settings=tight).error == "timeout"
    assert time.monotonic() - started < 0.3 + LATENESS_BOUND_S


def test_text_that_is_not_utf8_is_decoded_leniently(tmp_path: Path) -> None:
    path = tmp_path / "latin.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (name TEXT)")
    con.execute("INSERT INTO t VALUES (CAST(x'436166e9' AS TEXT))")  # 'Café' in latin-1
    con.commit()
    con.close()
    result = execute(path, "SELECT name FROM t")
    assert result.ok and result.rows == (("Caf",),)  # the invalid byte is dropped, like the reference


# ----------------------------------------------------------------------------- timeouts
RUNAWAYS = {
    "recursive_cte": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "cartesian_5": "SELECT count(*) FROM n a, n b, n c, n d, n e",
    "cartesian_rows": "SELECT a.i, b.i, c.i FROM n a, n b, n c ORDER BY a.label, b.label, c.label",
}


@pytest.mark.parametrize("name", list(RUNAWAYS))
def test_runaway_queries_are_interrupted_on_time(numbers_db: Path, name: str) -> None:
    started = time.monotonic()
    result = execute(numbers_db, RUNAWAYS[name], timeout_s=RUNAWAY_TIMEOUT_S)
    elapsed = time.monotonic() - started
    assert result.error == "timeout", result
    assert RUNAWAY_TIMEOUT_S <= elapsed < RUNAWAY_TIMEOUT_S + LATENESS_BOUND_S
    # The connection is still usable afterwards.
    assert execute(numbers_db, "SELECT count(*) FROM n").rows == ((1001,),)


# Queries that do their damage inside one SQLite operation, where the progress handler never
# runs (issue 33's recipes): SQLite's length limit fails the ones that build a huge value at once,
# the worker's hard stop ends the one that loops, the worker's memory cap the one that hoards rows.
BOMBS = {
    "randomblob": ("SELECT length(hex(randomblob(450000000)))", "too_big"),
    "zeroblob": ("SELECT length(zeroblob(2000000000))", "too_big"),
    "printf_width": ("SELECT length(printf('%900000000c', 'x'))", "too_big"),  # SQLite's own: NULL
    "doubling_cte": ("WITH RECURSIVE d(s, n) AS (SELECT 'x', 0 UNION ALL SELECT s || s, n + 1 FROM d WHERE n < 40) "
                     "SELECT max(length(s)) FROM d", "too_big"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_value_bombs_fail_fast_on_the_length_limit(numbers_db: Path, name: str) -> None:
    sql, kind = BOMBS[name]
    started = time.monotonic()
    result = execute(numbers_db, sql, timeout_s=2.0)
    assert time.monotonic() - started < 1.0
    assert result.error == kind, result
    if kind == "too_big":
        assert "sandbox.max_value_bytes" in result.message


# Values past sandbox.max_value_bytes (16 MB), function by function, on both execution paths
# (issue 39: SQLite's printf returned NULL, a silent wrong value, and took seconds to do it).
S9 = "hex(zeroblob(4500000))"  # 9 M characters
QUOTES9 = f"replace({S9}, '0', '''')"  # 9 M quotes: %q doubles each
LONG_VALUES = {
    "printf_precision": ("SELECT length(printf('%.*c', 20000000, 'x'))", "too_big"),
    "printf_precision_900M": ("SELECT length(printf('%.*c', 900000000, 'x'))", "too_big"),
    "printf_width": ("SELECT length(printf('%20000000d', 7))", "too_big"),
    "printf_float_precision": ("SELECT length(printf('%.20000000f', 1.5))", "too_big"),
    "printf_two_strings": (f"SELECT length(printf('%s%s', {S9}, {S9}))", "too_big"),
    "printf_quote_doubling": (f"SELECT length(printf('%q', {QUOTES9}))", "too_big"),  # past it only once formatted
    "format": ("SELECT length(format('%.*c', 20000000, 'x'))", "too_big"),
    "printf_in_where": ("SELECT count(*) FROM n WHERE printf('%.*c', 16000001 - i % 2, 'x') <> ''", "too_big"),
    "replace": (f"SELECT length(replace({S9}, '0', '00'))", "too_big"),
    "substr_of_blob_concat": ("SELECT length(substr(zeroblob(9000000) || zeroblob(9000000), 2))", "too_big"),
    "zeroblob": ("SELECT length(zeroblob(20000000))", "too_big"),
    "hex_of_blob": ("SELECT length(hex(zeroblob(9000000)))", "too_big"),
    "group_concat": ("SELECT length(group_concat(hex(zeroblob(20000)))) FROM n", "too_big"),
    "char_too_many_arguments": ("SELECT char(" + ", ".join(["1114111"] * 128) + ")", "runtime"),
    # within the limit: the true value, never NULL
    "printf_just_under": ("SELECT length(printf('%.*c', 15000000, 'x'))", 15_000_000),
    "printf_quote_under": ("SELECT length(printf('%q', replace(hex(zeroblob(3000000)), '0', '''')))", 12_000_000),
    "substr_of_blob": ("SELECT length(substr(zeroblob(15000000), 2))", 14_999_999),
    "char_127_arguments": ("SELECT length(char(" + ", ".join(["1114111"] * 127) + "))", 127),
}


@pytest.fixture(scope="module")
def long_value_worker():
    from progress_sql.sql.worker import Worker

    worker = Worker()
    yield worker
    worker.close()


@pytest.mark.parametrize("path", ["in_process", "worker"])
@pytest.mark.parametrize("name", list(LONG_VALUES))
def test_values_past_the_length_limit_are_too_big_on_both_paths(numbers_db: Path, long_value_worker, name: str,
                                                               path: str) -> None:
    sql, expected = LONG_VALUES[name]
    started = time.monotonic()
    if path == "in_process":
        result = execute(numbers_db, sql, timeout_s=5.0)
    else:
        result, = long_value_worker.run([(numbers_db, sql)], timeout_s=5.0)
    assert time.monotonic() - started < 2.0
    if isinstance(expected, int):
        assert result.rows == ((expected,),), result
    else:
        assert result.error == expected, result
        if expected == "too_big":
            assert "sandbox.max_value_bytes" in result.message
        else:
            assert "too many arguments on function char" in result.message


PRINTF_FORMATS = [
    ("'%5.2f|%d|%s|%q|%Q|%w|%-4s|'", "3.14159, 42, 'ab', 'it''s', NULL, 'a\"b', 'x'"),
    ("'%,d %x %X %o %e %E %g %G %c %%'", "1234567, 255, 255, 8, 1.5, 1.5, 0.1, 1e20, 'hello'"),
    ("'%*d|%-*d|%.*s|%.3c|%!.2s|%#x|%+d|% d|%05d'", "6, 42, 6, 42, 2, 'abcdef', 'é', 'éèê', 255, 5, 5, 5"),
    ("'%s %s %s %d %d'", "x'41', 1.0, NULL, '12abc', 3.9"),
    ("'%z|%i|%u|%lld|%p|%n|%'", "'z', -3, 7, 9007199254740993, 255, 0"),
    ("'%d %s'", ""),  # missing arguments
    ("'%T ends it %d'", "1, 2"),  # an internal conversion: SQLite stops there
    ("x'25642125'", "5"),  # a blob format
    ("NULL", "1"),
    ("''", ""),  # NULL: SQLite's printf of an empty result
    ("'%s'", "''"),  # '' here
]


@pytest.mark.parametrize(("fmt", "args"), PRINTF_FORMATS)
def test_bounded_printf_formats_as_sqlite_does(numbers_db: Path, fmt: str, args: str) -> None:
    call = f"({fmt}{', ' + args if args else ''})"
    sql = f"SELECT printf{call}, format{call}"
    con = sqlite3.connect(":memory:")
    expected = con.execute(sql).fetchall()
    con.close()
    result = execute(numbers_db, sql)
    assert result.ok and [tuple(row) for row in result.rows] == expected, (result, expected)


@hsettings(max_examples=300, deadline=None)
@given(fmt=st.text(alphabet="%%%-+ #!0,.*123lsdqQwcfeEgGxXopzin Tr|é", max_size=14),
       args=st.lists(st.one_of(st.integers(-999, 999), st.floats(-1e6, 1e6, allow_nan=False), st.text(max_size=5),
                               st.binary(max_size=4), st.none()), max_size=4))
def test_bounded_printf_agrees_with_sqlites_on_any_short_format(fmt: str, args: list) -> None:
    """SQLite's printf at the same length limit, or TooBig where that one gives a NULL that is a
    failure (its result without the limit is not NULL): past the limit, or, for a float with a
    width near it (`printf('%*E', 999981.0)`: 999,981 characters), its conversion buffer past it."""
    from progress_sql.sql.printf import TooBig, bounded_printf, state

    limit, call = 1_000_000, f"SELECT printf({', '.join('?' * (1 + len(args)))})"
    expected = {}
    for name, length in (("limited", limit), ("unlimited", None)):
        con = sqlite3.connect(":memory:")
        con.text_factory = lambda raw: raw.decode("utf-8", errors="ignore")  # a blob's bytes, as the sandbox reads them
        if length:
            con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, length)
        expected[name] = con.execute(call, (fmt, *args)).fetchone()[0]
        con.close()
    state.limit = limit
    if expected["limited"] is None and expected["unlimited"] is not None:
        with pytest.raises(TooBig):
            bounded_printf(fmt, *args)
    else:
        assert bounded_printf(fmt, *args) == expected["limited"]


def test_a_float_whose_conversion_buffer_passes_the_limit_is_refused_and_one_below_it_formatted() -> None:
    """Found by the test above: `%*E` with a width 19 short of the limit is 999,981 characters, yet
    SQLite's float buffer (width + precision 6 + 15) passes 1,000,000 and its printf gives NULL."""
    from progress_sql.sql.printf import TooBig, bounded_printf, state

    state.limit = 1_000_000
    with pytest.raises(TooBig):
        bounded_printf("%*E", 999_981.0)
    assert len(bounded_printf("%*E", 999_979.0)) == 999_979
    with pytest.raises(TooBig):
        bounded_printf("%*E", 999_980.0)  # a byte past: SQLite at the limit fails, one byte more would not

def test_printf_over_text_that_is_not_utf8_still_answers(tmp_path: Path) -> None:
    # Python cannot pass such text to the bounded printf: SQLite's own formats it
    path = tmp_path / "latin1.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (name TEXT)")
    con.execute("INSERT INTO t VALUES (CAST(x'436166e9' AS TEXT))")  # 'Café' in latin-1
    con.commit()
    con.close()
    assert execute(path, "SELECT printf('%s!', name) FROM t").rows == (("Caf!",),)
    assert execute(path, "SELECT length(printf('%.*c', 20000000, 'x'))").error == "too_big"


# Issue 49: text that is not UTF-8 cannot reach the bounded printf from Python, and SQLite's own
# gave NULL (the width) or ran for seconds (the precision). Every argument type, both paths.
PRINTF_ARGUMENTS = ["'x'", "CAST(x'ff' AS TEXT)", "x'ff'", "1", "1.5", "NULL"]
PRINTF_BOMBS = ["printf('%2000000000s', {})", "printf('%.*c', 2000000000, {})", "format('%2000000000d', {})",
                "printf(CAST(x'25323030303030303030306366ff' AS TEXT), {})"]  # a format not UTF-8: '%2000000000cf\xff'


@pytest.mark.parametrize("path", ["in_process", "worker"])
@pytest.mark.parametrize("bomb", PRINTF_BOMBS)
@pytest.mark.parametrize("argument", PRINTF_ARGUMENTS)
def test_printf_is_bounded_for_every_argument_type_on_both_paths(numbers_db: Path, long_value_worker, argument: str,
                                                                  bomb: str, path: str) -> None:
    sql = "SELECT " + bomb.format(argument)
    started = time.monotonic()
    if path == "in_process":
        result = execute(numbers_db, sql, timeout_s=2.0)
    else:
        result, = long_value_worker.run([(numbers_db, sql)], timeout_s=2.0)
    assert result.error == "too_big" and "sandbox.max_value_bytes" in result.message, result
    assert time.monotonic() - started < 1.0


LATIN1 = "CAST(x'436166e9' AS TEXT)"  # 'Café' in latin-1


@pytest.mark.parametrize(("fmt", "args"), [
    ("'%s!'", LATIN1), ("'%d|%s|%-6s|'", f"'12abc', {LATIN1}, {LATIN1}"), ("'%5.2f|%q|%Q|%w|%c'", f"1.5, {LATIN1}, "
     f"NULL, {LATIN1}, {LATIN1}"), ("'%.20f %s %lld %s'", f"0.1 + 0.2, x'ff00', 9007199254740993, {LATIN1}"),
    (f"{LATIN1} || '%s'", "-0.0"), ("'%.2s%s'", f"{LATIN1}, printf('%s', {LATIN1})"), ("''", LATIN1),
])
def test_printf_over_text_that_is_not_utf8_is_sqlites_own(numbers_db: Path, fmt: str, args: str) -> None:
    """The quoted rewrite gives SQLite's own bytes, typed text: the same value, length and
    comparisons as a plain connection reading text as the sandbox does."""
    call = f"printf({fmt}, {args})"
    sql = f"SELECT {call}, typeof({call}), length({call}), {call} = {call}, format({fmt}, {args}) = {call}"
    con = sqlite3.connect(":memory:")
    con.text_factory = lambda raw: raw.decode("utf-8", errors="ignore")
    expected = con.execute(sql).fetchall()
    con.close()
    result = execute(numbers_db, sql)
    assert result.ok and [tuple(row) for row in result.rows] == expected, (result, expected)


# ``instr`` of two long strings compares the needle at every position of the haystack inside one
# SQLite function call, deaf to the progress handler: ~30 s here in the calling process.
SLOW_INSTR = ("SELECT instr(replace(hex(zeroblob(2000000)), '0', 'a') || 'b', "
              "replace(hex(zeroblob(500000)), '0', 'a') || 'b')")


def test_one_operation_that_ignores_the_deadline_is_stopped_by_killing_its_worker(numbers_db: Path) -> None:
    from progress_sql.sql.worker import Worker

    settings = SandboxSettings(hard_stop_grace_s=0.3)
    worker = Worker(settings)
    try:
        assert worker.run([(numbers_db, "SELECT 1")])[0].rows == ((1,),)  # started
        pid = worker.pid
        started = time.monotonic()
        stopped, = worker.run([(numbers_db, SLOW_INSTR)], timeout_s=0.5)
        assert stopped.error == "timeout" and "worker was killed" in stopped.message, stopped
        assert time.monotonic() - started < 0.5 + 0.3 + 0.5  # deadline + grace + the kill
        assert worker.stops == 1 and worker.pid not in (None, pid)  # the next worker is starting already
        after, = worker.run([(numbers_db, "SELECT count(*) FROM n")])
        assert after.rows == ((1001,),)
    finally:
        worker.close()


def test_jobs_after_a_stopped_one_are_resent_to_the_next_worker(numbers_db: Path) -> None:
    from progress_sql.sql.worker import Worker

    worker = Worker(SandboxSettings(hard_stop_grace_s=0.3))
    try:
        stopped, after, last = worker.run([(numbers_db, SLOW_INSTR), (numbers_db, "SELECT count(*) FROM n"),
                                          (numbers_db, "SELECT 7")], timeout_s=0.5)
        assert (stopped.error, after.rows, last.rows) == ("timeout", ((1001,),), ((7,),))
    finally:
        worker.close()


def test_the_workers_memory_cap_turns_a_hoarding_query_into_out_of_memory(numbers_db: Path) -> None:
    from progress_sql.sql.worker import Worker

    worker = Worker(SandboxSettings(worker_memory_mb=256))
    try:  # 10,000 rows of 1 MB each would be 10 GB in the worker's hands
        result, = worker.run([(numbers_db, "SELECT randomblob(1000000) FROM n a, n b")], timeout_s=20.0,
                             max_rows=10_000)
        assert result.error == "out_of_memory", result
        assert worker.run([(numbers_db, "SELECT 1")])[0].rows == ((1,),)
    finally:
        worker.close()


def test_execute_isolated_answers_like_execute_and_runs_in_another_process(school_db: Path) -> None:
    from progress_sql.sql import execute_isolated
    from progress_sql.sql.worker import shared_worker_pid

    for sql in ("SELECT count(*) FROM student", "DROP TABLE student", "SELEC 1", "SELECT * FROM nowhere"):
        here, there = execute(school_db, sql), execute_isolated(school_db, sql)
        assert (there.rows, there.columns, there.error) == (here.rows, here.columns, here.error)
    assert shared_worker_pid() not in (None, os.getpid())
    inline = execute_isolated(school_db, "SELECT 1", settings=SandboxSettings(isolate=False))
    assert inline.rows == ((1,),)


def test_execute_isolated_reads_a_relative_path_from_the_callers_folder(school_db: Path, monkeypatch) -> None:
    from progress_sql.sql import execute_isolated

    execute_isolated(school_db, "SELECT 1")  # the worker is up, with its own working folder
    monkeypatch.chdir(school_db.parent)
    assert execute_isolated(school_db.name, "SELECT count(*) FROM student").rows == execute(
        school_db, "SELECT count(*) FROM student").rows


# ----------------------------------------------------------------------------- connections
def test_replaced_database_is_reopened(tmp_path: Path) -> None:
    path = tmp_path / "swap.sqlite"

    def build(value: int) -> None:
        tmp = tmp_path / "build.sqlite"
        con = sqlite3.connect(tmp)
        con.execute("CREATE TABLE t (v INTEGER)")
        con.execute("INSERT INTO t VALUES (?)", (value,))
        con.commit()
        con.close()
        os.replace(tmp, path)

    build(1)
    assert execute(path, "SELECT v FROM t").rows == ((1,),)
    build(2)
    assert execute(path, "SELECT v FROM t").rows == ((2,),)
    path.unlink()
    assert execute(path, "SELECT v FROM t").error == "no_database"


def test_database_rewritten_in_place_is_reopened(school_db: Path) -> None:
    assert execute(school_db, "SELECT count(*) FROM department").rows == ((3,),)
    con = sqlite3.connect(school_db)
    con.execute("INSERT INTO department VALUES (4, 'Art', 10.0)")
    con.commit()
    con.close()
    assert execute(school_db, "SELECT count(*) FROM department").rows == ((4,),)


def test_wal_mode_database_gets_no_wal_or_shm_files(tmp_path: Path) -> None:
    path = tmp_path / "wal.sqlite"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (v INTEGER)")
    con.execute("INSERT INTO t VALUES (7)")
    con.commit()
    con.close()
    before = _snapshot(tmp_path)
    assert execute(path, "SELECT v FROM t").rows == ((7,),)
    sandbox.clear_connection_cache()
    assert _snapshot(tmp_path) == before


def test_connection_cache_is_bounded(tmp_path: Path) -> None:
    sandbox.clear_connection_cache()
    paths = []
    for i in range(sandbox._CONNECTIONS_PER_THREAD + 3):
        path = tmp_path / f"db{i}.sqlite"
        sqlite3.connect(path).executescript(f"CREATE TABLE t (v); INSERT INTO t VALUES ({i});")
        paths.append(path)
    for i, path in enumerate(paths):
        assert execute(path, "SELECT v FROM t").rows == ((i,),)
    assert len(sandbox._local.entries) == sandbox._CONNECTIONS_PER_THREAD
    sandbox.clear_connection_cache()
    assert not sandbox._local.entries


# ----------------------------------------------------------------------------- pool
def test_pool_keeps_input_order_and_mixes_outcomes(school_db: Path, tmp_path: Path) -> None:
    jobs = []
    for i in range(40):
        if i % 4 == 0:
            jobs.append((school_db, f"SELECT {i}"))
        elif i % 4 == 1:
            jobs.append((school_db, "DROP TABLE student"))
        elif i % 4 == 2:
            jobs.append((tmp_path / "missing.sqlite", "SELECT 1"))
        else:
            jobs.append((school_db, f"SELECT count(*) FROM student WHERE age > {i % 8 + 17}"))
    expected = [execute(db, sql) for db, sql in jobs]
    with SQLPool(workers=3) as pool:
        got = pool.map(jobs)
    assert [(r.rows, r.error) for r in got] == [(r.rows, r.error) for r in expected]
    assert [r.rows for r in got[::4]] == [((i,),) for i in range(0, 40, 4)]


def test_pool_runs_runaways_in_parallel(numbers_db: Path) -> None:
    jobs = [(numbers_db, RUNAWAYS["cartesian_5"])] * 2
    with SQLPool(workers=2) as pool:
        results = pool.map(jobs, timeout_s=RUNAWAY_TIMEOUT_S)
    assert [r.error for r in results] == ["timeout", "timeout"]


def test_single_worker_pool_and_close(school_db: Path) -> None:
    pool = SQLPool(workers=1)
    assert pool.map([(school_db, "SELECT 1")], max_rows=1)[0].rows == ((1,),)
    pool.close()
    pool.close()
    with pytest.raises(RuntimeError):
        pool.map([(school_db, "SELECT 1")])
    with pytest.raises(ValueError):
        SQLPool(workers=0)
    assert SQLPool(settings=SandboxSettings(workers=4)).workers == 4


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of a process, in clock ticks (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_pool_uses_processes_and_survives_a_dead_worker(numbers_db: Path) -> None:
    with SQLPool(workers=2) as pool:
        assert pool.uses_processes
        pool.map([(numbers_db, "SELECT 1")] * 8)  # starts the workers
        pids = pool.pids
        assert len(pids) == 2
        busy_since = {pid: _cpu_ticks(pid) for pid in pids}

        def kill_when_both_run_a_query() -> None:  # a worker killed while idle is just restarted
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(_cpu_ticks(pid) - busy_since[pid] < 5 for pid in pids):
                time.sleep(0.02)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_both_run_a_query)
        killer.start()
        results = pool.map([(numbers_db, RUNAWAYS["cartesian_5"])] * 4, timeout_s=1.0)
        killer.join()
        # The query each worker was running when it was killed says so (a SIGKILL from outside
        # reads as the OOM killer's); the rest of its chunk is re-sent to a new worker and meets
        # its own deadline.
        died = [r for r in results if r.error == "out_of_memory"]
        assert len(died) == 2 and all(r.message.startswith("the worker running the query") for r in died), results
        assert [r.error for r in results].count("timeout") == 2, results
        assert not set(pool.pids) & set(pids)
        assert [r.rows for r in pool.map([(numbers_db, f"SELECT {i}") for i in range(6)])] == [((i,),) for i in range(6)]


def test_pool_with_isolate_off_runs_in_threads_of_this_process(school_db: Path) -> None:
    with SQLPool(workers=2, settings=SandboxSettings(isolate=False)) as pool:
        assert not pool.uses_processes
        assert [r.rows for r in pool.map([(school_db, "SELECT 1"), (school_db, "SELECT 2")])] == [((1,),), ((2,),)]
        assert pool.pids == []


# ----------------------------------------------------------------------------- gold cache
def test_gold_cache_hits_misses_and_lru(school_db: Path) -> None:
    cache = GoldCache(2)
    q1, q2, q3 = "SELECT count(*) FROM student", "SELECT name FROM department ORDER BY name", "SELECT 3"
    r1 = cache.get(school_db, q1)
    assert cache.get(school_db, q1) is r1
    assert (cache.hits, cache.misses) == (1, 1)
    cache.get(school_db, q2)
    cache.get(school_db, q3)  # evicts q1, the least recently used
    assert len(cache) == 2
    cache.get(school_db, q1)
    assert (cache.hits, cache.misses) == (1, 4)
    cache.clear()
    assert (len(cache), cache.hits, cache.misses) == (0, 0, 0)


def test_gold_cache_sees_a_changed_file(school_db: Path) -> None:
    cache = GoldCache(8)
    assert cache.get(school_db, "SELECT count(*) FROM department").rows == ((3,),)
    con = sqlite3.connect(school_db)
    con.execute("INSERT INTO department VALUES (4, 'Art', 10.0)")
    con.commit()
    con.close()
    assert cache.get(school_db, "SELECT count(*) FROM department").rows == ((4,),)
    assert cache.misses == 2


def test_gold_cache_does_not_keep_timeouts_and_size_zero_keeps_nothing(numbers_db: Path) -> None:
    cache = GoldCache(8)
    assert cache.get(numbers_db, RUNAWAYS["cartesian_5"], timeout_s=0.05).error == "timeout"
    assert len(cache) == 0
    off = GoldCache(0)
    off.get(numbers_db, "SELECT 1")
    off.get(numbers_db, "SELECT 1")
    assert (off.hits, off.misses, len(off)) == (0, 2, 0)
    assert cache.get(numbers_db.parent / "missing.sqlite", "SELECT 1").error == "no_database"


def test_gold_cache_is_thread_safe(school_db: Path) -> None:
    cache = GoldCache(64)
    queries = [f"SELECT count(*) FROM student WHERE age > {a}" for a in range(17, 25)]
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(5):
                for q in queries:
                    assert cache.get(school_db, q).ok
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.hits + cache.misses == 4 * 5 * len(queries)
    assert len(cache) == len(queries) and cache.misses >= len(queries)


def test_gold_result_uses_the_default_cache(school_db: Path) -> None:
    cache = default_gold_cache()
    hits = cache.hits
    sql = "SELECT name FROM department WHERE dept_id = 2"
    assert gold_result(school_db, sql).rows == (("History",),)
    assert gold_result(school_db, sql).rows == (("History",),)
    assert cache.hits == hits + 1
    assert cache.maxsize == SandboxSettings().gold_cache_size


def test_sandbox_copy_of_real_folder_is_read_only(school_db: Path, tmp_path: Path) -> None:
    """A read-only file (as shipped corpora are) still executes."""
    ro = tmp_path / "ro.sqlite"
    shutil.copy(school_db, ro)
    ro.chmod(0o444)
    assert execute(ro, "SELECT count(*) FROM course").rows == ((9,),)
