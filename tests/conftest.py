"""Shared fixtures: paths, a small real SQLite database, the conformance corpus."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Under `make test` two workers run torch on two threads each over two cores. OpenMP's threads
# spin while they wait for work, on a core the other worker's threads need: eight steps of a
# tiny RL run took 21 s alone and 250 s beside a second run, 23 s with threads that sleep
# instead. Set before a worker (or a process it starts) loads OpenMP with torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# A few real rows for three Spider schemas of ../shared/conformance/spider/tables.json.
SPIDER_ROWS = {
    "concert_singer": {
        "stadium": [(1, "Raith", "Stark's Park", 10104, 4812, 1294, 2106),
                    (2, "Ayr", "Somerset Park", 11998, 2363, 1057, 1477)],
        "singer": [(1, "Joe Sharp", "Netherlands", "You", "1992", 52, "F"),
                   (2, "Timbaland", "United States", "Dangerous", "2008", 32, "T"),
                   (3, "Justin Brown", "France", "Hey Oh", "2013", 29, "T")],
        "concert": [(1, "Auditions", "Free choice", "1", "2014"), (2, "Super bootcamp", "Happy", "2", "2015")],
        "singer_in_concert": [(1, "2"), (2, "3")],
    },
    "pets_1": {
        "Student": [(1001, "Smith", "Linda", 18, "F", 600, 1121, "BAL"),
                    (1002, "Kim", "Tracy", 19, "F", 600, 7712, "HKG"),
                    (1003, "Jones", "Shiela", 21, "M", 600, 7792, "WAS")],
        "Pets": [(2001, "cat", 3, 12.0), (2002, "dog", 2, 13.4), (2003, "dog", 1, 9.3)],
        "Has_Pet": [(1001, 2001), (1002, 2002), (1002, 2003)],
    },
    "perpetrator": {
        "people": [(1, "Ron Baxter", 6.4, 205, "Los Angeles, CA"), (2, "Brent Boyd", 6.3, 185, "Baton Rouge, LA")],
        "perpetrator": [(1, 1, "04.26 April 26/27", 1982, "Uiryeong", "South Korea", 56, 37)],
    },
}


def tiny_params() -> dict:
    """params.yaml with the ``tiny`` preset merged in (the tiny policy built from scratch instead
    of SmolLM2): the base of the tests that run the pipeline on a copy of the project's settings."""
    import yaml

    from progress_sql.params import load_preset, merge_overlay

    overlay, _ = load_preset("tiny", REPO / "configs" / "presets")
    return merge_overlay(yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8")), overlay)


def conformance_dir() -> Path | None:
    """../shared/conformance/spider, or PROGRESS_SQL_CONFORMANCE when set."""
    env = os.environ.get("PROGRESS_SQL_CONFORMANCE")
    path = Path(env) if env else REPO.parent / "shared" / "conformance" / "spider"
    return path if (path / "dev_gold.txt").exists() else None


@pytest.fixture(scope="session")
def conformance() -> Path:
    path = conformance_dir()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("conformance corpus missing: set PROGRESS_SQL_CONFORMANCE")
        pytest.skip("conformance corpus not found (set PROGRESS_SQL_CONFORMANCE)")
    return path


# A question on ``school_db`` (students over 21), a wrong answer to it, and a well-formed output.
GOLD = "SELECT name FROM student WHERE age > 21"
WRONG = "SELECT name FROM student"


def answer(sql: str, fmt: str = "think_sql") -> str:
    """A well-formed output holding ``sql`` in format ``fmt``."""
    from progress_sql.formats import answer_text

    return answer_text(fmt, "reasoning", sql)


@pytest.fixture()
def school_db(tmp_path: Path) -> Path:
    """A small real database: departments, students, courses, enrolments."""
    path = tmp_path / "school.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE department (dept_id INTEGER PRIMARY KEY, name TEXT NOT NULL, budget REAL);
        CREATE TABLE student (stu_id INTEGER PRIMARY KEY, name TEXT, age INTEGER,
                              dept_id INTEGER REFERENCES department(dept_id));
        CREATE TABLE course (course_id INTEGER PRIMARY KEY, title TEXT, credits INTEGER,
                             dept_id INTEGER REFERENCES department(dept_id));
        CREATE TABLE enrolment (stu_id INTEGER REFERENCES student(stu_id),
                                course_id INTEGER REFERENCES course(course_id), grade REAL,
                                PRIMARY KEY (stu_id, course_id));
        """
    )
    con.executemany("INSERT INTO department VALUES (?,?,?)",
                    [(1, "Physics", 1000.0), (2, "History", 500.0), (3, "Math", 800.0)])
    con.executemany("INSERT INTO student VALUES (?,?,?,?)",
                    [(i, f"s{i}", 17 + i % 8, 1 + i % 3) for i in range(1, 31)])
    con.executemany("INSERT INTO course VALUES (?,?,?,?)",
                    [(i, f"c{i}", 2 + i % 3, 1 + i % 3) for i in range(1, 10)])
    con.executemany("INSERT INTO enrolment VALUES (?,?,?)",
                    [(s, c, float((s * c) % 5)) for s in range(1, 31) for c in range(1, 10) if (s + c) % 3 == 0])
    con.commit()
    con.close()
    return path


# ----------------------------------------------------------------------------- MLflow
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite MLflow tracking store per test module (creating its tables takes seconds),
    with no pipeline parent run or DVC experiment inherited from the environment."""
    from progress_sql import tracking

    folder = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
        mp.delenv(tracking.PARENT_ENV, raising=False)
        mp.delenv("DVC_EXP_NAME", raising=False)
        yield folder


@pytest.fixture()
def no_active_run():
    """End any MLflow run a test leaves open (MLflow keeps the active run process-wide)."""
    yield
    import mlflow

    while mlflow.active_run() is not None:
        mlflow.end_run()


# ----------------------------------------------------------------------------- Spider conformance
@pytest.fixture(scope="module")
def spider(conformance: Path, tmp_path_factory) -> tuple[list[tuple[str, str, str]], dict[str, Path]]:
    """The 322 dev pairs (gold, db_id, prediction) and a generated database per db_id."""
    from spider_conformance import spider_databases

    return spider_databases(conformance, tmp_path_factory.mktemp("spider_dbs"))


@pytest.fixture(scope="module")
def judge():
    """The batched verdict over a one-worker SQL pool, as the evaluation builds it."""
    from progress_sql.params import default_settings
    from progress_sql.sql import BatchVerdicts, GoldCache, SQLPool

    sandbox = default_settings().sandbox
    with SQLPool(workers=1, settings=sandbox) as pool:
        yield BatchVerdicts(sandbox, pool=pool, gold_cache=GoldCache(settings=sandbox))
