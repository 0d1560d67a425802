"""EX / TS equivalence with the Spider test-suite semantics."""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from progress_sql.sql import (
    ExecResult,
    GoldCache,
    execute,
    execution_match,
    order_matters,
    results_match,
    rows_equivalent,
    strip_distinct,
    test_suite_match,
)
from progress_sql.sql.equivalence import spider_postprocess


def _brute_force(pred: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """The definition, literally: some column permutation makes the rows equal."""
    if not pred and not gold:
        return True
    if len(pred) != len(gold) or len(pred[0]) != len(gold[0]):
        return False
    for perm in itertools.permutations(range(len(gold[0]))):
        permuted = [tuple(r[j] for j in perm) for r in pred]
        if (permuted == gold) if ordered else (Counter(permuted) == Counter(gold)):
            return True
    return False


# ----------------------------------------------------------------------------- rows
def test_bag_semantics_duplicates_matter() -> None:
    assert rows_equivalent([(1,), (2,), (1,)], [(1,), (1,), (2,)], False)
    assert not rows_equivalent([(1,), (2,), (2,)], [(1,), (1,), (2,)], False)
    assert not rows_equivalent([(1,), (2,)], [(1,), (1,), (2,)], False)


def test_column_permutation_invariance() -> None:
    gold = [(1, "a", 2.5), (2, "b", 3.5)]
    assert rows_equivalent([("a", 2.5, 1), ("b", 3.5, 2)], gold, False)
    assert rows_equivalent([(2.5, "a", 1), (3.5, "b", 2)], gold, True)
    # Each column alone matches but the rows do not: no permutation works.
    assert not rows_equivalent([(1, "b"), (2, "a")], [(1, "a"), (2, "b")], False)


def test_order_only_when_asked() -> None:
    gold = [(1,), (2,), (3,)]
    assert rows_equivalent([(3,), (1,), (2,)], gold, False)
    assert not rows_equivalent([(3,), (1,), (2,)], gold, True)
    assert rows_equivalent([(1,), (2,), (3,)], gold, True)


def test_shapes_and_values() -> None:
    assert rows_equivalent([], [], True)
    assert not rows_equivalent([(1,)], [], False)
    assert not rows_equivalent([(1, 1)], [(1,)], False)
    assert rows_equivalent([(1, None)], [(1.0, None)], False)  # 1 == 1.0, NULL equals NULL
    assert not rows_equivalent([("1",)], [(1,)], False)
    assert not rows_equivalent([(b"a",)], [("a",)], False)
    assert not rows_equivalent([("A",)], [("a",)], False)
    assert not rows_equivalent([(0.1 + 0.2,)], [(0.3,)], False)  # no float tolerance, like the reference


def test_wide_results_do_not_blow_up() -> None:
    width, rows = 12, 300
    gold = [tuple((r * (c + 3)) % 7 for c in range(width)) for r in range(rows)]
    perm = list(reversed(range(width)))
    pred = [tuple(row[j] for j in perm) for row in gold]
    same_everywhere = [tuple(r % 5 for _ in range(width)) for r in range(rows)]
    broken = list(pred)
    broken[17] = broken[17][:-1] + ((broken[17][-1] + 1) % 7,)
    started = time.perf_counter()
    assert rows_equivalent(pred, gold, False)
    assert rows_equivalent(pred, gold, True)
    assert rows_equivalent(same_everywhere, same_everywhere[::-1], False)
    assert not rows_equivalent(broken, gold, False)
    assert time.perf_counter() - started < 5  # 12! permutations would take hours


@hsettings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    width=st.integers(1, 4),
    n_rows=st.integers(0, 6),
    ordered=st.booleans(),
)
def test_matches_the_brute_force_definition(data, width: int, n_rows: int, ordered: bool) -> None:
    value = st.sampled_from([None, 0, 1, 1.0, 2, "a", "b"])
    gold = data.draw(st.lists(st.tuples(*[value] * width), min_size=n_rows, max_size=n_rows))
    pred_kind = data.draw(st.sampled_from(["permuted", "shuffled", "random"]))
    if pred_kind == "random":
        pred = data.draw(st.lists(st.tuples(*[value] * width), min_size=n_rows, max_size=n_rows))
    else:
        perm = data.draw(st.permutations(range(width)))
        pred = [tuple(r[j] for j in perm) for r in gold]
        if pred_kind == "shuffled":
            pred = data.draw(st.permutations(pred))
    assert rows_equivalent(pred, gold, ordered) == _brute_force(pred, gold, ordered)


