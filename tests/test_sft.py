"""SFT warm start: examples (plain and revision), corruptions, masks, training, LoRA, greedy EX."""

from __future__ import annotations

import json
import random
import shutil

import pytest

torch = pytest.importorskip("torch")

from progress_sql.params import settings_from_dict  # noqa: E402
from corpora import small_corpus  # noqa: E402
from progress_sql.corpus.records import CorpusLayout, read_jsonl, write_jsonl  # noqa: E402
from progress_sql.envs import SchemaTexts, round1_messages  # noqa: E402
from progress_sql.odt import FALLBACK_FEEDBACK, VALUE_MISMATCH, diagnose, feedback_text  # noqa: E402
from progress_sql.odt.feedback import DB_ENGINE  # noqa: E402
from progress_sql.formats import parse_output  # noqa: E402
from progress_sql.sql import execute, order_matters, results_match  # noqa: E402
from progress_sql.sql.parse import parse_one  # noqa: E402
from progress_sql.train import corrupt as C  # noqa: E402
from progress_sql.inference.models import load_policy  # noqa: E402
from progress_sql.train.sft import (  # noqa: E402
    METRICS_FILE,
    _batches,
    _layers_checkpointed,
    build_sft_examples,
    encode_conversation,
    greedy_ex,
    load_train_examples,
    run_sft,
    schedule_factor,
    target_text,
    token_loss,
)
from progress_sql.train.packing import common_prefix  # noqa: E402
from progress_sql.train.precision import training_autocast  # noqa: E402
from progress_sql.train.tiny import build_tiny_model, copy_accuracy, copy_rows, ordinary_ids  # noqa: E402

TINY = {"vocab_size": 1024, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 2048, "copy_warmup": {"steps": 0}}
CORPUS = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 60, "dev_size": 10,
          "test_size": 10, "neighbours": 0}


def make_settings(tmp_path, **sft):
    base = {"init_from": str(tmp_path / "base"), "out_dir": str(tmp_path / "sft"), "batch_size": 8,
            "lr": 3e-3, "revision_share": 0.5, "max_seq_len": 2048}
    return settings_from_dict({"data": CORPUS, "model": TINY, "sft": {**base, **sft},
                               "generation": {"max_new_tokens": 96}})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sft")
    settings = make_settings(root)
    small_corpus(root / "corpus", settings)
    build_tiny_model(root / "corpus", settings, root / "base")
    return root


@pytest.fixture(scope="module")
def layout(workdir):
    return CorpusLayout(workdir / "corpus")


@pytest.fixture(scope="module")
def conversations(workdir, layout):
    examples = list(read_jsonl(layout.split("train")))
    return build_sft_examples(examples, make_settings(workdir), database=layout.database,
                              schema_texts=SchemaTexts.for_corpus(layout))


@pytest.fixture(scope="module")
def tokenizer(workdir):
    return load_policy(workdir / "base")[1]


# ----------------------------------------------------------------------------- corruptions
SCHEMA = {"ward": ["ward_id", "name", "floor", "beds"], "doctor": ["doctor_id", "name", "ward_id"]}
JOIN = ("SELECT T2.name, COUNT(*) FROM doctor AS T1 JOIN ward AS T2 ON T1.ward_id = T2.ward_id "
        "WHERE T2.floor > 2 AND T2.beds >= 10 GROUP BY T2.ward_id ORDER BY AVG(T2.beds) DESC LIMIT 3")


def _apply(name, sql=JOIN, seed=0):
    out = C.CORRUPTIONS[name](parse_one(sql), SCHEMA, random.Random(seed))
    return None if out is None else out.sql(dialect="sqlite")


