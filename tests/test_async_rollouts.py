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
    assert settings_from_dict(s.model_dump(mode="json")) == s  # a dump reads back (studies, settings.json)


@pytest.mark.parametrize("override, message", [
    ({"rl.async.max_staleness": -1}, "rl.async.max_staleness"),
    ({"rl.async.is_cap": 0.5}, "rl.async.is_cap"),
    ({"rl.async.timeout_s": 0}, "rl.async.timeout_s"),
    ({"rl.async.threads": 0}, "rl.async.threads"),
    ({"rl.async.stale": 1}, "rl.async.stale: unknown key"),
    ({"rl.async.devices": [-1]}, "rl.async.devices"),
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


# ----------------------------------------------------------------------------- the producer
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(corpus, policy): the school corpus and the untrained tiny policy (the producer's
    machinery needs no skill: its rollouts are noise, whole groups all the same)."""
    from corpora import school_corpus, school_settings

    from progress_sql.train.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("async")
    corpus = school_corpus(root / "corpus")
    return corpus, build_tiny_model(corpus, school_settings(), root / "base")


def _producer(corpus, policy, *, first_step=1, position=0, version=0, sample_from=None, **async_settings):
    from corpora import school_settings

    from progress_sql.corpus.records import CorpusLayout, read_jsonl
    from progress_sql.inference.models import load_policy
    from progress_sql.inference.lora import merged_weights
    from progress_sql.train.rollout_producer import ProducerSpec, RolloutProducer

    s = school_settings(policy)
    s.rl.steps = 4
    s.rl.async_ = s.rl.async_.model_copy(update={"enabled": True, **async_settings})
    train = list(read_jsonl(CorpusLayout(corpus).split("train")))
    model, _ = load_policy(policy, dtype="float32", device="cpu")
    spec = ProducerSpec(s, str(sample_from or corpus), train, first_step, position)
    return s, model, RolloutProducer(spec, merged_weights(model), version)


def test_the_producer_sends_whole_groups_step_by_step_within_the_staleness_bound(tiny):
    """Staleness 1: step 1 is sampled with the starting weights, each later step with the weights
    one update behind those that train it; every group is G episodes of one question, the
    questions those the trainer's stream draws; a step asked out of order is refused."""
    from progress_sql.train.questions import question_indices

    corpus, policy = tiny
    s, model, producer = _producer(corpus, policy)
    G = s.rl.group_size  # noqa: N806
    try:
        with pytest.raises(RuntimeError, match="step 2 asked, step 1 is next"):
            producer.next_batch(2, 1)
        drawn = question_indices(4, 0, 4 * s.rl.questions_per_step, s.rl.seed)
        for step in range(1, 5):
            batch = producer.next_batch(step, step - 1)
            assert step - 1 - batch.version == min(step - 1, 1)
            assert batch.data_position == step * s.rl.questions_per_step
            ids = [ep.example.id for ep in batch.episodes]
            assert [t.group_id for t in batch.trajs] == [i // G for i in range(len(ids))]
            assert all(len(set(ids[g:g + G])) == 1 for g in range(0, len(ids), G))
            assert [ids[g] for g in range(0, len(ids), G)] == [
                f"q{i}" for i in drawn[(step - 1) * s.rl.questions_per_step:step * s.rl.questions_per_step]]
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0 - 1e-3)
            producer.publish(model, step)
    finally:
        producer.close()
    assert not producer.process.is_alive()


def test_a_producer_error_comes_back_with_its_traceback(tiny, tmp_path):
    corpus, policy = tiny
    from progress_sql.train.rollout_producer import ProducerFailed

    _, _, producer = _producer(corpus, policy, sample_from=tmp_path / "no-corpus")
    try:
        with pytest.raises(ProducerFailed, match=r"(?s)failed:\nTraceback.*no-corpus"):
            producer.next_batch(1, 0)
    finally:
        producer.close()


def test_a_hung_producer_fails_within_the_timeout(tiny):
    """A producer that cannot go on (here: waiting for weights that never come) fails the
    trainer's wait after rl.async.timeout_s."""
    import time

    from progress_sql.train.rollout_producer import ProducerFailed

    corpus, policy = tiny
    _, _, producer = _producer(corpus, policy, first_step=3, version=0, max_staleness=0, timeout_s=3.0)
    started = time.monotonic()
    try:
        with pytest.raises(ProducerFailed, match=r"did not answer in 3 s \(rl.async.timeout_s; no batch for step 3\)"):
            producer.next_batch(3, 2)
    finally:
        producer.close()
    assert time.monotonic() - started < 30 and not producer.process.is_alive()


# ----------------------------------------------------------------------------- the loop
@pytest.fixture(scope="module")
def warmish(tiny, tmp_path_factory):
    """(corpus, policy): the tiny policy after 60 SFT steps (as tests/test_trainer.py warms it): rollouts
    whose rewards differ within a group, so updates move the weights and the importance weights move off 1."""
    from corpora import half_right_sft, school_settings

    from progress_sql.train.sft import run_sft

    corpus, base = tiny
    out = tmp_path_factory.mktemp("warmish") / "sft"
    run_sft(half_right_sft(school_settings(), base, 60.0), corpus, out_dir=out, progress=False)
    return corpus, out


def _async_settings(policy, steps=3, **async_settings):
    from corpora import school_settings

    s = school_settings(policy)
    s.rl.deepspeed, s.rl.steps, s.rl.checkpoint_every = "never", steps, 1
    s.rl.async_ = s.rl.async_.model_copy(update={"enabled": True, **async_settings})
    return s


def _rows(out, step):
    import json

    return [json.loads(line) for line in (out / "rollouts" / f"step-{step}.jsonl").read_text().splitlines()]


def _producers():
    import multiprocessing

    from progress_sql.train.rollout_producer import PROCESS_NAME

    return [p for p in multiprocessing.active_children() if p.name == PROCESS_NAME]


def test_async_rl_trains_each_step_once_on_whole_groups_within_the_staleness_bound(warmish, tmp_path):
    """Three steps, staleness 1: step 1 on the starting weights (0), the next ones a step behind
    (1); every step's batch is the trainer's question stream, G episodes of each question in one
    group; the importance weights are 1 at staleness 0 and move off 1 after an update."""
    from progress_sql.train.questions import question_indices
    from progress_sql.train.trainer import run_rl

    corpus, policy = warmish
    s = _async_settings(policy)
    s.rl.autocast = "off"  # the sampler decodes in fp32: a bf16 update would move the weights at staleness 0 off 1
    result = run_rl(s, corpus, out_dir=tmp_path, progress=False)
    m = result.metrics
    assert [x["step"] for x in m] == [1, 2, 3]
    assert [x["async/staleness_max"] for x in m] == [0.0, 1.0, 1.0]
    assert all(x["async/staleness_mean"] <= x["async/staleness_max"] <= s.rl.async_.max_staleness for x in m)
    assert m[0]["async/is_mean"] == pytest.approx(1.0, abs=1e-4) and m[0]["async/is_truncated"] == 0.0
    assert m[0]["ratio"] == pytest.approx(1.0, abs=1e-6)  # the clip is against the proximal policy
    assert any(abs(x["async/is_max"] - 1.0) > 1e-4 for x in m[1:])  # the behaviour policy was an update behind
    assert all(math.isfinite(v) for x in m for v in x.values() if isinstance(v, float))
    G, per_step = s.rl.group_size, s.rl.questions_per_step  # noqa: N806
    drawn = question_indices(4, 0, 3 * per_step, s.rl.seed)
    for step in (1, 2, 3):
        rows = _rows(result.out_dir, step)
        assert len(rows) == G * per_step
        groups: dict[int, set[str]] = {}
        for row in rows:
            groups.setdefault(row["group"], set()).add(row["example_id"])
        assert all(len(ids) == 1 for ids in groups.values()) and len(groups) == per_step
        assert [rows[g * G]["example_id"] for g in range(per_step)] == [
            f"q{i}" for i in drawn[(step - 1) * per_step:step * per_step]]
    assert not _producers()  # closed with the run


def test_producer_devices_are_a_gpu_per_rank_among_those_the_trainer_sees():
    from progress_sql.train.rollout_producer import producer_devices

    assert producer_devices([], 0, 1, 0, None) is None  # a CPU: the trainer's
    assert producer_devices([], 2, 4, 4, "4,5,6,7", trainer_gpu=2) == "6"  # beside its rank's trainer
    assert producer_devices([1], 0, 1, 2, None) == "1"
    assert [producer_devices([4, 5, 6, 7], r, 4, 8, None) for r in range(4)] == ["4", "5", "6", "7"]
    # the machine's numbering: the launcher's CUDA_VISIBLE_DEVICES shows the trainers GPUs 0-3 only
    assert producer_devices([4, 5, 6, 7], 2, 4, 4, "0,1,2,3") == "6"
    with pytest.raises(ValueError, match=r"shows none to the trainer"):
        producer_devices([0], 0, 1, 0, None)
    with pytest.raises(ValueError, match=r"names 1 GPU\(s\) for 2 training processes"):
        producer_devices([3], 1, 2, 4, None)
    with pytest.raises(ValueError, match=r"GPU 2 of rank 0 is not among this machine's 2"):
        producer_devices([2], 0, 1, 2, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check of a machine without GPUs")
def test_producer_gpus_on_a_machine_without_them_stop_the_run_before_it_trains(warmish, tmp_path):
    from progress_sql.train.trainer import run_rl

    corpus, policy = warmish
    with pytest.raises(ValueError, match=r"rl.async.devices \[0\] names GPUs"):
        run_rl(_async_settings(policy, devices=[0]), corpus, out_dir=tmp_path, progress=False)
    metrics = tmp_path / "metrics.jsonl"
    assert not _producers() and not (metrics.exists() and metrics.read_text().strip())  # no step trained


def test_a_killed_producer_ends_the_run_with_its_error(warmish, tmp_path):
    """SIGKILL to the producer after step 1: the run fails at the next batch it lacks, naming the
    signal, and leaves no producer behind. (Step 4 needs weights that step 2 makes: the producer
    cannot have sampled every step before it was killed.)"""
    import os
    import signal

    from progress_sql.train.rollout_producer import ProducerFailed
    from progress_sql.train.trainer import run_rl

    corpus, policy = warmish
    killed = []

    def kill(step, _metrics):
        if step == 1:
            [producer] = _producers()
            os.kill(producer.pid, signal.SIGKILL)
            killed.append(producer.pid)

    with pytest.raises(ProducerFailed, match=r"exited with code -9 \(killed by SIGKILL\)"):
        run_rl(_async_settings(policy, steps=4), corpus, out_dir=tmp_path, progress=False, on_step=kill)
    assert killed and not _producers()


def test_an_async_run_resumes_from_a_checkpoint_at_its_data_position(warmish, tmp_path):
    """Resumed from step 1's checkpoint, the producer starts again at step 2 with the checkpoint's
    weights (staleness 0: the queue of the first run is dropped) and draws step 2's questions."""
    from progress_sql.train.checkpoint import list_checkpoints
    from progress_sql.train.trainer import run_rl

    corpus, policy = warmish
    s = _async_settings(policy, steps=2)
    first = run_rl(s, corpus, out_dir=tmp_path / "a", progress=False)
    second = run_rl(s, corpus, out_dir=tmp_path / "b", resume=list_checkpoints(first.out_dir)[0], progress=False)
    assert [x["step"] for x in second.metrics] == [1, 2]
    assert second.metrics[0] == first.metrics[0]  # step 1 as the checkpoint recorded it
    assert first.metrics[1]["async/staleness_max"] == 1.0 and second.metrics[1]["async/staleness_max"] == 0.0
    assert [r["example_id"] for r in _rows(second.out_dir, 2)] == [r["example_id"] for r in _rows(first.out_dir, 2)]
    assert not _producers()


_RANK_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from corpora import school_settings
from progress_sql.train import trainer

seen = []  # the questions of each batch this rank trains, in order
produced = trainer.async_step


def spy(run, producer, state):
    batch, metrics = produced(run, producer, state)
    seen.append(list(dict.fromkeys(ep.example.id for ep in batch.episodes)))
    return batch, metrics


if __name__ == "__main__":
    trainer.async_step = spy
    s = school_settings({policy!r})
    s.rl.deepspeed, s.rl.steps, s.rl.checkpoint_every, s.rl.save_rollouts = "always", 3, 3, True
    s.rl.async_ = s.rl.async_.model_copy(update={{"enabled": True}})
    result = trainer.run_rl(s, Path({corpus!r}), out_dir=Path({out!r}), progress=False)
    print("SEEN " + json.dumps(seen))
    if result.metrics:  # rank 0's
        print("METRICS " + json.dumps([{{k: m[k] for k in ("step", "async/staleness_max")}} for m in result.metrics]))
"""


def test_two_deepspeed_ranks_each_train_their_producers_batches(warmish, tmp_path):
    """Two processes under DeepSpeed (CPU, gloo), as the launcher starts them: each rank's
    producer samples its own slice of the step's questions, the ranks step together (the
    gradient all-reduce would hang otherwise) within the staleness bound, and rank 0's batches
    are its slice of the question stream."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from progress_sql.train.distributed import free_port
    from progress_sql.train.questions import question_indices

    corpus, policy = warmish
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT.format(tests=str(Path(__file__).parent), policy=str(policy), corpus=str(corpus),
                                          out=str(tmp_path / "rl")))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in ranks]
    finally:
        for p in ranks:
            p.kill()  # a no-op for a process that has ended
    assert [p.returncode for p in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    def line(text, tag):
        return json.loads(next(x for x in text.splitlines() if x.startswith(tag + " "))[len(tag) + 1:])

    metrics = line(outputs[0], "METRICS")
    assert [(m["step"], m["async/staleness_max"]) for m in metrics] == [(1, 0.0), (2, 1.0), (3, 1.0)]
    s = _async_settings(policy)
    per_rank, G = s.rl.questions_per_step, s.rl.group_size  # noqa: N806
    drawn = question_indices(4, 0, 3 * 2 * per_rank, s.rl.seed)  # both ranks' questions, step by step
    for r, text in enumerate(outputs):  # rank r trains the r-th slice of each step's questions
        assert line(text, "SEEN") == [[f"q{i}" for i in drawn[(k * 2 + r) * per_rank:(k * 2 + r + 1) * per_rank]]
                                      for k in range(3)]
    for step in (1, 2, 3):
        text = (tmp_path / "rl" / "rollouts" / f"step-{step}.rank-0.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines()]
        assert len(rows) == G * per_rank  # rank 0's own episodes
        first = (step - 1) * 2 * per_rank
        assert [rows[g * G]["example_id"] for g in range(per_rank)] == [f"q{i}" for i in drawn[first:first + per_rank]]
    assert (tmp_path / "rl" / "final" / "config.json").exists()


# ----------------------------------------------------------------------------- rl.dynamic_sampling
def _groups(rows, G):  # noqa: N803
    return [rows[g:g + G] for g in range(0, len(rows), G)]


def test_async_dynamic_sampling_draws_as_the_synchronous_loop(warmish, tmp_path):
    """rl.dynamic_sampling with rl.async: the producer draws each step through the loop's own
    sampled_step: more questions from the stream's next places while fewer than
    questions_per_step groups have an EX signal (this policy's rollouts are mostly all wrong),
    the groups with one trained (none: the first), and the stream advanced by every draw the step
    could make, which is where a resumed producer starts."""
    import json

    from progress_sql.train.checkpoint import list_checkpoints
    from progress_sql.train.questions import question_indices
    from progress_sql.train.trainer import run_rl

    corpus, policy = warmish
    s = _async_settings(policy, steps=2)
    s.rl.dynamic_sampling.enabled, s.rl.dynamic_sampling.max_rounds = True, 2
    result = run_rl(s, corpus, out_dir=tmp_path, progress=False)
    G, per_step = s.rl.group_size, s.rl.questions_per_step  # noqa: N806
    for step, metrics in zip((1, 2), result.metrics):
        groups = _groups(_rows(result.out_dir, step), G)
        signal = [len({r["correct"] for r in group}) > 1 for group in groups]
        draws = len(groups) // per_step
        assert draws == 2 or sum(signal) >= per_step
        stream = question_indices(4, (step - 1) * 2 * per_step, draws * per_step, s.rl.seed)
        assert [group[0]["example_id"] for group in groups] == [f"q{i}" for i in stream]
        trained = [g for g, group in enumerate(groups) if group[0]["trained"]]
        assert trained == ([g for g, has in enumerate(signal) if has][:per_step] or [0])
        assert metrics["episodes/updated"] == len(trained) * G and metrics["groups/drawn"] == len(groups)
    state = json.loads((list_checkpoints(result.out_dir)[-1] / "trainer_state.json").read_text())
    assert state["data_position"] == 2 * 2 * per_step
    assert not _producers()


_DYNAMIC_RANK_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from corpora import school_settings
from progress_sql.train import trainer
from progress_sql.train.dynamic_sampling import group_signal

seen = []  # each step this rank trains: its groups' questions, the groups it kept, the groups it trained
produced = trainer.async_step


def spy(run, producer, state):
    batch, metrics = produced(run, producer, state)
    G, per = run.settings.rl.group_size, run.settings.rl.questions_per_step
    signal = group_signal(batch, "ex", G)
    seen.append({{"ids": [ep.example.id for ep in batch.episodes[::G]], "position": state.data_position,
                  "kept": min(sum(signal), per) or 1, "trained": len(batch.train_groups)}})
    return batch, metrics


if __name__ == "__main__":
    trainer.async_step = spy
    s = school_settings({policy!r})
    s.rl.deepspeed, s.rl.steps, s.rl.checkpoint_every = "always", 3, 3
    s.rl.async_ = s.rl.async_.model_copy(update={{"enabled": True}})
    s.rl.dynamic_sampling = s.rl.dynamic_sampling.model_copy(update={{"enabled": True, "signal": "ex",
                                                                       "max_rounds": 2}})
    trainer.run_rl(s, Path({corpus!r}), out_dir=Path({out!r}), progress=False)
    print("SEEN " + json.dumps(seen))
"""


def test_two_deepspeed_ranks_with_dynamic_sampling_agree_on_the_stream_and_the_groups(warmish, tmp_path):
    """rl.dynamic_sampling under DeepSpeed with two ranks and their producers (which cannot ask
    each other): each rank draws its slice of each draw of the step, the stream advances alike on
    both, and both train as many groups as the rank that kept fewest (ZeRO reduces gradients in
    every backward pass: unequal micro-batch counts would hang the run)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from progress_sql.train.distributed import free_port
    from progress_sql.train.questions import question_indices

    corpus, policy = warmish
    script = tmp_path / "rank.py"
    script.write_text(_DYNAMIC_RANK_SCRIPT.format(tests=str(Path(__file__).parent), policy=str(policy),
                                                  corpus=str(corpus), out=str(tmp_path / "rl")))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        outputs = [p.communicate(timeout=900)[0] for p in ranks]
    finally:
        for p in ranks:
            p.kill()  # a no-op for a process that has ended
    assert [p.returncode for p in ranks] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    seen = [json.loads(next(x for x in text.splitlines() if x.startswith("SEEN "))[5:]) for text in outputs]
    per, seed = _async_settings(policy).rl.questions_per_step, _async_settings(policy).rl.seed
    stride = 2 * 2 * per  # two ranks, two draws
    for k in range(3):
        both = [seen[r][k] for r in (0, 1)]
        assert [b["position"] for b in both] == [(k + 1) * stride] * 2
        assert [b["trained"] for b in both] == [min(b["kept"] for b in both)] * 2
        for r, b in enumerate(both):  # draw d: the r-th slice of the global batch at k·stride + d·2·per
            expected = [f"q{i}" for d in range(len(b["ids"]) // per)
                        for i in question_indices(4, k * stride + d * 2 * per, 2 * per, seed)[r * per:(r + 1) * per]]
            assert b["ids"] == expected
    # something to agree on: with EX as the signal (the warm policy is mostly wrong: whole groups
    # without signal), a step that drew twice or ranks that kept unequal counts (rewards, being
    # continuous, differ in nearly every group: nothing would be drawn again)
    assert any(len(seen[r][k]["ids"]) > per for r in (0, 1) for k in range(3)) or \
        any(seen[0][k]["kept"] != seen[1][k]["kept"] for k in range(3)), seen
