"""Where an RL run is (``RLState``) and whether it may go on from a checkpoint.

Each checkpoint records the run's fingerprint (``run_fingerprint``): the settings that decide
its course and the sha256 of its inputs. ``run_rl``'s ``resume="auto"`` goes on only from
checkpoints of the same fingerprint (``auto_resume_point``), so a changed setting, corpus,
starting policy or package starts the run over instead of mixing two runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from progress_sql.corpus.integrity import sha256_file, sha256_tree
from progress_sql.corpus.records import CorpusLayout
from progress_sql.params import Settings, dotted_items
from progress_sql.train.checkpoint import STATE_FILE, list_checkpoints, resume_checkpoint
from progress_sql.train.distributed import Engine, rank
from progress_sql.train.question_scores import policy_identity, scores_identity

log = logging.getLogger(__name__)

# The key of RLState.question_ids in trainer_state.json is "question_pool", rl.questions' name
# when checkpoints started to hold it: checkpoints written under that name resume with their questions.
QUESTION_IDS_KEY = "question_pool"
BEST_CHECK_KEY = "best_check"


@dataclass
class RLState:
    """Where a run is; a checkpoint keeps it (``trainer_state.json``) so the run goes on exactly."""

    step: int = 0
    data_position: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    question_ids: list[str] | None = None  # rl.questions solved or band: the ids kept, fixed at the start
    checkpoint: Path | None = None  # the newest one written or resumed from
    best: dict[str, Any] | None = None  # rl.check: the best check so far ({"step", "check/ex", ...}: train.check)

    def saved(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        """The trainer state a checkpoint records (``save_checkpoint`` adds the step)."""
        state = {"data_position": self.data_position, "history": self.history, "fingerprint": fingerprint}
        if self.question_ids is not None:
            state[QUESTION_IDS_KEY] = self.question_ids
        if self.best is not None:
            state[BEST_CHECK_KEY] = self.best
        return state

    @classmethod
    def restored(cls, saved: dict[str, Any], checkpoint: Path) -> RLState:
        """The state of ``checkpoint``, whose trainer state is ``saved``."""
        return cls(saved["step"], saved["data_position"], list(saved["history"]), saved.get(QUESTION_IDS_KEY),
                   checkpoint, saved.get(BEST_CHECK_KEY))


def resumed_state(engine: Engine, out: Path, resume: bool | str | Path, fingerprint: dict[str, Any],
                  steps: int) -> tuple[RLState | None, str]:
    """``run_rl``'s ``resume``: the state of the checkpoint it names, restored into ``engine``
    (None: the run starts at step 0), and for ``resume="auto"`` a line saying which and why."""
    start, auto = "", resume == "auto"
    if auto:  # go on only from checkpoints this run would have written
        resume, start = auto_resume_point(out, fingerprint, steps)
    # True: the newest intact checkpoint (it says which, and which corrupt ones it skipped); a path: that one
    resumed = resume_checkpoint(engine, out, None if resume is True else resume) if resume else None
    if resumed is None:
        return None, start
    checkpoint, saved = resumed
    if auto:
        start = f"resumed from {checkpoint} (same settings and inputs)"
    return RLState.restored(saved, checkpoint), start


# ----------------------------------------------------------------------------- fingerprints
# The settings dvc.yaml's train stage reads, less those that only say where the run goes, how
# long it goes on and what it keeps (rl.init_from counts by its content; rl.steps counts under a
# decaying schedule, whose length it sets).
FINGERPRINT_SECTIONS = ("seed", "rl", "generation", "env", "rewards", "odt", "sandbox")
_NOT_FINGERPRINTED = {"rl.out_dir", "rl.init_from", "rl.steps", "rl.max_minutes", "rl.checkpoint_every",
                      "rl.keep_checkpoints", "rl.save_rollouts", "rl.log_episodes", "rl.async.timeout_s",
                      "rl.async.threads", "rl.async.devices", "rl.scores.out_dir"}


def run_fingerprint(settings: Settings, layout: CorpusLayout) -> dict[str, Any]:
    """What decides the course of a run, recorded in each checkpoint: ``settings``, those of
    ``FINGERPRINT_SECTIONS`` (flat: ``"rl.lr": 0.001``), and ``inputs``, the sha256 of the train
    split, of the starting policy's files (its name when it is no folder: a hub id), of the
    question scores it draws by (rl.questions band) and of this package's source. A run resumed
    from a checkpoint of the same fingerprint goes on as the run that wrote it would have."""
    dumped = settings.model_dump(mode="json")
    flat = dotted_items({key: dumped[key] for key in FINGERPRINT_SECTIONS})
    keep_steps = settings.rl.schedule != "constant"
    inputs = {"train split": sha256_file(layout.split("train")),
              "starting policy": policy_identity(settings.rl.init_from),
              "code": sha256_tree(Path(__file__).resolve().parents[1])}
    if settings.rl.questions == "band":
        inputs["question scores"] = scores_identity(settings)
    return {"settings": {k: v for k, v in flat.items()
                         if k not in _NOT_FINGERPRINTED or (keep_steps and k == "rl.steps")},
            "inputs": inputs}


def auto_resume_point(out: Path, fingerprint: dict[str, Any], steps: int) -> tuple[bool, str]:
    """``resume="auto"``: whether to go on as ``resume=True`` does (from the newest intact
    checkpoint in ``out``), which is when every checkpoint there whose trainer state reads
    records ``fingerprint`` and none is past ``steps``; and a line saying why not."""
    states = {c: s for c in list_checkpoints(out) if (s := _trainer_state(c)) is not None}
    if not states:  # unreadable ones (corrupt) are no run to go on with
        return False, f"started at step 0: no checkpoint in {out}"
    for checkpoint, state in reversed(states.items()):
        reason = _not_resumable(state, fingerprint, steps)
        if reason:
            if rank() == 0:  # said at once: the fresh start removes the checkpoints
                log.warning("rl: starting over (the checkpoints in %s are removed): %s %s", out, checkpoint, reason)
            return False, f"started over: {checkpoint} {reason}"
    return True, ""


def _trainer_state(checkpoint: Path) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError):
        state = json.loads((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
        return state if isinstance(state, dict) else None
    return None


def _not_resumable(state: dict[str, Any], fingerprint: dict[str, Any], steps: int) -> str:
    """Why a run with ``fingerprint`` and ``steps`` may not go on from a checkpoint of trainer
    state ``state`` ('' if it may)."""
    recorded = state.get("fingerprint")
    if not (isinstance(recorded, dict) and isinstance(recorded.get("settings"), dict)
            and isinstance(recorded.get("inputs"), dict)):
        return "records no fingerprint of its settings and inputs"
    old, new = recorded["settings"], fingerprint["settings"]
    changed = [f"{k} {old.get(k)!r:.40} → {new.get(k)!r:.40}" for k in sorted(old.keys() | new.keys())
               if old.get(k) != new.get(k)]
    changed += [f"the {k}" for k, v in fingerprint["inputs"].items() if recorded["inputs"].get(k) != v]
    if changed:
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        return f"was trained otherwise ({'; '.join(changed[:5])}{more} changed)"
    if not isinstance(state.get("step"), int) or state["step"] > steps:
        return f"is past rl.steps ({steps})"
    return ""
