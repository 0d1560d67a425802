"""The RL trainer: multi-turn GRPO / GSPO / Dr.GRPO over the rollout environments.

The whole loop is ``run_rl``, one screen per phase (nano-aha-moment style):

    train      ← the train questions of rl.hardness; with rl.questions solved, only those of
                 rl.solved_candidates of them that the starting policy answers with one greedy
                 output; with band, those whose pass rate, scored before the run (rl.scores:
                 `progress-sql train score`), lies inside the band (either kept in the checkpoints)
    for step in 1..rl.steps (or until rl.max_minutes, which also covers that greedy pass and the checks):
        questions  ← the next questions_per_step questions of train (a seeded permutation
                     per epoch)
        episodes   ← envs.rollout(rl.env, ChatModel.policy, every question × G)   model in eval mode;
                     each conversation's KV cache kept between its turns (backend.reusing_prefixes)
        rewards    ← rewards.get(rl.recipe)(episode.trajectory())
        advantages ← per group of G: (r − mean)/(std + ε)   (Dr.GRPO: r − mean); negative ones
                     × rl.negative_advantage_scale
        rl.dynamic_sampling: groups without signal (G episodes equally correct) left out of the
                     update; questions_per_step more questions drawn, up to max_rounds draws,
                     until questions_per_step groups have one (train.dynamic_sampling)
        old logp   ← the current policy's own (detached: one update per batch), or one no-grad
                     forward of the same micro-batches before the first update (several passes)
        for pass in 1..updates_per_batch:                                      model in train mode
            for micro-batch (by length; rl.micro_batch_tokens or rl.micro_batch_size):
                loss share → backward → engine.step()                    (updates after the last)
        rl.check: every rl.check.every steps and the last, greedy EX on questions RL never draws
                     (check/ex; train.check), the best check's policy kept (rl.check.final best)
        metrics → metrics.jsonl, on_step, progress bar; checkpoint every checkpoint_every steps
    final policy → <out>/final (save_pretrained + tokenizer): the last, or the best check's

Old log-probabilities come from the trainer's forward, not from the sampler: the sampler's come
from a left-padded KV-cached decode (vLLM: another kernel, maybe bf16) and differ in the last
digits, so the first pass would not be exactly on-policy and clipping would fire on noise. With
one update per batch the loss's own forward, detached, is the old policy (the weights only move
at the batch's end), which saves a forward pass; with several passes one no-grad forward before
the first update gives them. Either way the ratio of pass 1 is 1 exactly; the sampler's values
are kept for the ``logprob_gap`` metric (at temperature 1). Every trainer-side pass (the loss's,
the old policy's, the KL reference's) runs at the engine's precision (``rl.autocast``: bf16
autocast where the device has it), so no ratio or KL compares two precisions; only the sampler's
values (``logprob_gap``, and with ``rl.async`` the behaviour policy of the importance weights)
come from another. Logits are computed only from the
first scored position on (the prompt's vocabulary projection is never trained).
Dropout is switched off in the policy, so eval-mode sampling and train-mode training see the
same function.

Around the loop: ``train.rl_run`` opens the run (``RLRun``: policy, engine, sampler, reward,
environments), ``train.questions`` picks and orders its questions, ``train.resume`` holds its
state (``RLState``) and decides whether it goes on from a checkpoint, ``train.step_batch`` samples
a step's groups, ``train.dynamic_sampling`` draws them and picks those the update trains on,
``train.check`` checks the policy on unseen questions and keeps the best. With ``rl.async`` a
producer process (``train.rollout_producer``) samples the next steps while the loop updates,
with weights at most ``rl.async.max_staleness`` updates old;
the update then takes the old log-probabilities as the proximal policy (recomputed as above) and
weights each token by its truncated importance weight to the sampler's (``train.losses``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from progress_sql import envs, rewards
from progress_sql.corpus.records import CorpusLayout, Example
from progress_sql.eval.metrics import second_turn_counts
from progress_sql.files import write_json_lines
from progress_sql.inference.lora import merged_weights
from progress_sql.params import RLSettings, Settings
from progress_sql.train.check import BEST_DIR, check_questions, check_step, due, final_origin, keep_only_best
from progress_sql.train.checkpoint import save_checkpoint
from progress_sql.train.distributed import rank, world_size
from progress_sql.train.dynamic_sampling import agree_on_groups, group_signal, sampled_step
from progress_sql.train.logprobs import token_logprobs
from progress_sql.train.lora import adapters_disabled
from progress_sql.train.losses import grpo_loss, gspo_loss
from progress_sql.train.packing import TokenBatch, micro_batches, token_batch
from progress_sql.train.questions import SOLVED_QUESTIONS_FILE, rl_questions, step_stride
from progress_sql.train.resume import RLState, resumed_state
from progress_sql.train.rl_run import RLRun, open_run
from progress_sql.train.rollout_producer import ProducerSpec, RolloutProducer
from progress_sql.train.step_batch import StepBatch, sample_step, step_seed
from progress_sql.train.samples import episode_view, spread
from progress_sql.train.trajectories import TokenizedTrajectory


@dataclass
class RLResult:
    """``final_dir``: the trained policy (``save_pretrained`` + tokenizer); ``steps``: the last
    step done; ``stopped_by``: ``steps`` or ``time``; ``metrics``: one dict per step."""

    out_dir: Path
    final_dir: Path
    steps: int
    stopped_by: str
    metrics: list[dict[str, Any]] = field(default_factory=list)
    last_checkpoint: Path | None = None
    questions: int = 0  # train questions drawn from (rl.hardness, rl.questions)
    start: str = ""  # resume="auto": where the run started and why
    final_from: dict[str, Any] = field(default_factory=dict)  # which policy final is (rl.check.final; rl_run.json)


# ----------------------------------------------------------------------------- helpers
def micro_batch_loss(
    forward: Any,
    batch: TokenBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    rl: RLSettings,
    *,
    temperature: float,
    num_sequences: int,
    num_tokens: float,
    max_tokens: int,
    off_policy: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the batch loss (``rl.algorithm``), and its stats.
    ``off_policy`` (rl.async): ``old_logp`` is the proximal policy and the batch's sampler
    log-probabilities the behaviour policy of the decoupled objective (``train.losses``)."""
    logp = token_logprobs(forward, batch, temperature=temperature, chunk_mb=rl.logits_chunk_mb)
    if old_logp is None:  # one update per batch: the weights have not moved since sampling
        old_logp = logp.detach()
    common: dict[str, Any] = dict(clip_eps=rl.clip_eps, clip_eps_high=rl.clip_eps_high, beta=rl.kl_beta)
    if off_policy:
        common.update(behaviour_logp=batch.sampler_logp, is_cap=rl.async_.is_cap)
    if rl.spec.ratio == "sequence":
        loss, stats = gspo_loss(logp, old_logp, ref_logp, advantages, batch.seq, **common,
                                num_sequences=num_sequences)
    else:
        loss, stats = grpo_loss(logp, old_logp, ref_logp, advantages, batch.seq, **common,
                                aggregation=rl.aggregation, num_sequences=num_sequences, num_tokens=num_tokens,
                                max_tokens=max_tokens)
    # |trainer − sampler| log-prob summed over scored tokens (the logprob_gap metric)
    stats["sampler_gap"] = float((old_logp - batch.sampler_logp).abs().sum())
    return loss, stats


