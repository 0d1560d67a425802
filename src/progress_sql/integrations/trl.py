"""TRL (``trl`` 1.x, ``GRPOTrainer``): reward functions and multi-turn environments.

Single turn, every single-turn recipe (``progress``, ``oneshot``, ``reasoning_sql``)::

    reward = reward_function("progress")       # f(prompts, completions, db_path, gold_sql, **columns)
    GRPOTrainer(model, reward_funcs=reward, train_dataset=dataset(corpus, "train", "progress"), ...)

The dataset's ``db_path`` and ``gold_sql`` columns reach the function as keyword arguments, as
TRL passes every dataset column; it returns one float per completion (``scoring``: the recipe's
reward, or its floor with the reason for bad input) and logs the mean of each component and the
share of floor rewards through TRL's ``log_metric`` (``<name>/<component>``, ``<name>/floored``).

Multi-turn, through TRL's environment API (``environment_factory``: one instance per rollout,
its public methods exposed to the model as tools, their results appended as ``tool`` messages
that TRL masks out of the loss), one class per protocol (``ENVIRONMENTS``), written out from its
environment's ``Env.adapter`` (class name, tool, the tool's docstring) by
``python -m progress_sql.integrations.trl``:

- ``ODTFeedbackEnvironment``: Algorithm 1. The tool ``submit_answer(answer)`` takes one turn,
  ``<think>…</think><sql>…</sql>``, and returns the ODT feedback, until the answer is correct
  or T turns were taken;
- ``SQLToolEnvironment``: the SQL tool loop. The tool ``run_sql(action)`` takes one turn in the
  ``trail`` format: ``<sql>`` runs the query and returns its result, ``<solution>`` ends it.

A turn's text is the tool argument, the text the project's environment parses, so the
episode (and its reward) is the one the project's own rollout would have with the same outputs.
``episode_reward`` scores the episodes (pass it as ``reward_funcs``); a final assistant message
without a tool call, while the episode is still open, is taken as its last turn (a model that
answers directly gets its answer judged). Pass the environment's round-1 prompts with
``dataset(..., protocol="odt")``. The model's chat template must support tool calls
(``trl.chat_template_utils.supports_tool_calling``, true for Qwen2.5/Qwen3); set
``max_tool_calling_iterations`` to the turn budget.

Nothing here imports TRL or torch; ``datasets`` (TRL's data stack) is imported by ``dataset``.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from progress_sql.formats import SINGLE_ANSWER_FORMATS
from progress_sql.integrations.scoring import Scored, floor, resolve_recipe, score_batch, task_settings
from progress_sql.integrations.sessions import PROTOCOLS, EpisodeSession
from progress_sql.integrations.tasks import task_rows
from progress_sql.rewards.types import Judge, Recipe
from progress_sql.sql import SQLPool

# The tool results a turn that does not reach the environment gets.
CORRECT = "Correct: the query returns the expected result. The task is done."
ANSWER_RECORDED = "Your final answer was recorded. The task is done."
LAST_TURN = "No attempts are left. The task is over."
TASK_BROKEN = "This task cannot be checked ({reason}). The task is over."
_ENDINGS = {"correct": CORRECT, "solution": ANSWER_RECORDED}  # by the episode's done_reason


def completion_text(completion: Any) -> str:
    """The model's text of one TRL completion: the string itself (standard format), or the
    last assistant message's content (conversational), its ``<think>`` block put back when the
    tokenizer's response parser moved it to ``reasoning_content``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return ""
    for message in reversed(completion):
        if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
            return _message_text(message)
    return ""


def _message_text(message: dict) -> str:
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning and "<think>" not in content:
        return f"<think>{reasoning}</think>{content}"  # Qwen's parser split <think>…</think> off
    return content


def _log(columns: dict[str, Any], name: str, recipe: Recipe, scored: Sequence[Scored]) -> None:
    """Component means and the floor share through TRL's ``log_metric``, reasons through
    ``log_extra`` (both absent outside a trainer)."""
    log_metric, log_extra = columns.get("log_metric"), columns.get("log_extra")
    if callable(log_metric) and scored:
        for component in recipe.components:
            log_metric(f"{name}/{component}", sum(s.components[component] for s in scored) / len(scored))
        log_metric(f"{name}/floored", sum(s.floored for s in scored) / len(scored))
    if callable(log_extra):
        log_extra(f"{name}/reason", [s.reason for s in scored])


def _check_columns(name: str, n: int, columns: dict[str, Any]) -> None:
    """TRL passes every dataset column as a list, one value per completion: a column given
    otherwise (a single string would be read character by character) is the caller's mistake,
    refused naming the column."""
    for column, values in columns.items():
        if values is None:
            continue
        if isinstance(values, (str, bytes, os.PathLike)) or not hasattr(values, "__len__"):
            raise TypeError(f"{name}: column {column!r} must be a list with one value per completion (as TRL "
                            f"passes dataset columns), got {type(values).__name__} {values!r:.80}")
        if len(values) != n:
            raise ValueError(f"{name}: column {column!r} has {len(values)} values for {n} completions")


