"""Reward recipes looked up by name, and the records they use.

>>> from progress_sql import rewards
>>> recipe = rewards.get("progress")
>>> out = recipe(trajectory, settings)          # doctest: +SKIP
>>> out.total, out.components, out.info         # doctest: +SKIP

Recipes: ``progress`` (Progress-SQL §4.2), ``oneshot`` (its Appendix E.1 baseline),
``reasoning_sql``, ``sql_trail`` and ``skyrl``. Pure functions of their inputs: no database
access, no torch, no MLflow; build turns for real with :func:`make_turn` (one) or :func:`make_turns` (a batch).
"""

from __future__ import annotations

from progress_sql.formats import FORMATS, ParsedOutput, parse_output
from progress_sql.rewards.judge import JudgeError, LocalJudge, OpenAIJudge, make_judge
from progress_sql.rewards.registry import RewardSettings, get, names
from progress_sql.rewards.turns import make_turn, make_turns
from progress_sql.rewards.types import Judge, Recipe, RewardOutput, Trajectory, Turn


__all__ = [
    "FORMATS",
    "Judge",
    "JudgeError",
    "LocalJudge",
    "OpenAIJudge",
    "ParsedOutput",
    "Recipe",
    "RewardOutput",
    "RewardSettings",
    "Trajectory",
    "Turn",
    "get",
    "make_judge",
    "make_turn",
    "make_turns",
    "names",
    "parse_output",
]
