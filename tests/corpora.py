"""The tests' corpus factories: a generated corpus (``data.build.build_corpus``, well under a
second at these sizes) written where a fixture asks, from its settings or the small default;
and the school corpus, one small hand-written database for the tests that train.

The school corpus is small enough that a 64-wide, 2-layer policy learns it in a minute of SFT,
and that RL on it shows in thirty steps whether the trainer raises the share of right answers.
The learning test (``tests/test_trainer.py``) and the learning benchmark
(``bench/bench_learning_vs_trl.py``) train on it, with the settings of ``school_settings``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from progress_sql.params import Settings, default_settings, settings_from_dict
from progress_sql.corpus.records import CorpusLayout, Example, write_jsonl
from progress_sql.data.build import build_corpus

# Three small train databases, one dev and one test database: enough for every split to exist.
SMALL_DATA = {"n_databases": 3, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 4,
              "test_size": 4, "neighbours": 0, "rows_scale": 0.3}


def small_corpus(out: Path, settings: Settings | None = None, **data: Any) -> Path:
    """A corpus built into ``out`` from ``settings`` (its ``data`` section), or from
    ``SMALL_DATA`` with ``data`` overriding it; returns ``out``."""
    if settings is None:
        settings = settings_from_dict({"data": {**SMALL_DATA, **data}})
    elif data:
        raise TypeError("give settings or data overrides, not both")
    build_corpus(settings, out, progress=False)
    return out


# The school corpus's four train questions, with their gold SQL.
QUESTIONS = [
    ("How many students are there?", "SELECT count(*) FROM student"),
    ("Which departments have a budget over 600?", "SELECT name FROM department WHERE budget > 600"),
    ("List the names of students older than 21.", "SELECT name FROM student WHERE age > 21"),
    ("What is the name of the oldest student?", "SELECT name FROM student ORDER BY age DESC LIMIT 1"),
]


def school_corpus(root: str | Path) -> Path:
    """Write the school corpus under ``root`` (which must not hold one yet); ``root``."""
    root = Path(root)
    layout = CorpusLayout(root)
    db = layout.database("school")
    db.parent.mkdir(parents=True)
    con = sqlite3.connect(db)
    con.executescript(
        "CREATE TABLE department (dept_id INTEGER PRIMARY KEY, name TEXT NOT NULL, budget REAL);"
        "CREATE TABLE student (stu_id INTEGER PRIMARY KEY, name TEXT, age INTEGER,"
        " dept_id INTEGER REFERENCES department(dept_id));"
    )
    con.executemany("INSERT INTO department VALUES (?,?,?)", [(1, "Physics", 1000.0), (2, "History", 500.0), (3, "Math", 800.0)])
    con.executemany("INSERT INTO student VALUES (?,?,?,?)", [(i, f"s{i}", 17 + i % 8, 1 + i % 3) for i in range(1, 21)])
    con.commit()
    con.close()
    write_jsonl(layout.split("train"), [
        Example(id=f"q{i}", db_id="school", question=q, gold_sql=sql, hardness="easy", reasoning="r")
        for i, (q, sql) in enumerate(QUESTIONS)
    ])
    return root


def school_settings(init_from: Path | str = "") -> Settings:
    """The defaults with a 64-wide 2-layer policy (no copy warmup), 2 turns, 24 new tokens a
    turn, and a short RL run (G 4 × 2 questions, 2 steps, lr 1e-3) from ``init_from``."""
    s = default_settings().model_copy(deep=True)
    m = s.model
    m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.intermediate_size = 1024, 64, 2, 4, 2, 128
    m.copy_warmup.steps = 0
    s.env.max_turns = 2
    s.generation.max_new_tokens = 24
    rl = s.rl
    rl.init_from = str(init_from)
    rl.group_size, rl.questions_per_step, rl.steps, rl.micro_batch_size = 4, 2, 2, 3  # 8 sequences: 3+3+2
    rl.lr, rl.checkpoint_every, rl.keep_checkpoints = 1e-3, 1, 2
    rl.seed = 1  # its first steps' groups hold unequal rewards (tests/test_trainer.py asserts it)
    return s


def half_right_sft(s: Settings, base: Path | str, steps: float = 80.0) -> Settings:
    """``s`` set up for the SFT of ``base`` on the four questions: ``steps`` steps of 4 at lr
    1e-2, no revision dialogues or copy rows. 80 steps give a policy whose temperature-1
    rollouts are right about half of the time; fewer, one whose rollouts hold SQL, some wrong.
    In fp32 (``sft.autocast: off``), so that the policy is the same on a CPU with bf16
    instructions and one without."""
    s = s.model_copy(deep=True)
    s.sft.init_from, s.sft.revision_share, s.sft.epochs = str(base), 0.0, steps
    s.sft.lr, s.sft.batch_size, s.sft.warmup_ratio, s.sft.copy_rows = 1e-2, 4, 0.0, 0
    s.sft.autocast = "off"
    return s
