"""SFT warm start: teach a policy the output format and what ODT feedback means.

Examples (``build_sft_examples``), from the corpus' train split:

- plain: the round-1 conversation the environment shows (``envs.round1_messages``) and the
  target ``<think>{reasoning trace}</think>\\n<sql>{gold}</sql>`` in the tags of ``fmt``
  (``run_sft``: the output format of ``rl.recipe``, the one RL goes on to train);
- revision (a ``revision_share`` of the examples, in addition): the real ``odt_feedback``
  environment driven by a scripted policy through a corrupted gold (``train.corrupt``) and then
  the gold, so the dialogue is exactly what a rollout shows: round-1 prompt → wrong SQL → the
  environment's ODT feedback (VALUE_MISMATCH when the structure matches) → the gold. A
  corruption whose execution matches the gold is skipped (the next one is tried).

- own revisions (``sft.own_mistakes``, a second pass): the same dialogues with the trained
  policy's OWN wrong answers as the first turn (``revise_on_own_mistakes``), sampled after the
  plain pass as an RL episode's first turn, plus plain examples replayed.

Only the final assistant turn is a target: the corrupted turn carries no loss, since training
on it would teach wrong SQL. Tokens are the chat template's, built segment by segment (each
message's text is the difference of two prefix renderings) so the assistant tokens are known
exactly; only the assistant's content and its end-of-turn token carry loss, never the header.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from tqdm import tqdm

from progress_sql import rewards
from progress_sql.params import Settings, default_settings
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, read_jsonl
from progress_sql.envs import (
    Message,
    ODTFeedbackEnv,
    ScriptedPolicy,
    SchemaTexts,
    ddl_from_sqlite,
    round1_messages,
    rollout,
)
from progress_sql.formats import FORMATS, FormatName, answer_text
from progress_sql.train.corrupt import corrupt, schema_from_ddl
from progress_sql.train.question_scores import judged_answers, question_pool
from progress_sql.eval.runner import greedy_answers
from progress_sql.inference.lora import base_model
from progress_sql.inference.models import load_policy
from progress_sql.inference.policy import ChatModel
from progress_sql.inference import attention
from progress_sql.train.logprobs import token_logprobs
from progress_sql.train.packing import MIN_SHARED, QUERY_BLOCK, token_batch
from progress_sql.train.precision import training_autocast
from progress_sql.train.lora import is_lora, save_policy, with_lora
from progress_sql.train.memory import map_large_blocks, release_free_heap
from progress_sql.train.tiny import copy_loss, ordinary_ids
from progress_sql.train.trajectories import TokenizedTrajectory

METRICS_FILE = "sft_metrics.json"


@dataclass(frozen=True)
class SFTExample:
    """One training conversation. ``targets``: indices of the messages that carry loss (the
    final assistant message); ``kind``: plain | revision | own_revision; ``db_id``: its database (batches are
    drawn per database, see ``token_loss``); ``corruption``: the corruption of a revision
    dialogue's wrong turn."""

    messages: list[Message]
    targets: tuple[int, ...]
    kind: str
    example_id: str
    db_id: str = ""
    corruption: str = ""


def target_text(example: Example, fmt: FormatName, sql: str | None = None) -> str:
    """The assistant output for ``example`` in format ``fmt``: its reasoning trace and ``sql``
    (default: the gold) in the format's tags."""
    return answer_text(fmt, example.reasoning, sql or example.gold_sql)


