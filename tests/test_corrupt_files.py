"""Corrupt checkpoints and model folders (issue 33): every error names the file and ends the
command in one line; ``--resume`` falls back past a corrupt newest checkpoint to the newest
intact one and says which it skipped and why; a model with NaN weights is refused.

One tiny 2-step RL run (plain torch engine, checkpoints step-1 and step-2) is shared by the
module; each test corrupts its own copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from progress_sql.cli import app  # noqa: E402
from progress_sql.params import Settings  # noqa: E402
from corpora import school_corpus, school_settings  # noqa: E402
from progress_sql.inference.models import PolicyLoadError  # noqa: E402
from progress_sql.train.checkpoint import STATE_FILE, CheckpointError, read_checkpoint  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.trainer import run_rl  # noqa: E402


@dataclass
class Trained:
    root: Path
    corpus: Path
    run: Path  # checkpoints/step-1, checkpoints/step-2, final/
    settings: Settings
    params: Path  # the settings as a params file, for the CLI


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("corrupt")
    corpus = school_corpus(root / "corpus")
    base = build_tiny_model(corpus, school_settings(), root / "base")
    s = school_settings(base)
    s.rl.deepspeed, s.rl.save_rollouts, s.rl.keep_checkpoints = "never", False, 2
    s.rl.out_dir, s.data.out_dir, s.tracking.enabled = str(root / "run"), str(corpus), False
    run_rl(s, corpus, progress=False)
    params = root / "params.yaml"
    params.write_text(json.dumps(s.model_dump(mode="json")))  # JSON is YAML
    return Trained(root, corpus, root / "run", s, params)


@pytest.fixture()
def run(trained, tmp_path) -> Path:
    """A copy of the trained run folder to corrupt."""
    return Path(shutil.copytree(trained.run, tmp_path / "run"))


def truncate(file: Path) -> Path:
    data = file.read_bytes()
    file.write_bytes(data[:len(data) // 2])
    return file


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_error(output: str, *names: str) -> str:
    """The command's error line; it names each of ``names`` and no traceback came with it."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]


