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
    # The longest string or blob a query may build (SQLite's SQLITE_LIMIT_LENGTH): one function
    # call (printf, randomblob, replace, group_concat) cannot allocate past it, nor run past its
    # deadline doing so.
    max_value_bytes: int = Field(16_000_000, ge=1_000, le=1_000_000_000)
    # SQLite's heap in one process (PRAGMA hard_heap_limit; process-wide): a query that needs
    # more fails with out_of_memory instead of taking the trainer's memory.
    max_memory_mb: int = Field(1024, ge=16, le=1_000_000)
    # Policy SQL runs in a supervised worker process (sql/worker.py): killed when one SQLite
    # operation outlives the deadline by hard_stop_grace_s, capped at worker_memory_mb of address
    # space. false: in the calling process (no hard stop, no memory cap; where no second
    # interpreter may be started).
    isolate: bool = True
    hard_stop_grace_s: float = Field(0.5, gt=0.0, le=60.0)
    worker_memory_mb: int = Field(2048, ge=256, le=1_000_000)


@lru_cache(maxsize=1)
def default_sandbox() -> SandboxSettings:
    """The built-in sandbox defaults (those of the shipped params.yaml)."""
    return SandboxSettings()
