"""The one verdict of "correct": rewards, rollouts and evaluation all decide here.

A prediction is correct when the result of its *comparison view* equals the gold's comparison
view's result under the rules of a named ``Semantics``. What a semantics fixes:

- ``view``: the SQL that is executed for the comparison (Spider: ``spider_postprocess`` then
  ``strip_distinct``, as the test-suite evaluator's ``postprocess`` + ``remove_distinct``);
- ``ordered``: whether row order can matter, decided on the gold's view (Spider:
  ``order_matters``);
- ``same``: how two results compare (Spider: ``results_match``, bags of rows up to a column
  permutation, lists when ordered; an error or a truncated result matches nothing).

The semantics:

- ``"spider"``: the Spider test-suite evaluator (``exec_eval.py`` of taoyds/test-suite-sql-eval,
  its defaults): the view is ``spider_postprocess`` then ``strip_distinct``; order counts only
  when the gold's output is ordered (``order_matters``); results are equal as bags of rows up
  to a column permutation (as lists when ordered).
- ``"bird"``: BIRD's official EX (``calculate_ex`` of its ``evaluation.py``): the SQL as written
  is the view (no DISTINCT removal, no operator fix-up); order never counts; the results are
  equal when ``set(pred rows) == set(gold rows)``, rows compared as the tuples SQLite returns
  (no column permutation; duplicates and row order ignored; ``1 == 1.0`` as in Python). An
  error or a truncated result matches nothing, as under Spider.

Which one applies is the example's (``corpus.records.Example.semantics``: BIRD and SynSQL
imports are ``"bird"``, Spider and the bundled corpus ``"spider"``), so rewards and evaluation
decide alike.

The SQL as written is executed too: that raw result is what "executable" means and what the
environments show as feedback. The view is executed separately only when its text differs
from the raw SQL (a DISTINCT, a spaced operator), so most predictions cost one query. Gold
results come from a ``GoldCache``, keyed by the gold's view, so the G rollouts (or k samples)
of one question execute their gold once.

``BatchVerdicts.judge`` decides, for a batch of any size: evaluation and the framework adapters
call it with a ``SQLPool``, rollouts through ``rewards.make_turn`` with a batch of one, and
``verdict`` is the one-prediction call.

A gold whose result has more than ``sandbox.max_rows`` rows cannot be judged against (only its
first rows were fetched, so even the gold itself would not match): every verdict of such a
question says so in ``Verdict.unjudged`` (``too_large_reason``), and its callers count it
apart: the recipes give the floor reward (``rewards.types.Recipe``), the adapters their floor
with that reason (``integrations.scoring.check_task``), evaluation leaves it out of EX and TS
(``eval.metrics``), and ``data validate`` flags the question (``data.validation``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Iterable
from typing import Callable, Literal, Sequence

from progress_sql.sql.settings import SandboxSettings, default_sandbox
from progress_sql.sql.equivalence import order_matters, results_match, spider_postprocess, strip_distinct
from progress_sql.sql.pool import GoldCache, SQLPool, default_gold_cache
from progress_sql.sql.result import ExecResult
from progress_sql.sql.worker import execute_isolated

Semantics = Literal["spider", "bird"]

_CACHE_SIZE = 8192


@dataclass(frozen=True)
class _Rules:
    """How one semantics decides: the executed view of a query, whether the gold's order
    counts, and how two results compare (``same(pred, gold, ordered)``)."""

    view: Callable[[str], str]
    ordered: Callable[[str], bool]
    same: Callable[[ExecResult, ExecResult, bool], bool]


def _spider_view(sql: str) -> str:
    return strip_distinct(spider_postprocess(sql))


def _as_written(sql: str) -> str:
    return sql


def _never_ordered(sql: str) -> bool:
    return False


def bird_results_match(pred: ExecResult, gold: ExecResult, ordered: bool = False) -> bool:
    """BIRD's EX: ``set(pred rows) == set(gold rows)`` (False when either errored or was
    truncated); ``ordered`` is ignored, order never counts under BIRD."""
    if not pred.ok or not gold.ok or pred.truncated or gold.truncated:
        return False
    return set(pred.rows) == set(gold.rows)


_RULES: dict[str, _Rules] = {
    "spider": _Rules(view=_spider_view, ordered=order_matters, same=results_match),
    "bird": _Rules(view=_as_written, ordered=_never_ordered, same=bird_results_match),
}
SEMANTICS: tuple[str, ...] = tuple(_RULES)  # the names a corpus or an example may give


def _rules(semantics: str) -> _Rules:
    try:
        return _RULES[semantics]
    except (KeyError, TypeError):
        raise ValueError(f"unknown comparison semantics {semantics!r}; known: {', '.join(_RULES)}") from None


@lru_cache(maxsize=_CACHE_SIZE)
def comparison_sql(sql: str, semantics: Semantics = "spider") -> str:
    """The query that is executed to compare ``sql`` (Spider: operators re-joined, DISTINCT
    removed)."""
    return _rules(semantics).view(sql)


@lru_cache(maxsize=_CACHE_SIZE)
def gold_order_matters(gold_sql: str, semantics: Semantics = "spider") -> bool:
    """Whether row order counts against ``gold_sql``, decided on its comparison view (as the
    reference evaluator does)."""
    return _rules(semantics).ordered(comparison_sql(gold_sql, semantics))


def same_answer(pred_result: ExecResult, gold_result: ExecResult, ordered: bool, semantics: Semantics = "spider") -> bool:
    """Whether two comparison-view results are the same answer (False when either errored or,
    under Spider, was truncated). Also the equivalence Vote@k groups by."""
    return _rules(semantics).same(pred_result, gold_result, ordered)


GOLD_TOO_LARGE = "gold_too_large"  # the kind of verdict (and of an adapter's floor reason)


def too_large_reason(gold: ExecResult | None) -> str:
    """'' when ``gold`` (a gold's comparison-view result) can be judged against, else why not:
    its result has more rows than ``sandbox.max_rows`` (only that many were fetched)."""
    if gold is None or not gold.ok or not gold.truncated:
        return ""
    return (f"{GOLD_TOO_LARGE}: the gold query returns more than {len(gold.rows):,} rows (sandbox.max_rows), so no "
            "answer can be judged against it; raise sandbox.max_rows or fix the question")


@dataclass(frozen=True)
class Verdict:
    """``result``: the execution of the SQL as written (None without SQL), for "executable"
    and feedback; ``correct``: the decision; ``compared``: the execution of the comparison
    view (``result`` itself when the view is the raw SQL; None without SQL), what Vote@k
    groups; ``gold``: the gold's comparison-view result it was judged against, for metrics
    that compare rows and for ``unjudged``."""

    result: ExecResult | None
    correct: bool
    compared: ExecResult | None
    gold: ExecResult | None = None

    @property
    def executed(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def unjudged(self) -> str:
        """'' normally; why the question cannot be judged when its gold's result passed
        ``sandbox.max_rows`` (``too_large_reason``: then ``correct`` is False for any answer)."""
        return too_large_reason(self.gold)


def gold_comparison_result(
    db_path: str | os.PathLike,
    gold_sql: str,
    semantics: Semantics = "spider",
    sandbox: SandboxSettings | None = None,
    gold_cache: GoldCache | None = None,
) -> ExecResult:
    """The gold's comparison-view result on ``db_path``, from ``gold_cache`` (default: the
    process-wide ``default_gold_cache()``), under ``sandbox``'s limits."""
    sandbox = sandbox if sandbox is not None else default_sandbox()
    cache = gold_cache if gold_cache is not None else default_gold_cache()
    return cache.get(db_path, comparison_sql(gold_sql, semantics), sandbox.timeout_s, sandbox.max_rows)