# ----------------------------------------------------------------------------- checkpoints
CORRUPTIONS = {
    "truncated engine.pt": lambda ckpt: truncate(ckpt / "engine.pt"),
    "truncated rng-rank0.pt": lambda ckpt: truncate(ckpt / "rng-rank0.pt"),
    "half-written trainer_state.json": lambda ckpt: truncate(ckpt / STATE_FILE),
    "missing trainer_state.json": lambda ckpt: (ckpt / STATE_FILE).unlink() or ckpt,
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_corrupt_checkpoint_file_is_named(run, corruption):
    step2 = run / "checkpoints" / "step-2"
    assert read_checkpoint(step2, "torch").trainer_state["step"] == 2  # intact before
    named = CORRUPTIONS[corruption](step2)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(step2, "torch")
    assert str(named) in str(err.value) and "\n" not in str(err.value)


def test_resume_falls_back_to_the_newest_intact_checkpoint(trained, run, capfd):
    """step-2's random states are truncated: the run resumes from step-1, says so, and its
    step 2 is the original's (the engine and random states all come from step-1)."""
    truncate(run / "checkpoints" / "step-2" / "rng-rank0.pt")
    result = run_rl(trained.settings, trained.corpus, out_dir=run, resume=True, progress=False)
    said = capfd.readouterr().err
    assert f"skipping step-2: {run / 'checkpoints' / 'step-2' / 'rng-rank0.pt'} is truncated" in said
    assert f"continuing from {run / 'checkpoints' / 'step-1'} (step 1)" in said
    original = [json.loads(line) for line in (trained.run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in result.metrics] == [1, 2]
    for key in ("reward/mean", "loss", "grad_norm"):
        assert result.metrics[1][key] == pytest.approx(original[1][key], rel=1e-5, abs=1e-7), key
    assert read_checkpoint(run / "checkpoints" / "step-2", "torch").trainer_state["step"] == 2  # saved afresh


def test_resume_says_which_incomplete_checkpoint_it_skipped(trained, run, capfd):
    (run / "checkpoints" / "step-2" / STATE_FILE).unlink()
    s = trained.settings.model_copy(deep=True)
    s.rl.steps = 1  # nothing left to train after step-1: only the choice is tested
    result = run_rl(s, trained.corpus, out_dir=run, resume=True, progress=False)
    said = capfd.readouterr().err
    assert f"skipping step-2: {run / 'checkpoints' / 'step-2'} is not a complete checkpoint (no {STATE_FILE}" in said
    assert f"continuing from {run / 'checkpoints' / 'step-1'}" in said
    assert result.steps == 1 and len(result.metrics) == 1


def test_resume_from_a_corrupt_folder_is_an_error_naming_the_file(trained, run):
    """--resume-from names the folder: no fallback, though step-2 is intact."""
    step1 = run / "checkpoints" / "step-1"
    truncate(step1 / "engine.pt")
    out = cli("train", "rl", "--params", str(trained.params), "--out", str(run), "--resume-from", str(step1),
              "--no-progress")
    assert out.exit_code == 1
    one_line_error(out.output, str(step1 / "engine.pt"))
    assert "continuing from" not in out.output


def test_resume_with_no_intact_checkpoint_names_each(trained, run):
    for step in ("step-1", "step-2"):
        truncate(run / "checkpoints" / step / STATE_FILE)
    out = cli("train", "rl", "--params", str(trained.params), "--out", str(run), "--resume", "--no-progress")
    assert out.exit_code == 1
    one_line_error(out.output, *(str(run / "checkpoints" / s / STATE_FILE) for s in ("step-1", "step-2")))
    assert (run / "checkpoints" / "step-1").is_dir()  # nothing deleted: the user decides


# ----------------------------------------------------------------------------- model folders
def test_eval_of_a_truncated_model_names_the_file(trained, run):
    """The issue's recipe, as a real command: one error line, exit code 1."""
    weights = truncate(run / "final" / "model.safetensors")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    exe = str(Path(sys.executable).with_name("progress-sql"))
    proc = subprocess.run([exe, "eval", "--params", str(trained.params),
                           "--model", str(run / "final"), "--split", "train", "--out", str(run / "eval"),
                           "--no-progress"], capture_output=True, text=True, env=env, cwd=trained.root, timeout=300)
    assert proc.returncode == 1, proc.stderr
    one_line_error(proc.stderr, str(weights))


def test_nan_weights_are_refused_by_eval_and_rl(trained, run):
    final = run / "final"
    weights = load_file(str(final / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, str(final / "model.safetensors"), metadata={"format": "pt"})
    out = cli("eval", "--params", str(trained.params), "--model", str(final), "--split", "train",
              "--out", str(run / "eval"), "--no-progress")
    assert out.exit_code == 1
    assert name in one_line_error(out.output, str(final), "NaN")
    assert not (run / "eval" / "metrics.json").exists()
    s = trained.settings.model_copy(deep=True)
    s.rl.init_from = str(final)  # the same load path: RL (and SFT) refuse it too
    with pytest.raises(PolicyLoadError, match="NaN"):
        run_rl(s, trained.corpus, out_dir=run / "rl-from-nan", progress=False)


def test_finite_weights_with_infinite_logits_stop_eval(trained, run):
    """Weights that read as finite but overflow on the way to the logits: eval stops at the
    first generated token instead of scoring noise."""
    final = run / "final"
    weights = load_file(str(final / "model.safetensors"))
    weights["model.norm.weight"].fill_(3e38)  # the largest float32 is 3.4e38: the normed states overflow
    save_file(weights, str(final / "model.safetensors"), metadata={"format": "pt"})
    out = cli("eval", "--params", str(trained.params), "--model", str(final), "--split", "train",
              "--out", str(run / "eval"), "--no-progress")
    assert out.exit_code == 1
    one_line_error(out.output, "NaN or infinite logits", "generated token 1")
    assert not (run / "eval" / "metrics.json").exists()
