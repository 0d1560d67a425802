"""One RL step's rollouts: G episodes of each question, sampled with a ``ChatModel``, scored by
the recipe, tokenised, with their group advantages (``StepBatch``). The synchronous loop samples
them in the trainer (``trainer.rollout_step``), the asynchronous one in the rollout producer's
process (``train.rollout_producer``); both through ``sample_step``, with the same seed a step.
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


def step_seed(seed: int, step: int, rank_: int = 0) -> int:
    """The generation seed of one step (and rank): resume replays the same rollouts."""
    return int(np.random.SeedSequence([seed, step, rank_]).generate_state(1)[0])


@dataclass
class StepBatch:
    """One step's rollouts: the episodes, their scores and token records, the advantages."""

    episodes: list[envs.Episode]
    scored: list[rewards.RewardOutput]
    trajs: list[TokenizedTrajectory]
    advantages: torch.Tensor
    rollout_s: float
    generate_s: float  # of rollout_s, in the backend's generate


def sample_step(settings: Settings, chat: ChatModel, recipe: rewards.Recipe, judge: Any,
                env_factory: Callable[[], envs.Env], database: Callable[[str], Any], questions: Sequence[Example],
                *, seed: int, max_tokens: int) -> StepBatch:
    """G episodes of each of ``questions`` in order (``rl.group_size``; the episodes of a question
    are one group, ``group_id`` its place in ``questions``), sampled with ``chat`` under ``seed``
    (no gradient; the caller has the weights in place and the model in eval mode), scored by
    ``recipe``, tokenised up to ``max_tokens``, with their group advantages."""
    rl = settings.rl
    started = time.monotonic()
    policy = chat.policy(recipe.fmt, max_tokens=max_tokens, seed=seed)
    with torch.no_grad(), chat.backend.reusing_prefixes():
        episodes = envs.rollout(env_factory, policy, [q for q in questions for _ in range(rl.group_size)], database)
    rollout_s = time.monotonic() - started
    scored = [recipe(ep.trajectory(), settings, judge=judge) for ep in episodes]
    trajs = [tokenized_trajectory(ep, r.total, i // rl.group_size, max_tokens)
             for i, (ep, r) in enumerate(zip(episodes, scored))]
    adv = group_advantages([t.reward for t in trajs], [t.group_id for t in trajs], rl.adv_eps,
                           scale_std=rl.spec.scale_std, negative_scale=rl.negative_advantage_scale)
    return StepBatch(episodes, scored, trajs, adv, rollout_s, policy.generate_s)
