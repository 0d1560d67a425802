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
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from corpora import school_corpus, school_settings  # noqa: E402
from progress_sql.cli.common import os_error_line  # noqa: E402
from progress_sql.files import disk_full, write_failure, write_text  # noqa: E402
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
        assert error_lines(proc.stderr) == [f"error: cannot write {mnt}/.out.lock: Read-only file system"], proc.stderr


@needs_mounts
def test_an_existing_run_folder_made_read_only_is_refused_before_any_work(project: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = digest(run)
    proc = in_namespace(f"mount --bind {run} {run} && mount -o remount,ro,bind {run} && "
                        f"{EXE} train rl --params params.yaml --out {run} --no-progress", project)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert error_lines(proc.stderr) == [f"error: cannot write {run}: Read-only file system"], proc.stderr
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
    assert error_lines(err) == [f"error: cannot write {mnt}/rl/checkpoints/step-2: No space left on device"], err
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
    assert lines[0].endswith(": No space left on device"), proc.stderr


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
        "error: cannot write /data/.rl.lock: Read-only file system"
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
