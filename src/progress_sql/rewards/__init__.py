"""Reward recipes looked up by name, and the records they use.

>>> from progress_sql import rewards
>>> recipe = rewards.get("progress")
>>> out = recipe(trajectory, settings)          # doctest: +SKIP
>>> out.total, out.components, out.info         # doctest: +SKIP

Recipes: ``progress`` (Progress-SQL §4.2), ``oneshot`` (its Appendix E.1 baseline),
``reasoning_sql``, ``sql_trail`` and ``skyrl``. Pure functions of their inputs: no database
access, no torch, no MLflow; build turns for real with :func:`make_turn`.
"""

from __future__ import annotations

from progress_sql.rewards import oneshot, progress, reasoning_sql, skyrl, sql_trail
from progress_sql.rewards.formats import FORMATS, ParsedOutput, parse_output
from progress_sql.rewards.judge import JudgeError, LocalJudge, OpenAIJudge, make_judge
from progress_sql.rewards.scoring import make_turn
from progress_sql.rewards.types import Judge, Recipe, RewardOutput, Trajectory, Turn

_RECIPES: dict[str, Recipe] = {
    module.RECIPE.name: module.RECIPE for module in (progress, oneshot, reasoning_sql, sql_trail, skyrl)
}


def names() -> tuple[str, ...]:
    """The names of every registered recipe."""
    return tuple(_RECIPES)


def get(name: str) -> Recipe:
    """The recipe called ``name``; KeyError naming the known recipes otherwise."""
    try:
        return _RECIPES[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown reward recipe {name!r}; known: {', '.join(_RECIPES)}") from None


__all__ = [
    "FORMATS",
    "Judge",
    "JudgeError",
    "LocalJudge",
    "OpenAIJudge",
    "ParsedOutput",
    "Recipe",
    "RewardOutput",
    "Trajectory",
    "Turn",
    "get",
    "make_judge",
    "make_turn",
    "names",
    "parse_output",
]
