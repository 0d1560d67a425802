"""The RL trainer: multi-turn GRPO / GSPO / Dr.GRPO over the rollout environments.

The whole loop is ``run_rl``, one screen per phase (nano-aha-moment style):

    train      ← the train questions of rl.hardness; with rl.questions solved, only those of
                 rl.solved_candidates of them that the starting policy answers with one greedy
                 output (kept in the checkpoints)
    for step in 1..rl.steps (or until rl.max_minutes, which also covers that greedy pass):
        questions  ← the next questions_per_step questions of train (a seeded permutation
                     per epoch)
        episodes   ← envs.rollout(rl.env, ChatModel.policy, every question × G)   model in eval mode;
                     each conversation's KV cache kept between its turns (backend.reusing_prefixes)
        rewards    ← rewards.get(rl.recipe)(episode.trajectory())
        advantages ← per group of G: (r − mean)/(std + ε)   (Dr.GRPO: r − mean); negative ones
                     × rl.negative_advantage_scale
        old logp   ← the current policy's own (detached: one update per batch), or one no-grad
                     forward of the same micro-batches before the first update (several passes)
        for pass in 1..updates_per_batch:                                      model in train mode
            for micro-batch (by length; rl.micro_batch_tokens or rl.micro_batch_size):
                loss share → backward → engine.step()                    (updates after the last)
        metrics → metrics.jsonl, on_step, progress bar; checkpoint every checkpoint_every steps
    final policy → <out>/final (save_pretrained + tokenizer)

Old log-probabilities come from the trainer's forward, not from the sampler: the sampler's come
from a left-padded KV-cached decode (vLLM: another kernel, maybe bf16) and differ in the last
digits, so the first pass would not be exactly on-policy and clipping would fire on noise. With
one update per batch the loss's own forward, detached, is the old policy (the weights only move
at the batch's end), which saves a forward pass; with several passes one no-grad forward before
the first update gives them. Either way the ratio of pass 1 is 1 exactly; the sampler's values
are kept for the ``logprob_gap`` metric (at temperature 1). Logits are computed only from the
first scored position on (the prompt's vocabulary projection is never trained).
Dropout is switched off in the policy, so eval-mode sampling and train-mode training see the
same function.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm import tqdm

from progress_sql import envs, rewards
from progress_sql.config import RLSettings, Settings, dotted_items
from progress_sql.corpus.integrity import sha256_file
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, read_jsonl
from progress_sql.envs.db_details import SchemaTexts
from progress_sql.eval.runner import greedy_answers
from progress_sql.files import write_json_lines
from progress_sql.inference.backends import GenerationBackend, make_backend
from progress_sql.inference.models import load_policy
from progress_sql.inference.policy import ChatModel
from progress_sql.train.checkpoint import (
    STATE_FILE,
    list_checkpoints,
    resume_checkpoint,
    save_checkpoint,
)
from progress_sql.train.distributed import Engine, make_engine, prepare_environment, rank, use_deepspeed, world_size
from progress_sql.train.logprobs import token_logprobs
from progress_sql.train.lora import adapters_disabled, adapts_tied_head, with_lora
from progress_sql.train.losses import group_advantages, grpo_loss, gspo_loss
from progress_sql.train.packing import TokenBatch, micro_batches, token_batch, use_packed_attention
from progress_sql.train.samples import episode_view, spread
from progress_sql.train.trajectories import TokenizedTrajectory, max_sequence_tokens, tokenized_trajectory

log = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------- helpers
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout so that sampling (eval mode) and training (train mode) agree."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(model.config, name, None), float):
            setattr(model.config, name, 0.0)


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


def step_seed(seed: int, step: int, rank_: int = 0) -> int:
    """The generation seed of one step (and rank): resume replays the same rollouts."""
    return int(np.random.SeedSequence([seed, step, rank_]).generate_state(1)[0])


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
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the batch loss (``rl.algorithm``), and its stats."""
    logp = token_logprobs(forward, batch, temperature=temperature, chunk_mb=rl.logits_chunk_mb)
    if old_logp is None:  # one update per batch: the weights have not moved since sampling
        old_logp = logp.detach()
    common = dict(clip_eps=rl.clip_eps, clip_eps_high=rl.clip_eps_high, beta=rl.kl_beta)
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


