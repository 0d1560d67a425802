"""One RL step's rollouts: G episodes of each question, sampled with a ``ChatModel``, scored by
the recipe, tokenised, with their group advantages (``StepBatch``). The synchronous loop samples
them in the trainer (``trainer.rollout_step``), the asynchronous one in the rollout producer's
process (``train.rollout_producer``); both through ``sample_step``, with the same seed a step
(with ``rl.dynamic_sampling``, a seed a draw of the step, joined into one batch: ``joined``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from progress_sql import envs, rewards
from progress_sql.corpus.records import Example
from progress_sql.inference.policy import ChatModel
from progress_sql.params import Settings
from progress_sql.train.losses import group_advantages
from progress_sql.train.trajectories import TokenizedTrajectory, tokenized_trajectory


def step_seed(seed: int, step: int, rank_: int = 0, round_: int = 0) -> int:
    """The generation seed of one step (and rank, and draw of the step: rl.dynamic_sampling):
    resume replays the same rollouts."""
    key = [seed, step, rank_] + ([round_] if round_ else [])  # the first draw keeps the seed steps always had
    return int(np.random.SeedSequence(key).generate_state(1)[0])


@dataclass
class StepBatch:
    """One step's rollouts: the episodes, their scores and token records, the advantages, and the
    groups the update trains on (``train_groups``, group ids; None: all of them)."""

    episodes: list[envs.Episode]
    scored: list[rewards.RewardOutput]
    trajs: list[TokenizedTrajectory]
    advantages: torch.Tensor
    rollout_s: float
    generate_s: float  # of rollout_s, in the backend's generate
    train_groups: list[int] | None = None  # rl.dynamic_sampling: those with signal (train.dynamic_sampling)

    def trained(self) -> list[int]:
        """The indices of the trajectories the update trains on."""
        if self.train_groups is None:
            return list(range(len(self.trajs)))
        kept = set(self.train_groups)
        return [i for i, t in enumerate(self.trajs) if t.group_id in kept]


def joined(batches: Sequence[StepBatch]) -> StepBatch:
    """The draws of one step as one batch (their group ids already distinct: ``sample_step``'s
    ``first_group``), timed as their sum."""
    if len(batches) == 1:
        return batches[0]
    return StepBatch([ep for b in batches for ep in b.episodes], [r for b in batches for r in b.scored],
                     [t for b in batches for t in b.trajs], torch.cat([b.advantages for b in batches]),
                     sum(b.rollout_s for b in batches), sum(b.generate_s for b in batches))


def sample_step(settings: Settings, chat: ChatModel, recipe: rewards.Recipe, judge: Any,
                env_factory: Callable[[], envs.Env], database: Callable[[str], Any], questions: Sequence[Example],
                *, seed: int, max_tokens: int, first_group: int = 0) -> StepBatch:
    """G episodes of each of ``questions`` in order (``rl.group_size``; the episodes of a question
    are one group, ``group_id`` ``first_group`` + its place in ``questions``), sampled with ``chat`` under ``seed``
    (no gradient; the caller has the weights in place and the model in eval mode), scored by
    ``recipe``, tokenised up to ``max_tokens``, with their group advantages."""
    rl = settings.rl
    started = time.monotonic()
    policy = chat.policy(recipe.fmt, max_tokens=max_tokens, seed=seed)
    with torch.no_grad(), chat.backend.reusing_prefixes():
        episodes = envs.rollout(env_factory, policy, [q for q in questions for _ in range(rl.group_size)], database)
    rollout_s = time.monotonic() - started
    scored = [recipe(ep.trajectory(), settings, judge=judge) for ep in episodes]
    trajs = [tokenized_trajectory(ep, r.total, first_group + i // rl.group_size, max_tokens)
             for i, (ep, r) in enumerate(zip(episodes, scored))]
    adv = group_advantages([t.reward for t in trajs], [t.group_id for t in trajs], rl.adv_eps,
                           scale_std=rl.spec.scale_std, negative_scale=rl.negative_advantage_scale)
    return StepBatch(episodes, scored, trajs, adv, rollout_s, policy.generate_s)
