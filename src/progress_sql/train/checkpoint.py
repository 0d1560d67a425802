"""RL checkpoints: ``<out>/checkpoints/step-N/`` holds everything a resume needs.

    engine state     model, optimizer and LR schedule (DeepSpeed's files, or engine.pt)
    rng-rank<r>.pt   python / numpy / torch (and CUDA) random states of each rank
    trainer_state.json  step, data position, metrics history (written last: its presence
                        marks a complete checkpoint)

A checkpoint is written to a hidden ``.step-N.partial`` folder and renamed to ``step-N`` once
complete, so a save cut short (a full disk, a kill) never leaves a ``step-N`` behind.

Only the newest ``keep`` complete checkpoints stay. A resume reads and checks every file of a
checkpoint before it applies any (``read_checkpoint``): a corrupt one is refused, naming the
file, while the engine is still untouched, so ``resume_checkpoint`` can fall back to the next
older one.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from progress_sql.files import write_failure
from progress_sql.train.distributed import Engine, rank

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# the file(s) each engine kind writes for its model state (a glob under the checkpoint folder)
_ENGINE_FILES = {"torch": "engine.pt", "deepspeed": "*model_states.pt"}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def checkpoints_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(out_dir) / f"step-{step}"


def _step_dirs(out_dir: str | Path) -> list[Path]:
    """Every ``step-N`` folder under ``out_dir``, complete or not, oldest first."""
    folder = checkpoints_dir(out_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``out_dir`` (those with their trainer state), oldest first."""
    return [p for p in _step_dirs(out_dir) if (p / STATE_FILE).is_file()]


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(engine: Engine, out_dir: str | Path, step: int, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint ``step`` (every rank calls this: DeepSpeed saves collectively) and drop
    all but the newest ``keep``. ``trainer_state`` must be JSON-serialisable.

    Everything is written to ``.step-N.partial`` and renamed to ``step-N`` when complete, so a
    save cut short (a full disk, a kill) leaves no ``step-N`` behind, only the hidden partial
    folder that the next save of any step replaces; older checkpoints are dropped only after the
    new one is complete. A failed write raises an OSError naming the checkpoint (ENOSPC when
    torch's own error does not say that the disk is full)."""
    path = checkpoint_path(out_dir, step)
    partial = path.with_name(f".{path.name}.partial")
    if rank() == 0:
        for stale in checkpoints_dir(out_dir).glob(".step-*.partial"):  # of a save cut short
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier()
    try:
        engine.save(partial)
        torch.save(rng_state(), partial / f"rng-rank{rank()}.pt")
        _barrier()
        if rank() == 0:
            (partial / STATE_FILE).write_text(json.dumps({**trainer_state, "step": step}, indent=1, sort_keys=True),
                                              encoding="utf-8")
    except Exception as err:  # noqa: BLE001 - torch reports a full disk as a RuntimeError
        failure = write_failure(err, path)
        if rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        if failure is err:
            raise
        raise failure from err
    if rank() == 0:
        if path.exists():  # this step saved before (a run resumed from an older checkpoint)
            shutil.rmtree(path)
        partial.rename(path)
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


# ----------------------------------------------------------------------------- loading
@dataclass
class CheckedCheckpoint:
    """A checkpoint whose files all read back, not applied yet: its trainer state and this
    rank's random states (None when it has no file for this rank)."""

    path: Path
    trainer_state: dict[str, Any]
    rng: dict[str, Any] | None


def _torch_file(file: Path, *, mmap: bool) -> Any:
    """``file``'s content; CheckpointError naming it when it cannot be read. ``mmap``: tensors
    stay on disk, so checking a large file reads only its index and structure."""
    if file.stat().st_size == 0:
        raise CheckpointError(f"{file} is empty (its save was cut short)")
    try:
        return torch.load(file, map_location="cpu", weights_only=False, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, OSError, pickle and EOF errors alike
        raise CheckpointError(f"{file} is truncated or corrupt ({_reason(err)})") from err


def read_checkpoint(path: str | Path, engine_kind: str) -> CheckedCheckpoint:
    """Read and check every file of checkpoint ``path`` without applying any: the trainer
    state, each ``*.pt`` (the engine's, every rank's random states: all ranks reach the same
    verdict) and that the engine's own files are there. CheckpointError names what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} not found")
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {STATE_FILE}: its save did not finish)")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{state_file} is not valid JSON ({err}): the file is truncated or corrupt") from None
    if not (isinstance(state, dict) and isinstance(state.get("step"), int)
            and isinstance(state.get("data_position"), int) and isinstance(state.get("history"), list)):
        raise CheckpointError(f"{state_file} lacks the step, data_position or history of a trainer state")
    pattern = _ENGINE_FILES[engine_kind]
    if not any(path.glob(pattern)):
        raise CheckpointError(f"{path} holds no {pattern} (the {engine_kind} engine's state)")
    own = path / f"rng-rank{rank()}.pt"
    rng = None
    for file in sorted(path.glob("*.pt")):
        content = _torch_file(file, mmap=file != own)
        if file == own:
            rng = content
    return CheckedCheckpoint(path, state, rng)


def apply_checkpoint(engine: Engine, checked: CheckedCheckpoint) -> dict[str, Any]:
    """Restore the engine and this rank's random states from a checked checkpoint; its trainer
    state. A failure here (files that read but do not fit this model) is a CheckpointError."""
    try:
        engine.load(checked.path)
    except Exception as err:  # noqa: BLE001 - e.g. a state dict of another model: name the checkpoint
        raise CheckpointError(f"{checked.path}: the engine state does not load into this model "
                              f"({_reason(err)})") from err
    if checked.rng is not None:
        set_rng_state(checked.rng)
    return checked.trainer_state


def load_checkpoint(engine: Engine, path: str | Path) -> dict[str, Any]:
    """Restore engine state and random states from ``path``; return its trainer state. Nothing
    is applied when a file of it is missing or corrupt (CheckpointError naming the file)."""
    return apply_checkpoint(engine, read_checkpoint(path, engine.kind))


def resume_checkpoint(engine: Engine, out_dir: str | Path,
                      path: str | Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """Restore checkpoint ``path``, or when None the newest intact one under ``out_dir``, and
    return it with its trainer state (None: ``out_dir`` has no checkpoint at all). A named
    ``path`` that is corrupt is an error; newer corrupt or incomplete ones are skipped, and
    rank 0 says on stderr which it skipped and why, and which it resumed from."""
    if path is not None:
        checked = read_checkpoint(path, engine.kind)
    else:
        candidates, skipped = _step_dirs(out_dir)[::-1], []
        for candidate in candidates:
            try:
                checked = read_checkpoint(candidate, engine.kind)
                break
            except CheckpointError as err:
                skipped.append(str(err))
                _say(f"resume: skipping {candidate.name}: {err}")
        else:
            if skipped:
                raise CheckpointError(f"no intact checkpoint under {checkpoints_dir(out_dir)} to resume from "
                                      f"({'; '.join(skipped)}); to start afresh, run without --resume")
            return None
    state = apply_checkpoint(engine, checked)
    _say(f"resume: continuing from {checked.path} (step {state['step']})")
    return checked.path, state


def _reason(err: BaseException) -> str:
    """The first sentence of ``err``'s message (torch's run to several lines of advice)."""
    line = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    return line.split(". ")[0]


def _say(message: str) -> None:
    if rank() == 0:
        print(message, file=sys.stderr, flush=True)


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
