"""The RL trainer: multi-turn GRPO / GSPO / Dr.GRPO over the rollout environments.

The whole loop is ``run_rl``, one screen per phase (nano-aha-moment style):

    pool ← the train questions of rl.hardness; with rl.question_pool solved, only those of
           rl.pool_candidates of them that the starting policy answers with one greedy output
           (kept in the checkpoints)
    for step in 1..rl.steps (or until rl.max_minutes, which also covers the pool's pass):
        questions  ← the next questions_per_step questions of the pool (a seeded permutation
                     per epoch)
        episodes   ← envs.rollout(rl.env, ChatModel.policy, every question × G)   model in eval mode;
                     each conversation's KV cache kept between its turns (generation.prefix_cache)
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
from progress_sql.inference import ChatModel, load_policy, make_backend, reusing_prefixes
from progress_sql.train.checkpoint import (
    STATE_FILE,
    list_checkpoints,
    resume_checkpoint,
    save_checkpoint,
)
from progress_sql.train.distributed import Engine, make_engine, prepare_environment, rank, use_deepspeed, world_size
from progress_sql.train.losses import group_advantages, grpo_loss, gspo_loss, token_logprobs
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
    questions: int = 0  # train questions drawn from (rl.hardness, rl.question_pool)
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


def micro_batches(lengths: list[int], max_sequences: int, max_tokens: int) -> list[list[int]]:
    """Indices of the micro-batches of one batch, sequences sorted by length (less padding).
    ``max_tokens`` > 0: each holds as many as fit in that many padded tokens (rows × longest),
    at least one; else ``max_sequences`` each. The loss is a sum over micro-batches, so how
    the batch is cut does not change the gradient, only the memory and the speed."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if max_tokens <= 0:
        return [order[i:i + max_sequences] for i in range(0, len(order), max_sequences)]
    chunks: list[list[int]] = [[]]
    for i in order:  # ascending lengths: the newest is the longest of its chunk
        if chunks[-1] and (len(chunks[-1]) + 1) * lengths[i] > max_tokens:
            chunks.append([])
        chunks[-1].append(i)
    return chunks