def test_each_corruption_makes_its_mistake():
    tree = lambda sql: parse_one(sql)  # noqa: E731
    dropped = tree(_apply("drop_where_predicate"))
    assert len(list(dropped.find_all(C.exp.GT, C.exp.GTE))) == 1
    assert tree(_apply("drop_where_predicate", "SELECT name FROM ward WHERE floor = 1")).args.get("where") is None
    assert _apply("flip_comparison", "SELECT name FROM ward WHERE floor > 2") == "SELECT name FROM ward WHERE floor < 2"
    assert _apply("flip_comparison", "SELECT name FROM ward WHERE floor = 2") == "SELECT name FROM ward WHERE floor <> 2"
    assert _apply("wrong_aggregate", "SELECT MAX(beds) FROM ward") in {
        f"SELECT {f}(beds) FROM ward" for f in ("MIN", "AVG", "SUM", "COUNT")}
    assert _apply("wrong_aggregate", "SELECT COUNT(*) FROM ward") is None
    assert "GROUP BY" not in _apply("drop_group_by") and "JOIN" not in _apply("drop_join")
    column = _apply("wrong_column", "SELECT T2.name FROM doctor AS T1 JOIN ward AS T2 ON T1.ward_id = T2.ward_id")
    assert column.split(" FROM")[0] in {f"SELECT T2.{c}" for c in ("ward_id", "floor", "beds")}
    assert _apply("wrong_column", "SELECT name FROM ward", seed=1).split(" FROM")[0] in {
        "SELECT ward_id", "SELECT floor", "SELECT beds"}
    assert "ORDER BY AVG(T2.beds) ASC" in _apply("change_order")
    assert _apply("change_limit") != JOIN
    assert _apply("toggle_distinct", "SELECT name FROM ward") == "SELECT DISTINCT name FROM ward"
    assert _apply("toggle_distinct", "SELECT DISTINCT name FROM ward") == "SELECT name FROM ward"
    assert _apply("drop_select_item") in {JOIN.replace("T2.name, ", ""), JOIN.replace(", COUNT(*)", "")}
    assert _apply("drop_select_item", "SELECT name FROM ward") is None


def test_corrupt_lists_distinct_applicable_corruptions():
    out = C.corrupt(JOIN, random.Random(0), SCHEMA)
    names = [n for n, _ in out]
    assert len(set(names)) == len(names) >= 8
    gold = parse_one(JOIN).sql(dialect="sqlite")
    assert all(sql != gold for _, sql in out)
    assert C.corrupt("SELEC nonsense (", random.Random(0)) == []
    assert C.schema_from_ddl("CREATE TABLE ward (ward_id NUMERIC, -- id\n name TEXT);") == {"ward": ["ward_id", "name"]}
    assert C.schema_from_ddl("not ddl at all (") == {}


# ----------------------------------------------------------------------------- examples
def test_plain_examples_are_the_environment_prompt_and_the_gold(conversations, layout):
    examples = {ex.id: ex for ex in read_jsonl(layout.split("train"))}
    plain = [c for c in conversations if c.kind == "plain"]
    assert len(plain) == len(examples)
    schemas = SchemaTexts.for_corpus(layout)
    for conv in plain[:10]:
        ex = examples[conv.example_id]
        assert conv.messages[:2] == round1_messages(ex, schemas(ex.db_id, layout.database(ex.db_id)), "think_sql")
        assert conv.targets == (2,) and conv.messages[2]["role"] == "assistant"
        parsed = parse_output(conv.messages[2]["content"], "think_sql")
        assert parsed.well_formed and parsed.sql == ex.gold_sql
        assert ex.reasoning and ex.reasoning in conv.messages[2]["content"]


def test_revision_dialogues_carry_the_real_odt_feedback(conversations, layout):
    examples = {ex.id: ex for ex in read_jsonl(layout.split("train"))}
    revisions = [c for c in conversations if c.kind == "revision"]
    assert 0.3 * len(examples) <= len(revisions) <= 0.7 * len(examples)  # revision_share 0.5
    assert len({c.corruption for c in revisions}) >= 4
    value_mismatch = 0
    for conv in revisions:
        ex = examples[conv.example_id]
        system, user, wrong, feedback, final = conv.messages
        assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user", "assistant"]
        assert conv.targets == (4,) and final["content"] == target_text(ex, "think_sql")
        wrong_sql = parse_output(wrong["content"], "think_sql").sql
        db = layout.database(ex.db_id)
        pred, gold = execute(db, wrong_sql), execute(db, ex.gold_sql)
        assert not (pred.ok and results_match(pred, gold, order_matters(ex.gold_sql)))  # really wrong
        d = diagnose(wrong_sql, ex.gold_sql)
        if not d.parsed:
            expected = FALLBACK_FEEDBACK.format(db_engine=DB_ENGINE)
        elif d.tags:
            expected = d.feedback
        else:
            expected, value_mismatch = feedback_text((VALUE_MISMATCH,)), value_mismatch + 1
        assert feedback["content"] == expected and expected.startswith("Feedback:")


