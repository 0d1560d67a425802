"""Token assembly of multi-turn rollouts (inference.policy, train.trajectories): exact sampled ids, masks, the chat
template's prefix property, conversation matching, truncation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from progress_sql import envs  # noqa: E402
from progress_sql.params import default_settings  # noqa: E402
from progress_sql.corpus.records import Example  # noqa: E402
from progress_sql.inference.backends import Sample, TransformersBackend  # noqa: E402
from progress_sql.inference.models import chat_prompt_ids, prepare_tokenizer  # noqa: E402
from progress_sql.formats import stop_strings  # noqa: E402
from progress_sql.inference.policy import TemplateDeltas, TokenPolicy  # noqa: E402
from progress_sql.train.trajectories import TokenizedTrajectory, max_sequence_tokens, tokenized_trajectory  # noqa: E402
from progress_sql.train.tiny import fixed_texts, tiny_config, train_tokenizer  # noqa: E402

GOLD = "SELECT name FROM department WHERE budget > 600"
WRONG = "<think>all departments</think><sql>SELECT name FROM department</sql>"
RIGHT = "<think>budget filter</think><sql>SELECT name FROM department WHERE budget > 600</sql>"


@pytest.fixture(scope="module")
def tokenizer():
    texts = fixed_texts() + [WRONG, RIGHT, "CREATE TABLE department (dept_id INTEGER PRIMARY KEY, name TEXT)"] * 3
    return prepare_tokenizer(train_tokenizer(texts, vocab_size=512))


@pytest.fixture()
def settings():
    s = default_settings().model_copy(deep=True)
    s.env.max_turns = 2
    s.generation.max_new_tokens = 12
    s.generation.max_prompt_tokens = 4096
    return s


def _example(i: int = 0) -> Example:
    return Example(id=f"ex{i}", db_id="school", question="Which departments have a budget over 600?",
                   gold_sql=GOLD, hardness="easy")


class ScriptBackend:
    """A sampler that emits scripted texts (one script per row of each call, in call order),
    tokenised as given by ``encode`` and ended with eos unless ``eos`` is False. It stands in
    for the model so that the expected token sequence is known exactly."""

    def __init__(self, tokenizer, calls, encode=None, eos=True):
        self.tokenizer, self.calls, self.eos = tokenizer, list(calls), eos
        self.encode = encode or (lambda text: tokenizer(text, add_special_tokens=False)["input_ids"])
        self.seen: list[list[list[int]]] = []

    def generate(self, prompts, *, n=1, temperature, top_p, max_new_tokens, stop=(), seed=None):
        texts = self.calls.pop(0)
        self.seen.append([list(p) for p in prompts])
        out = []
        for prompt, text in zip(prompts, texts):
            ids = list(self.encode(text)) + ([self.tokenizer.eos_token_id] if self.eos else [])
            out.append([Sample(list(prompt), ids, text, [-0.5] * len(ids), "eos" if self.eos else "stop")])
        return out

    def sync_weights(self, model):
        pass


def _rollout(policy, settings, db, n=1):
    return envs.rollout(lambda: envs.get("odt_feedback")(settings), policy, [_example(i) for i in range(n)],
                        lambda _db_id: db)


def _runs(mask):
    """Index ranges of the runs of 1s in a mask."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


# ----------------------------------------------------------------------------- template
def test_template_deltas_of_chatml(tokenizer):
    deltas = TemplateDeltas(tokenizer)
    assert tokenizer.convert_ids_to_tokens(deltas.eot)[0] == "<|im_end|>"
    assert tokenizer.decode(deltas.eot) == "<|im_end|>\n"
    cont = tokenizer.decode(deltas.continuation([{"role": "user", "content": "Feedback: fix it."}]))
    assert cont == "<|im_start|>user\nFeedback: fix it.<|im_end|>\n<|im_start|>assistant\n"
    eos = tokenizer.eos_token_id
    assert deltas.missing_eot([5, eos]) == deltas.eot[1:]  # a sampled eos is kept, only "\n" is added
    assert deltas.missing_eot([5, 6]) == deltas.eot