def _episode_record(ep: envs.Episode, traj: TokenizedTrajectory, out: rewards.RewardOutput, trained: bool
                    ) -> dict[str, Any]:
    return {"example_id": ep.example.id, "db_id": ep.example.db_id, "group": traj.group_id,
            "reward": out.total, "components": out.components, "k_star": ep.k_star, "correct": ep.correct,
            "turns": ep.K, "texts": [t.text for t in ep.turns], "trained": trained,
            "input_ids": traj.input_ids, "loss_mask": traj.loss_mask, "truncated": traj.truncated}


# ----------------------------------------------------------------------------- the step
def start_or_resume(run: RLRun, resume: bool | str | Path) -> tuple[RLState, str]:
    """The state to start from: a checkpoint's (``run_rl``'s ``resume``: ``train.resume``) or
    step 0, clearing what an earlier run left in ``run.out``; and, for ``resume="auto"``, a line
    saying which."""
    out = run.out
    state, start = resumed_state(run.engine, out, resume, run.fingerprint, run.settings.rl.steps)
    if state is not None:
        with run.engine.gathered():
            run.backend.sync_weights(run.engine.module)
        keep_only_best(run, state)  # rl.check: the best policy the checkpoint knows, no later one
    else:
        state = RLState()
        if run.is_rank0:  # a fresh run: nothing of an earlier run in out_dir may be mistaken for this one's
            for stale in ("checkpoints", "rollouts", "final", BEST_DIR):
                shutil.rmtree(out / stale, ignore_errors=True)
            (out / SOLVED_QUESTIONS_FILE).unlink(missing_ok=True)
    if run.is_rank0:
        out.mkdir(parents=True, exist_ok=True)
        write_json_lines(out / "metrics.jsonl", state.history)  # drop lines past the checkpoint
    return state, start


