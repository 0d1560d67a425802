"""Fuzzing the task module: no exception escapes diagnose, execute or any reward recipe, for
random text and for truncated or mutated real queries."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from progress_sql import rewards
from progress_sql.odt import diagnose
from progress_sql.sql import execute
from progress_sql.sql.result import ERROR_KINDS

from conftest import conformance_dir

_CONF = conformance_dir()
REAL_SQL = (
    [line.split("\t")[0] for line in (_CONF / "dev_gold.txt").read_text().splitlines() if line.strip()]
    + [line for line in (_CONF / "dev_predict.txt").read_text().splitlines() if line.strip()]
    if _CONF
    else ["SELECT T1.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id WHERE T2.budget > 500"]
)
GOLD = "SELECT T2.name, count(*) FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id GROUP BY T2.name"

SQL_ALPHABET = st.sampled_from(list("SELECTFROMWHEREGROUPBYORDERJOIN selectfromwherejoinon"
                                    "*(),.;'\"=<>!-+/%0123456789_abcT\n\t[]`"))


@st.composite
def mutated_real_sql(draw) -> str:
    sql = draw(st.sampled_from(REAL_SQL))
    op = draw(st.sampled_from(["truncate", "delete", "insert", "swap", "duplicate"]))
    i = draw(st.integers(0, max(0, len(sql) - 1)))
    if op == "truncate":
        return sql[:i]
    if op == "delete":
        j = draw(st.integers(i, len(sql)))
        return sql[:i] + sql[j:]
    if op == "insert":
        return sql[:i] + draw(st.text(SQL_ALPHABET, max_size=8)) + sql[i:]
    if op == "swap":
        parts = sql.split()
        draw(st.randoms()).shuffle(parts)
        return " ".join(parts)
    return sql + " " + sql


ANY_TEXT = st.one_of(st.text(max_size=300), st.text(SQL_ALPHABET, max_size=200), mutated_real_sql())
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(pred=ANY_TEXT, gold=st.one_of(st.sampled_from(REAL_SQL), ANY_TEXT))
def test_diagnose_never_raises(pred, gold):
    d = diagnose(pred, gold)
    assert 0.0 <= d.score <= 1.0
    assert isinstance(d.feedback, str)


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@FUZZ
@given(sql=ANY_TEXT)
def test_execute_never_raises_nor_writes(school_db, sql):
    before = _digest(school_db.parent)
    result = execute(school_db, sql, timeout_s=1.0)
    assert result.error is None or result.error in ERROR_KINDS
    assert _digest(school_db.parent) == before


@FUZZ
@given(texts=st.lists(ANY_TEXT, min_size=1, max_size=4), flags=st.lists(st.booleans(), min_size=8, max_size=8))
def test_recipes_never_raise(texts, flags):
    turns = tuple(
        rewards.Turn(text=t, sql=t if flags[i] else None, result=None, correct=flags[i + 4] and i == len(texts) - 1)
        for i, t in enumerate(texts)
    )
    traj = rewards.Trajectory(turns=turns, gold_sql=GOLD, db_id="school", difficulty="", max_turns=4)
    for name in rewards.names():
        out = rewards.get(name)(traj)
        assert out.total == out.total  # not NaN
        assert set(out.components) == set(rewards.get(name).components)
