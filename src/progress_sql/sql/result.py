"""The outcome of executing one SQL statement in the sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ErrorKind = Literal["syntax", "runtime", "timeout", "forbidden", "no_database"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("syntax", "runtime", "timeout", "forbidden", "no_database")


@dataclass(frozen=True)
class ExecResult:
    """Rows and column names on success; ``error`` (one of ERROR_KINDS) and ``message`` otherwise.

    ``truncated`` is True when more than ``max_rows`` rows existed and only the first
    ``max_rows`` were fetched.
    """

    rows: tuple[tuple, ...] = ()
    columns: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    error: ErrorKind | None = None
    message: str = ""
    truncated: bool = field(default=False)

    @property
    def ok(self) -> bool:
        """Executed without error: the paper's executability indicator E(y)."""
        return self.error is None
