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
from typing import Iterable, Iterator

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from progress_sql.config import EnvSettings, Settings, default_settings
from progress_sql.data.records import CorpusError, CorpusLayout, read_jsonl
from progress_sql.envs.db_details import SchemaTexts
from progress_sql.envs.prompts import FINAL_ANSWER, INVALID_ACTION, TURNS_LEFT, system_prompt, user_prompt
from progress_sql.odt import FALLBACK_FEEDBACK, TAGS, feedback_text
from progress_sql.odt.feedback import DB_ENGINE
from progress_sql.rewards.formats import FORMATS

PAD, BOS_TURN, EOS = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, BOS_TURN, EOS)
# Every tag of every output format and environment message (rewards.formats, envs.prompts).
FORMAT_TAGS = tuple(
    f"<{close}{tag}>"
    for tag in ("think", "sql", "reasoning", "answer", "solution", "observation")
    for close in ("", "/")
)

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


def build_tiny_model(corpus_dir: str | Path, settings: Settings, out_dir: str | Path | None = None) -> Path:
    """Train the tokenizer on the corpus, build the untrained tiny model from
    ``settings.model`` (seeded by ``settings.seed``) and save both, with a generation config
    whose eos ids are ``<|im_end|>`` and ``<|endoftext|>``, into ``out_dir`` (default
    ``settings.model.base_dir``). Returns the directory."""
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
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "tiny_model.json").write_text(
        json.dumps({"corpus": str(corpus_dir), "model": settings.model.model_dump(), "seed": settings.seed,
                    "parameters": sum(p.numel() for p in model.parameters())}, indent=2, sort_keys=True),
        encoding="utf-8",
    )
    return out

