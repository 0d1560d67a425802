"""One multi-turn episode of a project environment, driven by another framework's loop.

A protocol is a multi-turn environment that declares an ``Env.adapter`` (``envs.protocols()``),
and the recipe that scores it by default:

- ``odt``: ``odt_feedback``, Progress-SQL's Algorithm 1 (recipe ``progress``): after each wrong
  turn the ODT feedback; the episode stops at the first correct turn or after T turns;
- ``sql_tool``: ``exec_feedback``, the SQL tool loop of SQL-Trail / SkyRL-SQL (recipe
  ``sql_trail``): ``<sql>`` runs a query and its result comes back, ``<solution>`` ends it.

``EpisodeSession`` starts the environment from a dataset's columns and steps it with raw model
text, as the framework hands it over; the episode is the environment's own, so its reward is
exactly ``rewards.get(recipe)(env.episode.trajectory(), settings)``, or the floor (reasons as
in ``scoring``) when the task cannot be judged or no turn held SQL. Bad input never raises: a
missing database or a failing gold ends the episode before its first turn, a step after the
end or a non-text step is answered with a message and does not count as a turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from progress_sql import envs
from progress_sql.envs.base import Env
from progress_sql.envs.prompts import Message
from progress_sql.envs.settings import EnvSettings
from progress_sql.integrations.scoring import Scored, check_task, floor, resolve_recipe, score_turns, task_settings
from progress_sql.integrations.tasks import example_from_row
from progress_sql.rewards.types import Judge, Recipe
from progress_sql.sql import SandboxUnavailable


PROTOCOLS: dict[str, type[Env]] = envs.protocols()  # protocol name -> environment class

# What a step answers when it does not reach the environment (tool-style frameworks show it).
EPISODE_OVER = "The task is finished: no further attempts are taken."
NOT_TEXT = "The answer must be text."


@dataclass(frozen=True)
class Reply:
    """The environment's answer to one step: ``text`` (its reply message, '' when the episode
    ended without one), ``done``, ``counted`` (the step was a turn of the episode) and
    ``info`` (the environment's per-turn diagnostics)."""

    text: str
    done: bool
    counted: bool = True
    info: dict[str, Any] = field(default_factory=dict)


def with_max_turns(settings: Any, max_turns: int | None) -> Any:
    """``settings`` with ``max_turns`` as both the ODT budget T and the SQL tool budget
    (validated by ``EnvSettings``); ``settings`` itself when ``max_turns`` is None."""
    if max_turns is None:
        return settings
    env = EnvSettings.model_validate({**settings.env.model_dump(), "max_turns": int(max_turns),
                                      "trail_max_turns": int(max_turns)})
    return settings.model_copy(update={"env": env})


class EpisodeSession:
    """One episode of ``protocol`` (a name of ``PROTOCOLS``) scored by ``recipe`` (default the
    protocol's; it must speak the environment's output format) under ``settings`` (the task
    sections, see ``scoring.task_settings``); ``max_turns`` overrides the turn budget.

    ``start(...)`` then ``step(text)`` until ``done``; ``score()`` at any time gives the reward
    of the turns so far (the recipe scoring the episode at its end when it is done).
    """

    def __init__(self, protocol: str = "odt", recipe: str | Recipe | None = None, settings: Any = None, *,
                 judge: Judge | None = None, max_turns: int | None = None) -> None:
        try:
            env_cls = PROTOCOLS[protocol]
        except KeyError:
            raise KeyError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}") from None
        self.protocol = protocol
        self.recipe = resolve_recipe(recipe or env_cls.adapter.recipe)
        if self.recipe.fmt not in env_cls.formats:
            raise ValueError(f"recipe {self.recipe.name} writes {self.recipe.fmt}; {env_cls.name} speaks "
                             f"{', '.join(env_cls.formats)}")
        self.settings = with_max_turns(task_settings(settings), max_turns)
        self.judge = judge
        self._env_cls = env_cls
        self.env: Env = env_cls(self.settings, fmt=self.recipe.fmt)
        self.reason = "error: start() was not called"
        self._finished = True

    @property
    def max_turns(self) -> int:
        """The most turns an episode can have."""
        return self.env.max_turns

    @property
    def turns(self) -> int:
        """Turns taken so far."""
        try:
            return self.env.episode.K
        except RuntimeError:  # not reset: the task could not be judged
            return 0

    @property
    def done(self) -> bool:
        return self._finished

    def start(self, db_path: Any, gold_sql: Any, **columns: Any) -> list[Message]:
        """Start an episode for the example of these dataset columns (``db_id``, ``question``,
        ``difficulty``, ``evidence``, ``example_id``, ``hardness``; others are ignored); return
        its round-1 messages, or [] when the task cannot be judged (the episode is then over,
        ``reason`` says why and ``score()`` is the floor)."""
        self.reason, self._finished = "", False
        self.env = self._env_cls(self.settings, fmt=self.recipe.fmt)  # a fresh record per episode
        try:
            self.reason = check_task(db_path, gold_sql, self.settings, columns.get("semantics") or "spider")
            if not self.reason:
                names = ("db_id", "question", "difficulty", "evidence", "example_id", "hardness", "semantics")
                example = example_from_row(gold_sql, **{k: columns.get(k, "") for k in names})
                return [dict(m) for m in self.env.reset(example, db_path)]
        except SandboxUnavailable:  # no verdict at all, not a bad output
            raise
        except Exception as err:  # the framework's loop goes on: report it in the score
            self.reason = f"error: {type(err).__name__}: {err}"
        self._finished = True
        return []

    def step(self, text: Any) -> Reply:
        """Take one model output; the environment's reply (see ``Reply``). Never raises for bad
        output (``SandboxUnavailable`` when the sandbox cannot start)."""
        if self._finished:
            return Reply(EPISODE_OVER, True, counted=False)
        if not isinstance(text, str):
            return Reply(NOT_TEXT, False, counted=False)
        try:
            result = self.env.step(text)
        except SandboxUnavailable:  # no verdict at all, not a bad output
            raise
        except Exception as err:  # a turn half-recorded: the episode cannot go on
            self.reason, self._finished = f"error: {type(err).__name__}: {err}", True
            return Reply("", True, info={"reason": self.reason})
        self._finished = result.done
        reply = "\n".join(m["content"] for m in result.messages_to_append)
        return Reply(reply, result.done, info=dict(result.info))

    def score(self) -> Scored:
        """The recipe's reward of the episode so far; the floor when the task could not be
        judged, the episode has no turn yet, or no turn held SQL. Never raises."""
        if self.reason:
            return floor(self.recipe, self.settings, self.reason, self.turns)
        try:
            if not self.env.episode.turns:
                return floor(self.recipe, self.settings, "no_sql: the episode has no turn", 0)
            return score_turns(self.recipe, self.env.episode.trajectory(), self.settings, self.judge)
        except SandboxUnavailable:  # no verdict at all, not a bad output
            raise
        except Exception as err:
            return floor(self.recipe, self.settings, f"error: {type(err).__name__}: {err}", self.turns)