def collate(
    trajs: list[TokenizedTrajectory], advantages: torch.Tensor, pad_id: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Right-padded tensors of a micro-batch: ids, attention, loss mask, sampler logp, advantages."""
    width = max(len(t.input_ids) for t in trajs)
    ids = torch.full((len(trajs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(trajs), width), dtype=torch.long)
    mask = torch.zeros((len(trajs), width), dtype=torch.float32)
    sampler = torch.zeros((len(trajs), width), dtype=torch.float32)
    for r, t in enumerate(trajs):
        n = len(t.input_ids)
        ids[r, :n] = torch.tensor(t.input_ids)
        attention[r, :n] = 1
        mask[r, :n] = torch.tensor(t.loss_mask, dtype=torch.float32)
        sampler[r, :n] = torch.tensor(t.old_logprobs, dtype=torch.float32)
    mask[:, 0] = 0.0  # the first token has no context to be predicted from
    return {"input_ids": ids.to(device), "attention_mask": attention.to(device), "loss_mask": mask.to(device),
            "sampler_logp": sampler.to(device), "advantages": advantages.to(device)}


def _causal_only(batch: dict[str, torch.Tensor]) -> None:
    """The attention mask a forward over a ``collate`` batch needs: none. Rows are right-padded,
    so under the causal mask no real token attends to a pad (pads only follow), positions count
    from 0 as without padding, and pads are out of the loss; without a padding mask SDPA runs
    its fused causal kernel (flash attention on a GPU) instead of a masked one."""
    return None


def micro_batch_loss(
    forward: Callable[..., Any],
    batch: dict[str, torch.Tensor],
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
    logp = token_logprobs(forward, batch["input_ids"], _causal_only(batch), temperature, batch["loss_mask"])
    if old_logp is None:  # one update per batch: the weights have not moved since sampling
        old_logp = logp.detach()
    common = dict(clip_eps=rl.clip_eps, clip_eps_high=rl.clip_eps_high, beta=rl.kl_beta)
    if rl.spec.ratio == "sequence":
        loss, stats = gspo_loss(logp, old_logp, ref_logp, batch["advantages"], batch["loss_mask"], **common,
                                num_sequences=num_sequences)
    else:
        loss, stats = grpo_loss(logp, old_logp, ref_logp, batch["advantages"], batch["loss_mask"], **common,
                                aggregation=rl.aggregation, num_sequences=num_sequences, num_tokens=num_tokens,
                                max_tokens=max_tokens)
    # |trainer − sampler| log-prob summed over scored tokens (the logprob_gap metric)
    stats["sampler_gap"] = float(((old_logp - batch["sampler_logp"]).abs() * batch["loss_mask"]).sum())
    return loss, stats


def _env_factory(settings: Settings, recipe: rewards.Recipe, schema: SchemaTexts) -> Callable[[], envs.Env]:
    env_cls = envs.get(settings.rl.env)
    if recipe.fmt not in env_cls.formats:
        raise ValueError(f"rl.recipe {recipe.name!r} scores {recipe.fmt} outputs but rl.env {settings.rl.env!r} "
                         f"prompts for {', '.join(env_cls.formats)}; pick a matching pair")
    return lambda: env_cls(settings, fmt=recipe.fmt, schema_texts=schema)


def _episode_record(ep: envs.Episode, traj: TokenizedTrajectory, out: rewards.RewardOutput) -> dict[str, Any]:
    return {"example_id": ep.example.id, "db_id": ep.example.db_id, "group": traj.group_id,
            "reward": out.total, "components": out.components, "k_star": ep.k_star, "correct": ep.correct,
            "turns": ep.K, "texts": [envs.output_text(g) for g in ep.generations],
            "input_ids": traj.input_ids, "loss_mask": traj.loss_mask, "truncated": traj.truncated}


QUESTION_POOL_FILE = "question_pool.jsonl"


def solved_question_ids(settings: Settings, model: ChatModel, layout: CorpusLayout,
                        questions: list[Example], record_to: Path | None) -> list[str]:
    """The ids of ``questions`` that ``model`` answers right with one greedy output (the eval
    protocol: single turn, EX), for ``rl.question_pool: solved``. Rank 0 decides and the
    others take its answer (ranks must draw from one pool); its verdicts go to ``record_to``
    as predictions-file lines."""
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
                      "rl.keep_checkpoints", "rl.save_rollouts"}


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


# ----------------------------------------------------------------------------- the loop
def run_rl(
    settings: Settings,
    corpus_dir: str | Path,
    *,
    out_dir: str | Path | None = None,
    resume: bool | str | Path = False,
    progress: bool = True,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
) -> RLResult:
    """Train ``settings.rl.init_from`` with RL on the train split of ``corpus_dir``.

    ``out_dir`` (default ``rl.out_dir``) receives ``metrics.jsonl``, ``rollouts/step-N.jsonl``
    (when ``rl.save_rollouts``), ``checkpoints/step-N`` and ``final/``. ``resume``: False starts
    afresh (clearing earlier checkpoints, metrics and rollouts there); True continues from the
    newest checkpoint in ``out_dir`` (afresh when there is none); ``"auto"`` too, but only when
    that checkpoint has this run's ``run_fingerprint`` (else afresh; ``RLResult.start`` says
    which and why); a path continues from that checkpoint. Each checkpoint records the
    fingerprint. ``on_step(step, metrics)`` is called after every step (e.g. MLflow logging).
    The generation backend and the engine are closed however the run ends: a vLLM engine's
    processes stop, and a process group the run opened is destroyed.
    """
    with contextlib.ExitStack() as resources:
        return _run_rl(settings, corpus_dir, out_dir, resume, progress, on_step, resources)


def _run_rl(settings: Settings, corpus_dir: str | Path, out_dir: str | Path | None, resume: bool | str | Path,
            progress: bool, on_step: Callable[[int, dict[str, Any]], None] | None,
            resources: contextlib.ExitStack) -> RLResult:
    """``run_rl``'s loop; what it opens goes on ``resources``, which ``run_rl`` closes."""
    rl, gen = settings.rl, settings.generation
    out = Path(out_dir if out_dir is not None else rl.out_dir)
    layout = CorpusLayout(Path(corpus_dir))
    train = [ex for ex in read_jsonl(layout.split("train")) if ex.hardness in rl.hardness]
    if not train:
        raise CorpusError(f"{layout.split('train')}: no training examples of hardness {', '.join(rl.hardness)} "
                          "(rl.hardness)")
    fingerprint = run_fingerprint(settings, layout)
    start, auto = "", resume == "auto"
    if auto:  # go on only from checkpoints this run would have written
        resume, start = auto_resume_point(out, fingerprint, rl.steps)

    # -- policy, reference, engine, sampler
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
    disable_dropout(model)
    reference = None
    if rl.kl_beta > 0:  # a frozen copy of the starting policy; β = 0 keeps none
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            reference = reference.to(torch.bfloat16)
    recipe = rewards.get(rl.recipe)
    # Reasoning-SQL's LLM judge, when its judge_backend names one (None: off, weight redistributed)
    judge = rewards.make_judge(recipe.settings_of(settings).weights) if recipe.uses_judge else None
    env_factory = _env_factory(settings, recipe, SchemaTexts.for_corpus(layout, settings.env.prompt_style))
    max_turns = env_factory().max_turns
    max_tokens = max_sequence_tokens(gen, max_turns)
    budget_tokens = max_turns * gen.max_new_tokens  # Dr.GRPO's constant normaliser
    n_seq = rl.questions_per_step * rl.group_size  # trajectories per rank and step
    grad_accum = math.ceil(n_seq / rl.micro_batch_size)
    engine: Engine = make_engine(model, rl, deepspeed=deepspeed, total_updates=rl.steps * rl.updates_per_batch,
                                 grad_accum=grad_accum)
    resources.callback(engine.close)
    policy_model = engine.module
    backend = make_backend(gen, policy_model, tokenizer, rl.init_from, seed=settings.seed)
    if hasattr(backend, "close"):
        resources.callback(backend.close)
    chat = ChatModel(rl.init_from, backend, tokenizer, gen)
    pad_id = int(tokenizer.pad_token_id)
    main = rank() == 0

    # -- fresh start or resume
    state: dict[str, Any] = {"step": 0, "data_position": 0, "history": []}
    checkpoint = None
    # True: the newest intact checkpoint (it says which, and which corrupt ones it skipped); a path: that one
    resumed = resume_checkpoint(engine, out, None if resume is True else resume) if resume else None
    if resumed is not None:
        checkpoint, state = resumed
        with engine.gathered():
            backend.sync_weights(policy_model)
    elif main:  # a fresh run: nothing of an earlier run in out_dir may be mistaken for this one's
        for stale in ("checkpoints", "rollouts", "final"):
            shutil.rmtree(out / stale, ignore_errors=True)
        (out / QUESTION_POOL_FILE).unlink(missing_ok=True)
    if auto and checkpoint is not None:
        start = f"resumed from {checkpoint} (same settings and inputs)"
    history: list[dict[str, Any]] = list(state["history"])
    if main:
        out.mkdir(parents=True, exist_ok=True)
        write_json_lines(out / "metrics.jsonl", history)  # drop lines past the checkpoint

    started = time.monotonic()  # the budget covers the question pool's pass too
    if rl.question_pool == "solved":
        if "question_pool" not in state:  # a resumed run keeps the questions it started with
            candidates = train
            if 0 < rl.pool_candidates < len(train):  # the pass costs about as much as the eval of as many
                picked = np.random.default_rng([rl.seed, len(train)]).choice(len(train), rl.pool_candidates,
                                                                             replace=False)
                candidates = [train[i] for i in sorted(picked)]
            with engine.gathered(), torch.no_grad():
                state["question_pool"] = solved_question_ids(settings, chat, layout, candidates,
                                                             out / QUESTION_POOL_FILE if main else None)
        pool = set(state["question_pool"])
        train = [ex for ex in train if ex.id in pool]
        if not train:
            raise CorpusError(f"{rl.init_from} answers none of the train questions of hardness "
                              f"{', '.join(rl.hardness)} it was tried on (rl.question_pool: solved, "
                              f"rl.pool_candidates: {rl.pool_candidates}); raise rl.pool_candidates or "
                              "set rl.question_pool: all")
    pool_s = time.monotonic() - started

    bar = tqdm(total=rl.steps, initial=state["step"], disable=not (progress and main), desc="rl", unit="step")
    step, position, stopped_by, last_checkpoint = state["step"], state["data_position"], "steps", checkpoint
    while step < rl.steps:
        step += 1
        t_step = time.monotonic()
        # -- questions of this step (every rank draws the same global batch, takes its slice)
        global_idx = question_indices(len(train), position, rl.questions_per_step * world_size(), rl.seed)
        position += len(global_idx)
        mine = global_idx[rank() * rl.questions_per_step:(rank() + 1) * rl.questions_per_step]
        questions: list[Example] = [train[i] for i in mine]

        # -- rollouts (eval mode; ZeRO-3 gathers the full weights for the sampler)
        policy_model.eval()
        t_roll = time.monotonic()
        token_policy = chat.policy(recipe.fmt, max_tokens=max_tokens, seed=step_seed(rl.seed, step, rank()))
        with engine.gathered(), torch.no_grad(), reusing_prefixes(backend, gen.prefix_cache):
            episodes = envs.rollout(env_factory, token_policy, [q for q in questions for _ in range(rl.group_size)],
                                    layout.database)
        rollout_s = time.monotonic() - t_roll
        scored = [recipe(ep.trajectory(), settings, judge=judge) for ep in episodes]
        trajs = [tokenized_trajectory(ep, r.total, i // rl.group_size, max_tokens)
                 for i, (ep, r) in enumerate(zip(episodes, scored))]
        adv = group_advantages([t.reward for t in trajs], [t.group_id for t in trajs], rl.adv_eps,
                               scale_std=rl.spec.scale_std, negative_scale=rl.negative_advantage_scale)

        # -- optimisation (train mode, dropout off)
        t_update = time.monotonic()
        policy_model.train()
        chunks = micro_batches([len(t.input_ids) for t in trajs], rl.micro_batch_size, rl.micro_batch_tokens)
        batches = [collate([trajs[i] for i in c], adv[c], pad_id, engine.device) for c in chunks]
        num_tokens = float(sum(t.sampled_tokens for t in trajs))
        with torch.no_grad():
            # With one update per batch the loss's own forward gives the old log-probs (the
            # weights do not change before the step): no extra forward pass.
            old = ([None] * len(batches) if rl.updates_per_batch == 1 else
                   [token_logprobs(engine, b["input_ids"], _causal_only(b), gen.temperature, b["loss_mask"])
                    for b in batches])
            refs = [token_logprobs(reference, b["input_ids"], _causal_only(b), gen.temperature, b["loss_mask"])
                    if reference is not None else None for b in batches]
        stats_sum: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "ratio": 0.0}
        lr = engine.lr  # the rate of this step's (first) update
        sampler_gap = 0.0
        for update in range(rl.updates_per_batch):
            for k, (b, old_logp, ref_logp) in enumerate(zip(batches, old, refs)):
                loss, stats = micro_batch_loss(engine, b, old_logp, ref_logp, rl, temperature=gen.temperature,
                                               num_sequences=n_seq, num_tokens=num_tokens, max_tokens=budget_tokens)
                engine.backward(loss, last=k == len(batches) - 1)
                engine.step()
                stats_sum["loss"] += float(loss.detach()) / rl.updates_per_batch
                for key in ("clip_frac", "kl", "ratio"):
                    stats_sum[key] += stats[key] * stats["tokens"] / max(num_tokens, 1.0) / rl.updates_per_batch
                if update == 0:
                    sampler_gap += stats["sampler_gap"]
            with engine.gathered():
                backend.sync_weights(policy_model)
        update_s = time.monotonic() - t_update

        # -- metrics
        totals = np.array([t.reward for t in trajs])
        sampled = np.array([t.sampled_tokens for t in trajs])
        metrics: dict[str, Any] = {
            "step": step,
            "reward/mean": float(totals.mean()),
            "reward/std": float(totals.std()),
            **{f"reward/{c}": float(np.mean([r.components[c] for r in scored])) for c in recipe.components},
            "ex": float(np.mean([ep.correct for ep in episodes])),
            # groups whose G rollouts differ in correctness: the only ones that teach it
            "groups/mixed_ex": float(np.mean([0 < sum(ep.correct for ep in episodes[g:g + rl.group_size])
                                              < rl.group_size for g in range(0, len(episodes), rl.group_size)])),
            **{f"ex@{t}": float(np.mean([ep.k_star is not None and ep.k_star <= t for ep in episodes]))
               for t in range(1, max_turns + 1)},
            "turns/mean": float(np.mean([ep.K for ep in episodes])),
            "response_tokens/mean": float(sampled.mean()),
            "sequence_tokens/mean": float(np.mean([len(t.input_ids) for t in trajs])),
            "truncated": float(np.mean([t.truncated for t in trajs])),
            "loss": stats_sum["loss"],
            "kl": stats_sum["kl"],
            "clip_frac": stats_sum["clip_frac"],
            "ratio": stats_sum["ratio"],
            "grad_norm": engine.grad_norm,
            "lr": lr,
            "tokens_per_s": float(sampled.sum() / max(rollout_s, 1e-9)),
            "rollout_s": rollout_s,
            "generate_s": token_policy.generate_s,  # of rollout_s, in the backend's generate
            "update_s": update_s,  # the optimisation passes and the weight sync
            "micro_batches": len(batches),
        }
        if judge is not None:  # a judge that fails scores 0 and the step goes on: count both
            statuses = [str(r.info.get("judge", "")) for r in scored]
            metrics["judge/asked"] = float(sum(s == "asked" for s in statuses))
            metrics["judge/failed"] = float(sum(s.startswith("judge failed") for s in statuses))
        if gen.temperature == 1.0:  # the sampler reports temperature-1 log-probs
            metrics["logprob_gap"] = sampler_gap / max(num_tokens, 1.0)
        metrics["step_s"] = time.monotonic() - t_step
        metrics["trajectories_per_s"] = len(trajs) / max(metrics["step_s"], 1e-9)
        history.append(metrics)
        if main:
            write_json_lines(out / "metrics.jsonl", [metrics], append=True)
            if rl.save_rollouts:
                name = f"step-{step}.jsonl" if world_size() == 1 else f"step-{step}.rank-{rank()}.jsonl"
                write_json_lines(out / "rollouts" / name,
                                 [_episode_record(ep, t, r) for ep, t, r in zip(episodes, trajs, scored)])
            if on_step is not None:
                on_step(step, metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", ex=f"{metrics['ex']:.2f}",
                            loss=f"{metrics['loss']:.4f}")

        # -- stop on the time budget (after finishing the step), checkpoint
        # rank 0's decision on every rank: the time budget stops all ranks together
        out_of_time = engine.broadcast_flag(time.monotonic() - started > rl.max_minutes * 60)
        if out_of_time and step < rl.steps:
            stopped_by = "time"
        if step % rl.checkpoint_every == 0 or step == rl.steps or out_of_time:
            trainer_state = {"data_position": position, "history": history, "fingerprint": fingerprint}
            if "question_pool" in state:
                trainer_state["question_pool"] = state["question_pool"]
            last_checkpoint = save_checkpoint(engine, out, step, trainer_state, rl.keep_checkpoints)
        if out_of_time:
            break
    bar.close()

    final = out / "final"
    policy_model.eval()
    engine.save_pretrained(final, tokenizer)
    if main:
        summary = {"steps": step, "stopped_by": stopped_by, "engine": engine.kind, "zero_stage": engine.zero_stage,
                   "questions": len(train), "question_pool_s": pool_s, "rl": rl.model_dump(),
                   "last": history[-1] if history else {}}
        (final / "rl_run.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    return RLResult(out, final, step, stopped_by, history, last_checkpoint, questions=len(train), start=start)
