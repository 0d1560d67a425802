"""The outcome of executing one SQL statement in the sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# timeout, too_big and out_of_memory name the limit that stopped the query (sandbox.timeout_s,
# sandbox.max_value_bytes, sandbox.max_memory_mb)
ErrorKind = Literal["syntax", "runtime", "timeout", "forbidden", "no_database", "too_big", "out_of_memory"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("syntax", "runtime", "timeout", "forbidden", "no_database", "too_big",
                                      "out_of_memory")


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
