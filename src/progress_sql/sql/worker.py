"""A supervised worker process for SQL the policy wrote: a hard stop and a memory cap.

``execute``'s progress handler stops a query between SQLite's virtual-machine steps, but not
inside one: one built-in call can loop for seconds (``instr`` on two long strings is quadratic;
SQLite 3.40's ``printf('%.*c', 900000000, 'x')`` spent ~8 s failing to grow a string before the
sandbox bounded ``printf``). Only a process can be stopped in the middle of that, so policy SQL
runs in a child that the parent kills when a query outlives its deadline by
``sandbox.hard_stop_grace_s``, and that cannot grow past ``sandbox.worker_memory_mb`` of address
space (``RLIMIT_AS``: past it allocations fail and the query ends with ``out_of_memory``, the
trainer's memory untouched). A killed worker is restarted at once, for the next query; jobs
after the stopped one are re-sent.

The child is an interpreter of its own (``python -P -m progress_sql.sql.worker_main``, see
there), not a multiprocessing child: multiprocessing's spawn and forkserver re-import the
caller's ``__main__`` in the child, which fails for code read from stdin and runs an unguarded
script's top level a second time. This one imports only the package (the caller's copy: its
root leads the child's ``PYTHONPATH``; ``-P`` keeps the caller's folder off its path), reads no
stdin and writes nothing to the caller's stdout; it talks over a socket pair of its own. Any
process may start it: a script, ``python -c``, code on stdin, a notebook, a Ray worker, a
daemonic multiprocessing child. A cold start costs about a quarter of a second (the
interpreter, pydantic and sqlglot; ``bench/bench_sandbox.py --only-starts``), which is why a
killed worker's replacement is started at once.

A worker that cannot start raises ``SandboxUnavailable`` naming the cause: a sandbox that is
not there gives no verdict, never a "wrong" one.

``execute_isolated`` is ``execute`` through one process-wide worker (rollouts judge one turn at
a time); ``SQLPool`` keeps one ``Worker`` per slot. With ``sandbox.isolate: false`` queries
run in the calling process instead (no hard stop, no memory cap).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from typing import IO

import progress_sql
from progress_sql.sql.result import ExecResult
from progress_sql.sql.sandbox import execute
from progress_sql.sql.settings import SandboxSettings, default_sandbox

Job = tuple["str | os.PathLike", str]

_START_TIMEOUT_S = 120.0  # a cold interpreter importing sqlglot on a loaded machine
_LOG_TAIL_BYTES = 2000  # how much of a dead worker's stderr its error quotes


class SandboxUnavailable(RuntimeError):
    """The SQL worker process cannot be started (or keeps dying while idle); the message names
    the cause. Raised, never turned into an ``ExecResult``: no verdict without a sandbox."""


def _package_root() -> str:
    """The folder holding the caller's ``progress_sql`` package."""
    return os.path.dirname(os.path.dirname(os.path.abspath(progress_sql.__file__)))


def _child_env() -> dict[str, str]:
    """The caller's environment with its package root first on ``PYTHONPATH`` (a source checkout
    or another copy than the installed one), so the worker imports the same ``progress_sql``. A
    root that is a site-packages folder is on the child's path already, in its place: put first,
    it would put every package installed there before the standard library."""
    env = dict(os.environ)
    root = _package_root()
    sites = {os.path.realpath(p) for p in (*site.getsitepackages(), site.getusersitepackages())}
    if os.path.realpath(root) not in sites:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _absolute(job: Job) -> Job:
    """The job with its database path made absolute: the caller may have changed folder since
    the worker started."""
    db_path, sql = job
    try:
        return os.path.abspath(db_path), sql
    except TypeError:  # not a path: ``execute`` explains in the child
        return db_path, sql


