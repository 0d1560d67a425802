"""Faults of the machine (issue 39, item 5): a read-only folder, a full disk and a missing
permission end the command with one line naming the path and the cause (exit 1), a checkpoint
cut short leaves no ``step-N`` behind, and nothing already written is lost.

The read-only folders and the full disk are real: a small tmpfs or a read-only bind mount in a
mount namespace of the test's own (``unshare -rm``, no root needed where user namespaces are
allowed; skipped where they are not). Real commands, the tiny school policy."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from corpora import SMALL_DATA, school_corpus, school_settings, small_corpus  # noqa: E402
from progress_sql.cli.common import os_error_line  # noqa: E402
from progress_sql.files import disk_full, write_failure, write_text, written_aside  # noqa: E402
from progress_sql.params import settings_from_dict  # noqa: E402
from progress_sql.train.checkpoint import STATE_FILE, list_checkpoints, read_checkpoint, save_checkpoint  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402

EXE = str(Path(sys.executable).with_name("progress-sql"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
ENV.pop("DVC_STAGE", None)


def _namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mounts = pytest.mark.skipif(not _namespaces_work(), reason="needs `unshare -rm` (user and mount namespaces)")
# what the error lines say to do (cli.common.os_error_line)
ELSEWHERE = "write elsewhere (--out, or the setting naming the folder)"
FULL = f"No space left on device; free space on that disk or {ELSEWHERE}"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The school corpus, the untrained tiny policy and params.yaml for a short single-turn RL
    run with a checkpoint each step (engine.pt ~1.7 MB), tracking off."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("faults")
    corpus = school_corpus(root / "corpus")
    s = school_settings()
    base = build_tiny_model(corpus, s, root / "base")
    s.data.out_dir, s.rl.init_from, s.rl.out_dir = str(corpus), str(base), str(root / "rl")
    s.rl.env, s.rl.steps, s.rl.group_size, s.rl.questions_per_step = "single_turn", 1, 2, 1
    s.rl.micro_batch_size, s.rl.save_rollouts, s.rl.deepspeed = 2, False, "never"
    s.rl.checkpoint_every = 1
    s.generation.max_new_tokens, s.tracking.enabled = 8, False
    (root / "params.yaml").write_text(json.dumps(s.model_dump(mode="json")))  # JSON is YAML
    return root


def in_namespace(script: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``script`` (sh) as root of a user and mount namespace of its own: its mounts vanish with it."""
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- read-only
@needs_mounts
def test_an_output_folder_on_a_read_only_mount_is_one_line(project: Path, tmp_path: Path) -> None:
    # issue 39: `--out` on a read-only mount ended in a traceback: OSError [Errno 30] ... .rl.lock
    mnt = tmp_path / "ro"
    mnt.mkdir()
    for command in ("train rl", "eval --model oracle"):
        proc = in_namespace(f"mount -t tmpfs -o ro,size=1m tmpfs {mnt} && "
                            f"{EXE} {command} --params params.yaml --out {mnt}/out --no-progress", project)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert error_lines(proc.stderr) == [f"error: cannot write {mnt}/.out.lock: Read-only file system; {ELSEWHERE}"], \
            proc.stderr


