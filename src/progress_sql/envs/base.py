"""What every rollout environment shares: the policy protocol, the episode record, the Env base.

An environment (SkyRL-gym style) is driven by ``reset`` (the round-1 conversation) and ``step``
(one model output in, the environment's reply out); ``rollout`` in ``envs.rollout`` steps many
of them in lockstep. Correctness is decided once per turn by ``rewards.make_turn``: the turn's
SQL executed read-only and judged by ``sql.verdict``, the decision the evaluation's EX makes.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Protocol, Sequence, runtime_checkable

from progress_sql.corpus.records import Example
from progress_sql.envs.db_details import SchemaTexts
from progress_sql.envs.prompts import Message, round1_messages
from progress_sql.envs.settings import TaskSettings, default_task_settings
from progress_sql.formats import FormatName
from progress_sql.rewards.turns import Task, make_turn
from progress_sql.rewards.types import Trajectory, Turn
from progress_sql.sql import Semantics
from progress_sql.sql import GoldCache

# Why an episode ended. correct: a turn matched the gold (ODT loop); max_turns: T turns, none
# correct; single: the one turn of a single-turn episode; solution: the model gave its final
# <solution>; no_solution: the forced final answer was not a <solution> either.
DoneReason = Literal["correct", "max_turns", "single", "solution", "no_solution"]


# ----------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class Request:
    """One conversation to continue and the output format its prompt asks for (the format
    gives a generation's stop strings). ``example``: what the conversation is about, for
    generators that read it (evaluation's oracle); a model ignores it. ``episode_id``: which
    episode of an ``envs.rollout`` the conversation is (verl's ``instance_id``): a policy that
    keeps state per conversation keys it by this id, never by the text; None outside a rollout."""

    messages: list[Message]
    fmt: FormatName
    example: Example | None = None
    episode_id: int | None = None


@runtime_checkable
class Policy(Protocol):
    """Anything that continues conversations: one output per request, in order.

    An output is the generated text, or an object with a ``text`` attribute (a sampler's
    record with its token ids, which the policy itself keeps per episode).
    """

    def generate(self, requests: list[Request]) -> list[Any]: ...


@runtime_checkable
class TokenRecorder(Protocol):
    """A policy that keeps each episode's token record (``inference.policy.TokenPolicy``: the
    ids the model saw and sampled); ``envs.rollout`` hands every episode its record
    (``Episode.tokens``)."""

    def generate(self, requests: list[Request]) -> list[Any]: ...

    def record(self, episode_id: int) -> Any: ...


# The finish reason of an output that was never generated: its prompt is over
# ``generation.max_prompt_tokens`` (the policy answers it with an empty sample).
PROMPT_TOO_LONG = "prompt_too_long"


def output_text(output: Any) -> str:
    """The text of one policy output (``str`` or an object with a ``text`` string)."""
    text = output if isinstance(output, str) else getattr(output, "text", None)
    if not isinstance(text, str):
        raise TypeError(f"a policy output must be str or have a .text str, got {type(output).__name__}")
    return text


def episode_of(request: Request, owner: str) -> int:
    """The episode id of ``request``, for a policy (``owner``) that keeps state per episode."""
    if request.episode_id is None:
        raise ValueError(f"{owner} keeps a record per episode: each request needs its episode_id "
                         "(envs.rollout gives one)")
    return request.episode_id


class ScriptedPolicy:
    """Replays fixed outputs, one script per episode (tests, debugging).

    ``scripts[j]`` is the list of outputs of episode ``j`` (the j-th example given to
    ``envs.rollout``); asking for more outputs than a script has is an error. ``consumed[j]``
    counts the outputs script j has given.
    """

    def __init__(self, scripts: Sequence[Sequence[str]]) -> None:
        if isinstance(scripts, str) or any(isinstance(s, str) for s in scripts):
            raise TypeError("scripts is a list of scripts (lists of outputs), one per conversation")
        self.scripts = [list(s) for s in scripts]
        self.consumed = [0] * len(self.scripts)

    def generate(self, requests: list[Request]) -> list[str]:
        """The next output of each request's episode script."""
        outputs = []
        for request in requests:
            j = episode_of(request, "ScriptedPolicy")
            if not 0 <= j < len(self.scripts):
                raise ValueError(f"ScriptedPolicy: episode {j} has no script (there are {len(self.scripts)})")
            if self.consumed[j] >= len(self.scripts[j]):
                raise IndexError(f"ScriptedPolicy: script {j} has no output left (it has {len(self.scripts[j])})")
            outputs.append(self.scripts[j][self.consumed[j]])
            self.consumed[j] += 1
        return outputs


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class StepResult:
    """``messages_to_append``: the environment's reply (user messages) that follows the
    assistant message just given; empty when ``done``. ``info``: per-turn diagnostics."""

    messages_to_append: list[Message]
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """One finished (or running) rollout.

    ``messages``: the whole conversation (system, user, then assistant and environment
    messages); ``turns``: one ``rewards.Turn`` per assistant message; ``tags``: per turn, the
    ODT tags (``()`` for a correct turn or where the environment does not diagnose);
    ``k_star``: the first turn whose execution matched the gold (1-based), or None;
    ``correct``: the episode's final answer is correct; ``id``: its place in its rollout (the
    ``Request.episode_id`` of its generations); ``tokens``: its policy's token record when the
    policy keeps one (a ``TokenRecorder``: a ``TokenPolicy``'s ``ConversationTokens``, which the
    trainer trains on), else None.
    """

    env: str
    example: Example
    db_path: str
    db_details: str
    max_turns: int
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    tags: list[tuple[str, ...]] = field(default_factory=list)
    k_star: int | None = None
    correct: bool = False
    done_reason: DoneReason | None = None
    id: int = 0
    tokens: Any = None

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name for the stopping turn
        """The number of turns taken (Algorithm 1's K)."""
        return len(self.turns)

    @property
    def done(self) -> bool:
        return self.done_reason is not None

    def trajectory(self) -> Trajectory:
        """The record the reward recipes score (``rewards.get(name)(episode.trajectory())``)."""
        ex = self.example
        return Trajectory(
            turns=tuple(self.turns),
            gold_sql=ex.gold_sql,
            db_id=ex.db_id,
            difficulty=ex.difficulty or ex.hardness,
            question=ex.question,
            schema=self.db_details,
            max_turns=self.max_turns,
        )


# ----------------------------------------------------------------------------- environments
@dataclass(frozen=True)
class Adapter:
    """How other frameworks' loops reach a multi-turn environment (``integrations``).

    ``protocol``: its name there (``EpisodeSession(protocol)``, the SkyRL-gym id
    ``progress-sql-<protocol>``, the verl interaction ``progress_sql_<protocol>``); ``stem``:
    the adapters' class names (TRL ``<stem>Environment``, written out by ``python -m
    progress_sql.integrations.trl``; verl ``<stem>Interaction``); ``recipe``: the recipe that scores it by default; ``tool``,
    ``tool_arg`` and ``tool_doc``: the one tool a TRL model calls to take a turn, its argument
    and the docstring TRL shows the model (Google style: TRL builds the tool's schema from it).
    """

    protocol: str
    stem: str
    recipe: str
    tool: str
    tool_arg: str
    tool_doc: str


@functools.lru_cache(maxsize=2)
def _default_schema_texts(prompt_style: str) -> SchemaTexts:
    return SchemaTexts(prompt_style=prompt_style)  # shared: every environment reads a database's DDL once


class Env:
    """Base of the environments: ``reset`` then ``step`` until ``done``; ``episode`` is the record.

    ``settings``: the task module's sections (``TaskSettings``, or the pipeline's Settings,
    which holds them: env budgets, sandbox limits, ODT weights), default the built-in ones;
    ``fmt``: the output format, one of the class's ``formats`` (default the first);
    ``schema_texts(db_id, db_path)`` gives the prompts' schema text (default: a shared
    ``SchemaTexts`` of ``env.prompt_style`` reading the SQLite files). Each turn is judged under
    the episode's example's semantics (``Example.semantics``: Spider or BIRD rules), as the
    evaluation judges it.

    Class attributes a subclass sets: ``name`` (its registry name), ``formats`` (the output
    formats its prompts and parsing speak), ``reads_gold`` (its feedback reads the gold
    query, so it cannot run at test time) and, for a multi-turn environment that other
    frameworks drive, ``adapter`` (an ``Adapter``: the integrations build their classes from it).
    """

    name: ClassVar[str]
    formats: ClassVar[tuple[FormatName, ...]]
    reads_gold: ClassVar[bool] = False
    adapter: ClassVar[Adapter | None] = None

    def __init__(
        self,
        settings: TaskSettings | None = None,
        *,
        fmt: FormatName | None = None,
        schema_texts: Callable[[str, str | os.PathLike], str] | None = None,
    ) -> None:
        fmt = fmt or self.formats[0]
        if fmt not in self.formats:
            raise ValueError(f"{self.name}: format must be one of {', '.join(self.formats)}, got {fmt!r}")
        self.fmt: FormatName = fmt
        self.settings = settings if settings is not None else default_task_settings()
        self.schema_texts = schema_texts if schema_texts is not None else _default_schema_texts(
            self.settings.env.prompt_style)
        self._episode: Episode | None = None
        self._gold_cache: GoldCache | None = None  # reset()'s; None: the process-wide cache

    @property
    def max_turns(self) -> int:
        """The most assistant turns an episode can have."""
        raise NotImplementedError

    @property
    def semantics(self) -> Semantics:
        """What "correct" means in this episode (``sql.verdict``): its example's
        ``Example.semantics``, which the evaluation judges the same example by."""
        return self.episode.example.semantics

    @property
    def episode(self) -> Episode:
        if self._episode is None:
            raise RuntimeError(f"{self.name}: call reset() first")
        return self._episode

    @property
    def messages(self) -> list[Message]:
        """The conversation so far: the prompt of the next generation."""
        return self.episode.messages

    def request(self) -> Request:
        """The next generation's request: a copy of the conversation (a policy cannot change
        the episode's record), its format, example and episode id."""
        ep = self.episode
        return Request([dict(m) for m in ep.messages], self.fmt, ep.example, ep.id)

    @property
    def done(self) -> bool:
        return self.episode.done

    def reset(
        self,
        example: Example,
        db_path: str | os.PathLike,
        gold_cache: GoldCache | None = None,
        db_details: str | None = None,
        episode_id: int = 0,
    ) -> list[Message]:
        """Start an episode (``episode_id``) for ``example`` on ``db_path``; return the round-1
        conversation.

        Turns are judged against the gold's comparison view (``sql.verdict``), executed once
        per cache: ``gold_cache`` (default: the process-wide one). ``db_details`` is the
        schema text (default: ``schema_texts``).
        """
        path = Path(db_path)
        if not path.is_file():
            raise FileNotFoundError(f"{example.id}: database {path} not found")
        self._gold_cache = gold_cache
        if db_details is None:
            db_details = self.schema_texts(example.db_id, path)
        self._episode = Episode(
            env=self.name,
            example=example,
            db_path=str(path),
            db_details=db_details,
            max_turns=self.max_turns,
            messages=round1_messages(example, db_details, self.fmt, self.settings.env),
            id=episode_id,
        )
        return self.messages

    def task(self) -> Task:
        """What this episode's turns are judged against: database, gold query, semantics."""
        ep = self.episode
        return ep.db_path, ep.example.gold_sql, self.semantics

    def step(self, text: str, turn: Turn | None = None) -> StepResult:
        """Take one model output; return the environment's reply. ``turn``: the output already
        judged (``rewards.make_turns`` over ``task()``, as ``envs.rollout`` judges a round of
        episodes at once); None: judged here."""
        raise NotImplementedError

    # -- helpers for subclasses
    def _begin_turn(self, text: str, turn: Turn | None = None) -> Turn:
        """Score ``text`` as the next turn (unless ``turn`` is its verdict), record it and its
        assistant message."""
        ep = self.episode
        if ep.done:
            raise RuntimeError(f"{self.name}: the episode is over ({ep.done_reason}); call reset()")
        if not isinstance(text, str):
            raise TypeError(f"{self.name}: step() takes the output text, got {type(text).__name__}")
        if turn is None:
            turn = make_turn(text, self.fmt, ep.db_path, ep.example.gold_sql, self.settings.sandbox,
                             semantics=self.semantics, gold_cache=self._gold_cache)
        elif turn.text != text:
            raise ValueError(f"{self.name}: the judged turn is not of this output")
        ep.turns.append(turn)
        ep.tags.append(())
        ep.messages.append({"role": "assistant", "content": text})
        if turn.correct and ep.k_star is None:
            ep.k_star = ep.K
        return turn

    def _reply(self, content: str) -> StepResult:
        message = {"role": "user", "content": content}
        self.episode.messages.append(message)
        return StepResult([dict(message)], False, self._info())

    def _finish(self, reason: DoneReason, correct: bool) -> StepResult:
        self.episode.done_reason = reason
        self.episode.correct = correct
        return StepResult([], True, self._info())

    def _info(self) -> dict[str, Any]:
        ep = self.episode
        turn = ep.turns[-1]
        return {"turn": ep.K, "sql": turn.sql, "correct": turn.correct, "tags": ep.tags[-1], "done_reason": ep.done_reason}
