"""Rollout environments: prompts, the three environments and a batched driver.

>>> from progress_sql import envs
>>> env = envs.get("odt_feedback")(settings)                      # doctest: +SKIP
>>> episodes = envs.rollout(lambda: envs.get("odt_feedback")(settings), policy,
...                         examples, CorpusLayout(root).database)  # doctest: +SKIP
>>> rewards.get("progress")(episodes[0].trajectory(), settings)  # doctest: +SKIP

Environments: ``single_turn`` (one generation), ``odt_feedback`` (Progress-SQL's Algorithm 1)
and ``exec_feedback`` (SQL-Trail / SkyRL-SQL tool loop). Pure Python: no torch.
"""

from __future__ import annotations

from progress_sql.envs.base import (
    PROMPT_TOO_LONG,
    Adapter,
    Env,
    Episode,
    Policy,
    Request,
    ScriptedPolicy,
    StepResult,
    TokenRecorder,
    output_text,
)
from progress_sql.envs.db_details import SchemaTexts, ddl_from_sqlite
from progress_sql.envs.exec_feedback import ExecFeedbackEnv
from progress_sql.envs.odt_feedback import ODTFeedbackEnv
from progress_sql.envs.prompts import Message, round1_messages, system_prompt, user_prompt
from progress_sql.envs.rollout import rollout
from progress_sql.envs.settings import EnvSettings, TaskSettings
from progress_sql.envs.single_turn import SingleTurnEnv

# The registry: one entry per environment (``rl.env`` and ``eval.multi_turn_env`` name one).
_ENVS: dict[str, type[Env]] = {cls.name: cls for cls in (SingleTurnEnv, ODTFeedbackEnv, ExecFeedbackEnv)}


def names() -> tuple[str, ...]:
    """The names of every registered environment."""
    return tuple(_ENVS)


def get(name: str) -> type[Env]:
    """The environment class called ``name``; KeyError naming the known ones otherwise."""
    try:
        return _ENVS[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(_ENVS)}") from None


def protocols() -> dict[str, type[Env]]:
    """The environments other frameworks drive, by their ``Env.adapter`` protocol name
    (``odt``, ``sql_tool``): the integrations build their adapter classes from these."""
    return {cls.adapter.protocol: cls for cls in _ENVS.values() if cls.adapter is not None}


__all__ = [
    "PROMPT_TOO_LONG",
    "Adapter",
    "Env",
    "EnvSettings",
    "Episode",
    "ExecFeedbackEnv",
    "Message",
    "ODTFeedbackEnv",
    "Policy",
    "Request",
    "SchemaTexts",
    "ScriptedPolicy",
    "SingleTurnEnv",
    "StepResult",
    "TaskSettings",
    "TokenRecorder",
    "ddl_from_sqlite",
    "get",
    "names",
    "output_text",
    "protocols",
    "rollout",
    "round1_messages",
    "system_prompt",
    "user_prompt",
]