@needs_mounts
def test_an_existing_run_folder_made_read_only_is_refused_before_any_work(project: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = digest(run)
    proc = in_namespace(f"mount --bind {run} {run} && mount -o remount,ro,bind {run} && "
                        f"{EXE} train rl --params params.yaml --out {run} --no-progress", project)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert error_lines(proc.stderr) == [f"error: cannot write {run}: Read-only file system; {ELSEWHERE}"], proc.stderr
    assert "Traceback" not in proc.stderr
    assert digest(run) == before and not (tmp_path / "runs" / ".old.lock").exists()


# ----------------------------------------------------------------------------- full disk
@needs_mounts
@pytest.mark.slow  # two trainer processes (~30 s on 2 cores)
def test_a_full_disk_during_a_checkpoint_leaves_no_partial_one_and_loses_nothing(project: Path, tmp_path: Path) -> None:
    # issue 39: RuntimeError "inline_container.cc:672 unexpected pos", a truncated step-1/engine.pt
    mnt, snapshot, logs = tmp_path / "disk", tmp_path / "snapshot", tmp_path / "logs"
    for folder in (mnt, snapshot, logs):
        folder.mkdir()
    fill = ("import os, sys; st = os.statvfs(sys.argv[1]); "
            "open(os.path.join(sys.argv[1], 'filler'), 'wb').write(b'x' * (st.f_bavail * st.f_frsize - 700_000))")
    script = (f"mount -t tmpfs -o size=8m tmpfs {mnt} && "
              f"{EXE} train rl --params params.yaml --out {mnt}/rl --no-progress >{logs}/1.out 2>{logs}/1.err; "
              f"echo $? >{logs}/1.rc; cp -a {mnt}/rl {snapshot}/before; "
              f"{sys.executable} -c \"{fill}\" {mnt} && "
              f"{EXE} train rl --params params.yaml --out {mnt}/rl --resume --set rl.steps=3 --no-progress "
              f">{logs}/2.out 2>{logs}/2.err; echo $? >{logs}/2.rc; cp -a {mnt}/rl {snapshot}/after")
    proc = in_namespace(script, project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (logs / "1.rc").read_text().strip() == "0", (logs / "1.err").read_text()[-3000:]
    err = (logs / "2.err").read_text()
    assert (logs / "2.rc").read_text().strip() == "1", err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert error_lines(err) == [f"error: cannot write {mnt}/rl/checkpoints/step-2: {FULL}"], err
    before, after = snapshot / "before", snapshot / "after"
    assert [p.name for p in list_checkpoints(after)] == ["step-1"]
    assert sorted(p.name for p in (after / "checkpoints").iterdir()) == ["step-1"]  # no step-2, no partial
    lost = {k: v for k, v in digest(before).items() if k != "metrics.jsonl" and digest(after).get(k) != v}
    assert not lost  # step-1 and the first run's policy are byte-identical
    read_checkpoint(after / "checkpoints" / "step-1", "torch")  # and still read back


@needs_mounts
def test_a_full_disk_during_an_evaluation_is_one_line(project: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = in_namespace(f"mount -t tmpfs -o size=4k tmpfs {mnt} && "
                        f"{EXE} eval --model oracle --split train --params params.yaml --out {mnt}/eval --no-progress", project)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {mnt}/eval/"), proc.stderr
    assert lines[0].endswith(f": {FULL}"), proc.stderr


# ----------------------------------------------------------------------------- the parts
class _Engine:
    """An engine whose save writes part of its state, then fails as torch does on a full disk."""

    kind = "torch"

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def save(self, path: Path) -> None:
        (path / "engine.pt").write_bytes(b"x" * 1000)
        if self.fail:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


def test_a_save_cut_short_leaves_no_step_folder_and_keeps_the_older_ones(tmp_path: Path) -> None:
    save_checkpoint(_Engine(fail=False), tmp_path, 1, {"data_position": 0, "history": []}, keep=1)
    before = digest(tmp_path)
    with pytest.raises(RuntimeError, match="unexpected pos"):  # the disk is not full: torch's own error
        save_checkpoint(_Engine(fail=True), tmp_path, 2, {"data_position": 0, "history": []}, keep=1)
    assert digest(tmp_path) == before
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
    assert json.loads((tmp_path / "checkpoints" / "step-1" / STATE_FILE).read_text())["step"] == 1


def test_a_partial_save_of_a_killed_run_is_replaced_by_the_next_save(tmp_path: Path) -> None:
    stale = tmp_path / "checkpoints" / ".step-3.partial"
    stale.mkdir(parents=True)
    (stale / "engine.pt").write_bytes(b"half")
    save_checkpoint(_Engine(fail=False), tmp_path, 4, {"data_position": 0, "history": []}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-4"]


def test_a_write_failure_names_the_path_and_the_full_disk(tmp_path: Path) -> None:
    err = write_failure(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "x.json")
    assert (err.errno, err.filename) == (errno.ENOSPC, str(tmp_path / "x.json"))
    other = RuntimeError("unexpected pos")
    assert write_failure(other, tmp_path) is other  # a disk with room: not a full disk
    assert not disk_full(tmp_path / "not" / "yet")


def test_os_errors_read_as_one_line() -> None:
    assert os_error_line(OSError(errno.EROFS, "Read-only file system", "/data/.rl.lock")) == \
        "error: cannot write /data/.rl.lock: Read-only file system; write elsewhere (--out, or the setting naming the folder)"
    # issue 49: what to do about a full disk and a file size limit
    assert os_error_line(OSError(errno.ENOSPC, "No space left on device", "/data/eval/metrics.json")) == \
        "error: cannot write /data/eval/metrics.json: No space left on device; free space on that disk or write " \
        "elsewhere (--out, or the setting naming the folder)"
    assert os_error_line(OSError(errno.EFBIG, "File too large", "/data/corpus")) == \
        "error: cannot write /data/corpus: File too large; over the file size limit (ulimit -f) or the file system's " \
        "largest file: raise the limit or write elsewhere (--out, or the setting naming the folder)"
    assert os_error_line(PermissionError(errno.EACCES, "Permission denied", "/data/run")) == \
        "error: /data/run: Permission denied"
    assert os_error_line(OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")) == \
        "error: /a → /b: Invalid cross-device link"
    assert os_error_line(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")) == \
        "error: Connection refused"


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    target.write_text("old")
    with pytest.raises(ValueError):  # surrogates cannot be encoded: the write fails halfway
        write_text(target, "new \ud800")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_a_folder_without_write_permission_is_one_line(project: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        proc = subprocess.run([EXE, "eval", "--model", "oracle", "--params", "params.yaml", "--out",
                               str(locked / "eval"), "--no-progress"], cwd=project, env=ENV, capture_output=True,
                              text=True, timeout=300)
    finally:
        locked.chmod(0o700)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert error_lines(proc.stderr) == [f"error: {locked}/.eval.lock: Permission denied"], proc.stderr
    shutil.rmtree(locked)


# ----------------------------------------------------------------------------- outputs swapped in whole (issue 49)
# fill the disk holding argv[1] to argv[2] bytes free
FILL = (f"{sys.executable} -c \"import os, sys; st = os.statvfs(sys.argv[1]); open(os.path.join(sys.argv[1], 'filler'), "
        "'wb').write(b'x' * (st.f_bavail * st.f_frsize - int(sys.argv[2])))\"")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """A small generated corpus and params.yaml naming it, tracking off: for the oracle's evaluations,
    exports and rebuilds."""
    root = tmp_path_factory.mktemp("outputs")
    settings = settings_from_dict({"data": {**SMALL_DATA, "out_dir": str(root / "corpus")},
                                   "tracking": {"enabled": False}, "eval": {"ts": False}})
    small_corpus(root / "corpus", settings)
    (root / "params.yaml").write_text(json.dumps(settings.model_dump(mode="json")))  # JSON is YAML
    return root


def _one_line(err: str, rc: str, start: str, cause: str) -> None:
    """Exit 1 and one error line, ``start`` then ``cause``, no traceback."""
    assert rc.strip() == "1", err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith(start) and lines[0].endswith(cause), err


@needs_mounts
@pytest.mark.slow  # four evaluations (~30 s on 2 cores)
def test_an_evaluation_on_a_full_disk_keeps_the_previous_report_whole(outputs: Path, tmp_path: Path) -> None:
    # issue 49: a full disk deleted the old predictions/, left half a hardness.png under its final name and
    # the old robustness.png beside the new metrics.json, and said "error: No space left on device" (no path);
    # under `ulimit -f` "error: File too large" (no path)
    mnt, snap, logs = tmp_path / "disk", tmp_path / "snap", tmp_path / "logs"
    for folder in (mnt, snap, logs):
        folder.mkdir()
    ev = f"{EXE} eval --model oracle --params params.yaml --no-progress --out {mnt}/ev"
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && {ev} --split dev 2>{logs}/1.err && "
              f"echo mine >{mnt}/ev/notes.md && cp -a {mnt}/ev {snap}/before && {FILL} {mnt} 4096 && "
              f"{{ {ev} --split test --split dev 2>{logs}/full.err; echo $? >{logs}/full.rc; }}; "
              f"cp -a {mnt}/ev {snap}/full; ls -A {mnt} >{logs}/full.ls; rm {mnt}/filler && "
              f"(ulimit -f 8; {ev} --split test --split dev 2>{logs}/limit.err; echo $? >{logs}/limit.rc); "
              f"cp -a {mnt}/ev {snap}/limit; {ev} --split test --split dev 2>{logs}/3.err && cp -a {mnt}/ev {snap}/after")
    proc = in_namespace(script, outputs)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(p.read_text()[-2000:] for p in logs.glob("*.err"))
    before = digest(snap / "before")
    assert "predictions/dev.jsonl" in before and "plots/hardness.png" in before
    _one_line((logs / "full.err").read_text(), (logs / "full.rc").read_text(), f"error: cannot write {mnt}/ev/", FULL)
    assert digest(snap / "full") == before  # not a byte changed, nothing added
    assert (logs / "full.ls").read_text().split() == ["ev", "filler"]  # nothing left aside
    _one_line((logs / "limit.err").read_text(), (logs / "limit.rc").read_text(), f"error: cannot write {mnt}/ev/",
              f": File too large; over the file size limit (ulimit -f) or the file system's largest file: raise the "
              f"limit or {ELSEWHERE}")
    assert digest(snap / "limit") == before
    after = digest(snap / "after")  # room again: the new report whole, the user's notes kept
    assert after["notes.md"] == before["notes.md"] and after["metrics.json"] != before["metrics.json"]
    assert sorted(k for k in after if k.startswith("predictions/")) == ["predictions/dev.jsonl", "predictions/test.jsonl"]


@needs_mounts
def test_a_corpus_build_on_a_full_disk_is_one_line_and_keeps_the_old_corpus(outputs: Path, tmp_path: Path) -> None:
    # issue 49: a 103-line traceback ending "OperationalError: database or disk is full" ("disk I/O error"
    # under `ulimit -f`), naming no path
    mnt, snap, logs = tmp_path / "disk", tmp_path / "snap", tmp_path / "logs"
    for folder in (mnt, snap, logs):
        folder.mkdir()
    build = f"{EXE} data build --params params.yaml --no-progress --out {mnt}/corpus --set data.seed=7"
    script = (f"mount -t tmpfs -o size=4m tmpfs {mnt} && cp -a corpus {mnt}/corpus && {FILL} {mnt} 4096 && "
              f"{{ {build} 2>{logs}/full.err; echo $? >{logs}/full.rc; }}; ls -A {mnt} >{logs}/full.ls; "
              f"rm {mnt}/filler && (ulimit -f 8; {build} 2>{logs}/limit.err; echo $? >{logs}/limit.rc); "
              f"ls -A {mnt} >{logs}/limit.ls; cp -a {mnt}/corpus {snap}/after")
    proc = in_namespace(script, outputs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = f"error: cannot write {mnt}/corpus: "
    _one_line((logs / "full.err").read_text(), (logs / "full.rc").read_text(), start, FULL)
    _one_line((logs / "limit.err").read_text(), (logs / "limit.rc").read_text(), start + "File too large; ", ELSEWHERE)
    assert (logs / "full.ls").read_text().split() == ["corpus", "filler"]
    assert (logs / "limit.ls").read_text().split() == ["corpus"]
    assert digest(snap / "after") == digest(outputs / "corpus")  # the old corpus, byte for byte


@needs_mounts
def test_an_export_on_a_full_disk_keeps_the_previous_files(outputs: Path, tmp_path: Path) -> None:
    # a full disk left a 4 KB dev.parquet.tmp beside the old dev.parquet and said "error: Error writing
    # bytes to file. Detail: [errno 28] No space left on device" (no path)
    pytest.importorskip("pyarrow")
    mnt, snap, logs = tmp_path / "disk", tmp_path / "snap", tmp_path / "logs"
    for folder in (mnt, snap, logs):
        folder.mkdir()
    export = f"{EXE} data export-verl --params params.yaml --out {mnt}/verl"
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && {export} --split dev 2>{logs}/1.err && "
              f"echo mine >{mnt}/verl/notes.md && cp -a {mnt}/verl {snap}/before && {FILL} {mnt} 4096 && "
              f"{{ {export} --split dev --split train 2>{logs}/full.err; echo $? >{logs}/full.rc; }}; "
              f"ls -A {mnt} >{logs}/full.ls; cp -a {mnt}/verl {snap}/full")
    proc = in_namespace(script, outputs)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(p.read_text()[-2000:] for p in logs.glob("*.err"))
    _one_line((logs / "full.err").read_text(), (logs / "full.rc").read_text(), f"error: cannot write {mnt}/verl", FULL)
    assert digest(snap / "full") == digest(snap / "before")
    assert (logs / "full.ls").read_text().split() == ["filler", "verl"]


@needs_mounts
def test_a_validation_on_a_full_disk_keeps_the_previous_report_pair(outputs: Path, tmp_path: Path) -> None:
    # validation.json then validation.md were written in place: a full disk cut the new, longer report
    # (here: offenders of a failed expectation) short under its final name
    mnt, snap, logs = tmp_path / "disk", tmp_path / "snap", tmp_path / "logs"
    for folder in (mnt, snap, logs):
        folder.mkdir()
    validate = f"{EXE} data validate --params params.yaml --no-progress --report-dir {mnt}/data"
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && {validate} >/dev/null 2>{logs}/1.err && "
              f"cp -a {mnt}/data {snap}/before && {FILL} {mnt} 0 && "
              f"{{ {validate} --set sandbox.max_rows=1 >/dev/null 2>{logs}/full.err; echo $? >{logs}/full.rc; }}; "
              f"ls -A {mnt} >{logs}/full.ls; cp -a {mnt}/data {snap}/full")
    proc = in_namespace(script, outputs)
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(p.read_text()[-2000:] for p in logs.glob("*.err"))
    assert sorted(digest(snap / "before")) == ["validation.json", "validation.md"]
    _one_line((logs / "full.err").read_text(), (logs / "full.rc").read_text(), f"error: cannot write {mnt}/data", FULL)
    assert digest(snap / "full") == digest(snap / "before")
    assert (logs / "full.ls").read_text().split() == ["data", "filler"]


def test_a_tracking_store_that_cannot_grow_is_one_line_naming_it(outputs: Path, tmp_path: Path) -> None:
    # an evaluation with MLflow on under `ulimit -f`: SQLAlchemy's traceback ending "OperationalError: disk I/O
    # error", naming no path (the store's tables are written when the stage run opens)
    store = tmp_path / "mlruns" / "mlflow.db"
    ev = (f"{EXE} eval --model oracle --params params.yaml --no-progress --out {tmp_path}/ev --split dev "
          f"--set tracking.enabled=true --set tracking.tracking_uri=sqlite:///{store}")
    proc = subprocess.run(["bash", "-c", f"ulimit -f 8; {ev}"], cwd=outputs, env=ENV, capture_output=True, text=True,
                          timeout=300)
    _one_line(proc.stderr, str(proc.returncode), f"error: cannot write {store}: File too large; ", ELSEWHERE)
    assert not (tmp_path / "ev").exists()


def test_a_folder_written_aside_replaces_what_the_command_owns_and_keeps_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    owned = ["metrics.json", "plots/hardness.png", "predictions"]
    with written_aside(out, owned) as aside:
        write_text(aside / "metrics.json", "1")
        write_text(aside / "plots" / "hardness.png", "png 1")
        write_text(aside / "predictions" / "dev.jsonl", "dev")
    write_text(out / "notes.md", "mine")
    write_text(out / "plots" / "mine.png", "my plot")
    inode = (out / "notes.md").stat().st_ino
    real = tmp_path / "elsewhere"
    out.rename(real)
    out.symlink_to(real)  # an output folder that is a link: kept a link
    with written_aside(out, owned) as aside:
        write_text(aside / "metrics.json", "2")
        write_text(aside / "predictions" / "test.jsonl", "test")
    assert out.is_symlink() and digest(out) == {"metrics.json": digest_of("2"), "notes.md": digest_of("mine"),
                                                "plots/mine.png": digest_of("my plot"),
                                                "predictions/test.jsonl": digest_of("test")}
    assert (out / "notes.md").stat().st_ino == inode  # the user's file itself, not a copy
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "ev"]  # nothing left aside


def test_a_failure_while_writing_aside_leaves_the_folder_as_it_was_and_names_the_final_path(tmp_path: Path) -> None:
    out = tmp_path / "ev"
    with written_aside(out, ["metrics.json"]) as aside:
        write_text(aside / "metrics.json", "1")
    before = digest(out)
    with pytest.raises(OSError) as caught:
        with written_aside(out, ["metrics.json"]) as aside:
            write_text(aside / "metrics.json", "2")
            raise OSError(errno.ENOSPC, "No space left on device", str(aside / "plots" / "x.png"))
    assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, str(out / "plots" / "x.png"))
    with pytest.raises(ValueError, match="not a disk error"):  # any other error passes as it is
        with written_aside(out, ["metrics.json"]):
            raise ValueError("not a disk error")
    assert digest(out) == before and [p.name for p in tmp_path.iterdir()] == ["ev"]


def test_a_full_sqlite_database_is_a_full_disk_naming_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "corpus"
    with pytest.raises(OSError) as caught:
        with written_aside(out) as aside:
            con = sqlite3.connect(aside / "x.sqlite")
            con.execute("PRAGMA max_page_count = 2")  # SQLite's own "database or disk is full" (SQLITE_FULL)
            con.execute("CREATE TABLE t (x TEXT)")
            con.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,)] * 100)
    con.close()
    assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, str(out))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_what_a_killed_writer_left_aside_is_removed_by_the_next(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".ev.partial-{socket.gethostname()}-{dead.stdout.strip()}"
    live = tmp_path / f".ev.partial-{socket.gethostname()}-{os.getppid()}"  # a running writer's: left alone
    for folder in (stale, live):
        folder.mkdir()
        write_text(folder / "metrics.json", "half")
    with written_aside(tmp_path / "ev", ["metrics.json"]) as aside:
        write_text(aside / "metrics.json", "1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "ev"])


def test_a_study_report_that_fails_to_write_keeps_the_previous_one(tmp_path: Path, monkeypatch) -> None:
    from progress_sql.studies import make_plan
    from progress_sql.studies import report
    from progress_sql.studies.run import collect

    params = tmp_path / "params.yaml"
    params.write_text(json.dumps({"study": {"report_dir": str(tmp_path / "reports"),
                                              "out_dir": str(tmp_path / "runs")}}))
    plan = make_plan("ablations", params, "cpu-demo", arms=["no-decay", "progress-sql"], budget_overrides={"seeds": 1})
    report.write_report(plan, collect(plan), 60.0)
    write_text(plan.report_dir / "notes.md", "mine")
    before = digest(plan.report_dir)
    assert {"report.md", "report.html", "table.json", "notes.md"} <= set(before)

    def full(path: Path, text: str) -> None:  # the disk fills while report.html is written
        if path.name == "report.html":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write_text(path, text)

    monkeypatch.setattr(report, "write_text", full)
    with pytest.raises(OSError) as caught:
        report.write_report(plan, collect(plan), 600.0)  # "took 10.0 min", not 1.0
    assert caught.value.filename == str(plan.report_dir / "report.html")
    assert digest(plan.report_dir) == before and sorted(p.name for p in plan.report_dir.parent.iterdir()) == [
        plan.report_dir.name]


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
