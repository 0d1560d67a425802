"""The questions an RL run trains on: which of the train split (``rl_questions``: all of
``rl.hardness``; with ``rl.questions: solved`` those the starting policy answers greedily, found
by a pass at the run's start; with ``band`` those whose pass rate, scored before the run, lies
inside the band: ``train.question_scores``) and in which order (``round_questions``: a seeded
permutation per epoch, replayed from the data position alone, so a resumed run draws what the
run it continues would have drawn).

A step draws ``questions_per_step`` questions a rank from the stream at the data position, or
with ``rl.dynamic_sampling`` up to ``max_rounds`` such draws (``train.dynamic_sampling``). The
stream advances by every draw a step may make (``step_stride``), made or not: each rank, and
each rank's rollout producer (rl.async), knows where the next step starts without asking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from progress_sql.corpus.records import CorpusError, CorpusLayout, Example
from progress_sql.eval.runner import greedy_answers
from progress_sql.files import write_json_lines
from progress_sql.inference.policy import ChatModel
from progress_sql.params import RLSettings, Settings
from progress_sql.train.distributed import rank
from progress_sql.train.question_scores import SUMMARY_FILE, band_ids, question_pool
from progress_sql.train.resume import RLState
from progress_sql.train.rl_run import RLRun

SOLVED_QUESTIONS_FILE = "solved_questions.jsonl"  # rl.questions solved: the greedy pass's verdicts


def question_indices(n_examples: int, position: int, count: int, seed: int) -> list[int]:
    """Examples ``position .. position+count-1`` of the stream that walks a fresh seeded
    permutation of the train split each epoch: the data position alone replays the order."""
    orders: dict[int, np.ndarray] = {}
    out = []
    for p in range(position, position + count):
        epoch, offset = divmod(p, n_examples)
        if epoch not in orders:
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(n_examples)
        out.append(int(orders[epoch][offset]))
    return out


def step_stride(rl: RLSettings, world: int) -> int:
    """How far the question stream advances a step: every draw the step may make, on every rank."""
    draws = rl.dynamic_sampling.max_rounds if rl.dynamic_sampling.enabled else 1
    return rl.questions_per_step * world * draws


def round_questions(train: list[Example], position: int, draw: int, rl: RLSettings, rank_: int, world: int
                    ) -> list[Example]:
    """Rank ``rank_``'s questions of draw ``draw`` of the step whose stream starts at ``position``:
    every rank draws the same global batch and takes its slice."""
    per_rank = rl.questions_per_step
    global_idx = question_indices(len(train), position + draw * per_rank * world, per_rank * world, rl.seed)
    return [train[i] for i in global_idx[rank_ * per_rank:(rank_ + 1) * per_rank]]


def rl_questions(run: RLRun, state: RLState) -> list[Example]:
    """The train questions a run draws from: all of ``run.train``, or with ``rl.questions``
    solved or band those it keeps (decided once, kept in the state: a resumed run keeps the
    questions it started with)."""
    rl = run.settings.rl
    if rl.questions == "all":
        return run.train
    if state.question_ids is None:
        state.question_ids = solved_ids(run) if rl.questions == "solved" else band_ids(run.settings, run.layout)
    kept = set(state.question_ids)
    train = [ex for ex in run.train if ex.id in kept]
    if train:
        return train
    if rl.questions == "solved":
        raise CorpusError(f"{rl.init_from} answers none of the train questions of hardness "
                          f"{', '.join(rl.hardness)} it was tried on (rl.questions: solved, "
                          f"rl.solved_candidates: {rl.solved_candidates}); raise rl.solved_candidates or "
                          "set rl.questions: all")
    raise CorpusError(f"none of the train questions scored in {rl.scores.out_dir} has a pass rate inside the band "
                      f"{rl.scores.low:g} < rate < {rl.scores.high:g} (rl.scores.low, rl.scores.high; "
                      f"{Path(rl.scores.out_dir) / SUMMARY_FILE} counts them by rate): widen the band, score more "
                      "questions (rl.scores.pool) or set rl.questions: all")


def solved_ids(run: RLRun) -> list[str]:
    """rl.questions solved: the ids of the candidates (``rl.solved_candidates`` of the train
    questions, a seeded sample) that the starting policy answers with one greedy output."""
    rl = run.settings.rl
    # the pass costs about as much as the eval of as many questions
    candidates = question_pool(run.train, rl.solved_candidates, rl.seed)
    with run.engine.gathered(), torch.no_grad():
        return solved_question_ids(run.settings, run.chat, run.layout, candidates,
                                   run.out / SOLVED_QUESTIONS_FILE if run.is_rank0 else None)


def solved_question_ids(settings: Settings, model: ChatModel, layout: CorpusLayout,
                        questions: list[Example], record_to: Path | None) -> list[str]:
    """The ids of ``questions`` that ``model`` answers right with one greedy output (the eval
    protocol: single turn, EX), for ``rl.questions: solved``. Rank 0 decides and the others
    take its answer (ranks must draw from the same questions); its verdicts go to
    ``record_to`` as predictions-file lines."""
    ids: list[Any] = [None]
    if rank() == 0:
        evals = greedy_answers(settings, model, layout.root, questions)
        ids[0] = [ev.example.id for ev in evals if ev.greedy is not None and ev.greedy.verdict.correct]
        if record_to is not None:
            write_json_lines(record_to, [ev.record() for ev in evals])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(ids, src=0)
    return list(ids[0])
