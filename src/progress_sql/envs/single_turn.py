"""``single_turn``: one generation, one reward (one-shot baseline, Reasoning-SQL).

The output format follows the recipe: ``think_sql`` (Progress-SQL's prompt, the one-shot
baseline) or ``reasoning_answer`` (Reasoning-SQL), e.g. ``SingleTurnEnv(fmt=rewards.get(
"reasoning_sql").fmt)``.
"""

from __future__ import annotations

from typing import Any

from progress_sql.envs.base import Env, StepResult
from progress_sql.rewards.formats import FormatName

_FORMATS: tuple[FormatName, ...] = ("think_sql", "reasoning_answer")


class SingleTurnEnv(Env):
    name = "single_turn"

    def __init__(self, settings=None, *, fmt: FormatName = "think_sql", **kwargs: Any) -> None:
        if fmt not in _FORMATS:
            raise ValueError(f"single_turn: format must be one of {', '.join(_FORMATS)}, got {fmt!r}")
        super().__init__(settings, **kwargs)
        self.fmt = fmt

    @property
    def max_turns(self) -> int:
        return 1

    def step(self, text: str) -> StepResult:
        """Score the one output; the episode ends."""
        turn = self._begin_turn(text)
        return self._finish("single", turn.correct)
