"""The questions an RL run trains on: which of the train split (``rl_questions``: all of
``rl.hardness``, or with ``rl.questions: solved`` those the starting policy answers greedily) and
in which order (``next_questions``: a seeded permutation per epoch, replayed from the data
position alone, so a resumed run draws what the run it continues would have drawn).
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
from progress_sql.params import Settings
from progress_sql.train.distributed import rank, world_size
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


def next_questions(run: RLRun, train: list[Example], state: RLState) -> list[Example]:
    """This rank's questions of the next step, from ``train``: every rank draws the same global
    batch and takes its slice."""
    per_rank = run.settings.rl.questions_per_step
    global_idx = question_indices(len(train), state.data_position, per_rank * world_size(), run.settings.rl.seed)
    state.data_position += len(global_idx)
    return [train[i] for i in global_idx[rank() * per_rank:(rank() + 1) * per_rank]]


def rl_questions(run: RLRun, state: RLState) -> list[Example]:
    """The train questions a run draws from: all of ``run.train``, or with ``rl.questions:
    solved`` those the starting policy answers greedily (decided once, kept in the state)."""
    rl = run.settings.rl
    if rl.questions != "solved":
        return run.train
    if state.solved_ids is None:  # a resumed run keeps the questions it started with
        candidates = run.train
        if 0 < rl.solved_candidates < len(run.train):  # the pass costs about as much as the eval of as many
            picked = np.random.default_rng([rl.seed, len(run.train)]).choice(len(run.train), rl.solved_candidates,
                                                                            replace=False)
            candidates = [run.train[i] for i in sorted(picked)]
        with run.engine.gathered(), torch.no_grad():
            state.solved_ids = solved_question_ids(run.settings, run.chat, run.layout, candidates,
                                                   run.out / SOLVED_QUESTIONS_FILE if run.is_rank0 else None)
    kept = set(state.solved_ids)
    train = [ex for ex in run.train if ex.id in kept]
    if not train:
        raise CorpusError(f"{rl.init_from} answers none of the train questions of hardness "
                          f"{', '.join(rl.hardness)} it was tried on (rl.questions: solved, "
                          f"rl.solved_candidates: {rl.solved_candidates}); raise rl.solved_candidates or "
                          "set rl.questions: all")
    return train


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
