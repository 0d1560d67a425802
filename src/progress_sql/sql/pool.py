"""Parallel execution of many queries, and an LRU cache of gold results.

``SQLPool`` runs jobs in worker *processes*. Measured with ``bench/bench_sandbox.py`` (2
workers, 2 shared cores, four runs): on varied ~1 ms queries processes reached 1.8-2.0x the
single-thread rate and threads 1.4-1.8x; on ~20 µs point lookups processes 0.8-1.4x, threads
0.3-0.45x. sqlite3 releases the GIL while SQLite steps, but the Python side of every query (the
sqlglot check, row conversion, the progress handler) needs it, and with short queries
threads spend their time handing the GIL back and forth. Workers start with ``forkserver`` (``spawn``
where that is missing), never ``fork``, so a parent with threads (a trainer) is safe; each
worker keeps its own cached read-only connections. Inside a daemonic process, which may not
have children, the pool falls back to threads. A worker that dies (killed for memory) turns
its jobs into ``runtime`` errors and the pool is rebuilt for the next call.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from progress_sql.sql.settings import SandboxSettings, default_sandbox
from progress_sql.sql.result import ExecResult
from progress_sql.sql.sandbox import execute

Job = tuple["str | os.PathLike", str]

_CHUNKS_PER_WORKER = 4  # jobs go out in chunks: fewer round trips, still balanced


def _run_job(job: Job, timeout_s: float | None, max_rows: int | None, settings: SandboxSettings) -> ExecResult:
    db_path, sql = job
    return execute(db_path, sql, timeout_s, max_rows, settings=settings)


def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class SQLPool:
    """A pool of worker processes running ``execute``; use as a context manager.

    ``workers`` defaults to ``sandbox.workers``; with one worker the jobs run in the calling
    thread. Workers start on the first ``map``. Job paths must be picklable (``str`` or
    ``Path``), and a script that uses the pool needs the ``if __name__ == "__main__":`` guard
    (workers import the main module, as with any ``spawn``/``forkserver`` pool).
    """

    def __init__(self, workers: int | None = None, settings: SandboxSettings | None = None) -> None:
        self._settings = settings if settings is not None else default_sandbox()
        self.workers = self._settings.workers if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers!r}")
        self.uses_processes = self.workers > 1 and not multiprocessing.current_process().daemon
        self._executor: Executor | None = None
        self._closed = False

    def _pool(self) -> Executor:
        if self._executor is None:
            if self.uses_processes:
                context = multiprocessing.get_context(_start_method())
                self._executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=context)
            else:
                self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sqlpool")
        return self._executor

    def map(self, jobs: Sequence[Job], timeout_s: float | None = None, max_rows: int | None = None) -> list[ExecResult]:
        """Execute every ``(db_path, sql)`` job; results in input order (never raises per job)."""
        if self._closed:
            raise RuntimeError("SQLPool is closed")
        run = functools.partial(_run_job, timeout_s=timeout_s, max_rows=max_rows, settings=self._settings)
        jobs = list(jobs)
        if self.workers == 1 or len(jobs) <= 1:
            return [run(job) for job in jobs]
        chunk = max(1, len(jobs) // (self.workers * _CHUNKS_PER_WORKER))
        results: list[ExecResult] = []
        try:
            for result in self._pool().map(run, jobs, chunksize=chunk):
                results.append(result)
        except BrokenProcessPool as err:
            self._executor.shutdown(wait=False, cancel_futures=True)  # type: ignore[union-attr]
            self._executor = None  # rebuilt on the next call
            message = f"a worker process died ({err or 'killed'}); this query's result was lost"
            results += [ExecResult(error="runtime", message=message) for _ in jobs[len(results):]]
        return results

    def close(self) -> None:
        """Wait for running jobs and stop the workers (idempotent)."""
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

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
        if key is not None and self.maxsize > 0 and result.error != "timeout":
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
