"""The single-turn one-shot baseline of progress-sql.md, Appendix E.1.

"assigns a score of 2.0 if the generated SQL matches the gold execution result, 0.5 if the SQL
is executable, and 0.5 if the output follows the required format."

The three conditions are independent, so the terms ADD: a correct, well-formed answer earns
2.0 + 0.5 + 0.5 = 3.0. Reasons: the appendix lists three separate criteria ("rewards based on
execution correctness, executability, and format compliance"), and the progressive reward
mirrors them additively (ω_acc 2.0, ω_keep 0.5, ω_fmt 0.5 all paid for a first-turn correct
answer): with T = 1 it reduces to this baseline plus the constant ω_align−, which is what makes
the two curves of the appendix's Figure 4 comparable. Scored on the final turn.
"""

from __future__ import annotations

from pydantic import Field

from progress_sql.rewards.components import exec_match, executable, format_ok
from progress_sql.rewards.types import Judge, Recipe, RecipeSettings, RewardOutput, Trajectory, reward_output
from progress_sql.sections import Section


# The recipe's weights (params.yaml ``rewards.oneshot``).
class OneShotRewardSettings(Section):
    correct: float = Field(2.0, ge=0.0)
    executable: float = Field(0.5, ge=0.0)
    format: float = Field(0.5, ge=0.0)


NAME = "oneshot"
FORMAT = "think_sql"
COMPONENTS = ("correct", "executable", "format")


def score(trajectory: Trajectory, cfg: RecipeSettings, judge: Judge | None = None) -> RewardOutput:
    """2.0·1[correct] + 0.5·1[executable] + 0.5·1[well-formed] on the final turn (weights from settings)."""
    w = cfg.weights
    last = trajectory.last
    return reward_output(
        {
            "correct": w.correct if exec_match(last) else 0.0,
            "executable": w.executable if executable(last) else 0.0,
            "format": w.format if format_ok(last.text, FORMAT) else 0.0,
        }
    )


def bounds(w: OneShotRewardSettings) -> tuple[float, float]:
    return 0.0, w.correct + w.executable + w.format


RECIPE = Recipe(NAME, FORMAT, COMPONENTS, score, bounds, OneShotRewardSettings)
