"""Building turns for real: parse an output, execute its SQL in the sandbox, judge correctness
(with ``sql.verdict.BatchVerdicts``, the decision the evaluation's EX makes too).

This is the one place where the reward side touches a database; environments and the
framework adapters call it, recipes never do.
"""

from __future__ import annotations

import os
from typing import Sequence

from progress_sql.formats import FormatName, parse_output
from progress_sql.rewards.types import Turn
from progress_sql.sql import BatchVerdicts, Candidate, GoldCache, Semantics
from progress_sql.sql.settings import SandboxSettings

# What a turn is judged against: its database, the gold query and the example's semantics.
Task = tuple[str | os.PathLike, str, Semantics]


def make_turns(texts: Sequence[str], fmt: FormatName, tasks: Sequence[Task], judge: BatchVerdicts) -> list[Turn]:
    """``make_turn`` of every ``(texts[i], tasks[i])``, judged in one ``judge.judge`` batch
    (each distinct query once, through the judge's pool when it has one)."""
    sqls = [parse_output(text, fmt).sql for text in texts]
    verdicts = judge.judge([Candidate(db, sql, gold, semantics) for sql, (db, gold, semantics) in zip(sqls, tasks)])
    return [Turn(text=text, sql=sql, result=v.result, correct=v.correct, unjudged=v.unjudged)
            for text, sql, v in zip(texts, sqls, verdicts)]


def make_turn(
    text: str,
    fmt: FormatName,
    db_path: str | os.PathLike,
    gold_sql: str,
    sandbox: SandboxSettings | None = None,
    *,
    semantics: Semantics = "spider",
    gold_cache: GoldCache | None = None,
) -> Turn:
    """Parse ``text`` in format ``fmt`` and judge its SQL against ``gold_sql`` on ``db_path``
    with ``sql.verdict``: the evaluation's EX decision, under ``semantics``, executed with the
    ``sandbox`` limits (default the built-in ones).

    ``result`` is the raw execution of the SQL as written (executability and the environments'
    feedback read it); ``correct`` compares comparison views (Spider: DISTINCT removed), the
    gold's from ``gold_cache`` (default: the process-wide one), so the G rollouts of a question
    execute their gold once. A turn without extractable SQL is not executed (``result`` None,
    not correct). A gold that fails to execute matches nothing; one whose result passes
    ``sandbox.max_rows`` makes the turn ``unjudged`` (the recipes then give the floor). Never
    raises for any model text.
    """
    judge = BatchVerdicts(sandbox, gold_cache=gold_cache)
    return make_turns([text], fmt, [(db_path, gold_sql, semantics)], judge)[0]