def env_factory_for(settings: Settings, recipe: rewards.Recipe, schema: SchemaTexts) -> Callable[[], envs.Env]:
    """Fresh ``rl.env`` environments speaking ``recipe``'s output format (a mismatch is refused)."""
    env_cls = envs.get(settings.rl.env)
    if recipe.fmt not in env_cls.formats:
        raise ValueError(f"rl.recipe {recipe.name!r} scores {recipe.fmt} outputs but rl.env {settings.rl.env!r} "
                         f"prompts for {', '.join(env_cls.formats)}; pick a matching pair")
    return lambda: env_cls(settings, fmt=recipe.fmt, schema_texts=schema)


def _episode_record(ep: envs.Episode, traj: TokenizedTrajectory, out: rewards.RewardOutput) -> dict[str, Any]:
    return {"example_id": ep.example.id, "db_id": ep.example.db_id, "group": traj.group_id,
            "reward": out.total, "components": out.components, "k_star": ep.k_star, "correct": ep.correct,
            "turns": ep.K, "texts": [t.text for t in ep.turns],
            "input_ids": traj.input_ids, "loss_mask": traj.loss_mask, "truncated": traj.truncated}


SOLVED_QUESTIONS_FILE = "solved_questions.jsonl"  # rl.questions solved: the greedy pass's verdicts


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


# ----------------------------------------------------------------------------- resuming
# The settings dvc.yaml's train stage reads, less those that only say where the run goes, how
# long it goes on and what it keeps (rl.init_from counts by its content; rl.steps counts under a
# decaying schedule, whose length it sets).
FINGERPRINT_SECTIONS = ("seed", "rl", "generation", "env", "rewards", "odt", "sandbox")
_NOT_FINGERPRINTED = {"rl.out_dir", "rl.init_from", "rl.steps", "rl.max_minutes", "rl.checkpoint_every",
                      "rl.keep_checkpoints", "rl.save_rollouts", "rl.log_episodes"}


def run_fingerprint(settings: Settings, layout: CorpusLayout) -> dict[str, Any]:
    """What decides the course of a run, recorded in each checkpoint: ``settings``, those of
    ``FINGERPRINT_SECTIONS`` (flat: ``"rl.lr": 0.001``), and ``inputs``, the sha256 of the train
    split, of the starting policy's files (its name when it is no folder: a hub id) and of this
    package's source. A run resumed from a checkpoint of the same fingerprint goes on as the
    run that wrote it would have."""
    dumped = settings.model_dump(mode="json")
    flat = dotted_items({key: dumped[key] for key in FINGERPRINT_SECTIONS})
    keep_steps = settings.rl.schedule != "constant"
    init = Path(settings.rl.init_from)
    return {"settings": {k: v for k, v in flat.items()
                         if k not in _NOT_FINGERPRINTED or (keep_steps and k == "rl.steps")},
            "inputs": {"train split": sha256_file(layout.split("train")),
                       "starting policy": _tree_sha256(init) if init.is_dir() else settings.rl.init_from,
                       "code": _tree_sha256(Path(__file__).resolve().parents[1])}}


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


