"""Atomic writers for the files the stages leave behind (metrics, reports, plots) and for whole
output folders, the one-writer lock of an output folder, what a failed write means, and the
SQLite URI of a file path. The bottom of the import stack: it imports nothing from the package, so
every layer may use it.

A file is written to a temporary sibling and renamed over its target, so a reader (DVC, a
dashboard, a concurrent stage) never sees half a file, and a write that fails (a full disk, a
read-only folder) leaves the old file as it was and raises an OSError naming the path, which
the CLI prints as one line (``cli.common.os_error_line``).

A folder (an evaluation's report, a corpus, an export) is written aside and swapped in whole
(``written_aside``): on any failure the previous folder is intact and nothing half-written
carries a final name.

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
import ctypes
import errno
import fcntl
import glob
import io
import json
import os
import resource
import shutil
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import unquote


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, creating its folder. On a failure (a full disk, a
    read-only folder, the file size limit) the old file stays as it was, no temporary is left,
    and the OSError names ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise named(err, path) from None
        raise


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8) written atomically, as ``write_bytes``."""
    write_bytes(path, text.encode("utf-8"))


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
_FULL_BYTES = 1 << 20  # less room than this (or than 1/16 of a small disk) after a failed write: full
# SQLite reports a failed write without its cause or file: "database or disk is full", "disk I/O error"
_SQLITE_FULL, _SQLITE_IOERR = "SQLITE_FULL", "SQLITE_IOERR"


def named(err: OSError, path: str | Path) -> OSError:
    """``err`` with ``path`` as its file name when it has none (a write to an open file that
    fails for want of space names no file)."""
    if err.filename is None:  # the system's words for its errno (pyarrow's wrap them in a sentence)
        cause = os.strerror(err.errno) if isinstance(err.errno, int) else err.strerror or str(err)
        err = OSError(err.errno, cause, str(path))
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
    return st.f_bavail * st.f_frsize < min(_FULL_BYTES, st.f_blocks * st.f_frsize // 16)


def disk_error(err: BaseException, path: str | Path) -> OSError | None:
    """``err`` as an OSError naming ``path`` when it is a failed write that says so: an OSError
    (named as it is when it names a file), or SQLite's "database or disk is full" (ENOSPC) and
    "disk I/O error" (ENOSPC on a full disk; EFBIG under a file size limit, ``ulimit -f``, the
    likely cause then; else EIO); None for any other error."""
    if isinstance(err, OSError):
        return named(err, path)
    name = getattr(err, "sqlite_errorname", "") if isinstance(err, sqlite3.OperationalError) else ""
    if name == _SQLITE_FULL or (name.startswith(_SQLITE_IOERR) and disk_full(path)):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    if name.startswith(_SQLITE_IOERR):
        limited = resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(path)) if limited else \
            OSError(errno.EIO, str(err), str(path))
    return None


def write_failure(err: BaseException, path: str | Path) -> BaseException:
    """What a failed write of ``path`` should raise: ``disk_error``'s OSError naming ``path``
    (ENOSPC when the error did not say why but the disk is full), else ``err`` itself. Call it
    before removing what was written: that frees the space."""
    failure = disk_error(err, path)
    if failure is not None:
        return failure
    if disk_full(path):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return err


