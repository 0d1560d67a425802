"""SQL parsing, sandboxed execution, result equivalence (EX/TS), the verdict of "correct" and
Spider hardness."""

from progress_sql.sql.equivalence import order_matters, results_match, rows_equivalent, strip_distinct
from progress_sql.sql.hardness import HARDNESS_LEVELS, hardness
from progress_sql.sql.parse import SQLParseError, jaccard, ngram_jaccard, parse_one, sql_tokens
from progress_sql.sql.pool import GoldCache, SQLPool, gold_result
from progress_sql.sql.result import ERROR_KINDS, ExecResult
from progress_sql.sql.sandbox import execute
from progress_sql.sql.verdict import (
    BatchVerdicts,
    Candidate,
    Semantics,
    Verdict,
    execution_match,
    test_suite_match,
    verdict,
)
from progress_sql.sql.worker import SandboxUnavailable, execute_isolated

__all__ = [
    "BatchVerdicts",
    "Candidate",
    "ERROR_KINDS",
    "ExecResult",
    "GoldCache",
    "HARDNESS_LEVELS",
    "SQLParseError",
    "SQLPool",
    "SandboxUnavailable",
    "Semantics",
    "Verdict",
    "execute",
    "execute_isolated",
    "execution_match",
    "gold_result",
    "hardness",
    "jaccard",
    "ngram_jaccard",
    "order_matters",
    "parse_one",
    "results_match",
    "rows_equivalent",
    "sql_tokens",
    "strip_distinct",
    "test_suite_match",
    "verdict",
]
