"""EX and TS decisions for batches of predictions, executed through one ``SQLPool``.

The semantics are those of ``progress_sql.sql.equivalence`` (``execution_match`` /
``test_suite_match``, the Spider test-suite evaluator's): both queries go through
``spider_postprocess`` and ``strip_distinct`` before they run, order matters when the gold's
output is ordered, and rows compare as bags up to a column permutation. What this module adds
is throughput: predictions run in the pool in one batch, identical (database, SQL) jobs run
once, and gold results come from a ``GoldCache``. tests/test_eval_conformance.py checks that
its decisions equal ``execution_match``'s and the reference evaluator's.

Each prediction also keeps its *raw* execution (the SQL as the model wrote it): that is what
"executable" means in the reports and what Vote@k groups. The EX view is executed separately
only when it differs from the raw SQL (it has DISTINCT or a spaced operator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from progress_sql.config import SandboxSettings
from progress_sql.sql.equivalence import order_matters, results_match, spider_postprocess, strip_distinct
from progress_sql.sql.pool import GoldCache, SQLPool
from progress_sql.sql.result import ExecResult

_PREPARE_CACHE_SIZE = 8192


@lru_cache(maxsize=_PREPARE_CACHE_SIZE)
def ex_view(sql: str) -> str:
    """The query EX executes: operators re-joined and DISTINCT removed (the reference's
    ``postprocess`` + ``remove_distinct``)."""
    return strip_distinct(spider_postprocess(sql))


@lru_cache(maxsize=_PREPARE_CACHE_SIZE)
def gold_ordered(gold_sql: str) -> bool:
    """Whether order matters for ``gold_sql`` (decided on its EX view, as the reference does)."""
    return order_matters(ex_view(gold_sql))


@dataclass(frozen=True)
class Candidate:
    """One prediction to judge: its SQL (None when none was extracted) against the gold on
    ``db_path``."""

    db_path: str
    sql: str | None
    gold_sql: str


@dataclass(frozen=True)
class Verdict:
    """``result``: the raw SQL's execution (None without SQL); ``correct``: EX."""

    result: ExecResult | None
    correct: bool

    @property
    def executed(self) -> bool:
        return self.result is not None and self.result.ok


class Judge:
    """Batched EX / TS over a pool; ``gold_cache`` holds the gold results (EX views)."""

    def __init__(self, pool: SQLPool, sandbox: SandboxSettings, gold_cache: GoldCache | None = None) -> None:
        self.pool = pool
        self.sandbox = sandbox
        self.gold_cache = gold_cache if gold_cache is not None else GoldCache(settings=sandbox)

    def gold(self, db_path: str | os.PathLike, gold_sql: str) -> ExecResult:
        """The gold's EX-view result on ``db_path`` (cached)."""
        return self.gold_cache.get(db_path, ex_view(gold_sql), self.sandbox.timeout_s, self.sandbox.max_rows)

    def _run(self, jobs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], ExecResult]:
        unique = list(dict.fromkeys(jobs))
        return dict(zip(unique, self.pool.map(unique)))

    def judge(self, candidates: Sequence[Candidate]) -> list[Verdict]:
        """Raw execution and EX of every candidate, in order."""
        raw_jobs = [(c.db_path, c.sql) for c in candidates if c.sql is not None]
        view_jobs = [(c.db_path, ex_view(c.sql)) for c in candidates if c.sql is not None and ex_view(c.sql) != c.sql]
        done = self._run(raw_jobs + view_jobs)
        golds: dict[tuple[str, str], ExecResult] = {}  # the k samples of a question share one lookup
        verdicts = []
        for c in candidates:
            if c.sql is None:
                verdicts.append(Verdict(None, False))
                continue
            key = (c.db_path, c.gold_sql)
            if key not in golds:
                golds[key] = self.gold(c.db_path, c.gold_sql)
            raw, view = done[(c.db_path, c.sql)], done[(c.db_path, ex_view(c.sql))]
            verdicts.append(Verdict(raw, results_match(view, golds[key], gold_ordered(c.gold_sql))))
        return verdicts

    def test_suite(self, items: Sequence[tuple[Sequence[str | os.PathLike], str, str]]) -> list[bool]:
        """TS of ``(databases, pred_sql, gold_sql)`` items whose EX on ``databases[0]`` (the
        original) already holds: the prediction must also match on every other database."""
        keys = [(tuple(str(db) for db in dbs), pred, gold) for dbs, pred, gold in items]
        unique = list(dict.fromkeys(keys))  # greedy and Vote@k often give the same SQL
        done = self._run([(db, ex_view(pred)) for dbs, pred, _ in unique for db in dbs[1:]])
        passed = {
            (dbs, pred, gold): all(
                results_match(done[(db, ex_view(pred))], self.gold(db, gold), gold_ordered(gold)) for db in dbs[1:]
            )
            for dbs, pred, gold in unique
        }
        return [passed[key] for key in keys]