def rollout_step(run: RLRun, train: list[Example], state: RLState) -> StepBatch:
    """Step ``state.step``'s groups from the next questions of ``train`` (eval mode; ZeRO-3
    gathers the full weights for the sampler): G episodes of each question, scored by the
    recipe, tokenised, with their group advantages (``train.step_batch``); with
    rl.dynamic_sampling, drawn until enough groups have a signal (``train.dynamic_sampling``).
    The data position moves past the step."""
    s = run.settings

    def sample(questions: list[Example], draw: int, first_group: int) -> StepBatch:
        return sample_step(s, run.chat, run.recipe, run.judge, run.env_factory, run.layout.database, questions,
                           seed=step_seed(s.rl.seed, state.step, rank(), draw), max_tokens=run.max_tokens,
                           first_group=first_group)

    run.engine.module.eval()
    with run.engine.gathered():
        batch = sampled_step(s, train, state.data_position, sample, rank(), world_size())
    state.data_position += step_stride(s.rl, world_size())
    return batch


def optimise(run: RLRun, batch: StepBatch, producer: RolloutProducer | None = None, version: int = 0
             ) -> dict[str, Any]:
    """``rl.updates_per_batch`` passes over the batch's micro-batches (train mode), the sampler
    asleep (vLLM on a GPU frees its memory for the update); then the sampler wakes and takes the
    new weights. The loss statistics, token-weighted over the passes. With a ``producer``
    (rl.async) the loss is the decoupled one, its importance-weight statistics added (``is_*``,
    of the first pass), and the new weights go to the producer as ``version``."""
    rl, gen, engine = run.settings.rl, run.settings.generation, run.engine
    started = time.monotonic()
    share = rl.packing and rl.shared_prefix  # a group's prompt runs once in its micro-batch
    trajs, tokens, advantages = update_batches(run, batch, share)
    num_tokens = float(sum(t.sampled_tokens for t in trajs))
    stats = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "ratio": 0.0, "sampler_gap": 0.0, "lr": engine.lr}
    weighed = 0.0
    if producer is not None:
        stats.update(is_mean=0.0, is_max=0.0, is_truncated=0.0)
    with run.backend.asleep():
        engine.module.train()
        with torch.no_grad():
            # With one update per batch the loss's own forward gives the old log-probs (the
            # weights do not change before the step): no extra forward pass.
            old = ([None] * len(tokens) if rl.updates_per_batch == 1 else
                   [token_logprobs(engine, b, temperature=gen.temperature, chunk_mb=rl.logits_chunk_mb)
                    for b in tokens])
            refs = [reference_logprobs(run, b) for b in tokens]
        for update in range(rl.updates_per_batch):
            for k, (b, adv, old_logp, ref_logp) in enumerate(zip(tokens, advantages, old, refs)):
                loss, mb = micro_batch_loss(engine, b, adv, old_logp, ref_logp, rl, temperature=gen.temperature,
                                            num_sequences=len(trajs), num_tokens=num_tokens,
                                            max_tokens=run.max_turns * gen.max_new_tokens,  # Dr.GRPO's constant
                                            off_policy=producer is not None)
                engine.backward(loss, last=k == len(tokens) - 1)
                engine.step()
                stats["loss"] += float(loss.detach()) / rl.updates_per_batch
                for key in ("clip_frac", "kl", "ratio"):
                    stats[key] += mb[key] * mb["tokens"] / max(num_tokens, 1.0) / rl.updates_per_batch
                if update == 0:
                    stats["sampler_gap"] += mb["sampler_gap"]
                if update == 0 and producer is not None:  # the weights to the behaviour policy do not change
                    weighed += mb["is_count"]  # tokens (GSPO: sequences)
                    stats["is_mean"] += mb["is_mean"] * mb["is_count"]
                    stats["is_truncated"] += mb["is_truncated"] * mb["is_count"]
                    stats["is_max"] = max(stats["is_max"], mb["is_max"])
        updated = time.monotonic()
    if producer is not None:
        stats["is_mean"] /= max(weighed, 1.0)
        stats["is_truncated"] /= max(weighed, 1.0)
    with engine.gathered():
        if producer is None:
            run.backend.sync_weights(engine.module)
        else:
            producer.publish(engine.module, version)
    model_tokens = sum(b.model_tokens for b in tokens)
    stats.update(grad_norm=engine.grad_norm, micro_batches=len(tokens), update_s=time.monotonic() - started,
                 sync_s=time.monotonic() - updated, num_tokens=num_tokens, update_tokens=model_tokens,
                 padding=sum(b.pad_tokens for b in tokens) / max(model_tokens, 1),
                 shared=1.0 - model_tokens / max(sum(b.real_tokens for b in tokens), 1) if share else 0.0,
                 freed_gib=run.backend.freed_gib)
    return stats