@dataclass(frozen=True)
class Candidate:
    """One prediction to judge: its SQL (None when none was extracted) against the gold on
    ``db_path``, under ``semantics`` (the example's: ``Example.semantics``)."""

    db_path: str | os.PathLike
    sql: str | None
    gold_sql: str
    semantics: Semantics = "spider"


class BatchVerdicts:
    """The verdict of many predictions at once: the one place "correct" is decided.

    Rollouts (``rewards.make_turn``), the framework adapters
    (``integrations.scoring.score_batch``) and evaluation (EX, then TS) all call ``judge``.
    Identical (database, SQL) jobs of a batch run once, through ``pool`` (worker processes)
    or, without one, one by one in the process-wide supervised worker; gold results come from
    ``gold_cache`` (default: the process-wide one), so the G rollouts or k samples of a
    question execute their gold once. Every query runs under ``sandbox``'s limits.
    """

    def __init__(self, sandbox: SandboxSettings | None = None, *, pool: SQLPool | None = None,
                 gold_cache: GoldCache | None = None) -> None:
        self.sandbox = sandbox if sandbox is not None else default_sandbox()
        self.pool = pool
        self.gold_cache = gold_cache if gold_cache is not None else default_gold_cache()

    def gold(self, db_path: str | os.PathLike, gold_sql: str, semantics: Semantics = "spider") -> ExecResult:
        """The gold's comparison-view result on ``db_path`` (cached)."""
        return gold_comparison_result(db_path, gold_sql, semantics, self.sandbox, self.gold_cache)

    def _run(self, jobs: Sequence[tuple[str | os.PathLike, str]]) -> dict[tuple[str | os.PathLike, str], ExecResult]:
        unique = list(dict.fromkeys(jobs))
        if self.pool is None:
            return {job: execute_isolated(*job, settings=self.sandbox) for job in unique}
        return dict(zip(unique, self.pool.map(unique, self.sandbox.timeout_s, self.sandbox.max_rows)))

    def _same(self, view: ExecResult, gold: ExecResult, gold_sql: str, semantics: Semantics) -> bool:
        return same_answer(view, gold, gold_order_matters(gold_sql, semantics), semantics)

    def judge(self, candidates: Sequence[Candidate]) -> list[Verdict]:
        """The verdict of every candidate, in order. The raw SQL always runs; its comparison
        view runs only when the text differs. No SQL (None) is not correct and runs nothing of
        its own (its gold is looked up, so that ``unjudged`` holds for every answer of a
        question). A gold that fails matches nothing. Never raises for any prediction text."""
        views = [None if c.sql is None else comparison_sql(c.sql, c.semantics) for c in candidates]
        done = self._run([(c.db_path, sql) for c, view in zip(candidates, views) if c.sql is not None
                          for sql in dict.fromkeys((c.sql, view))])
        golds: dict[tuple, ExecResult] = {}  # the k samples of a question share one lookup
        verdicts = []
        for c, view in zip(candidates, views):
            key = (c.db_path, c.gold_sql, c.semantics)
            if key not in golds:
                golds[key] = self.gold(*key)
            if view is None:
                verdicts.append(Verdict(None, False, None, golds[key]))
                continue
            compared = done[(c.db_path, view)]
            verdicts.append(Verdict(done[(c.db_path, c.sql)], self._same(compared, golds[key], c.gold_sql, c.semantics),
                                    compared, golds[key]))
        return verdicts

    def test_suite(self, items: Sequence[tuple[Candidate, Sequence[str | os.PathLike]]]) -> list[bool]:
        """TS of ``(candidate, neighbours)`` items whose EX already holds on the candidate's
        own database: the prediction must also match on every neighbour database."""
        keys = [(c, tuple(str(db) for db in neighbours)) for c, neighbours in items]
        unique = list(dict.fromkeys(keys))  # greedy and Vote@k often give the same SQL
        views = {c: comparison_sql(c.sql, c.semantics) for c, _ in unique}
        done = self._run([(db, views[c]) for c, neighbours in unique for db in neighbours])

        def passes(c: Candidate, db: str) -> bool:
            return self._same(done[(db, views[c])], self.gold(db, c.gold_sql, c.semantics), c.gold_sql, c.semantics)

        passed = {(c, neighbours): all(passes(c, db) for db in neighbours) for c, neighbours in unique}
        return [passed[key] for key in keys]


