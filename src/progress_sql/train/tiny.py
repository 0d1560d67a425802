"""The tiny CPU policy: a byte-level BPE tokenizer trained on the corpus and a small
Qwen2/Llama-style model built from ``settings.model``, saved in Hugging Face format.

The tokenizer speaks ChatML (``<|im_start|>role\\n...<|im_end|>\\n``, the Qwen convention):
``<|im_end|>`` is the eos token (it ends an assistant turn), ``<|endoftext|>`` the pad token.
The output-format tags (``<think>``, ``<sql>``, ``<observation>``, ...) are single added
tokens that decode exactly to their text; they are not "special", so decoding with
``skip_special_tokens=True`` keeps them too.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from progress_sql.params import CopyWarmupSettings, EnvSettings, Settings, default_settings
from progress_sql.corpus.records import CorpusError, CorpusLayout, read_jsonl
from progress_sql.envs.db_details import SchemaTexts
from progress_sql.envs.prompts import FINAL_ANSWER, INVALID_ACTION, TURNS_LEFT, system_prompt, user_prompt
from progress_sql.odt import FALLBACK_FEEDBACK, TAGS, feedback_text
from progress_sql.odt.feedback import DB_ENGINE
from progress_sql.formats import ALL_TAGS, FORMATS

PAD, BOS_TURN, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS_TURN, EOS)
# Every tag of every output format and environment message, opening and closing.
FORMAT_TAGS = tuple(f"<{close}{tag}>" for tag in ALL_TAGS for close in ("", "/"))

# ChatML, the format of Qwen2 instruct models: what the tokenizer's apply_chat_template renders.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` with the chat special tokens, the format
    tags as single tokens and the ChatML chat template; saved to ``out_dir`` when given.

    Deterministic for the same texts in the same order. Any byte sequence is encodable
    (byte-level), and ``decode(encode(text)) == text`` for every text without special tokens.
    """
    fixed = len(SPECIAL_TOKENS) + len(FORMAT_TAGS) + 256
    if vocab_size <= fixed:
        raise ValueError(f"vocab_size must exceed {fixed} (special tokens, tags and the 256 bytes)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(FORMAT_TAGS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, single_word=False, normalized=False, special=False) for t in FORMAT_TAGS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    hf.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        hf.save_pretrained(str(out_dir))
    return hf


def fixed_texts() -> list[str]:
    """The texts every run shows the model whatever the data: system prompts of each format
    and prompt style, the ODT feedback of every tag and the tool-loop messages."""
    env = default_settings().env
    texts = [system_prompt(fmt, env.model_copy(update={"prompt_style": style}))
             for fmt in FORMATS for style in ("paper", "compact")]
    texts += [feedback_text((tag,)) for tag in TAGS]
    texts += [FALLBACK_FEEDBACK.format(db_engine=DB_ENGINE), INVALID_ACTION, FINAL_ANSWER]
    texts += [TURNS_LEFT.format(n=n) for n in range(10)]
    return texts


def corpus_texts(corpus_dir: str | Path, seed: int = 0, env: EnvSettings | None = None) -> Iterator[str]:
    """Tokenizer training texts from a built corpus, in the proportions a run shows them: per
    train example its round-1 system and user prompts, reasoning trace, gold SQL and one
    feedback message (tags taken in turn); the schemas of every database once (their text is
    model input, not a label). Prompts and schemas in ``env.prompt_style`` (default: the
    default settings'). Deterministic for a corpus and seed."""
    env = env or default_settings().env
    layout = CorpusLayout(Path(corpus_dir))
    train = list(read_jsonl(layout.split("train")))
    if not train:
        raise CorpusError(f"{layout.split('train')}: no training examples")
    schemas = SchemaTexts.for_corpus(layout, env.prompt_style)
    fixed = fixed_texts()
    feedback = [feedback_text((tag,)) for tag in TAGS]
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    system = system_prompt("think_sql", env)
    for k, i in enumerate(order):
        ex = train[i]
        yield system
        yield user_prompt(ex, schemas(ex.db_id, layout.database(ex.db_id)))
        yield f"<think>{ex.reasoning}</think><sql>{ex.gold_sql}</sql>"
        yield feedback[k % len(feedback)]
    yield from fixed
    for folder in sorted(p for p in layout.databases.iterdir() if p.is_dir()):
        yield schemas(folder.name, layout.database(folder.name))


def tiny_config(settings: Settings, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config | LlamaConfig:
    """The model config ``settings.model`` describes, sized to the tokenizer's vocabulary."""
    m = settings.model
    if m.hidden_size % m.num_heads or m.num_heads % m.num_kv_heads:
        raise ValueError("model.hidden_size must be a multiple of num_heads, and num_heads of num_kv_heads")
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2Config(**common) if m.arch == "qwen2" else LlamaConfig(**common)


# ----------------------------------------------------------------------------- copy warmup
def copy_rows(pool: list[int], sep: int, pad: int, count: int, max_len: int,
              rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` rows ``s + [sep] + s`` of random strings ``s`` drawn from ``pool``, right-padded:
    ``(input_ids, attention_mask, labels)``. Labels hold the repeat from its second token (the
    first only says where the repeat starts); everything else is -100."""
    strings = [[rng.choice(pool) for _ in range(rng.randint(min(8, max_len), max_len))] for _ in range(count)]
    width = 2 * max(map(len, strings)) + 1
    input_ids = torch.full((count, width), pad, dtype=torch.long)
    attention = torch.zeros((count, width), dtype=torch.long)
    labels = torch.full((count, width), -100, dtype=torch.long)
    for r, s in enumerate(strings):
        row = s + [sep] + s
        input_ids[r, :len(row)] = torch.tensor(row)
        attention[r, :len(row)] = 1
        labels[r, len(s) + 2:len(row)] = torch.tensor(s[1:])
    return input_ids, attention, labels


def ordinary_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Every token id but the special tokens and the added format tags."""
    reserved = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    return [i for i in range(len(tokenizer)) if i not in reserved]


def copy_loss(model: Any, tokenizer: PreTrainedTokenizerFast, pool: list[int], count: int, max_len: int,
              rng: random.Random) -> torch.Tensor:
    """The model's loss on the repeats of ``count`` fresh random strings from ``pool`` (``copy_rows``)."""
    input_ids, attention, labels = copy_rows(pool, tokenizer.eos_token_id, tokenizer.pad_token_id, count, max_len, rng)
    return model(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device),
                 labels=labels.to(model.device)).loss


@torch.no_grad()
def copy_accuracy(model: Any, tokenizer: PreTrainedTokenizerFast, *, strings: int = 64, max_len: int = 32,
                  seed: int = 1) -> float:
    """Share of the repeated tokens of ``strings`` fresh random strings (as in ``copy_warmup``)
    that the model's argmax predicts, teacher-forced: 1/vocabulary by chance, near 1 once it
    copies."""
    rng = random.Random(f"{seed}:copy-accuracy")
    input_ids, attention, labels = copy_rows(ordinary_ids(tokenizer), tokenizer.eos_token_id,
                                             tokenizer.pad_token_id, strings, max_len, rng)
    logits = model(input_ids=input_ids.to(model.device), attention_mask=attention.to(model.device)).logits
    target = labels[:, 1:].to(model.device)
    hits = (logits[:, :-1].argmax(-1) == target) & (target != -100)
    return float(hits.sum()) / float((target != -100).sum())


def copy_warmup(model: Any, tokenizer: PreTrainedTokenizerFast, warmup: CopyWarmupSettings, *, seed: int = 0,
                progress: bool = False) -> dict[str, Any]:
    """Pretrain an untrained ``model`` to copy: AdamW steps (constant lr) on random token
    strings, each followed by eos and itself, with loss on the repeat only, until the mean loss
    of the last 50 steps falls below ``warmup.target_loss`` or after ``warmup.steps``.

    Why: trained from scratch on a dozen databases, the tiny policy learns their names by
    heart and writes them on every database. Copying needs an induction head (attend to the
    token after an earlier occurrence of the current one), which forms suddenly, after a
    plateau whose length varies with the draw (steps ~1,200-1,700 for the default model); the
    strings are pure copy pressure, and SFT then has a copier to point at the schema. Returns
    the steps run, the loss at the first and last steps and ``copy_accuracy``.
    """
    rng = random.Random(f"{seed}:copy-warmup")
    pool = ordinary_ids(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=warmup.lr, weight_decay=0.0)
    losses: list[float] = []
    model.train()
    bar = tqdm(total=warmup.steps, desc="copy warmup", disable=not progress)
    while len(losses) < warmup.steps:
        loss = copy_loss(model, tokenizer, pool, warmup.batch_size, warmup.max_len, rng)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), warmup.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
        recent = sum(losses[-50:]) / len(losses[-50:])
        bar.update(1)
        bar.set_postfix(loss=f"{recent:.3f}")
        if len(losses) >= 50 and recent < warmup.target_loss:
            break
    bar.close()
    model.eval()
    tail = losses[-50:]
    return {"steps": len(losses), "first_loss": losses[0] if losses else None,
            "final_loss": sum(tail) / len(tail) if tail else None,
            "copy_accuracy": copy_accuracy(model, tokenizer, max_len=warmup.max_len, seed=seed)}


def build_tiny_model(corpus_dir: str | Path, settings: Settings, out_dir: str | Path | None = None, *,
                     progress: bool = False) -> Path:
    """Train the tokenizer on the corpus, build the tiny model from ``settings.model`` (seeded
    by ``settings.seed``), copy-pretrain it (``copy_warmup``; ``model.copy_warmup.steps`` 0:
    untrained) and save both, with a generation config whose eos ids are ``<|im_end|>`` and
    ``<|endoftext|>``, into ``out_dir`` (default ``settings.model.base_dir``). Returns the
    directory; ``tiny_model.json`` records the settings and the warmup's figures."""
    out = Path(out_dir if out_dir is not None else settings.model.base_dir)
    texts = corpus_texts(corpus_dir, settings.seed, settings.env)
    tokenizer = train_tokenizer(texts, settings.model.vocab_size)
    config = tiny_config(settings, tokenizer)
    torch.manual_seed(settings.seed)
    model_cls = Qwen2ForCausalLM if settings.model.arch == "qwen2" else LlamaForCausalLM
    model = model_cls(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=None
    )
    warmup = settings.model.copy_warmup
    before = copy_accuracy(model, tokenizer, max_len=warmup.max_len, seed=settings.seed)
    report = {"copy_accuracy_before": before}
    if warmup.steps:
        report.update(copy_warmup(model, tokenizer, warmup, seed=settings.seed, progress=progress))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "tiny_model.json").write_text(
        json.dumps({"corpus": str(corpus_dir), "model": settings.model.model_dump(), "seed": settings.seed,
                    "parameters": sum(p.numel() for p in model.parameters()), "copy_warmup": report},
                   indent=2, sort_keys=True),
        encoding="utf-8",
    )
    return out