def _tree_sha256(folder: Path) -> str:
    """One sha256 over the names and contents of the files under ``folder`` (bytecode caches aside)."""
    lines = [f"{p.relative_to(folder).as_posix()} {sha256_file(p)}" for p in sorted(folder.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts]
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------------------- the run
@dataclass
class RLRun:
    """What a run holds from its start to its end: the settings, the corpus, the policy behind
    its engine and sampler, the reward and the environments (``open_run``)."""

    settings: Settings
    out: Path
    layout: CorpusLayout
    train: list[Example]  # the train questions of rl.hardness (rl.questions may keep fewer: rl_questions)
    fingerprint: dict[str, Any]
    engine: Engine
    backend: GenerationBackend  # the sampler, holding the policy's current weights
    chat: ChatModel
    reference: torch.nn.Module | None  # the frozen starting policy of the KL term (rl.kl_beta > 0, no LoRA)
    recipe: rewards.Recipe
    judge: Any  # Reasoning-SQL's LLM judge, or None
    env_factory: Callable[[], envs.Env]
    max_turns: int
    max_tokens: int  # the length limit of a trajectory

    @property
    def main(self) -> bool:
        return rank() == 0


# The key of RLState.solved_ids in trainer_state.json: the setting's name (rl.question_pool, now
# rl.questions) when checkpoints started to hold it; kept, so that those checkpoints resume with
# the questions they chose.
SOLVED_IDS_KEY = "question_pool"


@dataclass
class RLState:
    """Where a run is; a checkpoint keeps it (``trainer_state.json``) so the run goes on exactly."""

    step: int = 0
    data_position: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    solved_ids: list[str] | None = None  # rl.questions solved: the ids kept, fixed at the start
    checkpoint: Path | None = None  # the newest one written or resumed from

    def saved(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
        state = {"data_position": self.data_position, "history": self.history, "fingerprint": fingerprint}
        if self.solved_ids is not None:
            state[SOLVED_IDS_KEY] = self.solved_ids
        return state


@dataclass
class StepBatch:
    """One step's rollouts: the episodes, their scores and token records, the advantages."""

    episodes: list[envs.Episode]
    scored: list[rewards.RewardOutput]
    trajs: list[TokenizedTrajectory]
    advantages: torch.Tensor
    rollout_s: float
    generate_s: float  # of rollout_s, in the backend's generate


def open_run(settings: Settings, layout: CorpusLayout, out: Path, resources: contextlib.ExitStack) -> RLRun:
    """Load the policy behind its engine and sampler; what it opens goes on ``resources``."""
    rl, gen = settings.rl, settings.generation
    train = [ex for ex in read_jsonl(layout.split("train")) if ex.hardness in rl.hardness]
    if not train:
        raise CorpusError(f"{layout.split('train')}: no training examples of hardness {', '.join(rl.hardness)} "
                          "(rl.hardness)")
    fingerprint = run_fingerprint(settings, layout)
    deepspeed = use_deepspeed(rl.deepspeed)
    prepare_environment(deepspeed)
    if not deepspeed and world_size() > 1:
        raise ValueError("several processes train together only through DeepSpeed: "
                         "set rl.deepspeed to auto or always")
    seed_everything(rl.seed)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    model, tokenizer = load_policy(rl.init_from, dtype="float32", device=device)  # fp32 master weights
    if rl.packing:
        use_packed_attention(model)
    reference = None
    if rl.lora.enabled:  # the base frozen, the adapters trained; the reference is the adapters off
        if gen.backend == "vllm" and adapts_tied_head(model, rl.lora):
            raise ValueError("rl.lora.targets adapt the output head of a model whose head is tied to its input "
                             "embedding: vLLM, loading that model, would drop the head's adapter; generate with the "
                             "transformers backend or leave the head out of rl.lora.targets")
        model = with_lora(model, rl.lora)
    elif rl.kl_beta > 0:  # a frozen copy of the starting policy; β = 0 keeps none
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            reference = reference.to(torch.bfloat16)
    disable_dropout(model)
    recipe = rewards.get(rl.recipe)
    # Reasoning-SQL's LLM judge, when its judge_backend names one (None: off, weight redistributed)
    judge = rewards.make_judge(recipe.settings_of(settings).weights) if recipe.uses_judge else None
    env_factory = env_factory_for(settings, recipe, SchemaTexts.for_corpus(layout, settings.env.prompt_style))
    max_turns = env_factory().max_turns
    grad_accum = math.ceil(rl.questions_per_step * rl.group_size / rl.micro_batch_size)
    engine = make_engine(model, rl, deepspeed=deepspeed, total_updates=rl.steps * rl.updates_per_batch,
                         grad_accum=grad_accum)
    resources.callback(engine.close)
    backend = make_backend(gen, engine.module, tokenizer, rl.init_from, seed=settings.seed)
    resources.callback(backend.close)
    return RLRun(settings, out, layout, train, fingerprint, engine, backend,
                 ChatModel(rl.init_from, backend, tokenizer, gen), reference, recipe, judge, env_factory,
                 max_turns, max_sequence_tokens(gen, max_turns))


def start_or_resume(run: RLRun, resume: bool | str | Path) -> tuple[RLState, str]:
    """The state to start from: step 0 (clearing what an earlier run left in ``run.out``) or a
    checkpoint's (``run_rl``'s ``resume``); and, for ``resume="auto"``, a line saying which."""
    out, start, auto = run.out, "", resume == "auto"
    if auto:  # go on only from checkpoints this run would have written
        resume, start = auto_resume_point(out, run.fingerprint, run.settings.rl.steps)
    state = RLState()
    # True: the newest intact checkpoint (it says which, and which corrupt ones it skipped); a path: that one
    resumed = resume_checkpoint(run.engine, out, None if resume is True else resume) if resume else None
    if resumed is not None:
        checkpoint, saved = resumed
        state = RLState(saved["step"], saved["data_position"], list(saved["history"]), saved.get(SOLVED_IDS_KEY),
                        checkpoint)
        with run.engine.gathered():
            run.backend.sync_weights(run.engine.module)
        if auto:
            start = f"resumed from {checkpoint} (same settings and inputs)"
    elif run.main:  # a fresh run: nothing of an earlier run in out_dir may be mistaken for this one's
        for stale in ("checkpoints", "rollouts", "final"):
            shutil.rmtree(out / stale, ignore_errors=True)
        (out / SOLVED_QUESTIONS_FILE).unlink(missing_ok=True)
    if run.main:
        out.mkdir(parents=True, exist_ok=True)
        write_json_lines(out / "metrics.jsonl", state.history)  # drop lines past the checkpoint
    return state, start


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
                                                   run.out / SOLVED_QUESTIONS_FILE if run.main else None)
    kept = set(state.solved_ids)
    train = [ex for ex in run.train if ex.id in kept]
    if not train:
        raise CorpusError(f"{rl.init_from} answers none of the train questions of hardness "
                          f"{', '.join(rl.hardness)} it was tried on (rl.questions: solved, "
                          f"rl.solved_candidates: {rl.solved_candidates}); raise rl.solved_candidates or "
                          "set rl.questions: all")
    return train


def next_questions(run: RLRun, train: list[Example], state: RLState) -> list[Example]:
    """This rank's questions of the next step, from ``train``: every rank draws the same global
    batch and takes its slice."""
    per_rank = run.settings.rl.questions_per_step
    global_idx = question_indices(len(train), state.data_position, per_rank * world_size(), run.settings.rl.seed)
    state.data_position += len(global_idx)
    return [train[i] for i in global_idx[rank() * per_rank:(rank() + 1) * per_rank]]


def rollout_step(run: RLRun, questions: list[Example], step: int) -> StepBatch:
    """G episodes of each question (eval mode; ZeRO-3 gathers the full weights for the
    sampler), scored by the recipe, tokenised, with their group advantages."""
    rl = run.settings.rl
    run.engine.module.eval()
    started = time.monotonic()
    policy = run.chat.policy(run.recipe.fmt, max_tokens=run.max_tokens, seed=step_seed(rl.seed, step, rank()))
    with run.engine.gathered(), torch.no_grad(), run.backend.reusing_prefixes():
        episodes = envs.rollout(run.env_factory, policy, [q for q in questions for _ in range(rl.group_size)],
                                run.layout.database)
    rollout_s = time.monotonic() - started
    scored = [run.recipe(ep.trajectory(), run.settings, judge=run.judge) for ep in episodes]
    trajs = [tokenized_trajectory(ep, policy.records[ep.id], r.total, i // rl.group_size, run.max_tokens)
             for i, (ep, r) in enumerate(zip(episodes, scored))]
    adv = group_advantages([t.reward for t in trajs], [t.group_id for t in trajs], rl.adv_eps,
                           scale_std=rl.spec.scale_std, negative_scale=rl.negative_advantage_scale)
    return StepBatch(episodes, scored, trajs, adv, rollout_s, policy.generate_s)


def optimise(run: RLRun, batch: StepBatch) -> dict[str, Any]:
    """``rl.updates_per_batch`` passes over the batch's micro-batches (train mode), the sampler
    asleep (vLLM on a GPU frees its memory for the update); then the sampler wakes and takes the
    new weights. The loss statistics, token-weighted over the passes."""
    rl, gen, engine = run.settings.rl, run.settings.generation, run.engine
    started = time.monotonic()
    trajs = batch.trajs
    share = rl.packing and rl.shared_prefix  # a group's prompt runs once in its micro-batch
    chunks = micro_batches([len(t.input_ids) for t in trajs], rl.micro_batch_size, rl.micro_batch_tokens,
                           packed=rl.packing, groups=[t.group_id for t in trajs] if share else None)
    tokens = [token_batch([trajs[i] for i in c], packed=rl.packing, pad_id=int(run.chat.tokenizer.pad_token_id),
                          device=engine.device, share_prefix=share) for c in chunks]
    advantages = [batch.advantages[c].to(engine.device) for c in chunks]
    num_tokens = float(sum(t.sampled_tokens for t in trajs))
    stats = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "ratio": 0.0, "sampler_gap": 0.0, "lr": engine.lr}
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
                                            max_tokens=run.max_turns * gen.max_new_tokens)  # Dr.GRPO's constant
                engine.backward(loss, last=k == len(tokens) - 1)
                engine.step()
                stats["loss"] += float(loss.detach()) / rl.updates_per_batch
                for key in ("clip_frac", "kl", "ratio"):
                    stats[key] += mb[key] * mb["tokens"] / max(num_tokens, 1.0) / rl.updates_per_batch
                if update == 0:
                    stats["sampler_gap"] += mb["sampler_gap"]
        updated = time.monotonic()
    with engine.gathered():
        run.backend.sync_weights(engine.module)
    model_tokens = sum(b.model_tokens for b in tokens)
    stats.update(grad_norm=engine.grad_norm, micro_batches=len(tokens), update_s=time.monotonic() - started,
                 sync_s=time.monotonic() - updated, num_tokens=num_tokens, update_tokens=model_tokens,
                 padding=sum(b.pad_tokens for b in tokens) / max(model_tokens, 1),
                 shared=1.0 - model_tokens / max(sum(b.real_tokens for b in tokens), 1) if share else 0.0,
                 freed_gib=run.backend.freed_gib)
    return stats