def build_sft_examples(
    examples: Sequence[Example],
    settings: Settings,
    *,
    database: Callable[[str], str | Path],
    schema_texts: Callable[[str, str | Path], str] | None = None,
    fmt: FormatName = "think_sql",
    seed: int | None = None,
) -> list[SFTExample]:
    """Plain examples for every example and revision dialogues for a ``settings.sft.revision_share``
    of them (``think_sql`` only: ODT feedback is that format's environment).

    ``database(db_id)`` gives the SQLite file (``CorpusLayout.database``), ``schema_texts`` the
    prompts' schema text (default: the files' DDL). Deterministic for a seed (default
    ``settings.seed``). Examples whose gold cannot be made into a revision dialogue (no
    corruption changes its result) stay plain only.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}")
    schema_texts = schema_texts or SchemaTexts(prompt_style=settings.env.prompt_style)
    rng = random.Random(f"{settings.seed if seed is None else seed}:sft")
    out: list[SFTExample] = []
    for ex in examples:
        details = schema_texts(ex.db_id, database(ex.db_id))
        messages = round1_messages(ex, details, fmt, settings.env)
        messages.append({"role": "assistant", "content": target_text(ex, fmt)})
        out.append(SFTExample(messages, (len(messages) - 1,), "plain", ex.id, ex.db_id))
    if fmt != "think_sql" or settings.sft.revision_share <= 0:
        return out
    chosen = [ex for ex in examples if rng.random() < settings.sft.revision_share]
    out.extend(_revision_dialogues(chosen, settings, database, schema_texts, rng))
    return out


def _revision_dialogues(
    examples: Sequence[Example],
    settings: Settings,
    database: Callable[[str], str | Path],
    schema_texts: Callable[[str, str | Path], str],
    rng: random.Random,
) -> list[SFTExample]:
    """Run each example's candidate corruptions through the ODT environment (one rollout per
    round of candidates) until one is wrong at turn 1 and the gold is right at turn 2."""
    pending = []
    schemas: dict[str, dict[str, list[str]]] = {}  # the corruptions' column choices, from each file's DDL
    for ex in examples:
        if ex.db_id not in schemas:
            schemas[ex.db_id] = schema_from_ddl(ddl_from_sqlite(database(ex.db_id)))
        schema = schemas[ex.db_id]
        candidates = corrupt(ex.gold_sql, rng, schema)
        if candidates:
            pending.append((ex, candidates))
    done: dict[str, SFTExample] = {}
    while pending and settings.env.max_turns >= 2:
        batch = [(ex, candidates[0]) for ex, candidates in pending]
        firsts = [(ex, target_text(ex, "think_sql", sql)) for ex, (_, sql) in batch]
        for (ex, (name, _)), messages in zip(batch, _odt_dialogues(settings, schema_texts, database, firsts)):
            if messages is not None:
                done[ex.id] = SFTExample(messages, (4,), "revision", ex.id, ex.db_id, name)
        pending = [(ex, candidates[1:]) for ex, candidates in pending if ex.id not in done and len(candidates) > 1]
    return [done[ex.id] for ex in examples if ex.id in done]


def _odt_dialogues(settings: Settings, schema_texts: Callable[[str, str | Path], str],
                   database: Callable[[str], str | Path],
                   firsts: Sequence[tuple[Example, str]]) -> list[list[Message] | None]:
    """Each (example, wrong first answer) run through the real ODT environment with the gold as
    every later turn: the dialogue (prompt, the answer, the environment's feedback, the gold) where
    the answer is wrong and the gold right at turn 2 (``k_star`` 2), else None."""
    if not firsts:
        return []
    # the gold repeated to the end, so a script never runs out
    scripts = [[text] + [target_text(ex, "think_sql")] * (settings.env.max_turns - 1) for ex, text in firsts]
    episodes = rollout(lambda: ODTFeedbackEnv(settings, schema_texts=schema_texts), ScriptedPolicy(scripts),
                       [ex for ex, _ in firsts], database)
    return [ep.messages[:5] if ep.k_star == 2 else None for ep in episodes]


def own_revision_dialogues(settings: Settings, chat: Any, layout: CorpusLayout, examples: Sequence[Example],
                           progress: bool = False) -> tuple[list[SFTExample], dict[str, int]]:
    """Revision dialogues from ``chat``'s own wrong answers: ``sft.own_mistakes.samples`` answers
    of each example (an RL episode's first turn: ``question_scores.judged_answers``), up to
    ``per_question`` distinct wrong ones kept, each run through the ODT environment with the gold
    as the next turn; a dialogue is kept when the gold is right there (turn 1 wrong, turn 2
    right: ``k_star`` 2). With counts of the answers, the wrong ones and the dialogues."""
    own = settings.sft.own_mistakes
    answers = judged_answers(settings, chat, layout, examples, own.samples, progress=progress, desc="own mistakes")
    firsts = [(ex, text) for ex, row in zip(examples, answers)
              for text in list(dict.fromkeys(t for t, right in row if not right))[:own.per_question]]
    schema_texts = SchemaTexts.for_corpus(layout, settings.env.prompt_style)
    dialogues = [SFTExample(messages, (4,), "own_revision", ex.id, ex.db_id)
                 for (ex, _), messages in zip(firsts, _odt_dialogues(settings, schema_texts, layout.database, firsts))
                 if messages is not None]
    counts = {"questions": len(examples), "answers": sum(map(len, answers)),
              "wrong": sum(not right for row in answers for _, right in row), "kept": len(firsts),
              "dialogues": len(dialogues)}
    return dialogues, counts


def own_mistakes_skipped(settings: Settings) -> str | None:
    """Why ``sft.own_mistakes`` does not apply to this recipe (None: it does). Its dialogue is the
    ODT one, as the corruptions' (``sft.revision_share``): the think_sql format and two turns; a
    recipe without them (Reasoning-SQL, SQL-Trail, a single-turn ablation) trains plain SFT."""
    fmt = rewards.get(settings.rl.recipe).fmt
    if fmt != "think_sql":
        return f"rl.recipe {settings.rl.recipe!r} writes {fmt}, not the ODT dialogue's think_sql"
    if settings.env.max_turns < 2:
        return f"env.max_turns is {settings.env.max_turns}: no second turn to revise in"
    return None


def revise_on_own_mistakes(model: Any, tokenizer: Any, settings: Settings, layout: CorpusLayout, out: Path,
                           plain: Sequence[SFTExample], progress: bool = True) -> tuple[Any, dict[str, Any]]:
    """``sft.own_mistakes``: the second pass. The policy as the plain pass left it is saved beside
    ``out`` (a temporary folder) and loaded by the rollout sampler (``generation.backend``), answers a seeded pool of
    train questions (``own_revision_dialogues``), and the model trains on those dialogues with
    ``replay`` plain examples each. The model trained (a LoRA model: fresh adapters on the plain
    pass's merged weights) and what the pass did (counts, steps, losses, seconds)."""
    own, started = settings.sft.own_mistakes, time.perf_counter()
    if (reason := own_mistakes_skipped(settings)) is not None:
        raise ValueError(f"sft.own_mistakes does not apply: {reason}")
    model.eval()
    lora = is_lora(model)
    train = list(read_jsonl(layout.split("train")))
    # the plain pass's policy, for the sampler to load, beside out (which only the finished run fills)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-plain-") as plain_dir:
        save_policy(model, tokenizer, Path(plain_dir))
        if lora:  # save_policy merged the adapters into the weights in place
            model = with_lora(model.get_base_model(), settings.sft.lora)
        # fp32 weights, as an RL run loads them for its sampler (vLLM takes generation.vllm.dtype)
        with ChatModel.load(plain_dir, settings.generation, dtype="float32", seed=settings.seed) as chat:
            dialogues, counts = own_revision_dialogues(settings, chat, layout,
                                                       question_pool(train, own.questions, settings.seed), progress)
    rng = random.Random(f"{settings.seed}:sft-own-replay")
    replayed = rng.sample(list(plain), min(len(plain), round(own.replay * len(dialogues))))
    result: dict[str, Any] = {**counts, "replayed": len(replayed), "steps": 0}
    if dialogues:
        encoded, groups, dropped = _encode(dialogues + replayed, tokenizer, settings.sft.max_seq_len)
        trained = _train(model, tokenizer, encoded, groups, settings, progress, second_pass=True)
        result.update(steps=trained.steps, losses=trained.losses, tokens=trained.tokens, dropped_too_long=dropped)
    result["seconds"] = round(time.perf_counter() - started, 2)
    return model, result


# ----------------------------------------------------------------------------- tokenisation
def _render(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


def _segment(tokenizer: Any, before: str, after: str) -> list[int]:
    if not after.startswith(before):
        raise ValueError("the chat template is not prefix-stable (rendering more messages changes the "
                         "earlier text), so assistant tokens cannot be located by prefixes")
    return tokenizer.encode(after[len(before):], add_special_tokens=False)


def encode_conversation(tokenizer: Any, messages: Sequence[Message], targets: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of a conversation rendered by the chat template.

    Each message is rendered as the text its prefix rendering gains and tokenised on its own,
    so the ids equal the tokenisation of the whole rendering whenever the template separates
    messages by special tokens (ChatML does). The mask is 1 on a target assistant message's
    content and end-of-turn (eos) token; 0 on its header (the generation prompt), on what the
    template puts after eos, and on every other message.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            header = _render(tokenizer, messages[:i], True)
            seg = _segment(tokenizer, rendered, header)
            ids += seg
            mask += [0] * len(seg)
            rendered = header
        full = _render(tokenizer, messages[: i + 1], False)
        seg = _segment(tokenizer, rendered, full)
        seg_mask = [0] * len(seg)
        if i in targets:
            if message["role"] != "assistant":
                raise ValueError(f"message {i} is a {message['role']} message; only assistant messages are targets")
            end = seg.index(eos) + 1 if eos in seg else len(seg)
            seg_mask[:end] = [1] * end
        ids += seg
        mask += seg_mask
        rendered = full
    return ids, mask


# ----------------------------------------------------------------------------- training
@dataclass
class SFTResult:
    """What ``run_sft`` did: where the model is, the loss of every optimiser step, counts."""

    out_dir: str
    losses: list[float]
    final_loss: float
    steps: int
    examples: dict[str, int]
    dropped_too_long: int
    tokens: int  # tokens run through the model (a batch's shared prefix counted once)
    seconds: float
    stopped_early: bool
    lora: bool
    copy_losses: list[float] = field(default_factory=list)  # the sft.copy_rows term, per step (empty: off)
    own_mistakes: dict[str, Any] = field(default_factory=dict)  # the second pass (sft.own_mistakes); empty: off
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def final_copy_loss(self) -> float | None:
        """Mean copy term of the last 20 steps; None without ``sft.copy_rows``."""
        tail = self.copy_losses[-20:]
        return sum(tail) / len(tail) if tail else None


def _batches(lengths: list[int], groups: list[str], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Batches within one group (database), of similar length: shuffle each group, sort windows
    of 8 batches by length, cut, then shuffle all batches. Examples of one database share their
    prompt up to the question (system prompt and schema), which ``token_loss`` computes once."""
    by_group: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        by_group.setdefault(group, []).append(i)
    batches = []
    for group in sorted(by_group):
        order = by_group[group]
        rng.shuffle(order)
        window = batch_size * 8
        for start in range(0, len(order), window):
            chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
            batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def token_loss(model: Any, rows: Sequence[tuple[list[int], list[int]]], pad_id: int, *, share_prefix: bool = True,
               chunk_mb: float = 0.0, min_shared: int = MIN_SHARED, query_block: int = QUERY_BLOCK) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the target tokens of a batch of ``(ids, mask)`` rows, and the
    number of positions the model ran over.

    The rows run as RL's micro-batches do (``train.packing``): packed into one row without
    padding, and with ``share_prefix`` their common prefix (one database's system prompt and
    schema) once, each row attending to it and to itself (``min_shared``, ``query_block``: as
    ``rl.shared_prefix_min_tokens`` and ``rl.attention_query_block``). The same loss and
    gradients as one row at a time (a test checks), several times cheaper when the prompt is
    long and the target short, as in Text-to-SQL; and no KV cache, so the layers can be
    checkpointed (``sft.gradient_checkpointing``). A model without the project's attention
    (``load_policy`` installs it on SDPA models) runs right-padded rows. The targets'
    log-probabilities come from the hidden states a chunk at a time (``train.logprobs``,
    ``chunk_mb`` of fp32 logits at once).
    """
    inner = base_model(model)
    packed = inner.config._attn_implementation == attention.ATTENTION
    trajs = [TokenizedTrajectory(list(ids), list(mask), [0.0] * len(ids), 0.0, 0, 1) for ids, mask in rows]
    batch = token_batch(trajs, packed=packed, pad_id=pad_id, device=model.device, share_prefix=share_prefix and packed,
                        min_shared=min_shared, query_block=query_block)
    logp = token_logprobs(model, batch, chunk_mb=chunk_mb)
    return -logp.sum() / max(logp.numel(), 1), batch.model_tokens


def schedule_factor(progress: float, warmup_ratio: float) -> float:
    """The learning-rate multiplier at ``progress`` in [0, 1] of the run: linear warmup over
    the first ``warmup_ratio``, then cosine decay to 0 at the end."""
    if progress < warmup_ratio:
        return progress / warmup_ratio
    span = max(1e-9, 1.0 - warmup_ratio)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (progress - warmup_ratio) / span)))


def load_train_examples(corpus_dir: str | Path, settings: Settings) -> list[Example]:
    """The train split, shuffled by the seed and cut to ``sft.max_examples`` (0: all)."""
    examples = list(read_jsonl(CorpusLayout(Path(corpus_dir)).split("train")))
    if not examples:
        raise CorpusError(f"{corpus_dir}: the train split is empty")
    random.Random(f"{settings.seed}:sft-examples").shuffle(examples)
    return examples[: settings.sft.max_examples] if settings.sft.max_examples else examples


def run_sft(settings: Settings, corpus_dir: str | Path, *, out_dir: str | Path | None = None,
            progress: bool = True) -> SFTResult:
    """Fine-tune ``sft.init_from`` on the corpus' train split and save it to ``out_dir``
    (default ``sft.out_dir``) with its tokenizer and ``sft_metrics.json``.

    A plain torch loop (not transformers' Trainer: ``token_loss`` shares each batch's prompt
    prefix, which is most of a Text-to-SQL sequence): AdamW, token-mean cross-entropy on target
    tokens only, gradient clipping at ``sft.grad_clip``, and a learning rate that warms up
    linearly then decays on a cosine (``schedule_factor``) over ``sft.epochs`` (fractional
    allowed). With ``sft.max_minutes`` > 0 the training loop (data preparation excluded) also
    ends at that wall-clock budget, and the schedule runs on whichever of steps or time is
    further along, so a slow machine still finishes its decay (such a run is not bit-for-bit
    reproducible across machines; ``max_minutes: 0`` is).
    With ``sft.copy_rows`` > 0 each step's loss also holds the copy warmup's loss on that many
    random strings (``tiny.copy_loss``); ``losses`` keep the SFT term alone, ``copy_losses`` the other.
    With ``sft.lora.enabled`` a LoRA adapter is trained: it is saved in ``out_dir/adapter`` and
    merged into the full model saved in ``out_dir``, so later stages load it like any other.
    With ``sft.own_mistakes.questions`` > 0 a second pass trains on revisions of the policy's own
    wrong answers (``revise_on_own_mistakes``; ``own_mistakes`` in the result and metrics).
    """
    sft = settings.sft
    out = Path(out_dir if out_dir is not None else sft.out_dir)
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    map_large_blocks()  # freed activations leave the process (train.memory)
    layout = CorpusLayout(Path(corpus_dir))
    # fp32 weights to train (an AdamW step below bf16's resolution would be lost in bf16 ones);
    # the forward pass runs in bf16 by autocast where the device has it (sft.autocast: auto)
    dtype = "float32" if settings.model.dtype == "auto" else settings.model.dtype
    model, tokenizer = load_policy(sft.init_from, dtype=dtype)
    # the output format RL will train (rl.recipe's): an SFT in other tags would teach the wrong ones
    conversations = build_sft_examples(load_train_examples(corpus_dir, settings), settings, database=layout.database,
                                       schema_texts=SchemaTexts.for_corpus(layout, settings.env.prompt_style),
                                       fmt=rewards.get(settings.rl.recipe).fmt)
    encoded, groups, dropped = _encode(conversations, tokenizer, sft.max_seq_len)
    if sft.lora.enabled:
        model = with_lora(model, sft.lora)
    trained = _train(model, tokenizer, encoded, groups, settings, progress)
    out.mkdir(parents=True, exist_ok=True)
    own: dict[str, Any] = {}
    if sft.own_mistakes.questions and (skipped := own_mistakes_skipped(settings)) is not None:
        own = {"skipped": skipped}
        print(f"sft: no own-mistakes pass (sft.own_mistakes): {skipped}", file=sys.stderr)
    elif sft.own_mistakes.questions:
        model, own = revise_on_own_mistakes(model, tokenizer, settings, layout, out,
                                            [c for c in conversations if c.kind == "plain"], progress)

    model.eval()
    save_policy(model, tokenizer, out)
    counts = {"plain": sum(c.kind == "plain" for c in conversations),
              "revision": sum(c.kind == "revision" for c in conversations), "trained": len(encoded)}
    seconds = time.perf_counter() - started
    losses = trained.losses
    tail = losses[-max(1, min(20, len(losses) // 10)):]
    result = SFTResult(
        out_dir=str(out), losses=losses, final_loss=sum(tail) / len(tail), steps=trained.steps, examples=counts,
        dropped_too_long=dropped, tokens=trained.tokens, seconds=round(seconds, 2), stopped_early=trained.stopped,
        lora=sft.lora.enabled, copy_losses=trained.copy_losses, own_mistakes=own,
    )
    result.metrics = {"sft": sft.model_dump(), "init_from": sft.init_from, "sequence_tokens": trained.sequence_tokens,
                      "sequence_tokens_per_s": round(trained.sequence_tokens / seconds, 1),
                      "first_loss": losses[0], "final_loss": result.final_loss}
    (out / METRICS_FILE).write_text(json.dumps(asdict(result), indent=2, sort_keys=True), encoding="utf-8")
    return result


def _encode(conversations: Sequence[SFTExample], tokenizer: Any,
            max_len: int) -> tuple[list[tuple[list[int], list[int]]], list[str], int]:
    """Token ids and target masks of the conversations that fit ``max_len`` (truncating would cut
    the target or change the prompt), the database of each (``_batches`` groups by it), and
    how many were dropped."""
    encoded, groups, dropped = [], [], 0
    for conv in conversations:
        ids, mask = encode_conversation(tokenizer, conv.messages, conv.targets)
        if len(ids) > max_len:
            dropped += 1
            continue
        encoded.append((ids, mask))
        groups.append(conv.db_id)
    if not encoded:
        raise ValueError(f"no SFT example fits sft.max_seq_len={max_len}")
    return encoded, groups, dropped


@dataclass
class _Trained:
    """What the SFT loop did: ``losses`` (the SFT term alone), ``copy_losses``, target
    ``tokens``, ``sequence_tokens``, ``steps``; ``stopped``: ended by the time budget."""

    losses: list[float] = field(default_factory=list)
    copy_losses: list[float] = field(default_factory=list)
    tokens: int = 0
    sequence_tokens: int = 0
    steps: int = 0
    stopped: bool = False


def _train(model: Any, tokenizer: Any, encoded: list[tuple[list[int], list[int]]], groups: list[str],
           settings: Settings, progress: bool, *, second_pass: bool = False) -> _Trained:
    """``run_sft``'s loop: batches by length within a database, the learning rate on its
    schedule, an AdamW step each, until the epochs or the time budget are spent. The
    ``second_pass`` (``sft.own_mistakes``) has its own epochs, peak learning rate, fresh
    optimizer and schedule, and no time budget."""
    sft, own = settings.sft, settings.sft.own_mistakes
    model.train()
    rng = random.Random(f"{settings.seed}:sft-batches" + (":own" if second_pass else ""))
    epochs, lr = (own.epochs, sft.lr * own.lr_scale) if second_pass else (sft.epochs, sft.lr)
    total = max(1, math.ceil(epochs * math.ceil(len(encoded) / sft.batch_size)))
    params = [p for p in model.parameters() if p.requires_grad]
    loss_of = _StepLoss(model, tokenizer, settings, params[0].dtype)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=sft.weight_decay)
    lengths = [len(ids) for ids, _ in encoded]
    done, budget_s, started = _Trained(), 0.0 if second_pass else sft.max_minutes * 60, time.perf_counter()
    bar = tqdm(total=total, desc="sft own revisions" if second_pass else "sft", disable=not progress)
    with _layers_checkpointed(model, sft.gradient_checkpointing):
        while done.steps < total and not done.stopped:
            for batch in _batches(lengths, groups, sft.batch_size, rng):
                spent = (time.perf_counter() - started) / budget_s if budget_s > 0 else 0.0
                at = max((done.steps + 0.5) / total, min(spent, 1.0))  # the middle of this step
                for group in optimizer.param_groups:
                    group["lr"] = lr * schedule_factor(at, sft.warmup_ratio)
                optimizer.zero_grad(set_to_none=True)  # no gradients held through the forward pass
                loss, total_loss, processed = loss_of([encoded[i] for i in batch], done)
                total_loss.backward()
                torch.nn.utils.clip_grad_norm_(params, sft.grad_clip)
                release_free_heap()  # the freed activations' heap, before the step adds its own
                optimizer.step()
                done.losses.append(float(loss.detach()))
                done.tokens += processed
                done.sequence_tokens += sum(lengths[i] for i in batch)
                done.steps += 1
                bar.update(1)
                bar.set_postfix(loss=f"{done.losses[-1]:.3f}")
                out_of_time = budget_s > 0 and time.perf_counter() - started >= budget_s
                if done.steps >= total or out_of_time:
                    done.stopped = done.steps < total
                    break
    bar.close()
    return done


class _StepLoss:
    """One step's loss at the precision of ``sft.autocast``: ``token_loss`` of the batch's rows,
    plus the copy term of ``sft.copy_rows`` (recorded in ``_Trained.copy_losses``)."""

    def __init__(self, model: Any, tokenizer: Any, settings: Settings, weights: torch.dtype) -> None:
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.autocast = training_autocast(settings.sft.autocast, model.device, weights)
        self.copy_rng, self.copy_pool = random.Random(f"{settings.seed}:sft-copy"), ordinary_ids(tokenizer)

    def __call__(self, rows: list[tuple[list[int], list[int]]], done: _Trained) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(the SFT loss, the loss to minimise, positions run through the model)."""
        sft, rl = self.settings.sft, self.settings.rl
        with self.autocast:
            loss, processed = token_loss(self.model, rows, self.tokenizer.pad_token_id, chunk_mb=sft.logits_chunk_mb,
                                         min_shared=rl.shared_prefix_min_tokens, query_block=rl.attention_query_block)
            if not sft.copy_rows:
                return loss, loss, processed
            # A token no SFT target holds (a piece of an unseen database's name) only ever has its
            # logit pushed down, until the policy cannot write it even when the schema does; the
            # copy strings keep every token's output and the copy head alive.
            copy_term = copy_loss(self.model, self.tokenizer, self.copy_pool, sft.copy_rows,
                                  self.settings.model.copy_warmup.max_len, self.copy_rng)
        done.copy_losses.append(float(copy_term.detach()))
        return loss, loss + copy_term, processed


@contextlib.contextmanager
def _layers_checkpointed(model: Any, on: bool) -> Iterator[None]:
    """Inside, with ``on`` (``sft.gradient_checkpointing``): each decoder layer keeps only its
    input for the backward pass and runs again there (transformers' gradient checkpointing):
    a step's activations shrink from ~1.3 MB a token (SmolLM2's 30 layers) to ~0.1 MB, for one
    more forward pass. Off again after."""
    inner = base_model(model)
    if not on:
        yield
        return
    inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        yield
    finally:
        inner.gradient_checkpointing_disable()


# ----------------------------------------------------------------------------- quick evaluation
def greedy_ex(model_dir: str | Path, corpus_dir: str | Path, split: str = "dev", limit: int | None = None,
              settings: Settings | None = None) -> float:
    """Execution accuracy of greedy single-turn generation (the output format of ``rl.recipe``)
    on the first ``limit`` examples of ``split``: the evaluation's greedy mode, as a quick check."""
    settings = settings or default_settings()
    layout = CorpusLayout(Path(corpus_dir))
    examples = list(read_jsonl(layout.split(split)))[: limit or None]
    if not examples:
        raise CorpusError(f"{layout.split(split)}: no examples")
    with ChatModel.load(model_dir, settings.generation, dtype=settings.model.dtype, seed=settings.seed) as chat:
        evals = greedy_answers(settings, chat, layout.root, examples)
    return sum(ev.greedy is not None and ev.greedy.verdict.correct for ev in evals) / len(evals)