def _tail(log: IO[bytes] | None) -> str:
    """The last line of what the worker wrote to its stderr (a traceback's error line)."""
    if log is None:
        return ""
    try:
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - _LOG_TAIL_BYTES))
        lines = [line.strip() for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return lines[-1] if lines else ""


def _reap(process: subprocess.Popen, conn: Connection, log: IO[bytes], owner: int) -> None:
    """Stop one worker for good (also what a garbage-collected ``Worker`` or the interpreter's
    exit runs). In a forked copy of its owner only the copies of its handles are closed: the
    worker is the owner's."""
    conn.close()
    log.close()
    if os.getpid() == owner:
        if process.poll() is None:
            process.kill()
        process.wait()


class Worker:
    """One child interpreter running ``execute``; ``run`` never raises per job (but raises
    ``SandboxUnavailable`` when no worker can be started). Not thread-safe."""

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self._settings = settings if settings is not None else default_sandbox()
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._log: IO[bytes] | None = None  # the child's stderr, quoted when it dies
        self._ready = False
        self._reaper: weakref.finalize | None = None
        self._owner = os.getpid()  # the process that started the worker
        self.stops = 0  # queries ended by killing the worker (for benches and tests)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _launch(self) -> None:
        """Start a child (not waiting for it to be ready: its start-up overlaps the caller's work)."""
        if not sys.executable:
            raise SandboxUnavailable("cannot start the SQL worker: sys.executable is empty (no Python "
                                     "interpreter to run it with); set sandbox.isolate: false to run SQL in-process")
        parent, child = Pipe()  # a socket pair: framed pickles both ways, poll() for deadlines
        log = tempfile.TemporaryFile(prefix="progress-sql-worker-")
        command = [sys.executable, "-P", "-m", "progress_sql.sql.worker_main", str(child.fileno()),
                   progress_sql.__file__]
        try:
            process = subprocess.Popen(command, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=log, env=_child_env())
        except (OSError, ValueError) as err:
            parent.close()
            log.close()
            raise SandboxUnavailable(f"cannot start the SQL worker ({sys.executable} -m "
                                     f"progress_sql.sql.worker_main): {err}") from err
        finally:
            child.close()
        self._process, self._conn, self._log, self._ready = process, parent, log, False
        self._owner = os.getpid()
        self._reaper = weakref.finalize(self, _reap, process, parent, log, self._owner)
        try:
            parent.send(self._settings)
        except OSError:
            pass  # it died at once: _connection() reports why

    def _connection(self) -> Connection:
        """The ready child's socket, starting a child first when there is none (or when this is a
        forked copy of the process that started it: two processes on one socket would read each
        other's results)."""
        if self._owner != os.getpid():
            self.close()
        if self._conn is None:
            self._launch()
        conn = self._conn
        if self._ready:
            return conn
        try:
            if not conn.poll(_START_TIMEOUT_S):
                raise TimeoutError(f"no answer within {_START_TIMEOUT_S:g} s")
            status, detail = conn.recv()
        except (EOFError, OSError, TimeoutError) as err:
            why = self._death() or f"{type(err).__name__}: {err}"
            self.close()
            raise SandboxUnavailable(f"the SQL worker process did not start: {why}") from None
        if status != "ready":
            self.close()
            raise SandboxUnavailable(f"the SQL worker process did not start: {detail}")
        self._ready = True
        return conn

    def _death(self) -> str:
        """How the child ended (its exit status and last line of stderr), '' while it runs."""
        process = self._process
        if process is None:
            return ""
        try:
            code = process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return ""
        tail = _tail(self._log)
        return f"exit code {code}" + (f": {tail}" if tail else "")

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
                conn = self._connection()
                try:
                    conn.send((pending, timeout, max_rows))
                except OSError as err:  # it died while idle (killed from outside): start another
                    why = self._death() or str(err)
                    self.close()
                    if retried:
                        raise SandboxUnavailable(f"the SQL worker process keeps dying while idle ({why})") from None
                    retried = True
                    continue
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
        """Kill the child (unless it died by itself), start the next one and say what ended its query."""
        if not died:
            self.close()
            self.stops += 1
            self._relaunch()
            return ExecResult(error="timeout", elapsed_s=elapsed,
                              message=f"query stopped after exceeding the {timeout:g} s time limit "
                                      "(one SQLite operation ignored the deadline: its worker was killed)")
        code = self._process.wait() if self._process is not None else None
        tail = _tail(self._log)
        self.close()
        self._relaunch()
        if code == -9:  # not ours: the kernel's OOM killer is the usual sender
            return ExecResult(error="out_of_memory", elapsed_s=elapsed,
                              message="the worker running the query was killed, most likely for memory "
                                      f"(sandbox.worker_memory_mb = {self._settings.worker_memory_mb})")
        return ExecResult(error="runtime", elapsed_s=elapsed,
                          message=f"the worker running the query died (exit code {code}"
                                  f"{': ' + tail if tail else ''}); the query's result was lost")

    def _relaunch(self) -> None:
        """Start the replacement now, so a caller that generates before its next query finds it
        warm; a failure is left for the next ``run`` to report."""
        try:
            self._launch()
        except SandboxUnavailable:
            pass

    def close(self) -> None:
        """Stop the child now (idempotent); the next ``run`` starts a new one."""
        reaper = self._reaper
        self._process = self._conn = self._log = self._reaper = None
        self._ready = False
        if reaper is not None:
            reaper()


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
    """``execute`` in the process-wide supervised worker (see the module docstring); never raises
    per query (``SandboxUnavailable`` when no worker can be started)."""
    global _shared, _shared_settings
    cfg = settings if settings is not None else default_sandbox()
    if not cfg.isolate:
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
