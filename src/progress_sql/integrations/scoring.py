"""One completion, one reward: a recipe's score as a framework's reward loop needs it.

A framework's reward loop must get a number for every completion and must never see an
exception. ``score_completion`` gives the recipe's reward of the one-turn trajectory that
``rewards.make_turn`` builds (parse, execute read-only, ``sql.verdict``): the reward the
project's own single-turn environment gives. Bad input gets the recipe's floor
(``recipe.min_reward``) and a ``reason`` instead:

- ``no_sql``: no SQL could be extracted from the completion (no answer tags, an empty block);
- ``no_database``: the database path is missing or not a file;
- ``gold_failed``: the gold query does not execute (the example cannot be judged);
- ``gold_too_large``: the gold's result has more than ``sandbox.max_rows`` rows (nor can it:
  the reason says to raise ``sandbox.max_rows`` or fix the question; ``sql.verdict``);
- ``error``: anything else raised (the message says what).

A sandbox that cannot start (``sql.SandboxUnavailable``) is the one exception that is raised:
it is the machine's fault, not the completion's, and a floor reward would train on it.

``score_batch`` scores many completions at once, their queries executed through one
``SQLPool`` (worker processes) in a single round, each distinct query once.

Every query runs in the sandbox (read-only, one SELECT, ``sandbox.timeout_s``): a call runs at
most three (the prediction, its comparison view when it differs, the gold on a cache miss).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from progress_sql import rewards
from progress_sql.envs.settings import TaskSettings, default_task_settings
from progress_sql.rewards.types import Judge, Recipe, Trajectory, Turn
from progress_sql.sql import BatchVerdicts, SandboxUnavailable, SQLPool
from progress_sql.sql.verdict import GOLD_TOO_LARGE, gold_comparison_result, too_large_reason

REASONS = ("no_sql", "no_database", "gold_failed", GOLD_TOO_LARGE, "error")


@dataclass(frozen=True)
class Scored:
    """The reward of one completion or episode, with what a framework logs beside it.

    ``total``: the reward; ``components``: the recipe's named terms (all 0.0 on a floor
    reward); ``correct``: the final answer matched the gold; ``reason``: '' when the recipe
    scored it, else why the floor was given (``<kind>: <detail>``, kind one of ``REASONS``);
    ``turns``: the turns scored; ``info``: the recipe's diagnostics.
    """

    total: float
    components: dict[str, float]
    correct: bool = False
    reason: str = ""
    turns: int = 1
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def floored(self) -> bool:
        """The floor reward was given for bad input."""
        return bool(self.reason)


def resolve_recipe(recipe: str | Recipe) -> Recipe:
    """The recipe called ``recipe`` (or ``recipe`` itself); KeyError naming the known ones."""
    return recipe if isinstance(recipe, Recipe) else rewards.get(recipe)


def task_settings(settings: Any = None) -> Any:
    """The settings the task module reads: ``settings`` itself when it holds the task
    sections (a ``TaskSettings`` or the pipeline's ``Settings``), a mapping validated into a
    ``TaskSettings`` (a framework's config), or the built-in defaults for None."""
    if settings is None:
        return default_task_settings()
    if isinstance(settings, Mapping):
        return TaskSettings.model_validate(dict(settings))
    if all(hasattr(settings, name) for name in ("sandbox", "odt", "rewards", "env")):
        return settings
    raise TypeError(f"settings must be TaskSettings, Settings or a mapping, got {type(settings).__name__}")


def floor(recipe: Recipe, settings: Any, reason: str, turns: int = 1) -> Scored:
    """The recipe's floor reward for bad input, every component 0, ``reason`` saying why."""
    return Scored(recipe.min_reward(settings), {name: 0.0 for name in recipe.components},
                  reason=reason, turns=turns)


def check_task(db_path: Any, gold_sql: Any, settings: Any, semantics: str = "spider") -> str:
    """'' when the example can be judged, else the floor reason: the database is missing, or
    the gold does not execute or returns more than ``sandbox.max_rows`` rows: the gold the
    verdict compares with, its comparison view under ``semantics`` (so a Spider gold with a
    spaced ``! =`` is judged, as the environments judge it), from the process-wide gold cache."""
    if not isinstance(gold_sql, str) or not gold_sql.strip():
        return "gold_failed: no gold SQL given"
    if not isinstance(db_path, (str, os.PathLike)) or not str(db_path):
        return "no_database: no database path given"
    path = Path(db_path)
    if not path.is_file():
        return f"no_database: {path} is not a file"
    gold = gold_comparison_result(path, gold_sql, semantics or "spider", settings.sandbox)
    if not gold.ok:
        return f"gold_failed: {gold.error}: {gold.message}"
    return too_large_reason(gold)


def score_turns(recipe: Recipe, trajectory: Trajectory, settings: Any, judge: Judge | None = None) -> Scored:
    """The recipe's reward of ``trajectory``; the floor (``no_sql``) when no turn holds SQL."""
    turns = len(trajectory.turns)
    if all(turn.sql is None for turn in trajectory.turns):
        return floor(recipe, settings, "no_sql: no turn holds SQL in the answer tags of format "
                                       f"{recipe.fmt}", turns)
    out = recipe(trajectory, settings, judge=judge)
    return Scored(out.total, dict(out.components), correct=trajectory.last.correct, turns=turns, info=out.info)


def _guarded(recipe: Recipe, settings: Any, run: Any) -> Scored:
    try:
        return run()
    except SandboxUnavailable:  # no verdict at all, not a bad completion
        raise
    except Exception as err:  # a framework's loop must get a number: report, never raise
        return floor(recipe, settings, f"error: {type(err).__name__}: {err}")


def score_completion(
    text: Any,
    db_path: Any,
    gold_sql: Any,
    recipe: str | Recipe = "progress",
    settings: Any = None,
    *,
    judge: Judge | None = None,
    question: str = "",
    difficulty: str = "",
    db_id: str = "",
    semantics: str = "spider",
) -> Scored:
    """The reward of one completion ``text`` for the example (``db_path``, ``gold_sql``):
    ``recipe`` on the one-turn trajectory ``make_turn`` builds, or the floor with the reason
    (see the module notes). ``question`` and ``difficulty`` are what some recipes read (the
    LLM judge, SQL-Trail's turn limits); ``semantics`` how the answer is judged (the example's:
    ``spider`` or ``bird``). Never raises for bad input (``SandboxUnavailable`` when the
    sandbox cannot start)."""
    recipe = resolve_recipe(recipe)
    settings = task_settings(settings)

    def run() -> Scored:
        problem = check_task(db_path, gold_sql, settings, semantics)
        if problem:
            return floor(recipe, settings, problem)
        turn = rewards.make_turn(text, recipe.fmt, db_path, gold_sql, settings.sandbox, semantics=semantics or "spider")
        return score_turns(recipe, _one_turn(turn, gold_sql, question, difficulty, db_id), settings, judge)

    return _guarded(recipe, settings, run)


def _one_turn(turn: Turn, gold_sql: str, question: Any, difficulty: Any, db_id: Any) -> Trajectory:
    return Trajectory(turns=(turn,), gold_sql=gold_sql, db_id=str(db_id or ""), difficulty=str(difficulty or ""),
                      question=str(question or ""), max_turns=1)


def _column(values: Sequence[Any] | None, n: int) -> list[Any]:
    return list(values) if values is not None else [""] * n


def score_batch(
    texts: Sequence[Any],
    db_paths: Sequence[Any],
    gold_sqls: Sequence[Any],
    recipe: str | Recipe = "progress",
    settings: Any = None,
    *,
    pool: SQLPool | None = None,
    judge: Judge | None = None,
    questions: Sequence[str] | None = None,
    difficulties: Sequence[str] | None = None,
    semantics: Sequence[str] | None = None,
) -> list[Scored]:
    """``score_completion`` of every ``(texts[i], db_paths[i], gold_sqls[i])``, in order,
    with the same rewards; the predictions' queries run in one ``pool.map`` (each distinct
    query once), or one by one in this thread without a pool. Never raises per item."""
    n = len(texts)
    if not len(db_paths) == len(gold_sqls) == n:
        raise ValueError(f"score_batch: {n} texts, {len(db_paths)} databases, {len(gold_sqls)} gold queries")
    recipe = resolve_recipe(recipe)
    settings = task_settings(settings)
    questions, difficulties = _column(questions, n), _column(difficulties, n)
    semantics = [s or "spider" for s in _column(semantics, n)]
    keys = [(*_task_key(db, gold), sem) for db, gold, sem in zip(db_paths, gold_sqls, semantics)]
    problems: dict[tuple[Any, ...], str] = {}
    for key, db, gold, sem in zip(keys, db_paths, gold_sqls, semantics):
        if key not in problems:  # the G completions of a question share one check
            problems[key] = check_task(db, gold, settings, sem)
    judged = [i for i in range(n) if not problems[keys[i]]]
    turns = dict(zip(judged, rewards.make_turns([texts[i] for i in judged], recipe.fmt,
                                                [(str(db_paths[i]), gold_sqls[i], semantics[i]) for i in judged],
                                                BatchVerdicts(settings.sandbox, pool=pool))))
    out = []
    for i in range(n):
        if i not in turns:
            out.append(floor(recipe, settings, problems[keys[i]]))
            continue

        def run(i: int = i) -> Scored:
            trajectory = _one_turn(turns[i], gold_sqls[i], questions[i], difficulties[i], "")
            return score_turns(recipe, trajectory, settings, judge)

        out.append(_guarded(recipe, settings, run))
    return out


def _task_key(db_path: Any, gold_sql: Any) -> tuple[Any, Any]:
    # hashable even for odd values (which check_task then reports)
    return (db_path if isinstance(db_path, (str, os.PathLike, type(None))) else (type(db_path), id(db_path)),
            gold_sql if isinstance(gold_sql, (str, type(None))) else (type(gold_sql), id(gold_sql)))
