"""``single_turn``: one generation, one reward (one-shot baseline, Reasoning-SQL).

The output format follows the recipe: ``think_sql`` (Progress-SQL's prompt, the one-shot
baseline) or ``reasoning_answer`` (Reasoning-SQL), e.g. ``SingleTurnEnv(fmt=rewards.get(
"reasoning_sql").fmt)``.
"""

from __future__ import annotations

from progress_sql.envs.base import Env, StepResult
from progress_sql.rewards.types import Turn
from progress_sql.formats import SINGLE_ANSWER_FORMATS


class SingleTurnEnv(Env):
    name = "single_turn"
    formats = SINGLE_ANSWER_FORMATS

    @property
    def max_turns(self) -> int:
        return 1

    def step(self, text: str, turn: Turn | None = None) -> StepResult:
        """Score the one output; the episode ends."""
        turn = self._begin_turn(text, turn)
        return self._finish("single", turn.correct)