def test_build_is_deterministic_and_other_formats_are_plain(workdir, layout, conversations):
    examples = list(read_jsonl(layout.split("train")))[:12]
    settings = make_settings(workdir)
    kwargs = dict(database=layout.database, schema_texts=SchemaTexts.for_corpus(layout))
    first = build_sft_examples(examples, settings, **kwargs)
    assert first == build_sft_examples(examples, settings, **kwargs)
    answer = build_sft_examples(examples, settings, fmt="reasoning_answer", **kwargs)
    assert len(answer) == 12 and all(c.kind == "plain" for c in answer)
    assert parse_output(answer[0].messages[-1]["content"], "reasoning_answer").well_formed
    assert "<reasoning>" in answer[0].messages[0]["content"]
    none = build_sft_examples(examples, make_settings(workdir, revision_share=0.0), **kwargs)
    assert all(c.kind == "plain" for c in none)


# ----------------------------------------------------------------------------- tokens and masks
def test_masks_cover_only_the_final_assistant_turn(conversations, tokenizer):
    for conv in [c for c in conversations if c.kind == "revision"][:5] + [conversations[0]]:
        ids, mask = encode_conversation(tokenizer, conv.messages, conv.targets)
        full = tokenizer.apply_chat_template(conv.messages, tokenize=True, return_dict=False)
        assert ids == list(full)  # segment-wise tokens = the whole rendering's tokens
        assert len(mask) == len(ids)
        target = [i for i, m in zip(ids, mask) if m]
        assert tokenizer.decode(target) == conv.messages[-1]["content"] + "<|im_end|>"
        # the masked span is contiguous and is exactly the last assistant content + eos
        on = [k for k, m in enumerate(mask) if m]
        assert on == list(range(on[0], on[-1] + 1))
        prefix = tokenizer.apply_chat_template(conv.messages[:-1], tokenize=True, return_dict=False,
                                               add_generation_prompt=True)
        assert on[0] == len(prefix) and ids[: len(prefix)] == list(prefix)
        assert sum(mask[: on[0]]) == 0  # prompt, corrupted turn, feedback: no loss
        assert mask[on[-1] + 1:] == [0] * (len(mask) - on[-1] - 1)


def test_encode_conversation_rejects_bad_targets_and_unstable_templates(conversations, tokenizer):
    conv = conversations[0]
    with pytest.raises(ValueError, match="only assistant"):
        encode_conversation(tokenizer, conv.messages, (1,))
    reversed_template = "{% for m in messages|reverse %}{{ m['role'] + ':' + m['content'] + '\n' }}{% endfor %}"
    unstable = load_policy.__globals__["AutoTokenizer"].from_pretrained(tokenizer.name_or_path)
    unstable.chat_template = reversed_template
    with pytest.raises(ValueError, match="prefix-stable"):
        encode_conversation(unstable, conv.messages, conv.targets)


# ----------------------------------------------------------------------------- training
def _rowwise_loss(model, rows):
    """The batch's mean cross-entropy over its targets computed one row at a time, full logits."""
    total, count = 0.0, 0
    for ids, mask in rows:
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
        picked = logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        total, count = total + (picked * torch.tensor(mask[1:])).sum(), count + sum(mask[1:])
    return -total / count


