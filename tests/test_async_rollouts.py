"""Asynchronous rollouts with bounded staleness (``rl.async``): the settings, the decoupled loss
(``train.losses``: the clip against the proximal policy, the importance weight to the behaviour
policy truncated at ``rl.async.is_cap``), and the producer (``train.rollout_producer``)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from progress_sql.params import RLSettings, SettingsError, default_settings, settings_from_dict  # noqa: E402
from progress_sql.train.losses import grpo_loss, gspo_loss, importance_weights  # noqa: E402


# ----------------------------------------------------------------------------- settings
def test_the_async_section_is_off_by_default_and_keyed_async():
    rl = default_settings().rl
    assert rl.async_.enabled is False and rl.async_.max_staleness == 1 and rl.async_.is_cap == 2.0
    assert "async" in rl.model_dump(mode="json") and "async_" not in rl.model_dump(mode="json")
    s = settings_from_dict({}, overrides={"rl.async.enabled": True, "rl.async.max_staleness": 2})
    assert s.rl.async_.enabled and s.rl.async_.max_staleness == 2
    assert RLSettings(async_={"enabled": True}).async_.enabled  # by name in Python
    assert settings_from_dict(s.model_dump(mode="json")) == s  # a dump reads back (comparisons, settings.json)


@pytest.mark.parametrize("override, message", [
    ({"rl.async.max_staleness": -1}, "rl.async.max_staleness"),
    ({"rl.async.is_cap": 0.5}, "rl.async.is_cap"),
    ({"rl.async.timeout_s": 0}, "rl.async.timeout_s"),
    ({"rl.async.threads": 0}, "rl.async.threads"),
    ({"rl.async.stale": 1}, "rl.async.stale: unknown key"),
    ({"rl.async.enabled": True, "generation.temperature": 0.6}, "temperature 1.0"),
    ({"rl.async.enabled": True, "generation.top_p": 0.95}, "top_p 1.0"),
])
def test_async_settings_are_validated(override, message):
    with pytest.raises(SettingsError, match=message):
        settings_from_dict({}, overrides=override)


# ----------------------------------------------------------------------------- the loss
def _tokens(seed: int = 0, n: int = 12, sequences: int = 3):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(n, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    prox = (logp.detach() + torch.randn(n, generator=g, dtype=torch.float64) * 0.05)
    seq = torch.arange(n) % sequences
    adv = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)[:sequences]
    return logp, prox, seq, adv


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_zero_staleness_gives_weights_of_one_and_the_synchronous_loss(aggregation):
    """behaviour = proximal: every weight is exp(0) = 1, and loss and gradient are the sync ones
    bit for bit; the synchronous call adds no statistic."""
    logp, prox, seq, adv = _tokens()
    common = dict(clip_eps=0.2, clip_eps_high=0.28, beta=0.0, aggregation=aggregation, max_tokens=16)
    sync, sync_stats = grpo_loss(logp, prox, None, adv, seq, **common)
    (g_sync,) = torch.autograd.grad(sync, logp)
    off, stats = grpo_loss(logp, prox, None, adv, seq, **common, behaviour_logp=prox.clone(), is_cap=2.0)
    (g_off,) = torch.autograd.grad(off, logp)
    assert torch.equal(sync, off) and torch.equal(g_sync, g_off)
    assert not any(k.startswith("is_") for k in sync_stats)
    assert (stats["is_mean"], stats["is_max"], stats["is_truncated"]) == (1.0, 1.0, 0.0)

    gs, _ = gspo_loss(logp, prox, None, adv, seq, clip_eps=3e-4, clip_eps_high=4e-4, beta=0.0)
    go, gstats = gspo_loss(logp, prox, None, adv, seq, clip_eps=3e-4, clip_eps_high=4e-4, beta=0.0,
                           behaviour_logp=prox.clone())
    assert torch.equal(gs, go) and gstats["is_max"] == 1.0 and gstats["is_count"] == 3


def test_each_token_is_weighted_by_its_truncated_importance_weight():
    """Two tokens of one sequence, ratio 1 (logp = proximal): the loss is −A·Σ w_t/2 with
    w = (0.5, min(3, cap)); the clip is against the proximal policy, not the behaviour one."""
    prox = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    logp = prox.clone().requires_grad_(True)
    behaviour = prox - torch.log(torch.tensor([0.5, 3.0], dtype=torch.float64))  # π_prox/π_b = 0.5, 3
    seq, adv = torch.tensor([0, 0]), torch.tensor([2.0], dtype=torch.float64)
    loss, stats = grpo_loss(logp, prox, None, adv, seq, clip_eps=0.2, clip_eps_high=0.2, beta=0.0,
                            behaviour_logp=behaviour, is_cap=2.0)
    assert float(loss.detach()) == pytest.approx(-2.0 * (0.5 + 2.0) / 2)
    assert stats["clip_frac"] == 0.0 and stats["ratio"] == pytest.approx(1.0)  # the ratio is to the proximal policy
    assert stats["is_mean"] == pytest.approx(1.75) and stats["is_max"] == pytest.approx(3.0)
    assert stats["is_truncated"] == 0.5
    (grad,) = torch.autograd.grad(loss, logp)  # d/dlogp of −A·w·r/2 at r = 1: −A·w/2
    assert grad.tolist() == pytest.approx([-2.0 * 0.5 / 2, -2.0 * 2.0 / 2])


def test_the_kl_term_is_not_weighted():
    prox = torch.tensor([-1.0], dtype=torch.float64)
    logp = prox.clone().requires_grad_(True)
    ref = torch.tensor([-1.5], dtype=torch.float64)
    behaviour = prox + math.log(4.0)  # weight 0.25
    kl = math.exp(-0.5) + 0.5 - 1.0
    loss, _ = grpo_loss(logp, prox, ref, torch.tensor([0.0], dtype=torch.float64), torch.tensor([0]), clip_eps=0.2,
                        clip_eps_high=0.2, beta=0.1, behaviour_logp=behaviour)
    assert float(loss.detach()) == pytest.approx(0.1 * kl)


def test_gspo_weights_each_sequence_by_its_mean_log_ratio():
    prox = torch.tensor([-1.0, -1.0, -2.0], dtype=torch.float64)
    logp = prox.clone().requires_grad_(True)
    behaviour = prox - torch.tensor([0.2, 0.4, 5.0], dtype=torch.float64)  # sequence 0: mean gap 0.3; 1: 5
    seq, adv = torch.tensor([0, 0, 1]), torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, stats = gspo_loss(logp, prox, None, adv, seq, clip_eps=0.2, clip_eps_high=0.2, beta=0.0,
                            behaviour_logp=behaviour, is_cap=2.0)
    assert float(loss.detach()) == pytest.approx(-(math.exp(0.3) + 2.0) / 2)
    assert stats["is_max"] == pytest.approx(math.exp(5.0)) and stats["is_truncated"] == 0.5


def test_importance_weights_refuse_a_cap_below_one():
    with pytest.raises(ValueError, match="at least 1"):
        importance_weights(torch.zeros(2), torch.zeros(2), 0.5)
