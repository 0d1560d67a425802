"""A check during RL on questions it never draws (``rl.check``), and the best policy kept.

Every ``rl.check.every`` steps, and at the run's last step, the policy answers the first
``rl.check.max_questions`` questions of ``rl.check.split`` with one greedy single-turn output
each, judged for EX: the evaluation's protocol (``eval.runner.greedy_answers``), through the run's
sampler after the step's weight sync (rl.async: the trainer's own sampler over its module). Rank 0
checks and the other ranks take its figures. The step's metrics line holds them (``check/ex``,
``check/n``, ``check/s``). Their time counts in ``rl.max_minutes``, the wall clock from the run's
start: a run that checks takes fewer steps in the same budget.

The split is indomain by default: unseen questions on the train databases. Dev and test hold the
EX the project reports; a policy picked on them would look better there than it is, and the
comparison of SFT with RL on them would be biased towards RL. (The evaluation's in-domain EX of a
policy picked by the check is optimistic in the same way, on the questions the check shares with it.)

With ``rl.check.final: best``, a check at least as good as every earlier one (a tie goes to the
later policy) saves the policy in ``<out>/best/step-N`` and becomes ``RLState.best``;
``<out>/final`` is that policy at the end (``final_origin`` says so in rl_run.json; a run that has
no check yet ends with its last policy). Each checkpoint records the best check, and the folders
of other bests are removed when a checkpoint is written (``keep_only_best``): the newest
checkpoint's best stays on disk, and a resumed run keeps only the one its checkpoint names.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from progress_sql.corpus.records import CorpusError, CorpusLayout, Example
from progress_sql.eval.runner import greedy_answers, load_split, split_path
from progress_sql.params import RLSettings, Settings
from progress_sql.train.resume import RLState
from progress_sql.train.rl_run import RLRun

log = logging.getLogger(__name__)

BEST_DIR = "best"  # <out>/best/step-N: the policy of the best check (rl.check.final best)


def check_questions(settings: Settings, layout: CorpusLayout) -> list[Example]:
    """The questions of the check (none when rl.check is off); CorpusError when its split has none."""
    check = settings.rl.check
    if not check.every:
        return []
    path = split_path(layout, check.split)
    examples = load_split(layout, check.split, check.max_questions) if path.is_file() else []
    if not examples:
        raise CorpusError(f"rl.check.split {check.split}: {path} holds no questions to check on "
                          "(build the corpus with that split, pick another split, or set rl.check.every: 0)")
    return examples


def due(rl: RLSettings, step: int, last: bool) -> bool:
    """Whether step ``step`` is checked: every rl.check.every steps, and the run's ``last``."""
    return rl.check.every > 0 and (step % rl.check.every == 0 or last)


def check_step(run: RLRun, state: RLState, questions: list[Example]) -> dict[str, float]:
    """The check of the policy after step ``state.step`` (its figures, on every rank); with
    rl.check.final best, the policy kept when no earlier check beats it."""
    started = time.monotonic()
    figures: list[Any] = [None]
    run.engine.module.eval()
    with run.engine.gathered(), torch.no_grad():
        if run.is_rank0:
            evals = greedy_answers(run.settings, run.chat, run.layout.root, questions)
            right = sum(ev.greedy is not None and ev.greedy.verdict.correct for ev in evals)
            figures[0] = {"check/ex": right / len(evals), "check/n": float(len(evals))}
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(figures, src=0)
    result = {**figures[0], "check/s": time.monotonic() - started}
    if run.settings.rl.check.final == "best" and (state.best is None or result["check/ex"] >= state.best["check/ex"]):
        save_policy(run, run.out / BEST_DIR / f"step-{state.step}")
        state.best = {"step": state.step, **result}
    return result


def save_policy(run: RLRun, dest: Path) -> None:
    """The policy now in ``dest`` (save_pretrained + tokenizer; every rank calls it: ZeRO-3
    gathers), written under a temporary name and renamed when complete."""
    partial = dest.with_name(f".{dest.name}.partial")
    if run.is_rank0:
        shutil.rmtree(partial, ignore_errors=True)
    run.engine.save_pretrained(partial, run.chat.tokenizer)
    if run.is_rank0:
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)


def keep_only_best(run: RLRun, state: RLState) -> None:
    """Remove the policies of ``<out>/best`` but the state's best (rank 0); a resumed state
    whose best is no longer there (an older checkpoint, a newer best since) forgets it."""
    folder = run.out / BEST_DIR
    kept = folder / f"step-{state.best['step']}" if state.best is not None else None
    # rank 0's look on every rank: the ranks must agree on where final comes from (ZeRO-3 saves together)
    if kept is not None and not run.engine.broadcast_flag(kept.is_dir()):
        log.warning("rl.check: the policy of the best check (step %s) is not in %s; the best is chosen "
                    "among the checks from here on", state.best["step"], folder)
        state.best, kept = None, None
    if run.is_rank0 and folder.is_dir():
        for path in folder.iterdir():
            if path != kept:
                shutil.rmtree(path, ignore_errors=True)


def final_origin(run: RLRun, state: RLState) -> tuple[Path | None, dict[str, Any]]:
    """Where ``<out>/final`` comes from: the folder of the best check's policy (None: the policy
    as the run ends), and what rl_run.json says of it (``final``: its step, the check figures)."""
    checks = [{k: v for k, v in m.items() if k == "step" or k.startswith("check/")}
              for m in state.history if "check/ex" in m]
    if run.settings.rl.check.final == "best" and state.best is not None:
        return run.out / BEST_DIR / f"step-{state.best['step']}", {"from": "best", **state.best, "checks": checks}
    origin: dict[str, Any] = {"from": "last", "step": state.step, "checks": checks}
    if run.settings.rl.check.final == "best":
        origin["note"] = "no check ran: the last policy"
    return None, origin