def test_prefix_property_tokens_equal_a_full_render(tokenizer, settings, school_db):
    """With canonically tokenised outputs the assembled record is exactly the chat template's
    rendering of the whole conversation: the template deltas add what a full render adds."""
    backend = ScriptBackend(tokenizer, [[WRONG], [RIGHT]])
    policy = TokenPolicy(backend, tokenizer, settings.generation, stop_strings("think_sql"))
    (episode,) = _rollout(policy, settings, school_db)
    assert episode.K == 2 and episode.correct and episode.messages[3]["role"] == "user"
    conv = episode.tokens
    assert conv is policy.record(episode.id)  # the rollout hands each episode its record
    full = chat_prompt_ids(tokenizer, episode.messages, add_generation_prompt=False)
    assert conv.input_ids + policy.deltas.missing_eot(conv.input_ids) == full
    # the second prompt was the first record plus the feedback turn, nothing re-rendered
    assert backend.seen[1][0] == chat_prompt_ids(tokenizer, episode.messages[:4], add_generation_prompt=True)


def test_masks_and_logprobs_follow_the_sampled_tokens(tokenizer, settings, school_db):
    backend = ScriptBackend(tokenizer, [[WRONG], [RIGHT]])
    policy = TokenPolicy(backend, tokenizer, settings.generation)
    (episode,) = _rollout(policy, settings, school_db)
    traj = tokenized_trajectory(episode, reward=1.5, group_id=3, max_tokens=10_000)
    assert isinstance(traj, TokenizedTrajectory) and traj.turn_count == 2 and not traj.truncated
    runs = _runs(traj.loss_mask)
    assert len(runs) == 2
    for (a, b), sample in zip(runs, episode.tokens.samples):
        assert traj.input_ids[a:b] == sample.token_ids
        assert traj.old_logprobs[a:b] == sample.logprobs
    assert all(lp == 0.0 for lp, m in zip(traj.old_logprobs, traj.loss_mask) if m == 0)
    prompt = chat_prompt_ids(tokenizer, episode.messages[:2])
    assert traj.input_ids[: len(prompt)] == prompt and runs[0][0] == len(prompt)
    assert (traj.reward, traj.group_id, traj.sampled_tokens) == (1.5, 3, runs[0][1] - runs[0][0] + runs[1][1] - runs[1][0])


def test_non_canonical_sampled_ids_are_kept_not_retokenised(tokenizer, settings, school_db):
    """A model may sample a tokenisation other than the canonical one: the record keeps it."""
    by_char = lambda text: [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]  # noqa: E731
    backend = ScriptBackend(tokenizer, [[WRONG], [RIGHT]], encode=by_char, eos=False)
    policy = TokenPolicy(backend, tokenizer, settings.generation)
    (episode,) = _rollout(policy, settings, school_db)
    conv = episode.tokens
    a, b = _runs(conv.loss_mask)[0]
    assert conv.input_ids[a:b] == by_char(WRONG) != tokenizer(WRONG, add_special_tokens=False)["input_ids"]
    # no sampled eos: the template's whole end-of-turn follows, unmasked
    eot = policy.deltas.eot
    assert conv.input_ids[b: b + len(eot)] == eot and conv.loss_mask[b: b + len(eot)] == [0] * len(eot)


def test_identical_conversations_keep_their_own_tokens(tokenizer, settings, school_db):
    """Two episodes with the same text but different sampled ids stay apart (by episode id)."""
    by_char = lambda text: [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]  # noqa: E731
    canonical = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    encoders = iter([canonical, by_char, canonical, by_char])
    backend = ScriptBackend(tokenizer, [[WRONG, WRONG], [RIGHT, RIGHT]], encode=lambda t: next(encoders)(t))
    policy = TokenPolicy(backend, tokenizer, settings.generation)
    episodes = envs.rollout(lambda: envs.get("odt_feedback")(settings), policy, [_example(), _example()],
                            lambda _db_id: school_db)
    first, second = (ep.tokens for ep in episodes)
    assert first is not second
    (a1, b1), _ = _runs(first.loss_mask)
    (a2, b2), _ = _runs(second.loss_mask)
    assert first.input_ids[a1:b1] == canonical(WRONG) + [tokenizer.eos_token_id]
    assert second.input_ids[a2:b2] == by_char(WRONG) + [tokenizer.eos_token_id]