def test_results_match_needs_two_clean_results() -> None:
    good = ExecResult(rows=((1,),), columns=("a",))
    assert results_match(good, good, False)
    assert not results_match(ExecResult(error="runtime", message="x"), good, False)
    assert not results_match(good, ExecResult(error="timeout", message="x"), False)
    assert not results_match(ExecResult(rows=((1,),), columns=("a",), truncated=True), good, False)
    assert results_match(ExecResult(columns=("a",)), ExecResult(columns=("b", "c")), True)  # both empty


# ----------------------------------------------------------------------------- query text
@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT name FROM t ORDER BY age", True),
        ("SELECT name FROM t", False),
        ("SELECT name FROM t WHERE id = (SELECT id FROM u ORDER BY x LIMIT 1)", False),
        ("SELECT name FROM t WHERE note = 'order by'", False),
        ("SELECT name FROM (SELECT name FROM t ORDER BY age DESC LIMIT 3)", True),
        ("SELECT a, count(*) FROM (SELECT a FROM t ORDER BY a) GROUP BY a", False),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY a", True),
        ("SELECT name FROM t\nORDER\n  BY age", True),
        ("SELEC name FROM t ORDER   BY age", True),  # unparsable: substring fallback
        ("SELEC name FROM t", False),
    ],
)
def test_order_matters(sql: str, expected: bool) -> None:
    assert order_matters(sql) is expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT DISTINCT name FROM t", "SELECT  name FROM t"),
        ("select count(distinct name) from t", "select count( name) from t"),
        ("SELECT name FROM t WHERE x = 'distinct'", "SELECT name FROM t WHERE x = 'distinct'"),
        ('SELECT "distinct" FROM t', 'SELECT "distinct" FROM t'),
        ("SELECT a FROM t WHERE a IS NOT DISTINCT FROM b", "SELECT a FROM t WHERE a IS NOT DISTINCT FROM b"),
        ("SELECT name FROM t", "SELECT name FROM t"),
        ("SELECT DISTINCT 'unterminated", "SELECT DISTINCT 'unterminated"),
        ("SELECT 'café👍', count(DISTINCT x) FROM t", "SELECT 'café👍', count( x) FROM t"),
    ],
)
def test_strip_distinct(sql: str, expected: str) -> None:
    assert strip_distinct(sql) == expected


def test_spider_postprocess_joins_split_operators() -> None:
    assert spider_postprocess('SELECT a FROM t WHERE b ! =  "x" AND c > = 1 AND d <  = 2') == (
        'SELECT a FROM t WHERE b !=  "x" AND c >= 1 AND d <= 2'
    )


# ----------------------------------------------------------------------------- EX on a database
def test_execution_match_on_a_real_database(school_db: Path) -> None:
    cache = GoldCache(16)

    def ex(pred: str, gold: str, **kw) -> bool:
        return execution_match(school_db, pred, gold, gold_cache=cache, **kw)

    gold = "SELECT name, age FROM student WHERE dept_id = 1"
    assert ex(gold, gold)
    assert ex("SELECT age, name FROM student WHERE dept_id = 1", gold)
    assert ex("SELECT s.name, s.age FROM student AS s JOIN department AS d ON s.dept_id = d.dept_id "
              "WHERE d.name = 'Physics' ORDER BY s.age DESC", gold)  # gold unordered: order ignored
    assert not ex("SELECT name FROM student WHERE dept_id = 1", gold)
    assert not ex("SELECT name, age FROM student WHERE dept_id = 2", gold)
    assert not ex("SELECT name, agee FROM student", gold)
    assert not ex("DROP TABLE student", gold)
    assert not ex(gold, "SELECT nope FROM student")  # a broken gold matches nothing


def test_execution_match_order_and_distinct(school_db: Path) -> None:
    ordered_gold = "SELECT name FROM student WHERE age > 20 ORDER BY age, name"
    assert execution_match(school_db, "SELECT name FROM student WHERE age > 20 ORDER BY age, name", ordered_gold)
    assert not execution_match(school_db, "SELECT name FROM student WHERE age > 20 ORDER BY name", ordered_gold)
    # DISTINCT is removed from both queries by default (the reference's keep_distinct=False) ...
    assert execution_match(school_db, "SELECT age FROM student", "SELECT DISTINCT age FROM student")
    assert execution_match(school_db, "SELECT count(age) FROM student", "SELECT count(DISTINCT age) FROM student")
    # ... and kept on request, when duplicates then make the results differ.
    assert not execution_match(
        school_db, "SELECT age FROM student", "SELECT DISTINCT age FROM student", keep_distinct=True
    )
    assert execution_match(school_db, "SELECT age FROM student WHERE age ! = 20", "SELECT age FROM student WHERE age <> 20")


