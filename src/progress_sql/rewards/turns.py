"""Building turns for real: parse an output, execute its SQL in the sandbox, judge correctness
(with ``sql.verdict``, the decision the evaluation's EX makes too).

This is the one place where the reward side touches a database; environments and evaluation
call it, recipes never do.
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.formats import FormatName, parse_output
from progress_sql.rewards.types import Turn
from progress_sql.sql import GoldCache, Semantics, verdict
from progress_sql.sql.settings import SandboxSettings


def make_turn(
    text: str,
    fmt: FormatName,
    db_path: str | Path,
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
    not correct). A gold that fails to execute matches nothing. Never raises for any model text.
    """
    parsed = parse_output(text, fmt)
    if parsed.sql is None:
        return Turn(text=text, sql=None, result=None, correct=False)
    decided = verdict(db_path, parsed.sql, gold_sql, semantics=semantics, sandbox=sandbox, gold_cache=gold_cache)
    return Turn(text=text, sql=parsed.sql, result=decided.result, correct=decided.correct)
