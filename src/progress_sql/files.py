"""Atomic writers for the text, JSON and CSV files the stages leave behind (metrics, reports,
plot data), the one-writer lock of an output folder, what a failed write means, and the SQLite
URI of a file path. The bottom of the import stack: it imports nothing from the package, so
every layer may use it.

A file is written to a temporary sibling and renamed over its target, so a reader (DVC, a
dashboard, a concurrent stage) never sees half a file, and a write that fails (a full disk, a
read-only folder) leaves the old file as it was and raises an OSError naming the path, which
the CLI prints as one line (``cli.common.os_error_line``).

``writer_lock(folder)``: a trainer or an evaluation holds its output folder's lock for the whole
run, so a second one on the same folder stops at once, before writing anything, instead of
interleaving its metrics, checkpoints and weights with the first's. Taking it also checks that
an existing folder can be written. The lock is
``fcntl.flock`` on an open file: the kernel releases it when the process ends however it ends
(SIGKILL too), so no stale lock outlives its holder; the file's text (pid, host, start time,
command) only names the holder in the refusal.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import unquote


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, creating its folder. On a failure (a full disk, a
    read-only folder) the old file stays as it was, no temporary is left, and the OSError names
    ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise named(err, path) from None
        raise


def write_json(path: Path, obj: Any) -> None:
    """Pretty JSON (strict: no NaN) written atomically."""
    write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_json_lines(path: Path, rows: Iterable[dict[str, Any]], *, append: bool = False) -> None:
    """One JSON object a line (sorted keys). ``append``: added to the end of the file (a log that
    grows a step at a time); otherwise the file is replaced atomically."""
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    if not append:
        write_text(path, text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        raise named(err, path) from None


def write_csv(path: Path, rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> None:
    """CSV with a header; None becomes an empty cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    write_text(path, buf.getvalue())


# ----------------------------------------------------------------------------- faults of the machine
_FULL_BYTES = 1 << 20  # less room than this, after a write failed, means the disk is full


def named(err: OSError, path: str | Path) -> OSError:
    """``err`` with ``path`` as its file name when it has none (a write to an open file that
    fails for want of space names no file)."""
    if err.filename is None:
        err = type(err)(err.errno, err.strerror or str(err), str(path))
    return err


def disk_full(path: str | Path) -> bool:
    """Whether the file system holding ``path`` (or its nearest existing folder) has no room
    left: the cause of a failed write that does not say why (torch's "unexpected pos")."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _FULL_BYTES


def write_failure(err: BaseException, path: str | Path) -> BaseException:
    """What a failed write of ``path`` should raise: an OSError naming ``path`` (ENOSPC when the
    error did not say why but the disk is full), else ``err`` itself. Call it before removing
    what was written: that frees the space."""
    if isinstance(err, OSError):
        return named(err, path)
    if disk_full(path):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return err


# ----------------------------------------------------------------------------- one writer per folder
class FolderInUse(RuntimeError):
    """Another process holds an output folder's writer lock; the message names the folder,
    the holder and the lock file."""


def lock_path(folder: str | Path) -> Path:
    """The lock file of ``folder``: beside it (``<parent>/.<name>.lock``), not in it, so that
    removing the folder (DVC removes a stage's outs before running it) cannot take a held lock
    with it."""
    folder = Path(folder).resolve()
    return folder.with_name(f".{folder.name}.lock")


@contextlib.contextmanager
def writer_lock(folder: str | Path) -> Iterator[Path]:
    """Hold ``folder``'s writer lock (yields the lock file) or raise FolderInUse at once. The
    lock file is removed on release; one left by a killed holder is simply taken over."""
    path = lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise FolderInUse(f"{folder} is being written by another process ({holder}; lock file {path}): "
                              "wait for it to end or stop it, or write elsewhere") from None
        try:  # the file we locked may have been released and removed meanwhile: lock the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        _probe_writable(Path(folder))
        yield path
    finally:
        # removed while still locked, and only when the path is still our file: a process that
        # opened it before then finds, once it gets the lock, that the path is not its file
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
        os.close(fd)


def _probe_writable(folder: Path) -> None:
    """An OSError naming ``folder`` when it exists and cannot be written (a read-only mount, no
    permission): now, rather than when the first checkpoint is due."""
    if not folder.is_dir():
        return
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise type(err)(err.errno, err.strerror or str(err), str(folder)) from None


def _holder(raw: bytes) -> str:
    """The holder as the refusal names it, from the lock file's text."""
    try:
        info = json.loads(raw.decode("utf-8"))
        return f"pid {info['pid']} on {info['host']} since {info['started']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its details yet"


# ----------------------------------------------------------------------------- SQLite URIs
SQLITE_PREFIX = "sqlite:///"


def sqlite_uri(path: str | Path) -> str:
    """``sqlite:////abs/path`` of a file, as SQLAlchemy (MLflow's store) reads it back: its path
    is cut at the first ``?`` (a query) and then percent-decoded, so ``%`` and ``?`` in a folder's
    name are escaped. Nothing else is: MLflow creates the URI's folder from the path as written
    (3.17), so an escaped space or ``#`` would leave an empty folder of that name beside it."""
    return SQLITE_PREFIX + str(Path(path).resolve()).replace("%", "%25").replace("?", "%3F")


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI (decoded, as SQLAlchemy opens it; its query dropped), or
    None for another kind of URI."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    return Path(unquote(uri[len(SQLITE_PREFIX):].partition("?")[0]))


@contextlib.contextmanager
def no_stray_sqlite_folder(uri: str) -> Iterator[None]:
    """Remove, on the way out, the folder MLflow (3.17) creates for a ``sqlite:///`` URI from its
    path as written, not decoded: for an escaped path (``sqlite_uri`` of a folder named with
    ``%`` or ``?``) an empty folder beside the real one. Only folders that did not exist before
    and are still empty go."""
    real = sqlite_path(uri)
    written = Path(uri[len(SQLITE_PREFIX):]).parent if real is not None else None
    made = [] if written is None or written == real.parent else [  # deepest first
        p for p in (written, *written.parents) if not p.exists()]
    try:
        yield
    finally:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty, or not made after all: leave it and what is above
                break
