"""Parallel execution of many queries, and an LRU cache of gold results.

``SQLPool`` runs jobs in supervised worker *processes* (``sql/worker.py``: a hard stop at the
deadline and a memory cap per worker), fed in chunks by one thread per worker. Measured with
``bench/bench_sandbox.py`` (2 workers, 2 shared cores): on varied ~4 ms queries processes
reached 1.8-2.0x the single-thread rate and threads 1.4-1.8x; on ~80 µs point lookups processes
0.5x (each result returns on its own, for its deadline: docs/experiments/2026-12-05-sandbox-bombs-
and-faults.md), threads 0.3-0.45x. sqlite3 releases the GIL while SQLite steps, but the
Python side of every query (the sqlglot check, row conversion, the progress handler) needs it,
and with short queries threads spend their time handing the GIL back and forth. Each worker
keeps its own cached read-only connections. With ``sandbox.isolate: false`` the pool runs
``execute`` in threads instead. Workers are interpreters of their own (not multiprocessing
children), so a pool works in any process, a daemonic one too.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from progress_sql.sql.settings import SandboxSettings, default_sandbox
from progress_sql.sql.result import ExecResult
from progress_sql.sql.sandbox import execute
from progress_sql.sql.worker import Job, Worker

_CHUNKS_PER_WORKER = 4  # jobs go out in chunks: fewer round trips, still balanced


def _run_job(job: Job, timeout_s: float | None, max_rows: int | None, settings: SandboxSettings) -> ExecResult:
    db_path, sql = job
    return execute(db_path, sql, timeout_s, max_rows, settings=settings)


class SQLPool:
    """A pool of supervised worker processes running ``execute``; use as a context manager.

    ``workers`` defaults to ``sandbox.workers``; with one worker the jobs run in one worker
    process driven from the calling thread. Workers start on the first ``map``.
    """

    def __init__(self, workers: int | None = None, settings: SandboxSettings | None = None) -> None:
        self._settings = settings if settings is not None else default_sandbox()
        self.workers = self._settings.workers if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers!r}")
        self.uses_processes = self._settings.isolate
        self._slots = [Worker(self._settings) for _ in range(self.workers)] if self.uses_processes else []
        self._closed = False

    def map(self, jobs: Sequence[Job], timeout_s: float | None = None, max_rows: int | None = None) -> list[ExecResult]:
        """Execute every ``(db_path, sql)`` job; results in input order (never raises per job;
        ``SandboxUnavailable`` when a worker cannot be started)."""
        if self._closed:
            raise RuntimeError("SQLPool is closed")
        jobs = list(jobs)
        if not self.uses_processes:
            run = functools.partial(_run_job, timeout_s=timeout_s, max_rows=max_rows, settings=self._settings)
            if self.workers == 1 or len(jobs) <= 1:
                return [run(job) for job in jobs]
            with ThreadPoolExecutor(self.workers, thread_name_prefix="sqlpool") as threads:
                return list(threads.map(run, jobs))
        size = max(1, len(jobs) // (self.workers * _CHUNKS_PER_WORKER))
        chunks: queue.SimpleQueue[int] = queue.SimpleQueue()
        for start in range(0, len(jobs), size):
            chunks.put(start)
        results: list[ExecResult | None] = [None] * len(jobs)

        def drain(worker: Worker) -> None:
            while True:
                try:
                    start = chunks.get_nowait()
                except queue.Empty:
                    return
                results[start:start + size] = worker.run(jobs[start:start + size], timeout_s, max_rows)

        slots = self._slots[:max(1, min(self.workers, -(-len(jobs) // size)))]
        if len(slots) == 1:
            drain(slots[0])
        else:
            with ThreadPoolExecutor(len(slots), thread_name_prefix="sqlpool") as threads:
                list(threads.map(drain, slots))
        return results  # type: ignore[return-value]

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (for tests and benches)."""
        return [pid for worker in self._slots if (pid := worker.pid) is not None]

    @property
    def stops(self) -> int:
        """Queries ended by killing their worker (a hard stop) since the pool started."""
        return sum(worker.stops for worker in self._slots)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._closed = True
        for worker in self._slots:
            worker.close()

    def __enter__(self) -> "SQLPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GoldCache:
    """Thread-safe LRU of gold-query results keyed by (database file, SQL, row cap).

    The database part of the key is the resolved path plus the file's mtime_ns and size, so a
    rebuilt database never serves a stale result. Timeouts are not cached (they depend on
    load); other errors are. Two threads missing the same key at once both execute it.
    """

    def __init__(self, maxsize: int | None = None, settings: SandboxSettings | None = None) -> None:
        self._settings = settings if settings is not None else default_sandbox()
        self.maxsize = self._settings.gold_cache_size if maxsize is None else int(maxsize)
        if self.maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize!r}")
        self._entries: OrderedDict[tuple, ExecResult] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(
        self,
        db_path: str | os.PathLike,
        gold_sql: str,
        timeout_s: float | None = None,
        max_rows: int | None = None,
    ) -> ExecResult:
        """The result of ``gold_sql`` on ``db_path``, executed at most once while cached."""
        limit = self._settings.max_rows if max_rows is None else max_rows
        try:
            st = os.stat(db_path)
            key = (os.path.realpath(db_path), st.st_mtime_ns, st.st_size, gold_sql, limit)
        except (OSError, TypeError, ValueError):
            key = None  # no such file: execute() explains, nothing to cache
        if key is not None:
            with self._lock:
                cached = self._entries.get(key)
                if cached is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return cached
        with self._lock:
            self.misses += 1
        result = execute(db_path, gold_sql, timeout_s, limit, settings=self._settings)
        # a timeout or a memory failure depends on the moment (load, other queries), not on the query alone
        if key is not None and self.maxsize > 0 and result.error not in ("timeout", "out_of_memory"):
            with self._lock:
                self._entries[key] = result
                self._entries.move_to_end(key)
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
        return result

    def clear(self) -> None:
        """Forget every entry and reset the counters."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


_default_cache: GoldCache | None = None
_default_lock = threading.Lock()


def default_gold_cache() -> GoldCache:
    """The process-wide gold cache, sized by ``sandbox.gold_cache_size``."""
    global _default_cache
    with _default_lock:
        if _default_cache is None:
            _default_cache = GoldCache()
        return _default_cache


def gold_result(
    db_path: str | os.PathLike, gold_sql: str, timeout_s: float | None = None, max_rows: int | None = None
) -> ExecResult:
    """``default_gold_cache().get(...)``: the cached result of a gold query."""
    return default_gold_cache().get(db_path, gold_sql, timeout_s, max_rows)
