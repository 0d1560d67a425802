"""The RL losses against hand-computed values on small tensors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from progress_sql.train.losses import (  # noqa: E402
    group_advantages,
    grpo_loss,
    gspo_loss,
    k3_kl,
    token_logprobs,
)


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# ----------------------------------------------------------------------------- advantages
def test_group_advantages_normalise_each_group():
    adv = group_advantages([1.0, 3.0, 0.0, 0.0, 2.0, 4.0], [0, 0, 1, 1, 2, 2], eps=0.0)
    s = math.sqrt(2.0)  # unbiased std of {1, 3}
    assert adv.tolist() == pytest.approx([-1 / s, 1 / s, 0.0, 0.0, -1 / s, 1 / s])


def test_group_advantages_without_std_scaling_is_dr_grpo():
    adv = group_advantages([1.0, 3.0, 5.0, 7.0], [0, 0, 0, 1], eps=1e-6, scale_std=False)
    assert adv.tolist() == pytest.approx([-2.0, 0.0, 2.0, 0.0])  # a lone episode gets 0


def test_negative_advantages_are_scaled_and_positive_ones_kept():
    full = group_advantages([1.0, 3.0, 5.0, 7.0, 0.0, 2.0], [0, 0, 0, 0, 1, 1], eps=0.0)
    scaled = group_advantages([1.0, 3.0, 5.0, 7.0, 0.0, 2.0], [0, 0, 0, 0, 1, 1], eps=0.0, negative_scale=0.1)
    assert scaled.tolist() == pytest.approx([a * 0.1 if a < 0 else a for a in full.tolist()])
    assert group_advantages([1.0, 3.0], [0, 0], eps=0.0, scale_std=False, negative_scale=0.0).tolist() == [0.0, 1.0]


def test_group_advantages_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="equal length"):
        group_advantages([1.0, 2.0], [0], eps=1e-6)


# ----------------------------------------------------------------------------- KL
def test_k3_kl_is_zero_when_equal_and_nonnegative():
    a = torch.tensor([-1.0, -2.0, -0.1])
    assert torch.equal(k3_kl(a, a), torch.zeros(3))
    b = torch.tensor([-3.0, -0.5, -0.1])
    kl = k3_kl(a, b)
    d = b - a
    assert torch.allclose(kl, torch.exp(d) - d - 1)
    assert bool((kl >= 0).all()) and float(kl[0]) > 0


# ----------------------------------------------------------------------------- GRPO
def test_grpo_on_policy_ratio_is_one_and_loss_is_minus_advantage():
    logp = _leaf([[0.0, -1.0, -2.0], [0.0, -0.5, -0.7]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, stats = grpo_loss(logp, logp.detach(), None, adv, mask, 0.2, 0.2, 0.0, "seq_mean_token_mean")
    assert stats["ratio"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0 and stats["kl"] == 0.0
    assert loss.item() == pytest.approx((-1.0 + 2.0) / 2)
    loss.backward()
    # d/dlogp of −A·exp(logp − old) at ratio 1 is −A, / tokens of its sequence, / 2 sequences
    expected = torch.tensor([[0.0, -0.25, -0.25], [0.0, 1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected)


def test_zero_advantage_gives_zero_gradient():
    logp = _leaf([[-1.0, -2.0, -0.3]])
    old = torch.tensor([[-1.2, -1.0, -0.3]], dtype=torch.float64)
    loss, _ = grpo_loss(logp, old, None, torch.zeros(1, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64),
                        0.2, 0.2, 0.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(logp.grad) == 0


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_masked_positions_get_no_gradient(aggregation):
    logp = _leaf([[-0.5, -1.0, -2.0, -0.2], [-0.3, -0.4, -0.9, -1.1]])
    ref = torch.tensor([[-0.4, -1.5, -1.0, -0.2], [-0.1, -0.4, -0.5, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.float64)
    loss, _ = grpo_loss(logp, logp.detach() - 0.05, ref, torch.tensor([1.5, -0.5], dtype=torch.float64), mask,
                        0.2, 0.28, 0.1, aggregation, max_tokens=8)
    loss.backward()
    assert torch.all(logp.grad[mask == 0] == 0)
    assert torch.all(logp.grad[mask == 1] != 0)


def test_clipping_activates_beyond_eps_and_dapo_clip_is_asymmetric():
    # ratios e^0.25 ≈ 1.284 (tokens of a positive advantage) and e^−0.25 ≈ 0.779 (negative)
    old = torch.zeros(2, 1, dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    logp = _leaf([[0.25], [-0.25]])

    # symmetric ε = 0.2: both tokens are clipped, so neither gets a gradient
    loss, stats = grpo_loss(logp, old, None, adv, mask, 0.2, 0.2, 0.0, "token_mean")
    loss.backward()
    assert stats["clip_frac"] == 1.0
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert torch.count_nonzero(logp.grad) == 0

    # DAPO clip-higher ε_high = 0.3: the positive-advantage token (1.284 < 1.3) is no longer clipped
    logp.grad = None
    loss, stats = grpo_loss(logp, old, None, adv, mask, 0.2, 0.3, 0.0, "token_mean")
    loss.backward()
    assert stats["clip_frac"] == 0.5
    r = math.exp(0.25)
    assert loss.item() == pytest.approx((-r + 0.8) / 2)
    assert float(logp.grad[0, 0]) == pytest.approx(-r / 2) and float(logp.grad[1, 0]) == 0.0


def test_clipping_never_hides_a_harmful_ratio():
    # A < 0 with ratio above 1 + ε: the unclipped term is the larger loss, and it keeps its gradient
    logp = _leaf([[0.5]])
    loss, stats = grpo_loss(logp, torch.zeros(1, 1, dtype=torch.float64), None,
                            torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                            0.2, 0.2, 0.0)
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(0.5)) and stats["clip_frac"] == 0.0
    assert float(logp.grad[0, 0]) == pytest.approx(math.exp(0.5))


def test_aggregations_by_hand():
    logp = torch.zeros(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([-1.0, -4.0], dtype=torch.float64)  # per-token loss = −A at ratio 1
    agg = {a: float(grpo_loss(logp, logp, None, adv, mask, 0.2, 0.2, 0.0, a, max_tokens=10)[0])
           for a in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")}
    assert agg["token_mean"] == pytest.approx((3 * 1 + 4) / 4)
    assert agg["seq_mean_token_mean"] == pytest.approx((1 + 4) / 2)
    assert agg["seq_mean_token_sum_norm"] == pytest.approx((3 / 10 + 4 / 10) / 2)
    with pytest.raises(ValueError, match="max_tokens"):
        grpo_loss(logp, logp, None, adv, mask, 0.2, 0.2, 0.0, "seq_mean_token_sum_norm")


def test_micro_batch_losses_add_up_to_the_batch_loss():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, dtype=torch.float64) * 0.1 - 1
    old = logp + torch.randn(4, 5, dtype=torch.float64) * 0.1
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64)
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        full = grpo_loss(logp, old, None, adv, mask, 0.2, 0.28, 0.0, agg, max_tokens=5)[0]
        parts = sum(
            grpo_loss(logp[s], old[s], None, adv[s], mask[s], 0.2, 0.28, 0.0, agg,
                      num_sequences=4, num_tokens=float(mask.sum()), max_tokens=5)[0]
            for s in (slice(0, 3), slice(3, 4))
        )
        assert float(parts) == pytest.approx(float(full), abs=1e-12), agg


def test_kl_term_is_beta_times_k3():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss, stats = grpo_loss(logp, logp, ref, torch.zeros(1, dtype=torch.float64), mask, 0.2, 0.2, 0.5, "token_mean")
    kl = k3_kl(logp, ref)
    assert stats["kl"] == pytest.approx(float(kl.mean()))
    assert loss.item() == pytest.approx(0.5 * float(kl.mean()))
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, logp, None, torch.zeros(1), mask, 0.2, 0.2, 0.5)


# ----------------------------------------------------------------------------- GSPO
def test_gspo_ratio_is_length_normalised_and_clipped_per_sequence():
    old = torch.zeros(2, 4, dtype=torch.float64)
    # sequence 0: log-ratios 0.1, 0.3 over 2 tokens → s = e^0.2; sequence 1: 0.4 over 4 tokens → e^0.4
    logp = _leaf([[0.0, 0.1, 0.3, 9.0], [0.4, 0.4, 0.4, 0.4]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, stats = gspo_loss(logp, old, None, adv, mask, 0.25, 0.25, 0.0)
    s0 = math.exp(0.2)  # 1.221 < 1.25: not clipped
    assert loss.item() == pytest.approx((-s0 - 1.25) / 2)
    assert stats["clip_frac"] == 0.5 and stats["ratio"] == pytest.approx((s0 + math.exp(0.4)) / 2)
    loss.backward()
    # d(−s0/2)/dlogp_t = −s0/2 · 1/len for the 2 unmasked tokens; sequence 1 is clipped: no gradient
    assert logp.grad[0].tolist() == pytest.approx([0.0, -s0 / 4, -s0 / 4, 0.0])
    assert torch.count_nonzero(logp.grad[1]) == 0


def test_gspo_on_policy_and_zero_advantage():
    logp = _leaf([[-1.0, -0.5, -0.25]])
    mask = torch.tensor([[0, 1, 1]], dtype=torch.float64)
    loss, stats = gspo_loss(logp, logp.detach(), None, torch.tensor([2.0], dtype=torch.float64), mask, 3e-4, 4e-4, 0.0)
    assert stats["ratio"] == pytest.approx(1.0) and loss.item() == pytest.approx(-2.0)
    logp2 = _leaf([[-1.0, -0.5, -0.25]])
    loss2, _ = gspo_loss(logp2, logp2.detach() + 0.1, None, torch.zeros(1, dtype=torch.float64), mask, 0.2, 0.2, 0.0)
    loss2.backward()
    assert torch.count_nonzero(logp2.grad) == 0


# ----------------------------------------------------------------------------- log-probs
class _Bigram(torch.nn.Module):
    """A model whose logits at position t depend on token t only: log-probs known by hand."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_token_logprobs_gathers_next_token_logprobs():
    table = torch.tensor([[0.0, 1.0, 2.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    ids = torch.tensor([[0, 2, 2, 1]])
    lp = token_logprobs(_Bigram(table), ids, torch.ones_like(ids))
    expected = [0.0] + [float(torch.log_softmax(table[a], -1)[b]) for a, b in ((0, 2), (2, 2), (2, 1))]
    assert lp[0].detach().tolist() == pytest.approx(expected, abs=1e-6)
    hot = token_logprobs(_Bigram(table), ids, torch.ones_like(ids), temperature=2.0)
    assert hot[0, 1].item() == pytest.approx(float(torch.log_softmax(table[0] / 2, -1)[2]), abs=1e-6)


def test_token_logprobs_from_the_first_scored_position_equal_the_full_ones():
    """With a loss mask, logits are computed only from the first scored position: the scored
    log-probs are the full computation's, earlier positions are 0."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    ids = torch.randint(0, 50, (2, 12))
    attention = torch.ones_like(ids)
    mask = torch.zeros(2, 12)
    mask[0, 7:10] = 1
    mask[1, 5:12] = 1
    full = token_logprobs(model, ids, attention)
    part = token_logprobs(model, ids, attention, loss_mask=mask)
    assert part.shape == full.shape
    assert torch.allclose(part[:, 5:], full[:, 5:], atol=1e-5)
    assert torch.count_nonzero(part[:, :5]) == 0
    # no scored position at all: the full computation
    assert torch.allclose(token_logprobs(model, ids, attention, loss_mask=torch.zeros(2, 12)), full)
