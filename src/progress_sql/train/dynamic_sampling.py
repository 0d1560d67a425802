"""A step's groups and which of them the update trains on (``rl.dynamic_sampling``: DAPO's
dynamic sampling, online difficulty filtering).

A group whose G episodes are all equally correct (``signal: ex``) or all equally rewarded
(``signal: reward``) has no signal: all right or all wrong, it says nothing about what to do
better. With dynamic sampling such groups are kept out of the update (sampled, scored, logged and
saved like the others, but no forward or backward pass runs over them), and the step draws more
questions, ``questions_per_step`` at a time, until ``questions_per_step`` groups have a signal or
``max_rounds`` draws were made. The first ``questions_per_step`` groups with a signal, in the
order drawn, are trained; a step that found none trains its first group (with equal rewards its
advantages are 0, so only a KL term moves the weights), so that every rank's update runs.

Both loops sample a step through ``sampled_step``: the synchronous one in the trainer, rl.async's
in each rank's rollout producer. Draw r of step s samples with the seed of (rl.seed, s, rank, r),
and the question stream advances by every draw the step could make (``questions.step_stride``):
the ranks, and the producers that cannot ask each other, agree on where the next step starts.
The ranks then agree on how many groups they train (``agree_on_groups``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from progress_sql.corpus.records import Example
from progress_sql.params import Settings
from progress_sql.train.questions import round_questions
from progress_sql.train.step_batch import StepBatch, joined

# (questions, draw, first group id) → that draw's groups
SampleDraw = Callable[[list[Example], int, int], StepBatch]


def group_signal(batch: StepBatch, rule: str, group_size: int) -> list[bool]:
    """Whether each group of ``batch`` (its episodes in groups of ``group_size``, in order) has a
    signal: its episodes differ in correctness (``rule`` ex) or in reward (reward)."""
    if rule == "ex":
        values: Sequence[object] = [ep.correct for ep in batch.episodes]
    else:
        values = [t.reward for t in batch.trajs]
    return [len(set(values[g:g + group_size])) > 1 for g in range(0, len(values), group_size)]


def sampled_step(settings: Settings, train: list[Example], position: int, sample: SampleDraw, rank: int,
                 world: int) -> StepBatch:
    """This rank's groups of the step whose question stream starts at ``position``: one draw, or
    with rl.dynamic_sampling as many as it takes (the module notes), the groups to train in
    ``train_groups``."""
    rl = settings.rl
    ds, per_rank = rl.dynamic_sampling, rl.questions_per_step
    draws: list[StepBatch] = []
    kept: list[int] = []
    for draw in range(ds.max_rounds if ds.enabled else 1):
        batch = sample(round_questions(train, position, draw, rl, rank, world), draw, draw * per_rank)
        draws.append(batch)
        kept += [draw * per_rank + g for g, signal in enumerate(group_signal(batch, ds.signal, rl.group_size))
                 if signal]
        if len(kept) >= per_rank:
            break
    step = joined(draws)
    if ds.enabled:
        step.train_groups = kept[:per_rank] or [0]
    return step


def agree_on_groups(settings: Settings, batch: StepBatch, device: torch.device) -> None:
    """With rl.dynamic_sampling and several ranks, each trains as many groups as the rank that kept
    fewest (the first of its own): ZeRO reduces gradients in every backward pass, so the ranks must
    run as many micro-batches (equal with rl.micro_batch_size), and a group weighs the same on
    every rank. Every rank calls it (an all-reduce)."""
    if not (settings.rl.dynamic_sampling.enabled and torch.distributed.is_available()
            and torch.distributed.is_initialized()) or batch.train_groups is None:
        return
    count = torch.tensor([len(batch.train_groups)], device=device)
    torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MIN)
    batch.train_groups = batch.train_groups[:int(count.item())]
