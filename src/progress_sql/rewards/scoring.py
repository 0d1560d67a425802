"""Building turns for real: parse an output, execute its SQL in the sandbox, judge correctness.

This is the one place where the reward side touches a database; environments and evaluation
call it, recipes never do.
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.config import Settings
from progress_sql.rewards.formats import FormatName, parse_output
from progress_sql.rewards.types import Turn
from progress_sql.sql import execute, results_match
from progress_sql.sql.result import ExecResult


def make_turn(
    text: str,
    fmt: FormatName,
    db_path: str | Path,
    gold_result: ExecResult | None,
    order_matters: bool,
    settings: Settings | None = None,
) -> Turn:
    """Parse ``text`` in format ``fmt``, execute its SQL read-only on ``db_path`` and compare
    with ``gold_result`` (the gold's execution; order-sensitive when ``order_matters``).

    A turn without extractable SQL is not executed (``result`` None, not correct). A gold that
    failed to execute matches nothing. Never raises for any model text.
    """
    parsed = parse_output(text, fmt)
    if parsed.sql is None:
        return Turn(text=text, sql=None, result=None, correct=False)
    result = execute(db_path, parsed.sql, settings=settings.sandbox if settings is not None else None)
    correct = (
        result.ok
        and gold_result is not None
        and gold_result.ok
        and results_match(result, gold_result, order_matters)
    )
    return Turn(text=text, sql=parsed.sql, result=result, correct=bool(correct))