def reference_logprobs(run: RLRun, batch: TokenBatch) -> torch.Tensor | None:
    """The KL reference's log-probabilities of ``batch``'s scored tokens (None when rl.kl_beta is
    0): the frozen starting policy, or with LoRA the policy with its adapters disabled."""
    rl, gen = run.settings.rl, run.settings.generation
    if rl.kl_beta <= 0:
        return None
    if run.reference is not None:
        return token_logprobs(run.reference, batch, temperature=gen.temperature, chunk_mb=rl.logits_chunk_mb)
    with adapters_disabled(run.engine.module):
        return token_logprobs(run.engine, batch, temperature=gen.temperature, chunk_mb=rl.logits_chunk_mb)


def step_metrics(run: RLRun, step: int, batch: StepBatch, opt: dict[str, Any]) -> dict[str, Any]:
    """The line of ``metrics.jsonl`` for one step (less its timing of the whole step)."""
    G, eps, trajs = run.settings.rl.group_size, batch.episodes, batch.trajs  # noqa: N806 - the paper's G
    totals = np.array([t.reward for t in trajs])
    sampled = np.array([t.sampled_tokens for t in trajs])
    metrics: dict[str, Any] = {
        "step": step,
        "reward/mean": float(totals.mean()),
        "reward/std": float(totals.std()),
        **{f"reward/{c}": float(np.mean([r.components[c] for r in batch.scored])) for c in run.recipe.components},
        "ex": float(np.mean([ep.correct for ep in eps])),
        # groups whose G rollouts differ in correctness: the only ones that teach it
        "groups/mixed_ex": float(np.mean([0 < sum(ep.correct for ep in eps[g:g + G]) < G
                                          for g in range(0, len(eps), G)])),
        **{f"ex@{t}": float(np.mean([ep.k_star is not None and ep.k_star <= t for ep in eps]))
           for t in range(1, run.max_turns + 1)},
        "turns/mean": float(np.mean([ep.K for ep in eps])),
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


def record_step(run: RLRun, step: int, metrics: dict[str, Any], batch: StepBatch) -> None:
    """Rank 0 appends the step's metrics line and, with ``rl.save_rollouts``, its rollouts."""
    if not run.main:
        return
    write_json_lines(run.out / "metrics.jsonl", [metrics], append=True)
    if run.settings.rl.save_rollouts:
        name = f"step-{step}.jsonl" if world_size() == 1 else f"step-{step}.rank-{rank()}.jsonl"
        write_json_lines(run.out / "rollouts" / name,
                         [_episode_record(ep, t, r) for ep, t, r in zip(batch.episodes, batch.trajs, batch.scored)])


def save_final(run: RLRun, state: RLState, stopped_by: str, train: list[Example], train_s: float) -> Path:
    """The trained policy in ``<out>/final`` (``save_pretrained`` + tokenizer, ``rl_run.json``),
    written under a temporary name and renamed when complete: a full disk leaves no half policy
    where ``eval`` would load it."""
    final, partial = run.out / "final", run.out / ".final.partial"
    if run.main:
        shutil.rmtree(partial, ignore_errors=True)
    run.engine.module.eval()
    run.engine.save_pretrained(partial, run.chat.tokenizer)
    if run.main:
        summary = {"steps": state.step, "stopped_by": stopped_by, "engine": run.engine.kind,
                   "zero_stage": run.engine.zero_stage, "questions": len(train), "questions_s": train_s,
                   "rl": run.settings.rl.model_dump(), "last": state.history[-1] if state.history else {}}
        (partial / "rl_run.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    return final


# ----------------------------------------------------------------------------- the loop
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
    rl = settings.rl
    out = Path(out_dir if out_dir is not None else rl.out_dir)
    with contextlib.ExitStack() as resources:
        run = open_run(settings, CorpusLayout(Path(corpus_dir)), out, resources)
        state, start = start_or_resume(run, resume)
        started = time.monotonic()  # rl.max_minutes covers rl.questions' greedy pass too
        train = rl_questions(run, state)
        train_s = time.monotonic() - started
        bar = tqdm(total=rl.steps, initial=state.step, disable=not (progress and run.main), desc="rl", unit="step")
        stopped_by = "steps"
        while state.step < rl.steps:
            state.step += 1
            t_step = time.monotonic()
            batch = rollout_step(run, next_questions(run, train, state), state.step)
            metrics = step_metrics(run, state.step, batch, optimise(run, batch))
            metrics["step_s"] = time.monotonic() - t_step
            metrics["trajectories_per_s"] = len(batch.trajs) / max(metrics["step_s"], 1e-9)
            state.history.append(metrics)
            record_step(run, state.step, metrics, batch)
            if run.main:
                if on_step is not None:
                    on_step(state.step, metrics)
                if on_episodes is not None and rl.log_episodes:
                    on_episodes(state.step, [episode_view(batch.episodes[i], batch.scored[i], run.recipe, settings,
                                                          state.step)
                                             for i in spread([t.reward for t in batch.trajs], rl.log_episodes)])
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", ex=f"{metrics['ex']:.2f}",
                                loss=f"{metrics['loss']:.4f}")
            # rank 0's decision on every rank: the time budget stops all ranks together, after the step
            out_of_time = run.engine.broadcast_flag(time.monotonic() - started > rl.max_minutes * 60)
            if out_of_time and state.step < rl.steps:
                stopped_by = "time"
            if state.step % rl.checkpoint_every == 0 or state.step == rl.steps or out_of_time:
                state.checkpoint = save_checkpoint(run.engine, out, state.step, state.saved(run.fingerprint),
                                                   rl.keep_checkpoints)
            if out_of_time:
                break
        bar.close()
        final = save_final(run, state, stopped_by, train, train_s)
    return RLResult(out, final, state.step, stopped_by, state.history, state.checkpoint, questions=len(train),
                    start=start)