def test_packed_shared_prefix_loss_equals_the_rowwise_loss_and_gradients(workdir, conversations, tokenizer):
    """token_loss packs a batch into one row and runs the database's prompt once: the loss and
    gradients of each row alone, with the prompt counted once in the positions run; and the
    same again with every layer checkpointed (sft.gradient_checkpointing)."""
    model, _ = load_policy(workdir / "base", dtype="float32")  # the arithmetic, not a precision, is checked
    model.train()
    db = conversations[0].db_id
    same_db = [c for c in conversations if c.db_id == db]
    rows = [encode_conversation(tokenizer, c.messages, c.targets) for c in same_db[:4] + [
        c for c in same_db if c.kind == "revision"][:2]]
    k = common_prefix([ids for ids, _ in rows])
    assert 100 < k < min(m.index(1) for _, m in rows)  # system prompt and schema shared, targets not
    runs = {}
    for name in ("rowwise", "shared", "plain", "checkpointed"):
        model.zero_grad()
        with _layers_checkpointed(model, name == "checkpointed"):
            loss, processed = ((_rowwise_loss(model, rows), 0) if name == "rowwise" else
                               token_loss(model, rows, tokenizer.pad_token_id, share_prefix=name != "plain"))
            loss.backward()
        runs[name] = (loss.item(), processed, torch.cat([p.grad.flatten() for p in model.parameters()]))
    reference, _, g_reference = runs.pop("rowwise")
    for name, (loss, _, grads) in runs.items():
        assert abs(loss - reference) < 1e-5, name
        assert torch.allclose(grads, g_reference, atol=1e-6, rtol=1e-4), name
    assert runs["plain"][1] == sum(len(ids) for ids, _ in rows)  # packed: no padding
    assert runs["plain"][1] - runs["shared"][1] == (len(rows) - 1) * k  # the prompt ran once, not once a row
    assert runs["checkpointed"][1] == runs["shared"][1]
    assert not model.is_gradient_checkpointing  # off again after


def test_checkpointed_layers_keep_a_fraction_of_the_activations(workdir, conversations, tokenizer):
    """sft.gradient_checkpointing: what a step keeps for its backward pass (the bytes autograd
    saves, counted by a saved-tensors hook) shrinks to each layer's input and the output head's,
    a small share of every layer's activations (SmolLM2's step: 9.6 GiB resident before, 3.2 now:
    bench/bench_cores.py --parts sft)."""
    model, _ = load_policy(workdir / "base", dtype="float32")
    model.train()
    rows = [encode_conversation(tokenizer, c.messages, c.targets) for c in conversations[:6]]
    saved = {}
    for on in (False, True):
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel() * t.element_size()
            return t

        with _layers_checkpointed(model, on), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _ = token_loss(model, rows, tokenizer.pad_token_id)
        loss.backward()
        saved[on] = total[0]
    assert saved[True] < saved[False] / 3, saved