def reward_function(
    recipe: str | Recipe = "progress",
    settings: Any = None,
    *,
    judge: Judge | None = None,
    pool: SQLPool | None = None,
) -> Callable[..., list[float]]:
    """A TRL reward function for the single-turn ``recipe`` under ``settings`` (the task
    sections; default the built-in ones), named ``progress_sql_<recipe>`` in TRL's logs.

    Its signature is TRL's: ``(prompts, completions, db_path, gold_sql, **columns)`` returning
    one float per completion; ``question``, ``difficulty`` and ``semantics`` columns are read
    when present. Every column is a list with one value per completion, as TRL passes them
    (called by hand with one completion too): anything else raises TypeError naming it.
    ``pool``: an ``SQLPool`` to run the batch's queries in worker processes (default: this
    thread). ``judge``: Reasoning-SQL's LLM judge (None: its weight is redistributed).
    """
    recipe = resolve_recipe(recipe)
    if recipe.fmt not in SINGLE_ANSWER_FORMATS:
        raise ValueError(f"{recipe.name} is a multi-turn recipe ({recipe.fmt}); use SQLToolEnvironment")
    settings = task_settings(settings)
    name = f"progress_sql_{recipe.name}"

    def reward(prompts: list, completions: list, db_path: Sequence[str] | None = None,
               gold_sql: Sequence[str] | None = None, **columns: Any) -> list[float]:
        n = len(completions)
        _check_columns(name, n, {"db_path": db_path, "gold_sql": gold_sql,
                                 **{k: columns.get(k) for k in ("question", "difficulty", "semantics")}})
        if db_path is None or gold_sql is None:
            missing = "db_path" if db_path is None else "gold_sql"
            scored = [floor(recipe, settings, f"error: the dataset has no {missing} column")] * n
        else:
            scored = score_batch([completion_text(c) for c in completions], db_path, gold_sql, recipe, settings,
                                 pool=pool, judge=judge, questions=columns.get("question"),
                                 difficulties=columns.get("difficulty"), semantics=columns.get("semantics"))
        _log(columns, name, recipe, scored)
        return [s.total for s in scored]

    reward.__name__ = reward.__qualname__ = name
    return reward


class _EpisodeEnvironment:
    """What both TRL environments share: a session per rollout, reset from the row."""

    protocol = "odt"

    def __init__(self, recipe: str | Recipe | None = None, settings: Any = None, *,
                 judge: Judge | None = None) -> None:
        self._session = EpisodeSession(self.protocol, recipe, settings, judge=judge)

    @property
    def session(self) -> EpisodeSession:
        """This rollout's episode (a property, so TRL does not offer it as a tool)."""
        return self._session

    def reset(self, db_path: Any = None, gold_sql: Any = None, **columns: Any) -> None:
        """Start the episode of this row; the prompt is the dataset's (returns None)."""
        self._session.start(db_path, gold_sql, **columns)

    def _take(self, text: Any) -> str:
        session = self._session
        if session.done and session.reason:
            return TASK_BROKEN.format(reason=session.reason)
        reply = session.step(text)
        if reply.text:
            return reply.text
        if session.reason:
            return TASK_BROKEN.format(reason=session.reason)
        return _ENDINGS.get(session.env.episode.done_reason, LAST_TURN)


# ----------------------------------------------------------------------------- written out
# One class per protocol, its tool the one its environment's ``Env.adapter`` names: TRL builds
# the tool's schema from the method's signature and docstring, so both are the adapter's. The
# block between the two marker lines is generated from ``envs.protocols()`` by
# ``python -m progress_sql.integrations.trl`` (tests/test_integrations_trl.py checks it is current).
_BEGIN = "# >>> generated by python -m progress_sql.integrations.trl: do not edit"
_END = "# <<< generated"


def environment_classes_source() -> str:
    """The Python source of the TRL environment classes of every protocol, and ``ENVIRONMENTS``."""
    blocks = []
    for protocol, env in PROTOCOLS.items():
        adapter = env.adapter
        doc = "\n".join(f"        {line}" if line else "" for line in inspect.cleandoc(adapter.tool_doc).splitlines())
        blocks.append(
            f"class {adapter.stem}Environment(_EpisodeEnvironment):\n"
            f'    """The {protocol} protocol ({env.name}) as a TRL environment (see the module notes)."""\n\n'
            f'    protocol = "{protocol}"\n\n'
            f"    def {adapter.tool}(self, {adapter.tool_arg}: str) -> str:\n"
            f'        """{doc.lstrip()}\n        """\n'
            f"        return self._take({adapter.tool_arg})\n")
    names = ", ".join(f'"{protocol}": {env.adapter.stem}Environment' for protocol, env in PROTOCOLS.items())
    return "\n\n".join(blocks) + f"\n\nENVIRONMENTS: dict[str, type[_EpisodeEnvironment]] = {{{names}}}\n"


