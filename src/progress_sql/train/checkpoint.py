"""RL checkpoints: ``<out>/checkpoints/step-N/`` holds everything a resume needs.

    engine state     model, optimizer and LR schedule (DeepSpeed's files, or engine.pt)
    rng-rank<r>.pt   python / numpy / torch (and CUDA) random states of each rank
    trainer_state.json  step, data position, metrics history (written last: its presence
                        marks a complete checkpoint, so a crash mid-save is never resumed)

Only the newest ``keep`` complete checkpoints stay.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from progress_sql.train.distributed import Engine, rank

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing or incomplete; the message names it."""


def checkpoints_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(out_dir) / f"step-{step}"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints under ``out_dir``, oldest first."""
    folder = checkpoints_dir(out_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


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
    all but the newest ``keep``. ``trainer_state`` must be JSON-serialisable."""
    path = checkpoint_path(out_dir, step)
    if rank() == 0 and path.exists():
        shutil.rmtree(path)  # a stale, incomplete save of the same step
    _barrier()
    path.mkdir(parents=True, exist_ok=True)
    engine.save(path)
    torch.save(rng_state(), path / f"rng-rank{rank()}.pt")
    _barrier()
    if rank() == 0:
        tmp = path / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps({**trainer_state, "step": step}, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path / STATE_FILE)
        for old in list_checkpoints(out_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


def load_checkpoint(engine: Engine, path: str | Path) -> dict[str, Any]:
    """Restore engine state and random states from ``path``; return its trainer state."""
    path = Path(path)
    state_file = path / STATE_FILE
    if not state_file.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    engine.load(path)
    rng_file = path / f"rng-rank{rank()}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    return json.loads(state_file.read_text(encoding="utf-8"))


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
