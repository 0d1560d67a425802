"""A supervised worker process for SQL the policy wrote: a hard stop and a memory cap.

``execute``'s progress handler stops a query between SQLite's virtual-machine steps, but not
inside one: one built-in call can loop for seconds (``printf('%.*c', 900000000, 'x')`` on
SQLite 3.40 spends ~8 s failing to grow a string, one character at a time; ``instr`` on two
long strings is quadratic). Only a process can be stopped in the middle of that, so policy SQL
runs in a child that the parent kills when a query outlives its deadline by
``sandbox.hard_stop_grace_s``, and that cannot grow past ``sandbox.worker_memory_mb`` of address
space (``RLIMIT_AS``: past it allocations fail and the query ends with ``out_of_memory``, the
trainer's memory untouched). A killed worker is restarted for the next query; jobs after the
stopped one are re-sent.

``execute_isolated`` is ``execute`` through one process-wide worker (rollouts judge one turn at
a time); ``SQLPool`` keeps one ``Worker`` per slot. Inside a daemonic process, which may not
have children, or with ``sandbox.isolate: false``, queries run in this process instead.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from progress_sql.sql.result import ExecResult
from progress_sql.sql.sandbox import execute
from progress_sql.sql.settings import SandboxSettings, default_sandbox

Job = tuple["str | os.PathLike", str]

_START_TIMEOUT_S = 120.0  # a cold interpreter importing sqlglot on a loaded machine


def start_method() -> str:
    """``forkserver`` where there is one (a parent with threads stays safe), else ``spawn``; never ``fork``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def can_have_children() -> bool:
    return not multiprocessing.current_process().daemon


def _absolute(job: Job) -> Job:
    """The job with its database path made absolute: the child's working folder is the fork
    server's, not the caller's (the caller may have changed folder since the worker started)."""
    db_path, sql = job
    try:
        return os.path.abspath(db_path), sql
    except TypeError:  # not a path: ``execute`` explains in the child
        return db_path, sql


def _serve(conn: Connection, settings: SandboxSettings) -> None:
    """The child: cap the address space, then answer each job of each batch, one result at a time."""
    cap = settings.worker_memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    conn.send(None)  # ready: the parent's clock for the first query starts now, not at the fork
    while True:
        try:
            jobs, timeout_s, max_rows = conn.recv()
            for db_path, sql in jobs:
                conn.send(execute(db_path, sql, timeout_s, max_rows, settings=settings))
        except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone or stopping us
            return


class Worker:
    """One child process running ``execute``; ``run`` never raises per job. Not thread-safe."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self._settings = settings if settings is not None else default_sandbox()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self.stops = 0  # queries ended by killing the worker (for benches and tests)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> Connection:
        context = multiprocessing.get_context(start_method())
        if start_method() == "forkserver":  # restarts fork from a server that has the sandbox imported
            context.set_forkserver_preload([__name__])
        parent, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, self._settings), name="sql-worker", daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        try:
            if not parent.poll(_START_TIMEOUT_S):
                raise TimeoutError(f"no answer within {_START_TIMEOUT_S:g} s")
            parent.recv()
        except (EOFError, OSError) as err:
            self.close()
            raise RuntimeError(f"the SQL worker process did not start ({type(err).__name__}: {err})") from err
        return parent

    def run(self, jobs: Sequence[Job], timeout_s: float | None = None, max_rows: int | None = None) -> list[ExecResult]:
        """``execute`` of every job in the child, results in order. A job that outlives its deadline
        by ``sandbox.hard_stop_grace_s`` is ended by killing the child (error ``timeout``)."""
        timeout = self._settings.timeout_s if timeout_s is None else float(timeout_s)
        limit = timeout + self._settings.hard_stop_grace_s
        jobs = [_absolute(job) for job in jobs]
        results: list[ExecResult] = []
        retried = False
        try:
            while len(results) < len(jobs):
                pending = jobs[len(results):]
                try:
                    conn = self._conn or self._start()
                except RuntimeError as err:
                    results += [ExecResult(error="runtime", message=str(err)) for _ in pending]
                    break
                try:
                    conn.send((pending, timeout, max_rows))
                except OSError:  # it died while idle (killed from outside): start another
                    self.close()
                    if not retried:
                        retried = True
                        continue
                    results += [ExecResult(error="runtime", message="the SQL worker process keeps dying")
                                for _ in pending]
                    break
                for _ in pending:
                    began = time.monotonic()  # the child starts the next job as it sends the last result
                    result = self._receive(conn, began + limit)
                    if isinstance(result, bool):
                        results.append(self._stopped(time.monotonic() - began, timeout, died=result))
                        break
                    results.append(result)
        except BaseException:  # interrupted mid-batch: the child's later answers would be misread
            self.close()
            raise
        return results

    def _receive(self, conn: Connection, deadline: float) -> ExecResult | bool:
        """The next result; False when the deadline passed first, True when the child died."""
        try:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                return False
            return conn.recv()
        except (EOFError, OSError):
            return True

    def _stopped(self, elapsed: float, timeout: float, died: bool) -> ExecResult:
        """Kill the child (unless it died by itself) and say what ended its query."""
        process = self._process
        self.close()
        if not died:
            self.stops += 1
            return ExecResult(error="timeout", elapsed_s=elapsed,
                              message=f"query stopped after exceeding the {timeout:g} s time limit "
                                      "(one SQLite operation ignored the deadline: its worker was killed)")
        code = process.exitcode if process is not None else None
        if code == -9:  # not ours: the kernel's OOM killer is the usual sender
            return ExecResult(error="out_of_memory", elapsed_s=elapsed,
                              message="the worker running the query was killed, most likely for memory "
                                      f"(sandbox.worker_memory_mb = {self._settings.worker_memory_mb})")
        # 255: the fork server lost the status (seen when two workers die at once)
        how = "its exit status was lost" if code == 255 and start_method() == "forkserver" else f"exit code {code}"
        return ExecResult(error="runtime", elapsed_s=elapsed,
                          message=f"the worker running the query died ({how}); the query's result was lost")

    def close(self) -> None:
        """Stop the child now (idempotent); the next ``run`` starts a new one."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join()


_shared: Worker | None = None
_shared_settings: SandboxSettings | None = None
_shared_lock = threading.Lock()


def execute_isolated(
    db_path: str | os.PathLike,
    sql: str,
    timeout_s: float | None = None,
    max_rows: int | None = None,
    *,
    settings: SandboxSettings | None = None,
) -> ExecResult:
    """``execute`` in the process-wide supervised worker (see the module docstring); never raises."""
    global _shared, _shared_settings
    cfg = settings if settings is not None else default_sandbox()
    if not cfg.isolate or not can_have_children():
        return execute(db_path, sql, timeout_s, max_rows, settings=cfg)
    with _shared_lock:
        if _shared is None or _shared_settings != cfg:
            if _shared is not None:
                _shared.close()
            _shared, _shared_settings = Worker(cfg), cfg
        return _shared.run([(db_path, sql)], timeout_s, max_rows)[0]


def shared_worker_pid() -> int | None:
    """The process-wide worker's pid, or None before its first query (for tests)."""
    return _shared.pid if _shared is not None else None
