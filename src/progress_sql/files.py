"""Atomic writers for the text, JSON and CSV files the stages leave behind (metrics, reports,
plot data), the one-writer lock of an output folder, and the SQLite URI of a file path. The
bottom of the import stack: it imports nothing from the package, so every layer may use it.

A file is written to a temporary sibling and renamed over its target, so a reader (DVC, a
dashboard, a concurrent stage) never sees half a file.

``writer_lock(folder)``: a trainer or an evaluation holds its output folder's lock for the whole
run, so a second one on the same folder stops at once, before writing anything, instead of
interleaving its metrics, checkpoints and weights with the first's. The lock is
``fcntl.flock`` on an open file: the kernel releases it when the process ends however it ends
(SIGKILL too), so no stale lock outlives its holder; the file's text (pid, host, start time,
command) only names the holder in the refusal.
"""

from __future__ import annotations

import contextlib
import csv
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
    """Write ``text`` to ``path`` atomically, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


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
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


def write_csv(path: Path, rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> None:
    """CSV with a header; None becomes an empty cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    write_text(path, buf.getvalue())


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
        yield path
    finally:
        # removed while still locked, and only when the path is still our file: a process that
        # opened it before then finds, once it gets the lock, that the path is not its file
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                path.unlink()
        os.close(fd)


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