def written_source(module_text: str) -> str:
    """What the generated block of this module's text holds."""
    return module_text.split(_BEGIN + "\n", 1)[1].split(_END, 1)[0].strip("\n") + "\n"


# >>> generated by python -m progress_sql.integrations.trl: do not edit
class ODTFeedbackEnvironment(_EpisodeEnvironment):
    """The odt protocol (odt_feedback) as a TRL environment (see the module notes)."""

    protocol = "odt"

    def submit_answer(self, answer: str) -> str:
        """Submit one answer; it is run against the database and compared with the intended query.

        Args:
            answer: Your reasoning and SQL query, written as <think>reasoning</think><sql>query</sql>.

        Returns:
            Feedback on what to fix in the query, or a note that it is correct and the task is done.
        """
        return self._take(answer)


class SQLToolEnvironment(_EpisodeEnvironment):
    """The sql_tool protocol (exec_feedback) as a TRL environment (see the module notes)."""

    protocol = "sql_tool"

    def run_sql(self, action: str) -> str:
        """Take one step of the task: run a query against the database, or give the final answer.

        Args:
            action: <think>reasoning</think> followed by <sql>a query to run</sql>, or by <solution>your final query</solution>.

        Returns:
            The query's result table or its error, or a note that the final answer was recorded.
        """
        return self._take(action)


ENVIRONMENTS: dict[str, type[_EpisodeEnvironment]] = {"odt": ODTFeedbackEnvironment, "sql_tool": SQLToolEnvironment}
# <<< generated


def _last_plain_answer(completion: Any) -> str | None:
    """The final assistant message's text when it made no tool call, else None."""
    if not isinstance(completion, (list, tuple)) or not completion:
        return None
    last = completion[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    text = _message_text(last)
    return text if text.strip() else None


def episode_reward(prompts: list, completions: list, environments: Sequence[Any] | None = None,
                   **columns: Any) -> list[float | None]:
    """TRL reward function for ``ODTFeedbackEnvironment`` / ``SQLToolEnvironment`` rollouts:
    each episode's reward under its environment's recipe (module notes); None (TRL: not
    applicable) for a rollout of another environment."""
    sessions = [getattr(env, "session", None) for env in (environments or [None] * len(completions))]
    scored: list[Scored | None] = []
    for completion, session in zip(completions, sessions):
        if not isinstance(session, EpisodeSession):
            scored.append(None)
            continue
        text = _last_plain_answer(completion)
        if text is not None and not session.done:
            session.step(text)  # a direct answer is the episode's last turn
        scored.append(session.score())
    ours = [s for s in scored if s is not None]
    if ours:
        recipe = next(s.recipe for s in sessions if isinstance(s, EpisodeSession))
        _log(columns, "progress_sql_episode", recipe, ours)
    return [s.total if s is not None else None for s in scored]


episode_reward.__name__ = episode_reward.__qualname__ = "progress_sql_episode"  # its name in TRL's logs


def dataset(
    corpus_dir: str,
    split: str = "train",
    recipe: str | Recipe | None = None,
    settings: Any = None,
    *,
    protocol: str | None = None,
    limit: int | None = None,
):
    """A ``datasets.Dataset`` of the corpus split for TRL: ``prompt`` (conversational) plus the
    ``tasks.ROW_COLUMNS`` the reward functions and environments read. With ``protocol``
    (``odt``, ``sql_tool``) the prompts are that protocol's environment's and ``recipe``
    defaults to its recipe; without, the single-turn prompt of ``recipe`` (default progress)."""
    from datasets import Dataset  # noqa: PLC0415 - TRL's data stack, only when a dataset is built

    env = PROTOCOLS[protocol].name if protocol is not None else "single_turn"
    recipe = recipe or (PROTOCOLS[protocol].adapter.recipe if protocol is not None else "progress")
    return Dataset.from_list(task_rows(corpus_dir, split, recipe, settings, env=env, limit=limit))


def _write_environment_classes() -> None:  # pragma: no cover - the generator's entry point
    """Rewrite the generated block of this module from the registry of protocols."""
    path = Path(__file__)
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(_BEGIN + "\n", 1)
    path.write_text(f"{head}{_BEGIN}\n{environment_classes_source()}{_END}{rest.split(_END, 1)[1]}", encoding="utf-8")


if __name__ == "__main__":
    _write_environment_classes()
