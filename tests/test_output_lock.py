"""One writer per output folder, and the DVC train stage's --auto-resume (issue 33, item 3).

Two `train rl --out S` at once: the second stops at once with an error naming S and the first's
pid, writes nothing, and the first finishes with steps 1..N in order. A SIGKILLed holder leaves
no lock behind; an evaluation into a locked folder is refused; a trainer started by DVC dies
with it. --auto-resume goes on from the newest checkpoint only when it was trained the same way.
Real processes, real flock, the tiny school policy (tests/test_trainer.py's settings, no SFT)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from progress_sql.cli import app  # noqa: E402
from progress_sql.corpus.records import CorpusLayout  # noqa: E402
from corpora import school_corpus, school_settings  # noqa: E402
from progress_sql.files import FolderInUse, lock_path, writer_lock  # noqa: E402
from progress_sql.train.checkpoint import STATE_FILE  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.resume import auto_resume_point, run_fingerprint  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
ENV.pop("DVC_STAGE", None)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project folder: the school corpus, the untrained tiny policy, params.yaml for a
    3-step single-turn RL run (a checkpoint each step, tracking off)."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("lock")
    corpus = school_corpus(root / "corpus")
    s = school_settings()
    base = build_tiny_model(corpus, s, root / "base")
    s.data.out_dir, s.rl.init_from, s.rl.out_dir = str(corpus), str(base), str(root / "rl")
    s.rl.env, s.rl.steps, s.rl.group_size, s.rl.questions_per_step = "single_turn", 3, 2, 1
    s.rl.micro_batch_size, s.rl.save_rollouts, s.rl.deepspeed = 2, False, "never"
    s.generation.max_new_tokens, s.tracking.enabled = 8, False
    (root / "params.yaml").write_text(json.dumps(s.model_dump(mode="json")))  # JSON is YAML
    return root


def cli(project: Path, *args: str):
    # a train command's reports go to the project, not to reports/ of the folder pytest runs in
    reports = ["--report-dir", str(project / "reports")] if args[0] == "train" else []
    return CliRunner().invoke(app, [*args, "--params", str(project / "params.yaml"), *reports, "--no-progress"])


def steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def files_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.exists() else {}


def wait_for_holder(folder: Path, pid: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``pid`` has written its details into ``folder``'s lock file (it holds the lock then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the holder ended early ({proc.returncode}): {proc.stderr.read()[-3000:]}"
        with contextlib.suppress(OSError, ValueError):
            if json.loads(lock_path(folder).read_text())["pid"] == pid:
                return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never took the lock of {folder}")


@contextlib.contextmanager
def holder(folder: Path):
    """Another process holding ``folder``'s writer lock (a bare python, no torch)."""
    code = ("import sys, time; from progress_sql.files import writer_lock\n"
            "with writer_lock(sys.argv[1]):\n    time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_holder(folder, proc.pid, proc)
        yield proc
    finally:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------- one writer
@pytest.mark.slow  # a real trainer process (~15 s on 2 cores, most of it starting up)
def test_a_second_trainer_on_the_folder_is_refused_and_the_first_finishes_alone(project):
    run = project / "two"
    exe = Path(sys.executable).with_name("progress-sql")
    first = subprocess.Popen([str(exe), "train", "rl", "--params", "params.yaml", "--out", str(run), "--no-progress"],
                             cwd=project, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_holder(run, first.pid, first)
        first.send_signal(signal.SIGSTOP)  # holds the lock, and stays mid-run while the second tries
        before = files_under(run)
        second = cli(project, "train", "rl", "--out", str(run))
        assert second.exit_code == 1, second.output
        assert f"{run} is being written by another process (pid {first.pid} on " in second.output
        assert "train rl" in second.output  # the holder's command
        assert files_under(run) == before  # the second wrote nothing
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert steps(run) == [1, 2, 3] and "policy saved to" in out
    assert not lock_path(run).exists()  # released and removed at the end


def test_a_killed_holder_leaves_no_lock(tmp_path):
    folder = tmp_path / "run"
    with holder(folder) as proc:
        with pytest.raises(FolderInUse, match=f"pid {proc.pid} on "):
            with writer_lock(folder):
                pass
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads(lock_path(folder).read_text())["pid"] == proc.pid  # its text stays; the flock went with it
    with writer_lock(folder) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not lock_path(folder).exists()


def test_eval_into_a_folder_being_written_is_refused(project, tmp_path):
    out = tmp_path / "eval"
    with holder(out) as proc:
        result = cli(project, "eval", "--model", "oracle", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert f"{out} is being written by another process (pid {proc.pid} on " in result.output
    assert not out.exists()


# issue 39: the refusal took 13-19 s: torch, transformers and MLflow were imported before the lock
LOADED = ("import sys\nfrom progress_sql.cli import main\ntry:\n    main()\nfinally:\n    print('LOADED', "
          "sorted(m for m in ('torch', 'transformers', 'mlflow') if m in sys.modules), file=sys.stderr)")


@pytest.mark.parametrize("command", [["train", "rl"], ["train", "sft"], ["eval", "--model", "oracle"]],
                         ids=["train_rl", "train_sft", "eval"])
def test_a_refused_writer_answers_before_torch_or_mlflow_load(project, tmp_path, command):
    out = tmp_path / "busy"
    with holder(out) as proc:
        started = time.monotonic()
        refused = subprocess.run([sys.executable, "-c", LOADED, *command, "--params", str(project / "params.yaml"),
                                  "--out", str(out), "--no-progress", "--set", f"sft.init_from={project / 'base'}"],
                                 env=ENV, capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - started
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert f"{out} is being written by another process (pid {proc.pid} on " in refused.stderr
    assert "LOADED []" in refused.stderr  # what took the seconds was never imported
    assert elapsed < 5.0  # a cold interpreter and the settings: ~0.5 s on 2 idle cores


@pytest.mark.parametrize("under_dvc", [True, False])
def test_a_command_started_by_dvc_dies_with_it(tmp_path, under_dvc):
    """``die_with_dvc``: under DVC (DVC_STAGE set) the command ends when its parent is killed;
    started any other way (by hand, nohup) it lives on."""
    child = ("import time; from progress_sql.cli.common import die_with_dvc\n"
             "die_with_dvc(); print('ok', flush=True); time.sleep(60)")
    parent = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
              "print(p.pid, flush=True); p.wait()")
    env = {**ENV, "DVC_STAGE": "train"} if under_dvc else ENV
    proc = subprocess.Popen([sys.executable, "-c", parent, child], env=env, stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "ok"  # the child is past die_with_dvc
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + (10 if under_dvc else 1)  # the signal comes at once; give a busy machine time
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    try:
        assert _alive(pid) is not under_dvc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (a zombie, which no one reaps here once orphaned to init, counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


# ----------------------------------------------------------------------------- --auto-resume
def test_auto_resume_goes_on_only_from_a_checkpoint_of_the_same_settings(project):
    run = project / "auto"
    first = cli(project, "train", "rl", "--out", str(run), "--set", "rl.steps=2")
    assert first.exit_code == 0, first.output
    lines = (run / "metrics.jsonl").read_text().splitlines()
    fingerprint = json.loads((run / "checkpoints" / "step-2" / STATE_FILE).read_text())["fingerprint"]
    assert fingerprint["settings"]["rl.lr"] == 1e-3 and set(fingerprint["inputs"]) == {
        "train split", "starting policy", "code"}

    # more steps asked (the steps are no part of the fingerprint under a constant schedule): resumes
    more = cli(project, "train", "rl", "--out", str(run), "--auto-resume", "--set", "rl.steps=3")
    assert more.exit_code == 0, more.output
    assert f"rl: resumed from {run / 'checkpoints' / 'step-2'} (same settings and inputs)" in more.output
    assert steps(run) == [1, 2, 3]
    assert (run / "metrics.jsonl").read_text().splitlines()[:2] == lines  # steps 1-2 kept, not run again

    # another learning rate: starts over, and says why
    other = cli(project, "train", "rl", "--out", str(run), "--auto-resume", "--set", "rl.steps=3",
                "--set", "rl.lr=0.002")
    assert other.exit_code == 0, other.output
    assert f"rl: started over: {run / 'checkpoints' / 'step-3'} was trained otherwise (rl.lr 0.001 → 0.002 " \
           "changed)" in other.output
    assert steps(run) == [1, 2, 3] and (run / "metrics.jsonl").read_text().splitlines()[0] != lines[0]
    assert json.loads((run / "checkpoints" / "step-3" / STATE_FILE).read_text())["fingerprint"]["settings"][
        "rl.lr"] == 0.002

    refused = cli(project, "train", "rl", "--out", str(run), "--auto-resume", "--resume")
    assert refused.exit_code == 2 and "--auto-resume" in refused.output


def test_auto_resume_point_names_what_changed(project, tmp_path):
    """The decision alone, on a checkpoint's trainer_state.json (the engine files play no part)."""
    s = school_settings(project / "base")
    corpus = tmp_path / "corpus"
    school_corpus(corpus)
    fingerprint = run_fingerprint(s, CorpusLayout(corpus))
    state = tmp_path / "run" / "checkpoints" / "step-2" / STATE_FILE
    state.parent.mkdir(parents=True)

    no_state = auto_resume_point(tmp_path / "run", fingerprint, 3)  # a save that never finished
    assert no_state == (False, f"started at step 0: no checkpoint in {tmp_path / 'run'}")
    state.write_text(json.dumps({"step": 2, "fingerprint": fingerprint}))
    assert auto_resume_point(tmp_path / "run", fingerprint, 3) == (True, "")
    assert auto_resume_point(tmp_path / "run", fingerprint, 1) == (
        False, f"started over: {state.parent} is past rl.steps (1)")

    with (corpus / "train.jsonl").open("a") as fh:  # another corpus under the same path
        fh.write((corpus / "train.jsonl").read_text().splitlines()[0] + "\n")
    changed = run_fingerprint(s, CorpusLayout(corpus))
    assert auto_resume_point(tmp_path / "run", changed, 3) == (
        False, f"started over: {state.parent} was trained otherwise (the train split changed)")

    older = state.parent.with_name("step-1") / STATE_FILE  # of a run with other settings, resumed with --resume
    older.parent.mkdir()
    older.write_text(json.dumps({"step": 1, "fingerprint": changed}))
    assert auto_resume_point(tmp_path / "run", changed, 3) == (
        False, f"started over: {state.parent} was trained otherwise (the train split changed)")
    assert auto_resume_point(tmp_path / "run", fingerprint, 3) == (
        False, f"started over: {older.parent} was trained otherwise (the train split changed)")

    state.write_text(json.dumps({"step": 2}))  # written before checkpoints had fingerprints
    assert "records no fingerprint" in auto_resume_point(tmp_path / "run", fingerprint, 3)[1]