def test_execution_match_uses_the_gold_cache(school_db: Path) -> None:
    cache = GoldCache(4)
    gold = "SELECT title FROM course WHERE credits = 3"
    for pred in [gold, "SELECT title FROM course WHERE credits > 2 AND credits < 4", "SELECT 1"]:
        execution_match(school_db, pred, gold, gold_cache=cache)
    assert (cache.misses, cache.hits) == (1, 2)


# ----------------------------------------------------------------------------- TS
def _neighbours(school_db: Path, tmp_path: Path) -> list[Path]:
    """The original database and three variants; the last one holds a student aged 99."""
    paths = [school_db]
    for i in range(3):
        path = tmp_path / f"neighbour_{i}.sqlite"
        path.write_bytes(school_db.read_bytes())
        con = sqlite3.connect(path)
        con.execute("UPDATE student SET age = age + ?", (i,))
        if i == 2:
            con.execute("UPDATE student SET age = 99 WHERE stu_id = 5")
        con.commit()
        con.close()
        paths.append(path)
    return paths


def test_test_suite_match(school_db: Path, tmp_path: Path) -> None:
    dbs = _neighbours(school_db, tmp_path)
    gold = "SELECT name FROM student WHERE age >= 24"
    assert test_suite_match(dbs, "SELECT name FROM student WHERE age > 23", gold)
    # Equal on the original database, different only on the last neighbour.
    overfit = "SELECT name FROM student WHERE age >= 24 AND age < 99"
    assert execution_match(school_db, overfit, gold)
    assert not test_suite_match(dbs, overfit, gold)
    with pytest.raises(ValueError):
        test_suite_match([], gold, gold)


def test_test_suite_match_stops_at_the_first_mismatch(school_db: Path, tmp_path: Path) -> None:
    dbs = _neighbours(school_db, tmp_path)
    gold = "SELECT count(*) FROM student WHERE age > 22"
    counts = [execute(db, gold).rows[0][0] for db in dbs]
    first_mismatch = next(i for i, c in enumerate(counts) if c != counts[0])
    assert first_mismatch < len(dbs) - 1  # some databases come after it
    cache = GoldCache(16)
    assert not test_suite_match(dbs, f"SELECT {counts[0]}", gold, gold_cache=cache)
    assert cache.misses == first_mismatch + 1  # the databases after the mismatch never ran


# ----------------------------------------------------------------------------- conformance
def _spider_schema_db(tables_json: Path, db_id: str, folder: Path, rows: int = 3) -> Path:
    """A database with the Spider schema of ``db_id`` and a few generated rows per table."""
    schema = next(s for s in json.loads(tables_json.read_text()) if s["db_id"] == db_id)
    path = folder / f"{db_id}.sqlite"
    con = sqlite3.connect(path)
    for t_index, table in enumerate(schema["table_names_original"]):
        if table.lower().startswith("sqlite_"):
            continue  # internal tables (sqlite_sequence) cannot be created by hand
        kinds = [
            (name, kind)
            for (owner, name), kind in zip(schema["column_names_original"], schema["column_types"])
            if owner == t_index
        ]
        cols = ", ".join(f'"{name}" {"REAL" if kind == "number" else "TEXT"}' for name, kind in kinds)
        con.execute(f'CREATE TABLE "{table}" ({cols})')
        values = [tuple(i if kind == "number" else f"v{i}" for _, kind in kinds) for i in range(1, rows + 1)]
        con.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(kinds))})', values)
    con.commit()
    con.close()
    return path


@pytest.mark.conformance
def test_spider_dev_gold_runs_in_the_sandbox_and_matches_itself(conformance: Path, tmp_path: Path) -> None:
    lines = [line.split("\t") for line in (conformance / "dev_gold.txt").read_text().splitlines() if line.strip()]
    dbs = {db: _spider_schema_db(conformance / "tables.json", db, tmp_path) for db in {d for _, d in lines}}
    failures = []
    for sql, db in lines:
        result = execute(dbs[db], spider_postprocess(strip_distinct(sql)))
        if not result.ok:
            failures.append((sql, result.error, result.message))
        elif not execution_match(dbs[db], sql, sql, gold_cache=GoldCache(0)):
            failures.append((sql, "self-mismatch", ""))
    assert not failures, failures[:5]
