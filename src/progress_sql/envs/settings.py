"""The environments' settings (params.yaml ``env``), and ``TaskSettings``: every section the
task module (sandbox, ODT, rewards, environments) reads, without the pipeline's others.

Environments and recipes take a ``TaskSettings``, or the pipeline's ``config.Settings``,
which holds the same four sections; neither needs to know the rest of the pipeline.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field

from progress_sql.odt.settings import ODTSettings
from progress_sql.rewards.registry import RewardSettings
from progress_sql.sections import Section
from progress_sql.sql.settings import SandboxSettings


class EnvSettings(Section):
    # paper: Appendix F's system prompt and the schema as DDL; compact: a one-line system prompt
    # and ``- table: column, ...`` lines (the tiny CPU policy; see envs.prompts)
    prompt_style: Literal["paper", "compact"] = "compact"
    max_turns: int = Field(4, ge=1, le=32)  # T of Algorithm 1
    trail_max_turns: int = Field(10, ge=1, le=64)  # SQL-Trail / SkyRL tool budget
    observation_max_rows: int = Field(50, ge=1)
    observation_max_chars: int = Field(9000, ge=100)


class TaskSettings(Section):
    """The sections of params.yaml that the task module reads."""

    sandbox: SandboxSettings = SandboxSettings()
    odt: ODTSettings = ODTSettings()
    rewards: RewardSettings = RewardSettings()
    env: EnvSettings = EnvSettings()


@lru_cache(maxsize=1)
def default_task_settings() -> TaskSettings:
    """The built-in defaults of the task module's sections (those of the shipped params.yaml)."""
    return TaskSettings()