def update_batches(run: RLRun, batch: StepBatch, share: bool
                   ) -> tuple[list[TokenizedTrajectory], list[TokenBatch], list[torch.Tensor]]:
    """The trajectories the update trains on (``StepBatch.trained``; with rl.dynamic_sampling as
    many groups on every rank: an all-reduce), their micro-batches on the engine's device (by
    length: rl.micro_batch_tokens or rl.micro_batch_size; ``share``: a group's prompt once in its
    micro-batch) and their advantages."""
    rl, device = run.settings.rl, run.engine.device
    agree_on_groups(run.settings, batch, device)
    trained = batch.trained()
    trajs, advantages = [batch.trajs[i] for i in trained], batch.advantages[trained]
    chunks = micro_batches([len(t.input_ids) for t in trajs], rl.micro_batch_size, rl.micro_batch_tokens,
                           packed=rl.packing, groups=[t.group_id for t in trajs] if share else None)
    tokens = [token_batch([trajs[i] for i in c], packed=rl.packing, pad_id=int(run.chat.tokenizer.pad_token_id),
                          device=device, share_prefix=share, min_shared=rl.shared_prefix_min_tokens,
                          query_block=rl.attention_query_block) for c in chunks]
    return trajs, tokens, [advantages[c].to(device) for c in chunks]


def reference_logprobs(run: RLRun, batch: TokenBatch) -> torch.Tensor | None:
    """The KL reference's log-probabilities of ``batch``'s scored tokens (None when rl.kl_beta is
    0): the frozen starting policy, or with LoRA the policy with its adapters disabled. At the
    policy's precision (the engine's autocast, ``rl.autocast``): a reference in fp32 against a
    policy in bf16 would show a KL of bf16's rounding before any update."""
    rl, gen = run.settings.rl, run.settings.generation
    if rl.kl_beta <= 0:
        return None
    if run.reference is not None:
        with run.engine.autocast():
            return token_logprobs(run.reference, batch, temperature=gen.temperature, chunk_mb=rl.logits_chunk_mb)
    with adapters_disabled(run.engine.module):
        return token_logprobs(run.engine, batch, temperature=gen.temperature, chunk_mb=rl.logits_chunk_mb)


