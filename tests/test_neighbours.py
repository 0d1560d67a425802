"""Test-suite neighbour databases (same schema, fuzzed data, keys intact), mutations of gold
queries, and the EX-versus-TS measurement."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from progress_sql.params import settings_from_dict
from progress_sql.data.build import build_corpus
from progress_sql.data.domains import get_domain
from progress_sql.data.generate_db import database_fingerprint, generate_rows, write_database
from progress_sql.data.neighbours import (
    MUTATION_KINDS, column_types, fuzz_rows, measure_ex_vs_ts, mutate, query_literals,
)
from progress_sql.data.query import Col, Cond, Select
from progress_sql.corpus.records import CorpusLayout
from progress_sql.sql import execution_match, parse_one, test_suite_match

SETTINGS = settings_from_dict({"data": {
    "n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1,
    "train_size": 20, "dev_size": 60, "test_size": 20, "neighbours": 3,
}})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> CorpusLayout:
    out = tmp_path_factory.mktemp("ts") / "corpus"
    build_corpus(SETTINGS, out, progress=False)
    return CorpusLayout(out)


def _schema(path: Path) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        con.close()


def test_neighbours_share_the_schema_and_differ_in_data(corpus):
    held_out = [db for db in (corpus.root / "neighbours").iterdir()]
    assert len(held_out) == 2
    for folder in held_out:
        original = corpus.database(folder.name)
        neighbours = corpus.neighbours(folder.name)
        assert [p.name for p in neighbours] == ["1.sqlite", "2.sqlite", "3.sqlite"]
        prints = {database_fingerprint(original)}
        for path in neighbours:
            assert _schema(path) == _schema(original)
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                assert con.execute("PRAGMA foreign_key_check").fetchall() == []
            finally:
                con.close()
            prints.add(database_fingerprint(path))
        assert len(prints) == 4  # every neighbour differs from the original and each other


def test_fuzz_rows_keeps_keys_and_row_counts_close_and_plants_literals():
    domain = get_domain("sports")
    rows = generate_rows(domain, seed=0)
    literals = {("player", "age"): [99]}
    fuzzed = fuzz_rows(domain, rows, random.Random(1), keep=0.0, row_change=0.2, literals=literals)
    for table in domain.tables:
        n, m = len(rows[table.name]), len(fuzzed[table.name])
        assert 0.75 * n <= m <= 1.25 * n + 1
    players = fuzzed["player"]
    cols = [c.name for c in domain.table("player").columns]
    assert any(r[cols.index("age")] == 99 for r in players)  # a boundary the queries test
    assert [r[0] for r in players] == list(range(1, len(players) + 1))
    fixture_cols = [c.name for c in domain.table("fixture").columns]
    home, away = fixture_cols.index("home_team_id"), fixture_cols.index("away_team_id")
    assert all(r[home] != r[away] for r in fuzzed["fixture"])
    university = get_domain("university")
    enrolments = fuzz_rows(university, generate_rows(university, 0), random.Random(2), 0.5, 0.2)["enrolment"]
    assert len({(r[0], r[1]) for r in enrolments}) == len(enrolments)  # composite key stays unique


def test_query_literals_collects_compared_values_and_rule_values():
    domain = get_domain("university")
    inner = Select(("enrolment",), (Col(0, "stu_id"),), where=(Cond(Col(0, "semester"), "IN", ("Fall", "Spring")),))
    sel = Select(("student",), (Col(0, "name"),),
                 where=(Cond(Col(0, "age"), "BETWEEN", (19, 23)), Cond(Col(0, "stu_id"), "IN", inner)))
    found = query_literals([sel], domain)
    assert found[("student", "age")] == [19, 23]
    assert found[("enrolment", "semester")] == ["Fall", "Spring"]
    assert found[("student", "gpa")] == [3.5]  # from the domain-knowledge rule


# ----------------------------------------------------------------------------- mutations
TYPES = {"student": {"stu_id": "INTEGER", "name": "TEXT", "age": "INTEGER", "gpa": "REAL", "home_city": "TEXT",
                     "dept_id": "INTEGER"},
         "department": {"dept_id": "INTEGER", "name": "TEXT", "building": "TEXT"}}


def test_comparison_mutation_changes_one_operator_outside_joins():
    gold = "SELECT T1.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id WHERE T1.age > 20"
    wrong = mutate(gold, "comparison", TYPES, random.Random(0))
    assert wrong == "SELECT T1.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id WHERE T1.age >= 20"
    assert mutate("SELECT COUNT(*) FROM student", "comparison", TYPES, random.Random(0)) is None


def test_dropped_predicate_removes_one_conjunct_or_the_where():
    two = "SELECT name FROM student WHERE age > 20 AND home_city = 'Oslo'"
    results = {mutate(two, "dropped_predicate", TYPES, random.Random(i)) for i in range(20)}
    assert results == {"SELECT name FROM student WHERE age > 20", "SELECT name FROM student WHERE home_city = 'Oslo'"}
    assert mutate("SELECT name FROM student WHERE age > 20", "dropped_predicate", TYPES,
                  random.Random(0)) == "SELECT name FROM student"
    assert mutate("SELECT name FROM student", "dropped_predicate", TYPES, random.Random(0)) is None


def test_wrong_column_uses_another_column_of_the_same_type():
    gold = "SELECT name FROM student WHERE gpa > 3"
    wrong = mutate(gold, "wrong_column", TYPES, random.Random(0))
    assert wrong == "SELECT home_city FROM student WHERE gpa > 3"  # gpa is the only REAL column
    joined = "SELECT T2.building FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id"
    assert mutate(joined, "wrong_column", TYPES, random.Random(0)) == (
        "SELECT T2.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id")
    with pytest.raises(ValueError, match="unknown mutation kind"):
        mutate(gold, "typo", TYPES, random.Random(0))
    assert mutate("not sql at all (", "wrong_column", TYPES, random.Random(0)) is None


# ----------------------------------------------------------------------------- TS versus EX
def test_ts_rejects_a_prediction_that_matches_by_coincidence(tmp_path):
    domain = get_domain("university")
    rows = generate_rows(domain, seed=0)
    cols = [c.name for c in domain.table("student").columns]
    age = cols.index("age")
    rows["student"] = [r[:age] + ((31 if r[age] == 30 else r[age]),) + r[age + 1:] for r in rows["student"]]
    original = tmp_path / "university.sqlite"
    write_database(original, domain, rows)
    gold, wrong = "SELECT name FROM student WHERE age > 30", "SELECT name FROM student WHERE age >= 30"
    assert execution_match(original, wrong, gold)  # nobody is 30: EX cannot tell them apart

    gold_sel = Select(("student",), (Col(0, "name"),), where=(Cond(Col(0, "age"), ">", 30),))
    literals = query_literals([gold_sel], domain)
    suite = [original]
    for k in range(3):
        path = tmp_path / f"{k}.sqlite"
        write_database(path, domain, fuzz_rows(domain, rows, random.Random(k), 0.5, 0.2, literals))
        suite.append(path)
    assert test_suite_match(suite, gold, gold)
    assert not test_suite_match(suite, wrong, gold)


def test_measurement_on_the_dev_split_shows_ts_stricter_than_ex(corpus):
    report = measure_ex_vs_ts(corpus.root, SETTINGS, split="dev")
    assert report.golds == 60 and report.gold_self_ts == report.golds
    assert set(report.mutants) == set(MUTATION_KINDS) and all(report.mutants[k] > 0 for k in MUTATION_KINDS)
    for k in MUTATION_KINDS:
        assert report.ts_accept[k] <= report.ex_accept[k] <= report.mutants[k]
    assert 0 < report.ex_share and report.ts_share < report.ex_share
    assert "EX accepts" in report.summary() and "TS accepts" in report.summary()


def test_mutants_of_real_golds_parse_and_differ(corpus):
    from progress_sql.corpus.records import read_jsonl

    for ex in list(read_jsonl(corpus.split("dev")))[:30]:
        types = column_types(corpus.database(ex.db_id))
        for kind in MUTATION_KINDS:
            wrong = mutate(ex.gold_sql, kind, types, random.Random(0))
            if wrong is not None:
                parse_one(wrong)
                assert wrong != ex.gold_sql
