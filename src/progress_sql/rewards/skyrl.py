"""SkyRL-SQL's baseline reward: -1 bad format, 0 wrong, 1 correct (weights from settings).

"Bad format" means the final output is not a well-formed ``trail`` output whose action is a
``<solution>``: the final answer is all SkyRL-SQL scores.
"""

from __future__ import annotations

from pydantic import Field

from progress_sql.rewards.components import exec_match
from progress_sql.formats import parse_output
from progress_sql.rewards.types import Judge, Recipe, RecipeSettings, RewardOutput, Trajectory, reward_output
from progress_sql.sections import Section


# The recipe's weights (params.yaml ``rewards.skyrl``).
class SkyRLRewardSettings(Section):
    bad_format: float = Field(-1.0, le=0.0)
    wrong: float = 0.0
    correct: float = Field(1.0, gt=0.0)


NAME = "skyrl"
FORMAT = "trail"
COMPONENTS = ("outcome",)


def score(trajectory: Trajectory, cfg: RecipeSettings, judge: Judge | None = None) -> RewardOutput:
    """One outcome term: bad_format, wrong or correct."""
    w = cfg.weights
    parsed = parse_output(trajectory.last.text, FORMAT)
    reason = parsed.reason or ("" if parsed.kind == "solution" else "final turn is not a <solution>")
    if reason:
        outcome, value = "bad_format", w.bad_format
    elif exec_match(trajectory.last):
        outcome, value = "correct", w.correct
    else:
        outcome, value = "wrong", w.wrong
    return reward_output({"outcome": value}, outcome=outcome, reason=reason)


def bounds(w: SkyRLRewardSettings) -> tuple[float, float]:
    values = (w.bad_format, w.wrong, w.correct)
    return min(values), max(values)


RECIPE = Recipe(NAME, FORMAT, COMPONENTS, score, bounds, SkyRLRewardSettings)