def test_bf16_autocast_keeps_the_loss_and_fp32_weights_and_gradients(workdir, conversations, tokenizer):
    model, _ = load_policy(workdir / "base", dtype="float32", device="cpu")
    model.train()
    rows = [encode_conversation(tokenizer, c.messages, c.targets) for c in conversations[:4]]
    losses = {}
    for mode in ("off", "bf16"):
        model.zero_grad()
        with training_autocast(mode, torch.device("cpu"), torch.float32):
            loss, _ = token_loss(model, rows, tokenizer.pad_token_id)
            logits = model(torch.tensor([rows[0][0][:8]])).logits
        loss.backward()
        losses[mode] = loss.item()
        assert logits.dtype == (torch.bfloat16 if mode == "bf16" else torch.float32)
        assert all(p.dtype == p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
    assert abs(losses["bf16"] - losses["off"]) < 0.05 * losses["off"]  # bf16 rounding, not another loss
    # auto leaves weights that are already low precision as they are
    with training_autocast("auto", torch.device("cpu"), torch.bfloat16):
        assert not torch.is_autocast_enabled("cpu")


def test_batches_hold_one_database_and_cover_every_example():
    groups = ["a"] * 7 + ["b"] * 5
    lengths = list(range(12))
    batches = _batches(lengths, groups, 3, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(12))
    assert all(len({groups[i] for i in b}) == 1 and len(b) <= 3 for b in batches)


def test_schedule_warms_up_then_decays_to_zero():
    assert schedule_factor(0.0, 0.1) == 0.0 and schedule_factor(0.05, 0.1) == pytest.approx(0.5)
    assert schedule_factor(0.1, 0.1) == pytest.approx(1.0) and schedule_factor(0.55, 0.1) == pytest.approx(0.5)
    assert schedule_factor(1.0, 0.1) == pytest.approx(0.0) and schedule_factor(0.0, 0.0) == pytest.approx(1.0)


def test_sft_lowers_the_loss_and_saves_a_loadable_model(workdir):
    settings = make_settings(workdir, max_examples=40, epochs=3.0, revision_share=0.25, lr=2e-2)
    result = run_sft(settings, workdir / "corpus", progress=False)
    assert result.examples["plain"] == 40 and result.examples["revision"] > 0
    assert result.steps == len(result.losses) > 0
    assert result.final_loss < result.losses[0] - 1.5  # nats, from ln(vocab) at the untrained start
    metrics = json.loads((workdir / "sft" / METRICS_FILE).read_text())
    assert metrics["steps"] == result.steps and metrics["losses"] == result.losses
    model, tok = load_policy(workdir / "sft")
    assert tok.chat_template and model.config.hidden_size == TINY["hidden_size"]


def test_sft_respects_max_seq_len_and_the_time_budget(workdir, tmp_path):
    settings = make_settings(workdir, max_examples=8, max_seq_len=900, epochs=50.0, max_minutes=1e-9,
                             revision_share=0.0, out_dir=str(tmp_path / "short"))
    result = run_sft(settings, workdir / "corpus", out_dir=tmp_path / "short", progress=False)
    assert result.stopped_early and result.steps == 1
    assert result.dropped_too_long + result.examples["trained"] == 8
    with pytest.raises(ValueError, match="max_seq_len"):
        run_sft(make_settings(workdir, max_examples=4, max_seq_len=32), workdir / "corpus", out_dir=tmp_path / "x",
                progress=False)


def test_the_heap_goes_back_after_the_backward_pass_before_each_step(workdir, tmp_path, monkeypatch):
    """The freed activations' heap is trimmed before the optimizer step allocates its own
    temporaries on top (2026-12-07-heap-before-the-step.md: SmolLM2's SFT peak 2.90 -> 2.79 GiB, no creep)."""
    from progress_sql.train import sft as sft_module
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    events = []
    release = sft_module.release_free_heap

    def recorded_release():
        events.append("release")
        return release()

    monkeypatch.setattr(sft_module, "release_free_heap", recorded_release)
    hook = register_optimizer_step_pre_hook(lambda *_: events.append("step"))
    try:
        settings = make_settings(workdir, max_examples=16, epochs=1.0, revision_share=0.0,
                                 out_dir=str(tmp_path / "heap"))
        result = run_sft(settings, workdir / "corpus", out_dir=tmp_path / "heap", progress=False)
    finally:
        hook.remove()
    assert result.steps == 2
    assert events == ["release", "step"] * 2


def test_copy_rows_add_the_copy_loss_on_fresh_strings_to_each_step(workdir, tmp_path):
    """With sft.copy_rows the step's loss is the SFT loss plus the copy-warmup loss on that many
    random strings (drawn from the seed): step 1 shows both terms, computed on the start model."""
    runs = {}
    for rows in (0, 6):
        settings = make_settings(workdir, max_examples=8, epochs=1.0, revision_share=0.0, copy_rows=rows)
        runs[rows] = run_sft(settings, workdir / "corpus", out_dir=tmp_path / f"c{rows}", progress=False)
    assert runs[0].copy_losses == [] and runs[0].final_copy_loss is None
    assert len(runs[6].copy_losses) == runs[6].steps == 1
    assert runs[6].losses[0] == pytest.approx(runs[0].losses[0], rel=1e-5)  # the SFT term alone
    model, tokenizer = load_policy(workdir / "base", dtype="float32")  # the weights SFT trains
    ids, attention, labels = copy_rows(ordinary_ids(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, 6,
                                       settings.model.copy_warmup.max_len, random.Random("0:sft-copy"))
    model.train()  # as in the SFT loop (no dropout in the tiny model either way)
    with torch.no_grad(), training_autocast(settings.sft.autocast, model.device, torch.float32):
        expected = float(model(input_ids=ids.to(model.device), attention_mask=attention.to(model.device),
                               labels=labels.to(model.device)).loss)
    assert runs[6].copy_losses[0] == pytest.approx(expected, rel=1e-4)
    assert runs[6].final_copy_loss == pytest.approx(expected, rel=1e-4)


def test_copy_rows_keep_the_copy_warmup_through_sft(workdir, tmp_path):
    """SFT alone unlearns copying (the tokens of strings it never writes lose their logits);
    with copy rows in every step the policy still copies fresh strings afterwards."""
    warm = {**TINY, "copy_warmup": {"steps": 600, "max_len": 8, "lr": 3e-3, "target_loss": 0.3}}
    settings = settings_from_dict({"data": CORPUS, "model": warm})
    build_tiny_model(workdir / "corpus", settings, tmp_path / "warm")
    assert copy_accuracy(*load_policy(tmp_path / "warm"), max_len=8) > 0.9
    after = {}
    for rows in (0, 16):
        sft = make_settings(workdir, init_from=str(tmp_path / "warm"), max_examples=40, epochs=8.0, lr=1e-2,
                            copy_rows=rows).model_copy(update={"model": settings.model})  # strings as warmed
        run_sft(sft, workdir / "corpus", out_dir=tmp_path / f"sft{rows}", progress=False)
        after[rows] = copy_accuracy(*load_policy(tmp_path / f"sft{rows}"), max_len=8)
    assert after[0] < 0.3 < 0.9 < after[16]


def test_lora_trains_an_adapter_and_saves_a_merged_model(workdir, tmp_path):
    settings = make_settings(workdir, max_examples=8, epochs=1.0, revision_share=0.0,
                             lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0})
    result = run_sft(settings, workdir / "corpus", out_dir=tmp_path / "lora", progress=False)
    assert result.lora and result.steps == 1
    assert (tmp_path / "lora" / "adapter" / "adapter_config.json").is_file()
    merged, _ = load_policy(tmp_path / "lora")
    base, _ = load_policy(workdir / "base")
    assert not any("lora" in k for k in merged.state_dict())
    assert torch.equal(merged.model.embed_tokens.weight, base.model.embed_tokens.weight)  # not a LoRA target
    changed = [k for k, v in base.state_dict().items() if not torch.equal(v, merged.state_dict()[k])]
    assert changed and all("proj" in k for k in changed)  # only the adapted linear layers moved


def test_load_train_examples_cuts_and_shuffles(workdir):
    settings = make_settings(workdir, max_examples=5)
    picked = load_train_examples(workdir / "corpus", settings)
    assert len(picked) == 5 and picked == load_train_examples(workdir / "corpus", settings)


@pytest.mark.slow
def test_greedy_ex_counts_the_examples_a_memorised_model_gets_right(workdir, tmp_path):
    """A model fit to one example answers every prompt with that example's SQL: greedy EX is
    1 on a split holding that example, 1/2 once an example with another answer joins it."""
    corpus = tmp_path / "corpus1"
    shutil.copytree(workdir / "corpus", corpus)
    train = list(read_jsonl(corpus / "train.jsonl"))
    one = train[0]
    other = next(ex for ex in train if ex.db_id == one.db_id and ex.gold_sql != one.gold_sql
                 and not execute(layout_db := CorpusLayout(corpus).database(one.db_id), ex.gold_sql).rows
                 == execute(layout_db, one.gold_sql).rows)
    write_jsonl(corpus / "train.jsonl", [one])
    write_jsonl(corpus / "dev.jsonl", [one, other])
    settings = make_settings(workdir, epochs=80.0, batch_size=1, revision_share=0.0, warmup_ratio=0.1, lr=5e-3,
                             out_dir=str(tmp_path / "memo"))
    # room for the reasoning and the SQL of a long gold (names of several words)
    settings = settings.model_copy(update={"generation": settings.generation.model_copy(update={"max_new_tokens": 256})})
    run_sft(settings, corpus, progress=False)
    assert greedy_ex(tmp_path / "memo", corpus, split="train", settings=settings) == 1.0
    assert greedy_ex(tmp_path / "memo", corpus, split="dev", settings=settings) == 0.5
    assert greedy_ex(tmp_path / "memo", corpus, split="dev", limit=1, settings=settings) == 1.0


# ----------------------------------------------------------------------------- own mistakes
def own_settings(workdir, tmp_path, **own):
    settings = make_settings(workdir, max_examples=16, epochs=1.0, revision_share=0.0, out_dir=str(tmp_path / "own"),
                             own_mistakes={"questions": 6, "samples": 2, **own})
    return settings.model_copy(update={"generation": settings.generation.model_copy(
        update={"backend": "transformers", "max_new_tokens": 48})})


def test_own_revision_dialogues_put_the_policys_own_wrong_answer_before_the_feedback(workdir, layout):
    """Each dialogue is the environment's prompt, one of the policy's own sampled answers (as an
    RL episode's first turn samples it), the ODT feedback on it, and the gold as the target."""
    from progress_sql.inference.policy import ChatModel
    from progress_sql.train.question_scores import judged_answers
    from progress_sql.train.sft import own_revision_dialogues

    settings = own_settings(workdir, workdir, per_question=2)
    examples = list(read_jsonl(layout.split("train")))[:6]
    chat = ChatModel.load(workdir / "base", settings.generation, dtype="float32", seed=0)
    try:
        dialogues, counts = own_revision_dialogues(settings, chat, layout, examples)
        answers = judged_answers(settings, chat, layout, examples, 2)  # the same seeded samples
    finally:
        chat.close()
    wrong = {(ex.id, text) for ex, row in zip(examples, answers) for text, right in row if not right}
    assert counts["questions"] == 6 and counts["answers"] == 12 and counts["wrong"] == 12  # an untrained policy
    assert counts["dialogues"] == len(dialogues) <= counts["kept"] <= 12 and dialogues
    by_id = {ex.id: ex for ex in examples}
    for conv in dialogues:
        assert conv.kind == "own_revision" and conv.targets == (4,)
        roles = [m["role"] for m in conv.messages]
        assert roles[-3:] == ["assistant", "user", "assistant"]
        assert (conv.example_id, conv.messages[2]["content"]) in wrong
        assert conv.messages[4]["content"] == target_text(by_id[conv.example_id], "think_sql")
        assert conv.messages[3]["content"] and conv.messages[3]["content"] != conv.messages[1]["content"]


def test_own_mistakes_pass_trains_on_the_dialogues_and_replayed_examples(workdir, tmp_path):
    settings = own_settings(workdir, tmp_path, replay=0.5, epochs=2.0)
    result = run_sft(settings, workdir / "corpus", progress=False)
    own = result.own_mistakes
    assert own["questions"] == 6 and own["answers"] == 12 and own["dialogues"] > 0
    assert own["replayed"] == round(0.5 * own["dialogues"])
    trained = own["dialogues"] + own["replayed"] - own["dropped_too_long"]
    assert own["steps"] == len(own["losses"]) == 2 * -(-trained // settings.sft.batch_size)
    assert result.steps == 2 and len(result.losses) == 2  # the plain pass: 16 examples, batches of 8
    assert json.loads((tmp_path / "own" / METRICS_FILE).read_text())["own_mistakes"]["steps"] == own["steps"]
    load_policy(tmp_path / "own")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own"]  # the sampler's copy of the plain pass is gone


def test_own_mistakes_with_lora_trains_fresh_adapters_on_the_merged_weights(workdir, tmp_path):
    settings = own_settings(workdir, tmp_path)
    settings = settings.model_copy(update={"sft": settings.sft.model_copy(update={"lora": settings.sft.lora.model_copy(
        update={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0})})})
    result = run_sft(settings, workdir / "corpus", progress=False)
    assert result.own_mistakes["steps"] > 0
    assert (tmp_path / "own" / "adapter" / "adapter_config.json").is_file()
    merged, _ = load_policy(tmp_path / "own")
    assert not any("lora" in k for k in merged.state_dict())


def test_own_mistakes_are_skipped_where_the_recipe_has_no_odt_dialogue(workdir, tmp_path, capsys):
    """As the corruptions' dialogues: a recipe in other tags, or one turn, trains plain SFT and
    says why (the default run's pass must not break the other methods' presets)."""
    settings = own_settings(workdir, tmp_path)
    for update, why in (({"rl": settings.rl.model_copy(update={"recipe": "reasoning_sql"})}, "reasoning_answer"),
                        ({"env": settings.env.model_copy(update={"max_turns": 1})}, "env.max_turns is 1")):
        result = run_sft(settings.model_copy(update=update), workdir / "corpus", progress=False)
        assert why in result.own_mistakes["skipped"] and why in capsys.readouterr().err
        assert result.steps == 2 and "steps" not in result.own_mistakes
    for key, bad in (("samples", 0), ("questions", -1), ("replay", -0.5), ("lr_scale", 0.0)):
        with pytest.raises(ValueError, match=f"sft.own_mistakes.{key}"):
            settings_from_dict({"sft": {"own_mistakes": {key: bad}}})
