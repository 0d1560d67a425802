"""The sandbox's settings (params.yaml ``sandbox``): time and size limits of SQL execution."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field

from progress_sql.sections import Section


class SandboxSettings(Section):
    timeout_s: float = Field(5.0, gt=0.0, le=600.0)
    max_rows: int = Field(10_000, ge=1)
    max_sql_chars: int = Field(100_000, ge=1)
    workers: int = Field(2, ge=1, le=256)
    gold_cache_size: int = Field(4096, ge=0)


@lru_cache(maxsize=1)
def default_sandbox() -> SandboxSettings:
    """The built-in sandbox defaults (those of the shipped params.yaml)."""
    return SandboxSettings()