def step_metrics(run: RLRun, step: int, batch: StepBatch, opt: dict[str, Any]) -> dict[str, Any]:
    """The line of ``metrics.jsonl`` for one step (less its timing of the whole step). Its
    rewards, EX and lengths are of every group drawn; loss, KL and the update's sizes of the
    groups trained (rl.dynamic_sampling keeps those without signal out)."""
    G, eps, trajs = run.settings.rl.group_size, batch.episodes, batch.trajs  # noqa: N806 - the paper's G
    totals = np.array([t.reward for t in trajs])
    sampled = np.array([t.sampled_tokens for t in trajs])
    trained = set(batch.train_groups) if batch.train_groups is not None else set(range(len(trajs) // G))
    rewards_differ = group_signal(batch, "reward", G)
    metrics: dict[str, Any] = {
        "step": step,
        "reward/mean": float(totals.mean()),
        "reward/std": float(totals.std()),
        **{f"reward/{c}": float(np.mean([r.components[c] for r in batch.scored])) for c in run.recipe.components},
        "ex": float(np.mean([ep.correct for ep in eps])),
        # groups whose G rollouts differ in correctness: the only ones that teach it
        "groups/mixed_ex": float(np.mean([0 < sum(ep.correct for ep in eps[g:g + G]) < G
                                          for g in range(0, len(eps), G)])),
        "groups/drawn": float(len(rewards_differ)),  # rl.dynamic_sampling: more than questions_per_step
        "groups/signal": float(sum(group_signal(batch, run.settings.rl.dynamic_sampling.signal, G))),
        "episodes/updated": float(len(trained) * G),  # the episodes the update trained on
        # of those, the ones in a group whose rewards differ (the others' advantages are 0)
        "episodes/useful": float(sum(G for g, differ in enumerate(rewards_differ) if differ and g in trained)),
        **{f"ex@{t}": float(np.mean([ep.k_star is not None and ep.k_star <= t for ep in eps]))
           for t in range(1, run.max_turns + 1)},
        "turns/mean": float(np.mean([ep.K for ep in eps])),
        **{f"turn2/{k}": v for k, v in second_turn_counts(ep.turns for ep in eps).items()},  # fixes, repeats
        "response_tokens/mean": float(sampled.mean()),
        "sequence_tokens/mean": float(np.mean([len(t.input_ids) for t in trajs])),
        "truncated": float(np.mean([t.truncated for t in trajs])),
        **{k: opt[k] for k in ("loss", "kl", "clip_frac", "ratio", "grad_norm", "lr")},
        "tokens_per_s": float(sampled.sum() / max(batch.rollout_s, 1e-9)),
        "rollout_s": batch.rollout_s,
        "generate_s": batch.generate_s,  # of rollout_s, in the backend's generate
        "update_s": opt["update_s"],  # the optimisation passes and the weight sync
        "sync_s": opt["sync_s"],  # of update_s, waking the sampler and loading the new weights into it
        "micro_batches": opt["micro_batches"],
        "update_tokens": opt["update_tokens"],  # positions the update's forward passes ran over
        "padding": opt["padding"],  # of those, the share that were padding (0 when packed)
        "shared_prefix": opt["shared"],  # of the trajectories' tokens, the share a shared prompt saved
        "sampler/freed_gib": opt["freed_gib"],  # device memory the sampler freed for the update (vLLM asleep)
    }
    if run.judge is not None:  # a judge that fails scores 0 and the step goes on: count both
        statuses = [str(r.info.get("judge", "")) for r in batch.scored]
        metrics["judge/asked"] = float(sum(s == "asked" for s in statuses))
        metrics["judge/failed"] = float(sum(s.startswith("judge failed") for s in statuses))
    if run.settings.generation.temperature == 1.0:  # the sampler reports temperature-1 log-probs
        metrics["logprob_gap"] = opt["sampler_gap"] / max(opt["num_tokens"], 1.0)
    return metrics


def record_step(run: RLRun, step: int, metrics: dict[str, Any], batch: StepBatch,
                on_step: Callable[[int, dict[str, Any]], None] | None,
                on_episodes: Callable[[int, list[dict[str, Any]]], None] | None) -> None:
    """Rank 0 appends the step's metrics line and, with ``rl.save_rollouts``, its rollouts; then
    calls ``on_step`` and ``on_episodes`` (``rl.log_episodes`` episodes, spread over the rewards)."""
    if not run.is_rank0:
        return
    rl = run.settings.rl
    write_json_lines(run.out / "metrics.jsonl", [metrics], append=True)
    if rl.save_rollouts:
        name = f"step-{step}.jsonl" if world_size() == 1 else f"step-{step}.rank-{rank()}.jsonl"
        trained = set(batch.trained())
        write_json_lines(run.out / "rollouts" / name,
                         [_episode_record(ep, t, r, i in trained)
                          for i, (ep, t, r) in enumerate(zip(batch.episodes, batch.trajs, batch.scored))])
    if on_step is not None:
        on_step(step, metrics)
    if on_episodes is not None and rl.log_episodes:
        on_episodes(step, [episode_view(batch.episodes[i], batch.scored[i], run.recipe, run.settings, step)
                           for i in spread([t.reward for t in batch.trajs], rl.log_episodes)])


def save_final(run: RLRun, state: RLState, stopped_by: str, train: list[Example], train_s: float
               ) -> tuple[Path, dict[str, Any]]:
    """The trained policy in ``<out>/final`` (``save_pretrained`` + tokenizer, ``rl_run.json``):
    the last one, or with rl.check.final best the best check's (``train.check``; rl_run.json's
    ``final`` says which, with the check figures). Written under a temporary name and renamed
    when complete: a full disk leaves no half policy where ``eval`` would load it."""
    final, partial = run.out / "final", run.out / ".final.partial"
    if run.is_rank0:
        shutil.rmtree(partial, ignore_errors=True)
    best, origin = final_origin(run, state)
    if best is None:
        run.engine.module.eval()
        run.engine.save_pretrained(partial, run.chat.tokenizer)
    elif run.is_rank0:
        shutil.copytree(best, partial)
    if run.is_rank0:
        summary = {"steps": state.step, "stopped_by": stopped_by, "engine": run.engine.kind,
                   "zero_stage": run.engine.zero_stage, "questions": len(train), "questions_s": train_s,
                   "rl": run.settings.rl.model_dump(), "last": state.history[-1] if state.history else {},
                   "final": origin}
        (partial / "rl_run.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    return final, origin


# ----------------------------------------------------------------------------- rl.async
def start_producer(run: RLRun, state: RLState, train: list[Example], resources: contextlib.ExitStack
                   ) -> RolloutProducer:
    """The rollout producer of this run (``train.rollout_producer``), from the next step at the
    state's data position, with the trainer's weights as version ``state.step`` (a resumed run
    starts it at the checkpoint's: what an earlier producer had sampled beyond it is gone);
    closed however the run ends."""
    with run.engine.gathered():
        weights = merged_weights(run.engine.module)
    spec = ProducerSpec(run.settings, str(run.layout.root), train, state.step + 1, state.data_position, rank(),
                        world_size())
    producer = RolloutProducer(spec, weights, version=state.step, trainer_device=run.engine.device)
    resources.callback(producer.close)
    return producer


def async_step(run: RLRun, producer: RolloutProducer, state: RLState) -> tuple[StepBatch, dict[str, Any]]:
    """Step ``state.step`` with rl.async: the producer's batch of this step (sampled with weights
    at most rl.async.max_staleness updates old), the decoupled update, the new weights to the
    producer; its metrics with the ``async/`` ones."""
    waited = time.monotonic()
    produced = producer.next_batch(state.step, trained_version=state.step - 1)
    wait_s = time.monotonic() - waited
    state.data_position = produced.data_position
    batch = produced.step_batch()
    opt = optimise(run, batch, producer, version=state.step)
    metrics = step_metrics(run, state.step, batch, opt)
    staleness = float(state.step - 1 - produced.version)  # one version a batch: each episode's staleness
    metrics.update({
        "async/staleness_mean": staleness, "async/staleness_max": staleness,
        "async/is_mean": opt["is_mean"], "async/is_max": opt["is_max"], "async/is_truncated": opt["is_truncated"],
        "async/wait_s": wait_s,  # the trainer idle, waiting for this batch
        "async/producer_sync_s": produced.sync_s,  # the producer loading the weights it sampled with
    })
    return batch, metrics


# ----------------------------------------------------------------------------- the loop
def train_step(run: RLRun, train: list[Example], state: RLState, producer: RolloutProducer | None
               ) -> tuple[StepBatch, dict[str, Any]]:
    """Step ``state.step``: its rollouts of the next questions of ``train`` (rl.async: the
    producer's batch), the update, and the step's metrics with its timing."""
    started = time.monotonic()
    if producer is None:
        batch = rollout_step(run, train, state)
        metrics = step_metrics(run, state.step, batch, optimise(run, batch))
    else:
        batch, metrics = async_step(run, producer, state)
    metrics["step_s"] = time.monotonic() - started
    metrics["trajectories_per_s"] = len(batch.trajs) / max(metrics["step_s"], 1e-9)
    metrics["episodes/useful_per_min"] = metrics["episodes/useful"] / max(metrics["step_s"] / 60, 1e-9)
    return batch, metrics


def run_rl(
    settings: Settings,
    corpus_dir: str | Path,
    *,
    out_dir: str | Path | None = None,
    resume: bool | str | Path = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_episodes: Callable[[int, list[dict[str, Any]]], None] | None = None,
) -> RLResult:
    """Train ``settings.rl.init_from`` with RL on the train split of ``corpus_dir``.

    ``out_dir`` (default ``rl.out_dir``) receives ``metrics.jsonl``, ``rollouts/step-N.jsonl``
    (when ``rl.save_rollouts``), ``checkpoints/step-N`` and ``final/``. ``resume``: False starts
    afresh (clearing earlier checkpoints, metrics and rollouts there); True continues from the
    newest checkpoint in ``out_dir`` (afresh when there is none); ``"auto"`` too, but only when
    that checkpoint has this run's ``run_fingerprint`` (else afresh; ``RLResult.start`` says
    which and why); a path continues from that checkpoint. Each checkpoint records the
    fingerprint. ``on_step(step, metrics)`` is called after every step (e.g. MLflow logging),
    ``on_episodes(step, views)`` with ``rl.log_episodes`` of its episodes turn by turn
    (``train.samples``; the train stage logs them to MLflow).
    The generation backend and the engine are closed however the run ends: a vLLM engine's
    processes stop, and a process group the run opened is destroyed.
    """
    rl, layout = settings.rl, CorpusLayout(Path(corpus_dir))
    out = Path(out_dir if out_dir is not None else rl.out_dir)
    checked = check_questions(settings, layout)  # rl.check's questions (none when off): a missing split fails first
    with contextlib.ExitStack() as resources:
        run = open_run(settings, layout, out, resources)
        state, start = start_or_resume(run, resume)
        started = time.monotonic()  # rl.max_minutes covers rl.questions' greedy pass and rl.check too
        train = rl_questions(run, state)
        train_s = time.monotonic() - started
        producer = start_producer(run, state, train, resources) if rl.async_.enabled else None  # rl.async
        bar = tqdm(total=rl.steps, initial=state.step, disable=not (progress and run.is_rank0), desc="rl", unit="step")
        stopped_by = "steps"
        while state.step < rl.steps:
            state.step += 1
            batch, metrics = train_step(run, train, state, producer)
            # rank 0's decision on every rank: the time budget stops all ranks together, after the step
            out_of_time = run.engine.broadcast_flag(time.monotonic() - started > rl.max_minutes * 60)
            if due(rl, state.step, last=out_of_time or state.step == rl.steps):
                metrics.update(check_step(run, state, checked))
            state.history.append(metrics)
            record_step(run, state.step, metrics, batch, on_step, on_episodes)
            bar.update(1)  # rank 0's bar (the others' is disabled)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", ex=f"{metrics['ex']:.2f}", loss=f"{metrics['loss']:.4f}")
            if out_of_time and state.step < rl.steps:
                stopped_by = "time"
            if state.step % rl.checkpoint_every == 0 or state.step == rl.steps or out_of_time:
                state.checkpoint = save_checkpoint(run.engine, out, state.step, state.saved(run.fingerprint),
                                                   rl.keep_checkpoints)
                keep_only_best(run, state)  # the checkpoint records the best check: older bests go
            if out_of_time:
                break
        bar.close()
        final, final_from = save_final(run, state, stopped_by, train, train_s)
    return RLResult(out, final, state.step, stopped_by, state.history, state.checkpoint, questions=len(train),
                    start=start, final_from=final_from)