# ----------------------------------------------------------------------------- whole folders
@contextlib.contextmanager
def written_aside(out: str | Path, owned: Iterable[str] | None = None) -> Iterator[Path]:
    """Yield an empty folder beside ``out`` to write a command's output in; when the block ends
    without an error, swap it in for ``out`` whole, else remove it and leave ``out`` as it was.
    An error of the machine (``disk_error``) leaves as an OSError naming the path under ``out``
    that failed (the one the user knows), or ``out`` itself.

    ``owned``: the paths (relative to ``out``; a folder stands for all it holds) the command
    writes. The other entries of an existing ``out`` (a user's notes) are hard-linked into the
    new folder before the swap, so they are kept as they were (an entry added to ``out`` in the
    moment between those links and the swap is not). None: the command owns the whole folder (a
    corpus). Writing aside needs room for the old and the new output at once. The swap is one
    step where Linux can exchange two names (``renameat2``); elsewhere two renames. A symlinked
    ``out`` keeps its link: the folder it points to is swapped, beside itself. The writer lock
    of ``out`` (``writer_lock``) sits beside it and is not touched."""
    given = Path(out)
    out = given.resolve()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(given))
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = _sibling(out, "partial", os.getpid())
    tmp.mkdir()
    try:
        yield tmp
        if owned is not None and out.is_dir():
            _carry(out, tmp, frozenset(owned))
        _swap(tmp, out)  # from here tmp holds the previous folder, if there was one
    except BaseException as err:
        failure = disk_error(err, given) if isinstance(err, Exception) else None
        failure = _final_names(failure, tmp, given) if failure is not None else err
        shutil.rmtree(tmp, ignore_errors=True)
        if failure is err:
            raise
        raise failure from None
    shutil.rmtree(tmp, ignore_errors=True)


def _sibling(out: Path, kind: str, pid: int | str) -> Path:
    """A hidden folder beside ``out`` of this host's process ``pid``: ``.NAME.KIND-HOST-PID``."""
    return out.with_name(f".{out.name}.{kind}-{socket.gethostname()}-{pid}")


def _remove_stale(out: Path) -> None:
    """Remove what a killed writer of ``out`` on this host left aside (its process is gone)."""
    for path in out.parent.glob(glob.escape(_sibling(out, "partial", "").name) + "*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _carry(src: Path, dest: Path, owned: frozenset[str], prefix: str = "") -> None:
    """Hard-link into ``dest`` each entry of ``src`` not ``owned`` (relative paths) and not in
    ``dest`` yet; folders are made, and recursed into where they hold owned paths."""
    for entry in os.scandir(src):
        rel = prefix + entry.name
        if rel in owned:
            continue
        target = dest / entry.name
        is_dir = entry.is_dir(follow_symlinks=False)
        if is_dir and (target.is_dir() or any(p.startswith(rel + "/") for p in owned)):
            target.mkdir(exist_ok=True)
            _carry(Path(entry.path), target, owned, rel + "/")
        elif is_dir and not os.path.lexists(target):
            shutil.copytree(entry.path, target, symlinks=True, copy_function=_link)
        elif not os.path.lexists(target):
            _link(entry.path, target)


def _link(src: str, dest: str | Path) -> None:
    """``dest`` as a hard link of ``src`` (the same file, no data copied), else a copy (a file
    system without hard links, or a file of another owner under protected_hardlinks)."""
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dest, follow_symlinks=False)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


def _swap(new: Path, out: Path) -> None:
    """Put the folder ``new`` in the place of ``out``; ``new`` then names the previous ``out``."""
    if not out.exists():
        new.rename(out)
        return
    if _exchange(new, out):
        return
    old = _sibling(out, "old", os.getpid())
    out.rename(old)
    try:
        new.rename(out)
    except BaseException:
        old.rename(out)
        raise
    old.rename(new)


def _exchange(a: Path, b: Path) -> bool:
    """Exchange the names ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``), so
    that no moment passes without one of them; False where the system or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _final_names(err: OSError, tmp: Path, out: Path) -> OSError:
    """``err`` naming, for a path under ``tmp``, the path it would have had under ``out``."""
    def final(name: Any) -> Any:
        text = os.fsdecode(name) if isinstance(name, (str, bytes)) else None
        if text is None or not (text == str(tmp) or text.startswith(str(tmp) + os.sep)):
            return name
        return str(out) + text[len(str(tmp)):]

    return OSError(err.errno, err.strerror, final(err.filename), None, final(err.filename2))


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
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        except OSError as err:  # a full disk: the error names no file
            raise named(err, path) from None
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
