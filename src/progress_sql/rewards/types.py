"""The records every reward recipe reads and writes, and the Recipe object of the registry."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from progress_sql.formats import FormatName
from progress_sql.sql.result import ExecResult

if TYPE_CHECKING:
    from progress_sql.odt.settings import ODTSettings
    from progress_sql.sections import Section


@dataclass(frozen=True)
class Turn:
    """One model output of a rollout.

    ``text``: the raw output; ``sql``: the SQL extracted from it (None when nothing could be
    extracted); ``result``: the execution of ``sql`` (None when not executed); ``correct``:
    the turn is correct by ``sql.verdict`` (the evaluation's decision too); ``unjudged``: ''
    or why no turn of this question can be judged (``sql.verdict.Verdict.unjudged``: the gold's
    result passed ``sandbox.max_rows``).
    Build real turns with :func:`progress_sql.rewards.turns.make_turn`.
    """

    text: str
    sql: str | None = None
    result: ExecResult | None = None
    correct: bool = False
    unjudged: str = ""


@dataclass(frozen=True)
class Trajectory:
    """All turns of one rollout plus what the reward needs to know about the example.

    For the ODT-feedback rollout the turns are the successive SQL attempts; for tool-using
    recipes (SQL-Trail, SkyRL) every assistant message is a turn (tool calls) and the last one
    holds the final answer. ``difficulty`` is the example's label ('' when unknown);
    ``question`` and ``schema`` are for the LLM judge; ``max_turns`` is the budget T.
    """

    turns: tuple[Turn, ...]
    gold_sql: str
    db_id: str = ""
    difficulty: str = ""
    question: str = ""
    schema: str = ""
    max_turns: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))
        if not self.turns:
            raise ValueError("a trajectory needs at least one turn")
        if not all(isinstance(t, Turn) for t in self.turns):
            raise TypeError("trajectory turns must be Turn records")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")

    @property
    def first(self) -> Turn:
        """y_1, the first turn."""
        return self.turns[0]

    @property
    def last(self) -> Turn:
        """y_K, the final turn."""
        return self.turns[-1]


@dataclass(frozen=True)
class RewardOutput:
    """``total`` = sum of ``components`` (weighted contributions, always the same keys for a
    recipe so runs compare in MLflow), except for an unjudged question's floor (``Recipe``);
    ``info``: diagnostics (k*, notes, raw scores)."""

    total: float
    components: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)


class Judge(Protocol):
    """An LLM-as-a-judge: how close a wrong SQL is to the gold, in [0, 1]."""

    def score(self, question: str, schema: str, pred_sql: str, gold_sql: str) -> float: ...


@dataclass(frozen=True)
class RecipeSettings:
    """What a recipe's score function receives: its own weights, and ODT settings for F_struct
    (None: the ODT defaults)."""

    weights: Any
    odt: "ODTSettings | None" = None


ScoreFn = Callable[[Trajectory, RecipeSettings, "Judge | None"], RewardOutput]
BoundFn = Callable[[Any], tuple[float, float]]


@dataclass(frozen=True)
class Recipe:
    """A reward recipe looked up by name: ``recipe(trajectory, settings, judge=...)``.

    ``fmt`` is the output format its model outputs must follow; ``components`` the fixed keys
    of every output's ``components``; ``weights`` the class of its section of params.yaml
    ``rewards`` (named as the recipe); ``uses_judge``: it scores with an LLM judge when one
    is configured.

    ``settings`` may be the recipe's own weights, the rewards section, settings that hold a
    rewards section (the task's or the pipeline's; their ODT section then drives F_struct),
    or None (the built-in weights).
    """

    name: str
    fmt: FormatName
    components: tuple[str, ...]
    score_fn: ScoreFn = field(repr=False)
    bounds_fn: BoundFn = field(repr=False)
    weights: "type[Section]" = field(repr=False)
    # Whether ``score_fn`` reads an LLM judge: its weights then name the judge's backend
    # (``judge_backend`` …, see ``rewards.make_judge``), and the trainer builds one.
    uses_judge: bool = False

    def settings_of(self, settings: Any) -> RecipeSettings:
        """The weights and ODT settings this recipe reads from ``settings`` (see the class notes)."""
        if settings is None:
            return RecipeSettings(_default_weights(self.weights), None)
        if isinstance(settings, self.weights):
            return RecipeSettings(settings, None)
        if isinstance(getattr(settings, self.name, None), self.weights):  # the rewards section
            return RecipeSettings(getattr(settings, self.name), None)
        section = getattr(settings, "rewards", None)
        if isinstance(getattr(section, self.name, None), self.weights):
            return RecipeSettings(getattr(section, self.name), getattr(settings, "odt", None))
        raise TypeError(f"{self.name}: settings must be its weights, the rewards section or hold one, "
                        f"got {type(settings).__name__}")

    def __call__(self, trajectory: Trajectory, settings: Any = None, *, judge: Judge | None = None) -> RewardOutput:
        """The reward of ``trajectory``; the floor (``min_reward``, every component 0, the reason
        in ``info["unjudged"]``) when its question cannot be judged: every rollout of it then
        gets the same reward, so a group-relative update learns nothing from it (the adapters
        give a gold that fails the same floor)."""
        unjudged = next((turn.unjudged for turn in trajectory.turns if turn.unjudged), "")
        if unjudged:
            return RewardOutput(self.min_reward(settings), dict.fromkeys(self.components, 0.0), {"unjudged": unjudged})
        out = self.score_fn(trajectory, self.settings_of(settings), judge)
        if tuple(out.components) != self.components:  # a recipe bug, never bad input
            raise RuntimeError(f"{self.name}: components {tuple(out.components)} != {self.components}")
        return out

    def bounds(self, settings: Any = None) -> tuple[float, float]:
        """(min_reward, max_reward) over every possible trajectory."""
        return self.bounds_fn(self.settings_of(settings).weights)

    def min_reward(self, settings: Any = None) -> float:
        return self.bounds(settings)[0]

    def max_reward(self, settings: Any = None) -> float:
        return self.bounds(settings)[1]


@functools.lru_cache(maxsize=None)
def _default_weights(weights: type) -> Any:
    return weights()


def reward_output(components: dict[str, float], **info: Any) -> RewardOutput:
    """Build a RewardOutput whose total is the sum of its components."""
    comps = {k: float(v) for k, v in components.items()}
    return RewardOutput(total=float(sum(comps.values())), components=comps, info=info)
