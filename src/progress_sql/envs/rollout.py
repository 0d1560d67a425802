"""Batched rollouts: many episodes stepped in lockstep, one ``policy.generate`` call per turn.

    envs = one fresh environment per example; reset each (gold results executed once per
           distinct (database, gold SQL), not once per rollout)
    while some episode is running:
        outputs = policy.generate([request of every running episode])   its conversation and episode id
        step each running episode with its output

An episode's turns do not depend on which others share its batch: running examples together
gives the same episodes as running each alone (the tests check this).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from progress_sql.corpus.records import Example
from progress_sql.envs.base import Env, Episode, Policy, output_text
from progress_sql.sql import GoldCache


def rollout(
    env_factory: Callable[[], Env],
    policy: Policy,
    examples: Sequence[Example],
    database: Callable[[str], str | os.PathLike],
    *,
    gold_cache: GoldCache | None = None,
) -> list[Episode]:
    """Run one episode per example (repeat an example G times for a GRPO group).

    ``env_factory()`` makes a fresh environment (``lambda: envs.get("odt_feedback")(settings)``);
    ``database(db_id)`` gives the SQLite file (``CorpusLayout(root).database``); gold results
    come from ``gold_cache`` (default: the process-wide one), so the G episodes of a question
    execute its gold once. Returns the episodes in input order; episode ``i`` (``Episode.id``)
    is the ``Request.episode_id`` of its generations, by which a policy keeps its own records
    (a ``TokenPolicy``'s token ids).
    """
    envs = [env_factory() for _ in examples]
    for i, (env, example) in enumerate(zip(envs, examples)):
        env.reset(example, Path(database(example.db_id)), gold_cache, episode_id=i)

    running = list(range(len(envs)))
    while running:
        outputs = list(policy.generate([envs[i].request() for i in running]))
        if len(outputs) != len(running):
            raise ValueError(f"policy returned {len(outputs)} outputs for {len(running)} conversations")
        for i, output in zip(running, outputs):
            envs[i].step(output_text(output))
        running = [i for i in running if not envs[i].done]
    return [env.episode for env in envs]
