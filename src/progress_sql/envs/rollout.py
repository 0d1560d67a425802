"""Batched rollouts: many episodes stepped in lockstep, one ``policy.generate`` call per turn.

    envs = one fresh environment per example; reset each (gold results executed once per
           distinct (database, gold SQL), not once per rollout)
    while some episode is running:
        outputs = policy.generate([request of every running episode])   its conversation and episode id
        turns = the outputs judged in one batch                           each distinct query run once
        step each running episode with its output and its turn

An episode's turns do not depend on which others share its batch: running examples together
gives the same episodes as running each alone (the tests check this).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

from progress_sql.corpus.records import Example
from progress_sql.envs.base import Env, Episode, Policy, TokenRecorder, output_text
from progress_sql.rewards.turns import make_turns
from progress_sql.sql import BatchVerdicts


def rollout(
    env_factory: Callable[[], Env],
    policy: Policy,
    examples: Sequence[Example],
    database: Callable[[str], str | os.PathLike],
    *,
    judge: BatchVerdicts | None = None,
) -> list[Episode]:
    """Run one episode per example (repeat an example G times for a GRPO group).

    ``env_factory()`` makes a fresh environment (``lambda: envs.get("odt_feedback")(settings)``);
    ``database(db_id)`` gives the SQLite file (``CorpusLayout(root).database``). Each round's
    outputs are judged together by ``judge`` (default: one of the environments' sandbox limits,
    running queries in this process's supervised worker; evaluation passes its judge with a
    process pool), so the G episodes of a question run an SQL they share once and execute their
    gold once (the judge's gold cache). Returns the episodes in input order; episode ``i`` (``Episode.id``)
    is the ``Request.episode_id`` of its generations, by which a policy keeps its own records;
    a ``TokenRecorder``'s record of each episode comes with it (``Episode.tokens``).
    """
    envs = [env_factory() for _ in examples]
    if not envs:
        return []
    first = envs[0]
    if any(env.fmt != first.fmt or env.settings.sandbox != first.settings.sandbox for env in envs):
        raise ValueError("a rollout's environments must share one output format and sandbox (one env_factory)")
    judge = judge if judge is not None else BatchVerdicts(first.settings.sandbox)
    for i, (env, example) in enumerate(zip(envs, examples)):
        env.reset(example, Path(database(example.db_id)), judge.gold_cache, episode_id=i)

    running = list(range(len(envs)))
    while running:
        outputs = list(policy.generate([envs[i].request() for i in running]))
        if len(outputs) != len(running):
            raise ValueError(f"policy returned {len(outputs)} outputs for {len(running)} conversations")
        texts = [output_text(output) for output in outputs]
        turns = make_turns(texts, first.fmt, [envs[i].task() for i in running], judge)
        for i, text, turn in zip(running, texts, turns):
            envs[i].step(text, turn)
        running = [i for i in running if not envs[i].done]
    episodes = [env.episode for env in envs]
    if isinstance(policy, TokenRecorder):
        for episode in episodes:
            episode.tokens = policy.record(episode.id)
    return episodes
