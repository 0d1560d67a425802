"""The SQL worker's own interpreter: ``python -P -m progress_sql.sql.worker_main FD PACKAGE_FILE``.

``sql/worker.py`` starts it and talks to it over the socket ``FD`` (framed pickles): first the
``SandboxSettings``, answered by ``("ready", pid)`` once the address space is capped (or
``("failed", why)``), then batches ``(jobs, timeout_s, max_rows)``, each job answered by its
``ExecResult`` as soon as it is done. ``PACKAGE_FILE`` is the caller's ``progress_sql/__init__.py``:
a worker that imported another copy of the package refuses to serve. Nothing here reads stdin or
writes stdout; the process ends when its caller closes the socket (or dies).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from multiprocessing.connection import Connection

import progress_sql
from progress_sql.sql.sandbox import execute


def _cap_address_space(megabytes: int) -> None:
    """RLIMIT_AS at ``megabytes`` (or the hard limit the caller already had, when lower)."""
    cap = megabytes * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def serve(conn: Connection, package_file: str) -> None:
    settings = conn.recv()
    here = os.path.realpath(progress_sql.__file__)
    if here != os.path.realpath(package_file):
        conn.send(("failed", f"the worker imported progress_sql from {here}, not the caller's {package_file}"))
        return
    try:
        _cap_address_space(settings.worker_memory_mb)
    except (OSError, ValueError) as err:
        conn.send(("failed", f"cannot cap the worker's address space at sandbox.worker_memory_mb = "
                             f"{settings.worker_memory_mb}: {err}"))
        return
    conn.send(("ready", os.getpid()))  # the caller's clock for the first query starts now
    while True:
        try:
            jobs, timeout_s, max_rows = conn.recv()
            for db_path, sql in jobs:
                conn.send(execute(db_path, sql, timeout_s, max_rows, settings=settings))
        except (EOFError, OSError):  # the caller closed the socket or is gone
            return


def main(argv: list[str]) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the caller decides what stops, and
    # closes this worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, package_file = int(argv[0]), argv[1]
    with Connection(fd) as conn:
        serve(conn, package_file)


if __name__ == "__main__":
    main(sys.argv[1:])