def test_unknown_or_rewritten_conversations_are_refused(tokenizer, settings):
    policy = TokenPolicy(ScriptBackend(tokenizer, [["first"]]), tokenizer, settings.generation)
    start = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    stranger = start + [{"role": "assistant", "content": "never generated"}, {"role": "user", "content": "again"}]
    with pytest.raises(ValueError, match="needs its episode_id"):
        policy.generate([envs.Request(start, "think_sql")])
    with pytest.raises(ValueError, match="is new but its conversation has assistant turns"):
        policy.generate([envs.Request(stranger, "think_sql", episode_id=0)])
    assert policy.generate([envs.Request(start, "think_sql", episode_id=0)])[0].text == "first"
    with pytest.raises(ValueError, match="does not continue"):  # its reply rewritten
        policy.generate([envs.Request(stranger, "think_sql", episode_id=0)])
    with pytest.raises(ValueError, match="nothing to answer"):
        policy.generate([envs.Request(start + [{"role": "assistant", "content": "first"}], "think_sql", episode_id=0)])


def test_stop_strings_per_format():
    assert stop_strings("think_sql") == ("</sql>",)
    assert set(stop_strings("trail")) == {"</sql>", "</solution>"}
    with pytest.raises(KeyError, match="unknown output format"):
        stop_strings("xml")


# ----------------------------------------------------------------------------- with the model
@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    s = default_settings().model_copy(deep=True)
    s.model.hidden_size, s.model.num_layers, s.model.num_heads, s.model.num_kv_heads = 32, 2, 2, 1
    s.model.intermediate_size = 64
    torch.manual_seed(0)
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM(tiny_config(s, tokenizer)).to("cuda" if torch.cuda.is_available() else "cpu").eval()


def test_real_sampler_records_are_exact_and_seeded(tokenizer, tiny_model, settings, school_db):
    torch.set_num_threads(1)
    backend = TransformersBackend(tiny_model, tokenizer, batch_size=8)
    limit = max_sequence_tokens(settings.generation, settings.env.max_turns)

    def run(seed):
        policy = TokenPolicy(backend, tokenizer, settings.generation, ("</sql>",), max_tokens=limit, seed=seed)
        return _rollout(policy, settings, school_db, n=3)

    episodes = run(7)
    for ep in episodes:
        traj = tokenized_trajectory(ep, 0.0, 0, limit)
        runs = _runs(traj.loss_mask)
        sampled = [s for s in ep.tokens.samples if s.token_ids]
        assert len(runs) == len(sampled) == ep.K  # an untrained model never answers right
        for (a, b), sample in zip(runs, sampled):
            assert traj.input_ids[a:b] == sample.token_ids and traj.old_logprobs[a:b] == sample.logprobs
            assert len(sample.token_ids) <= settings.generation.max_new_tokens
    ids = [ep.tokens.input_ids for ep in episodes]
    assert [e.tokens.input_ids for e in run(7)] == ids
    assert [e.tokens.input_ids for e in run(8)] != ids


def test_length_limit_and_truncation_keep_masks_consistent(tokenizer, tiny_model, settings, school_db):
    backend = TransformersBackend(tiny_model, tokenizer, batch_size=4)
    prompt_len = len(chat_prompt_ids(tokenizer, envs.get("odt_feedback")(settings).reset(_example(), school_db)))
    limit = prompt_len + 5  # room for 5 tokens of turn 1, none for turn 2
    policy = TokenPolicy(backend, tokenizer, settings.generation, max_tokens=limit, seed=1)
    (ep,) = _rollout(policy, settings, school_db)
    conv = ep.tokens
    first = conv.samples[0]
    assert len(first.token_ids) <= 5
    assert ep.K == 2  # an untrained model is wrong at turn 1; turn 2 has no budget: an empty output
    assert conv.samples[1].token_ids == [] and conv.samples[1].text == ""
    traj = tokenized_trajectory(ep, 0.0, 0, limit)
    assert len(traj.input_ids) == len(traj.loss_mask) == len(traj.old_logprobs) <= limit
    assert traj.sampled_tokens == len(first.token_ids)
    short = tokenized_trajectory(ep, 0.0, 0, prompt_len + 2)
    assert short.truncated and len(short.input_ids) == prompt_len + 2
    assert short.loss_mask == traj.loss_mask[: prompt_len + 2] and short.old_logprobs == traj.old_logprobs[: prompt_len + 2]