def verdict(
    db_path: str | os.PathLike,
    pred_sql: str | None,
    gold_sql: str,
    *,
    semantics: Semantics = "spider",
    sandbox: SandboxSettings | None = None,
    gold_cache: GoldCache | None = None,
) -> Verdict:
    """The verdict of one prediction: ``BatchVerdicts.judge`` on a batch of one (no pool)."""
    return BatchVerdicts(sandbox, gold_cache=gold_cache).judge([Candidate(db_path, pred_sql, gold_sql, semantics)])[0]


# ----------------------------------------------------------------------------- EX and TS
# The Spider evaluator's two functions, deciding with the pieces above (as the rewards do).
def _prepare(pred: str, gold: str, keep_distinct: bool) -> tuple[str, str, bool]:
    if keep_distinct:  # the reference's keep_distinct=True: only the operator fix-up
        gold = spider_postprocess(gold)
        return spider_postprocess(pred), gold, order_matters(gold)
    return comparison_sql(pred), comparison_sql(gold), gold_order_matters(gold)


def _match_on(
    db_path: str | os.PathLike, pred: str, gold: str, ordered: bool, timeout_s: float | None, cache: GoldCache
) -> bool:
    """``pred`` and ``gold`` are comparison views already."""
    gold_res = cache.get(db_path, gold, timeout_s)
    if not gold_res.ok:
        return False
    return same_answer(execute_isolated(db_path, pred, timeout_s), gold_res, ordered)


def execution_match(
    db_path: str | os.PathLike,
    pred: str,
    gold: str,
    *,
    timeout_s: float | None = None,
    keep_distinct: bool = False,
    gold_cache: GoldCache | None = None,
) -> bool:
    """EX: the prediction's result equals the gold's on ``db_path`` (``test_suite_match`` on
    that one database).

    Gold results come from ``gold_cache`` (default: the process-wide ``default_gold_cache()``;
    pass ``GoldCache(0)`` to disable caching).
    """
    return test_suite_match([db_path], pred, gold, timeout_s=timeout_s, keep_distinct=keep_distinct,
                            gold_cache=gold_cache)


def test_suite_match(
    db_paths: Iterable[str | os.PathLike],
    pred: str,
    gold: str,
    *,
    timeout_s: float | None = None,
    keep_distinct: bool = False,
    gold_cache: GoldCache | None = None,
) -> bool:
    """TS: the prediction matches the gold on every database (stops at the first mismatch)."""
    paths = list(db_paths)
    if not paths:
        raise ValueError("test_suite_match needs at least one database")
    pred_sql, gold_sql, ordered = _prepare(pred, gold, keep_distinct)
    cache = gold_cache if gold_cache is not None else default_gold_cache()
    return all(_match_on(p, pred_sql, gold_sql, ordered, timeout_s, cache) for p in paths)


test_suite_match.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
