"""The RL losses against hand-computed values on small tensors. The losses take the scored
tokens flat (``[N]`` with each token's sequence); the tests write them as ``[B, L]`` rows with a
mask, which ``_scored`` flattens as ``train.packing`` does."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from progress_sql.train.losses import (  # noqa: E402
    group_advantages,
    grpo_loss,
    gspo_loss,
    k3_kl,
    token_weights,
)


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def _scored(mask, *rows):
    """The mask's scored positions of each ``[B, L]`` tensor in ``rows`` (None stays None), and
    the sequence of each: the losses' flat layout."""
    keep = mask.bool()
    seq = torch.arange(mask.shape[0])[:, None].expand_as(mask)[keep]
    return [None if r is None else r[keep] for r in rows] + [seq]


def grpo(logp, old, ref, adv, mask, *args, **kwargs):
    lp, o, r, seq = _scored(mask, logp, old, ref)
    return grpo_loss(lp, o, r, adv, seq, *args, **kwargs)


def gspo(logp, old, ref, adv, mask, *args, **kwargs):
    lp, o, r, seq = _scored(mask, logp, old, ref)
    return gspo_loss(lp, o, r, adv, seq, *args, **kwargs)


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
    loss, stats = grpo(logp, logp.detach(), None, adv, mask, 0.2, 0.2, 0.0, "seq_mean_token_mean")
    assert stats["ratio"] == pytest.approx(1.0) and stats["clip_frac"] == 0.0 and stats["kl"] == 0.0
    assert loss.item() == pytest.approx((-1.0 + 2.0) / 2)
    loss.backward()
    # d/dlogp of −A·exp(logp − old) at ratio 1 is −A, / tokens of its sequence, / 2 sequences
    expected = torch.tensor([[0.0, -0.25, -0.25], [0.0, 1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(logp.grad, expected)


def test_zero_advantage_gives_zero_gradient():
    logp = _leaf([[-1.0, -2.0, -0.3]])
    old = torch.tensor([[-1.2, -1.0, -0.3]], dtype=torch.float64)
    loss, _ = grpo(logp, old, None, torch.zeros(1, dtype=torch.float64), torch.ones(1, 3, dtype=torch.float64),
                        0.2, 0.2, 0.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(logp.grad) == 0


def test_token_weights_are_each_aggregation():
    seq = torch.tensor([0, 0, 0, 1])  # three tokens of sequence 0, one of sequence 1
    assert token_weights(seq, 2, "token_mean").tolist() == pytest.approx([0.25] * 4)
    assert token_weights(seq, 2, "seq_mean_token_mean").tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0.5])
    assert token_weights(seq, 2, "seq_mean_token_sum_norm", max_tokens=10).tolist() == pytest.approx([0.05] * 4)
    # the whole batch's counts when accumulating: 8 sequences, 20 tokens
    assert token_weights(seq, 2, "token_mean", num_sequences=8, num_tokens=20).tolist() == pytest.approx([0.05] * 4)
    assert token_weights(seq, 2, "seq_mean_token_mean", num_sequences=8).tolist() == pytest.approx(
        [1 / 24, 1 / 24, 1 / 24, 1 / 8])
    with pytest.raises(ValueError, match="unknown aggregation"):
        token_weights(seq, 2, "mean")


def test_clipping_activates_beyond_eps_and_dapo_clip_is_asymmetric():
    # ratios e^0.25 ≈ 1.284 (tokens of a positive advantage) and e^−0.25 ≈ 0.779 (negative)
    old = torch.zeros(2, 1, dtype=torch.float64)
    mask = torch.ones(2, 1, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    logp = _leaf([[0.25], [-0.25]])

    # symmetric ε = 0.2: both tokens are clipped, so neither gets a gradient
    loss, stats = grpo(logp, old, None, adv, mask, 0.2, 0.2, 0.0, "token_mean")
    loss.backward()
    assert stats["clip_frac"] == 1.0
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert torch.count_nonzero(logp.grad) == 0

    # DAPO clip-higher ε_high = 0.3: the positive-advantage token (1.284 < 1.3) is no longer clipped
    logp.grad = None
    loss, stats = grpo(logp, old, None, adv, mask, 0.2, 0.3, 0.0, "token_mean")
    loss.backward()
    assert stats["clip_frac"] == 0.5
    r = math.exp(0.25)
    assert loss.item() == pytest.approx((-r + 0.8) / 2)
    assert float(logp.grad[0, 0]) == pytest.approx(-r / 2) and float(logp.grad[1, 0]) == 0.0


def test_clipping_never_hides_a_harmful_ratio():
    # A < 0 with ratio above 1 + ε: the unclipped term is the larger loss, and it keeps its gradient
    logp = _leaf([[0.5]])
    loss, stats = grpo(logp, torch.zeros(1, 1, dtype=torch.float64), None,
                            torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64),
                            0.2, 0.2, 0.0)
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(0.5)) and stats["clip_frac"] == 0.0
    assert float(logp.grad[0, 0]) == pytest.approx(math.exp(0.5))


def test_aggregations_by_hand():
    logp = torch.zeros(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([-1.0, -4.0], dtype=torch.float64)  # per-token loss = −A at ratio 1
    agg = {a: float(grpo(logp, logp, None, adv, mask, 0.2, 0.2, 0.0, a, max_tokens=10)[0])
           for a in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")}
    assert agg["token_mean"] == pytest.approx((3 * 1 + 4) / 4)
    assert agg["seq_mean_token_mean"] == pytest.approx((1 + 4) / 2)
    assert agg["seq_mean_token_sum_norm"] == pytest.approx((3 / 10 + 4 / 10) / 2)
    with pytest.raises(ValueError, match="max_tokens"):
        grpo(logp, logp, None, adv, mask, 0.2, 0.2, 0.0, "seq_mean_token_sum_norm")


def test_micro_batch_losses_add_up_to_the_batch_loss():
    torch.manual_seed(0)
    logp = torch.randn(4, 5, dtype=torch.float64) * 0.1 - 1
    old = logp + torch.randn(4, 5, dtype=torch.float64) * 0.1
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64)
    for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        full = grpo(logp, old, None, adv, mask, 0.2, 0.28, 0.0, agg, max_tokens=5)[0]
        parts = sum(
            grpo(logp[s], old[s], None, adv[s], mask[s], 0.2, 0.28, 0.0, agg,
                      num_sequences=4, num_tokens=float(mask.sum()), max_tokens=5)[0]
            for s in (slice(0, 3), slice(3, 4))
        )
        assert float(parts) == pytest.approx(float(full), abs=1e-12), agg


def test_kl_term_is_beta_times_k3():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss, stats = grpo(logp, logp, ref, torch.zeros(1, dtype=torch.float64), mask, 0.2, 0.2, 0.5, "token_mean")
    kl = k3_kl(logp, ref)
    assert stats["kl"] == pytest.approx(float(kl.mean()))
    assert loss.item() == pytest.approx(0.5 * float(kl.mean()))
    with pytest.raises(ValueError, match="ref_logp"):
        grpo(logp, logp, None, torch.zeros(1), mask, 0.2, 0.2, 0.5)


# ----------------------------------------------------------------------------- GSPO
def test_gspo_ratio_is_length_normalised_and_clipped_per_sequence():
    old = torch.zeros(2, 4, dtype=torch.float64)
    # sequence 0: log-ratios 0.1, 0.3 over 2 tokens → s = e^0.2; sequence 1: 0.4 over 4 tokens → e^0.4
    logp = _leaf([[0.0, 0.1, 0.3, 9.0], [0.4, 0.4, 0.4, 0.4]])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, stats = gspo(logp, old, None, adv, mask, 0.25, 0.25, 0.0)
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
    loss, stats = gspo(logp, logp.detach(), None, torch.tensor([2.0], dtype=torch.float64), mask, 3e-4, 4e-4, 0.0)
    assert stats["ratio"] == pytest.approx(1.0) and loss.item() == pytest.approx(-2.0)
    logp2 = _leaf([[-1.0, -0.5, -0.25]])
    loss2, _ = gspo(logp2, logp2.detach() + 0.1, None, torch.zeros(1, dtype=torch.float64), mask, 0.2, 0.2, 0.0)
    loss2.backward()
    assert torch.count_nonzero(logp2.grad) == 0
