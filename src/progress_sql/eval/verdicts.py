"""EX and TS decisions for batches of predictions, executed through one ``SQLPool``.

The decision is ``progress_sql.sql.verdict``'s, the one the rewards use, under each example's
semantics (``Candidate.semantics``, from ``Example.semantics``): each query's comparison view
(Spider: ``spider_postprocess`` and ``strip_distinct``; BIRD: the SQL as written) is executed,
order matters when the gold's output is ordered (never under BIRD), and results compare with
``same_answer`` (Spider: bags up to a column permutation; BIRD: sets of rows). What this module
adds is throughput: predictions run in the pool in one batch, identical (database, SQL) jobs
run once, and gold results come from a ``GoldCache``. tests/test_eval_conformance.py checks that its decisions equal
``execution_match``'s and the reference evaluator's; tests/test_verdict_agreement.py that they
equal the rewards'.

Each prediction keeps its *raw* execution (the SQL as the model wrote it: what "executable"
means in the reports) and its comparison-view execution (what Vote@k groups). The view is
executed separately only when it differs from the raw SQL (it has DISTINCT or a spaced
operator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from progress_sql.sql.settings import SandboxSettings
from progress_sql.sql.pool import GoldCache, SQLPool
from progress_sql.sql.result import ExecResult
from progress_sql.sql.verdict import (
    Semantics,
    Verdict,
    comparison_sql,
    gold_comparison_result,
    gold_order_matters,
    same_answer,
)

__all__ = ["BatchVerdicts", "Candidate", "Verdict"]


@dataclass(frozen=True)
class Candidate:
    """One prediction to judge: its SQL (None when none was extracted) against the gold on
    ``db_path``, under ``semantics`` (the example's; None: the judge's default)."""

    db_path: str
    sql: str | None
    gold_sql: str
    semantics: Semantics | None = None


class BatchVerdicts:
    """Batched EX / TS over a pool; ``semantics`` is the default where a candidate or a call
    names none (each example names its own: ``Example.semantics``); ``gold_cache`` holds the
    gold results (comparison views)."""

    def __init__(self, pool: SQLPool, sandbox: SandboxSettings, gold_cache: GoldCache | None = None,
                 semantics: Semantics = "spider") -> None:
        self.pool = pool
        self.sandbox = sandbox
        self.gold_cache = gold_cache if gold_cache is not None else GoldCache(settings=sandbox)
        self.semantics = semantics

    def gold(self, db_path: str | os.PathLike, gold_sql: str, semantics: Semantics | None = None) -> ExecResult:
        """The gold's comparison-view result on ``db_path`` (cached)."""
        return gold_comparison_result(db_path, gold_sql, semantics or self.semantics, self.sandbox, self.gold_cache)

    def order_matters(self, gold_sql: str, semantics: Semantics | None = None) -> bool:
        """Whether row order counts against ``gold_sql`` (for EX and TS; Vote@k never reads it)."""
        return gold_order_matters(gold_sql, semantics or self.semantics)

    def _view(self, sql: str, semantics: Semantics | None = None) -> str:
        return comparison_sql(sql, semantics or self.semantics)

    def _same(self, pred: ExecResult, gold: ExecResult, gold_sql: str, semantics: Semantics | None = None) -> bool:
        return same_answer(pred, gold, self.order_matters(gold_sql, semantics), semantics or self.semantics)

    def _run(self, jobs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], ExecResult]:
        unique = list(dict.fromkeys(jobs))
        return dict(zip(unique, self.pool.map(unique)))

    def judge(self, candidates: Sequence[Candidate]) -> list[Verdict]:
        """Raw execution, comparison-view execution and EX of every candidate, in order: the
        verdict ``sql.verdict`` gives, batched."""
        raw_jobs = [(c.db_path, c.sql) for c in candidates if c.sql is not None]
        view_jobs = [(c.db_path, self._view(c.sql, c.semantics)) for c in candidates
                     if c.sql is not None and self._view(c.sql, c.semantics) != c.sql]
        done = self._run(raw_jobs + view_jobs)
        golds: dict[tuple[str, str], ExecResult] = {}  # the k samples of a question share one lookup
        verdicts = []
        for c in candidates:
            if c.sql is None:
                verdicts.append(Verdict(None, False, None))
                continue
            key = (c.db_path, c.gold_sql, c.semantics)
            if key not in golds:
                golds[key] = self.gold(c.db_path, c.gold_sql, c.semantics)
            raw, view = done[(c.db_path, c.sql)], done[(c.db_path, self._view(c.sql, c.semantics))]
            verdicts.append(Verdict(raw, self._same(view, golds[key], c.gold_sql, c.semantics), view))
        return verdicts

    def test_suite(self, items: Sequence[tuple]) -> list[bool]:
        """TS of ``(databases, pred_sql, gold_sql[, semantics])`` items whose EX on
        ``databases[0]`` (the original) already holds: the prediction must also match on
        every other database."""
        keys = [(tuple(str(db) for db in item[0]), item[1], item[2], item[3] if len(item) > 3 else None)
                for item in items]
        unique = list(dict.fromkeys(keys))  # greedy and Vote@k often give the same SQL
        done = self._run([(db, self._view(pred, sem)) for dbs, pred, _, sem in unique for db in dbs[1:]])
        passed = {
            (dbs, pred, gold, sem): all(self._same(done[(db, self._view(pred, sem))], self.gold(db, gold, sem), gold, sem)
                                        for db in dbs[1:])
            for dbs, pred, gold, sem in unique
        }
        return [passed[key] for key in keys]
