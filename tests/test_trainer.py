"""The RL trainer end to end on CPU: a tiny corpus, the tiny model warm-started by SFT, real
rollouts, DeepSpeed ZeRO-2/3 (gloo, CPU accelerator) and plain torch."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

from progress_sql import envs  # noqa: E402
from progress_sql.params import RLSettings  # noqa: E402
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, read_jsonl, write_jsonl  # noqa: E402
from progress_sql.train.checkpoint import list_checkpoints  # noqa: E402
from progress_sql.train.distributed import deepspeed_config, lr_lambda, process_environment, use_deepspeed  # noqa: E402
from progress_sql.train.losses import group_advantages  # noqa: E402
from progress_sql.train.precision import autocast_dtype  # noqa: E402
from progress_sql.train.packing import token_batch, use_packed_attention  # noqa: E402
from progress_sql.inference.models import load_policy  # noqa: E402
from progress_sql.formats import stop_strings  # noqa: E402
from progress_sql.inference.policy import TokenPolicy  # noqa: E402
from progress_sql.train.trajectories import tokenized_trajectory  # noqa: E402
from progress_sql.train.sft import run_sft  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.questions import question_indices  # noqa: E402
from progress_sql.train.trainer import micro_batch_loss, run_rl  # noqa: E402
from progress_sql.inference.backends import TransformersBackend  # noqa: E402
from corpora import QUESTIONS, half_right_sft, school_corpus, school_settings  # noqa: E402


# On a GPU, DeepSpeed runs the module in bf16 (the code's choice there), and what is exact on a
# CPU holds to bf16's precision: the sampler's cached decode and the trainer's full forward agree
# to ~1e-2 in log-probability, the policy and its bf16 reference to ~2e-4 in k3 KL at step 1
# (an H200; the training forward takes another attention kernel), and a saved bf16 weight may sit
# one bf16 step (2**-8 relative) away after fp32 master weights that differ in their last bits
# (attention's backward on CUDA adds with atomics, in no fixed order). On a CPU with bf16
# instructions the trainer's passes run under bf16 autocast (rl.autocast: auto) while the sampler
# decodes in fp32: their log-probabilities differ by bf16's rounding; the reference runs at the
# policy's precision, so the KL at step 1 is still 0, and CPU kernels keep a resume exact.
BF16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
TRAINER_BF16 = autocast_dtype(RLSettings().autocast, torch.device("cuda" if BF16 else "cpu")) == torch.bfloat16
LOGPROB_GAP = 5e-2 if TRAINER_BF16 else 1e-4
KL_AT_START = 1e-3 if BF16 else 1e-9  # after one update the KL is ~2e-2 (CPU)
WEIGHTS = dict(atol=1e-6, rtol=2**-7) if BF16 else dict(atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, policy): the tiny model after a short SFT, so that rollouts hold SQL-like
    outputs whose rewards differ within a group (an untrained model's all score the same)."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("rl")
    corpus = school_corpus(root / "corpus")
    s = school_settings()
    base = build_tiny_model(corpus, s, root / "base")
    # 60 steps: loss ~0.5; no copy rows (the seeded rollouts below are drawn from this policy)
    run_sft(half_right_sft(s, base, 60.0), corpus, out_dir=root / "sft", progress=False)
    return corpus, root / "sft"


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _rollout_rows(out: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (out / "rollouts" / f"step-{step}.jsonl").read_text().splitlines()]


def _finite(metrics: dict) -> bool:
    return all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))


# ----------------------------------------------------------------------------- DeepSpeed
def test_zero2_two_steps_then_resume_reproduces_step_two(warm, tmp_path):
    corpus, policy = warm
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.deepspeed_config = "always", "configs/deepspeed/zero2.json"
    # DAPO-style: token-mean aggregation and clip-higher; KL to the reference with k3
    s.rl.loss_aggregation, s.rl.clip_eps_high, s.rl.kl_beta = "token_mean", 0.28, 0.05
    s.rl.schedule, s.rl.warmup_steps = "linear", 1  # the schedule's state must survive the resume
    first = run_rl(s, corpus, out_dir=tmp_path / "a", progress=False)
    assert not torch.distributed.is_initialized()  # the run closed the process group it opened

    assert (first.steps, first.stopped_by) == (2, "steps")
    run_info = json.loads((first.final_dir / "rl_run.json").read_text())
    assert (run_info["engine"], run_info["zero_stage"]) == ("deepspeed", 2)
    m1, m2 = first.metrics
    groups: dict[int, set[float]] = {}
    for row in _rollout_rows(first.out_dir, 1):
        groups.setdefault(row["group"], set()).add(row["reward"])
    assert any(len(r) > 1 for r in groups.values()), "step 1 needs a group with unequal rewards to learn from"
    assert _finite(m1) and _finite(m2) and m1["grad_norm"] > 0 and m1["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert m1["logprob_gap"] < LOGPROB_GAP  # the sampler's log-probs are the trainer's at the same positions
    assert abs(m1["kl"]) < KL_AT_START < m2["kl"]  # step 1's policy is the reference itself
    for key in ("reward/align", "reward/exec", "ex@1", "ex@2", "turns/mean", "response_tokens/mean", "clip_frac",
                "tokens_per_s", "trajectories_per_s", "lr", "logprob_gap"):
        assert key in m2
    assert [json.loads(line)["step"] for line in (first.out_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # weights changed in step 1 (DeepSpeed's own checkpoint of the module)
    step1 = list_checkpoints(first.out_dir)[0]
    module = torch.load(step1 / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    start = _weights(policy)
    assert any(not torch.equal(module[k], start[k].to(module[k].dtype)) for k in start)  # at the module's precision

    # resume from the step-1 checkpoint into another folder: step 2 again, identically
    second = run_rl(s, corpus, out_dir=tmp_path / "b", resume=step1, progress=False)
    assert second.steps == 2 and [m["step"] for m in second.metrics] == [1, 2]
    a_rows, b_rows = _rollout_rows(first.out_dir, 2), _rollout_rows(second.out_dir, 2)
    assert [r["input_ids"] for r in a_rows] == [r["input_ids"] for r in b_rows]
    assert [r["loss_mask"] for r in a_rows] == [r["loss_mask"] for r in b_rows]
    assert second.metrics[-1]["loss"] == pytest.approx(m2["loss"], abs=1e-6)
    assert second.metrics[-1]["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert second.metrics[-1]["lr"] == m2["lr"] != m1["lr"]
    wa, wb = _weights(first.final_dir), _weights(second.final_dir)
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k].float(), wb[k].float(), **WEIGHTS) for k in wa)
    assert not all(torch.equal(wa[k], start[k].to(wa[k].dtype)) for k in wa)


def test_zero3_one_step_saves_consolidated_weights(warm, tmp_path):
    """... and leaves the process as it found it: ZeRO-3 swaps torch's linear for its own, whose
    last bits differ, and a later run in the same process would not reproduce."""
    corpus, policy = warm
    linear, environ = torch.nn.functional.linear, dict(os.environ)
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.deepspeed_config = "always", "configs/deepspeed/zero3.json"
    s.rl.steps, s.rl.questions_per_step = 1, 1
    result = run_rl(s, corpus, out_dir=tmp_path, progress=False)
    assert torch.nn.functional.linear is linear
    assert dict(os.environ) == environ  # no MASTER_PORT left for a child to find still taken
    assert json.loads((result.final_dir / "rl_run.json").read_text())["zero_stage"] == 3
    rewards = {row["reward"] for row in _rollout_rows(result.out_dir, 1)}
    assert len(rewards) > 1, "the step's one group needs unequal rewards to learn from"
    assert _finite(result.metrics[0])
    start, final = _weights(policy), _weights(result.final_dir)
    assert {k: v.shape for k, v in final.items()} == {k: v.shape for k, v in start.items()}
    assert any(not torch.equal(final[k], start[k]) for k in start)
    model, _ = load_policy(result.final_dir, device="cpu")  # a complete transformers checkpoint
    assert sum(p.numel() for p in model.parameters()) == sum(v.numel() for k, v in start.items() if k != "lm_head.weight")


# ----------------------------------------------------------------------------- plain torch
def test_bf16_update_compares_one_precision_in_its_ratio_and_kl(warm, tmp_path):
    """rl.autocast bf16 on a plain engine (auto on a CPU with AVX512-BF16/AMX): the update's
    forward runs in bf16 while the weights stay fp32; the old policy's pass (two passes a batch)
    and the frozen KL reference's run at the same precision, so with weights that do not move
    (lr 1e-12) every ratio is 1 and the KL 0, as in fp32 (a reference left in fp32 showed a KL of
    bf16's rounding); the loss is the fp32 run's to bf16's rounding."""
    corpus, policy = warm
    runs = {}
    for mode in ("off", "bf16"):
        s = school_settings(policy)
        s.rl.deepspeed, s.rl.autocast, s.rl.steps = "never", mode, 1
        s.rl.kl_beta, s.rl.updates_per_batch, s.rl.lr = 0.05, 2, 1e-12
        runs[mode] = run_rl(s, corpus, out_dir=tmp_path / mode, progress=False).metrics[0]
        assert abs(runs[mode]["kl"]) < 1e-9 and runs[mode]["ratio"] == pytest.approx(1.0, abs=1e-7), mode
        assert runs[mode]["clip_frac"] == 0.0 and runs[mode]["grad_norm"] > 0, mode
        assert all(w.dtype == torch.float32 for w in _weights(tmp_path / mode / "final").values())
    off, bf16 = runs["off"], runs["bf16"]
    assert bf16["loss"] == pytest.approx(off["loss"], abs=0.02)
    assert off["logprob_gap"] < 1e-4 < bf16["logprob_gap"] < 5e-2  # the fp32 sampler against each


def test_plain_torch_resume_in_place_and_time_budget(warm, tmp_path):
    corpus, policy = warm
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.algorithm, s.rl.clip_eps, s.rl.clip_eps_high = "never", "gspo", 3e-4, 4e-4
    s.rl.steps, s.rl.keep_checkpoints = 1, 1
    one = run_rl(s, corpus, out_dir=tmp_path / "run", progress=False)
    assert one.steps == 1 and json.loads((one.final_dir / "rl_run.json").read_text())["engine"] == "torch"

    s.rl.steps = 2  # asked for more: resume=True continues in place from the newest checkpoint
    two = run_rl(s, corpus, out_dir=tmp_path / "run", resume=True, progress=False)
    assert [m["step"] for m in two.metrics] == [1, 2] and _finite(two.metrics[-1])
    assert [p.name for p in list_checkpoints(two.out_dir)] == ["step-2"]  # keep_checkpoints = 1
    assert len((two.out_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert _weights(one.final_dir).keys() == _weights(two.final_dir).keys()

    s.rl.steps, s.rl.max_minutes = 5, 1e-6  # the budget runs out during step 1
    timed = run_rl(s, corpus, out_dir=tmp_path / "timed", progress=False)
    assert (timed.steps, timed.stopped_by) == (1, "time")
    assert [p.name for p in list_checkpoints(timed.out_dir)] == ["step-1"] and (timed.final_dir / "config.json").is_file()


# ----------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("engine", ["never", "zero2", "zero3"])
def test_lora_rl_trains_adapters_only_and_resumes_exactly(warm, tmp_path, engine):
    """rl.lora: only the adapters move (the base frozen: embeddings and norms end as they began);
    the KL reference is the policy with its adapters off, so step 1's KL is 0 with no second
    model; the final policy is saved merged (a plain model folder, adapters beside it); a run
    resumed from its step-1 checkpoint ends with the weights of the run that went on."""
    corpus, policy = warm
    s = school_settings(policy)
    s.rl.deepspeed = "never" if engine == "never" else "always"
    s.rl.deepspeed_config = f"configs/deepspeed/{engine if engine != 'never' else 'zero2'}.json"
    s.rl.lora.enabled, s.rl.lora.r, s.rl.lora.alpha, s.rl.kl_beta, s.rl.lr = True, 4, 8, 0.05, 1e-2
    first = run_rl(s, corpus, out_dir=tmp_path / "a", progress=False)
    m1, m2 = first.metrics
    assert m1["kl"] == pytest.approx(0.0, abs=KL_AT_START) and m2["kl"] > 0 and m1["grad_norm"] > 0
    assert (first.final_dir / "adapter" / "adapter_config.json").is_file()
    start, final = _weights(policy), _weights(first.final_dir)
    assert final.keys() == start.keys()  # merged: no adapter weights, the base's names
    frozen = [k for k in start if "embed" in k or "norm" in k]
    assert frozen and all(torch.equal(final[k], start[k].to(final[k].dtype)) for k in frozen)
    assert any(not torch.equal(final[k], start[k].to(final[k].dtype)) for k in start if k.endswith("proj.weight"))

    second = run_rl(s, corpus, out_dir=tmp_path / "b", resume=list_checkpoints(first.out_dir)[0], progress=False)
    assert second.metrics[-1]["loss"] == pytest.approx(m2["loss"], abs=1e-6)
    resumed = _weights(second.final_dir)
    assert all(torch.allclose(resumed[k].float(), final[k].float(), **WEIGHTS) for k in final)


def test_lora_weights_reach_vllm_merged_under_the_base_names(warm):
    """What a LoRA policy sends vLLM after an update: every base parameter under its own name,
    the adapters merged in (the function the trainer's policy computes), nothing of the adapters;
    the policy itself is left unmerged."""
    from progress_sql.inference.lora import merged_weights
    from progress_sql.train.lora import with_lora

    _, policy = warm
    model, _ = load_policy(policy, dtype="float32", device="cpu")
    names = {n: p.detach().clone() for n, p in model.named_parameters()}
    lora = with_lora(model, RLSettings().lora.model_copy(update={"enabled": True, "r": 4, "alpha": 8}))
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)  # B starts at 0: give the adapters something to add
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    with torch.no_grad():
        expected = lora(input_ids=ids).logits
    weights = merged_weights(lora)
    assert set(weights) == set(names) - {"lm_head.weight"} or set(weights) == set(names)
    assert not any("lora" in k for k in weights)
    assert any(not torch.equal(weights[k], names[k]) for k in weights if k.endswith("proj.weight"))
    fresh, _ = load_policy(policy, dtype="float32", device="cpu")
    fresh.load_state_dict(weights, strict=False)
    with torch.no_grad():
        assert torch.allclose(fresh(input_ids=ids).logits, expected, atol=1e-5)
        assert torch.equal(lora(input_ids=ids).logits, expected)  # never merged: not a bit moved


def test_only_sampled_tokens_are_scored_and_each_gets_a_gradient(warm):
    """A real multi-turn rollout's micro-batch, packed: the tokens scored are exactly those the
    policy sampled (prompt, feedback and end-of-turn tokens never reach the output head), and on
    policy every one of a sequence with a non-zero advantage gets a gradient."""
    corpus, policy = warm
    s = school_settings(policy)
    model, tokenizer = load_policy(policy, device="cpu")
    use_packed_attention(model)
    layout = CorpusLayout(corpus)
    token_policy = TokenPolicy(TransformersBackend(model, tokenizer), tokenizer, s.generation, stop_strings("think_sql"), seed=3)
    examples = [Example(id="q", db_id="school", question=QUESTIONS[1][0], gold_sql=QUESTIONS[1][1], hardness="easy")] * 3
    episodes = envs.rollout(lambda: envs.get("odt_feedback")(s), token_policy, examples, layout.database)
    trajs = [tokenized_trajectory(ep, float(i), 0, 10_000) for i, ep in enumerate(episodes)]
    assert any(ep.K > 1 for ep in episodes)  # feedback between turns is part of the check
    batch = token_batch(trajs, packed=True, pad_id=tokenizer.pad_token_id, device="cpu")
    sampled = [(r, t.input_ids[k]) for r, t in enumerate(trajs) for k, m in enumerate(t.loss_mask) if m and k > 0]
    assert list(zip(batch.seq.tolist(), batch.targets.tolist())) == sampled

    captured = {}

    def keep_hidden(_module, _inputs, output):  # the final norm's output: what the head projects
        if output.requires_grad:
            output.retain_grad()
            captured["hidden"] = output

    handle = model.model.norm.register_forward_hook(keep_hidden)
    model.train()
    adv = group_advantages([0.0, 1.0, 2.0], [0, 0, 0], 1e-6)
    loss, _ = micro_batch_loss(model, batch, adv, None, None, s.rl, temperature=1.0, num_sequences=3,
                               num_tokens=float(len(sampled)), max_tokens=48)
    loss.backward()
    handle.remove()
    grad = captured["hidden"].grad.reshape(-1, captured["hidden"].shape[-1])  # one row per position
    assert grad.shape[0] == batch.input_ids.numel()
    at = batch.positions[adv[batch.seq] != 0]  # the positions predicting a token of a moving sequence
    assert bool((grad[at].abs().sum(-1) > 0).all())
    others = torch.ones(grad.shape[0], dtype=torch.bool)
    others[at] = False
    assert torch.count_nonzero(grad[others]) == 0  # prompt, feedback, end-of-turn: nothing reaches them


# ----------------------------------------------------------------------------- pieces
def test_each_step_shows_a_few_episodes_turn_by_turn(warm, tmp_path):
    """on_episodes gets rl.log_episodes episodes a step, best to worst reward: each turn's prompt
    tail, output, the environment's feedback and the reward had the episode stopped there."""
    corpus, policy = warm
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.steps, s.rl.log_episodes = "never", 1, 3
    shown: list[tuple[int, list[dict]]] = []
    result = run_rl(s, corpus, out_dir=tmp_path, progress=False, on_episodes=lambda step, views: shown.append((step, views)))
    [(step, views)] = shown
    assert step == 1 and len(views) == 3
    rewards = [row["reward"] for row in _rollout_rows(result.out_dir, 1)]
    shown_rewards = [v["reward"] for v in views]
    assert shown_rewards == sorted(shown_rewards, reverse=True)
    assert shown_rewards[0] == max(rewards) and shown_rewards[-1] == min(rewards)
    for view in views:
        turns = view["turns"]
        assert turns and [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
        assert turns[-1]["reward_so_far"] == view["reward"] and turns[-1]["correct"] == view["correct"]
        assert all(t["feedback"] for t in turns[:-1])  # the ODT feedback the next turn answers
        assert all(t["prompt_tail"] and t["output"] is not None for t in turns)
        assert view["question"] and view["gold_sql"] and set(view["components"]) == set(rewards_of(s).components)


def rewards_of(settings):
    from progress_sql import rewards

    return rewards.get(settings.rl.recipe)


def test_spread_picks_best_worst_and_between():
    from progress_sql.train.samples import spread

    assert spread([0.1, 0.9, 0.5, 0.3, 0.7], 3) == [1, 2, 0]
    assert spread([0.1, 0.9], 4) == [1, 0]
    assert spread([1.0, 1.0, 0.0], 1) == [0]


def test_question_stream_is_a_seeded_permutation_per_epoch():
    first = question_indices(5, 0, 5, seed=1)
    assert sorted(first) == list(range(5))
    assert question_indices(5, 0, 12, seed=1)[:5] == first
    assert question_indices(5, 3, 4, seed=1) == question_indices(5, 0, 7, seed=1)[3:]  # position replays
    assert sorted(question_indices(5, 5, 5, seed=1)) == list(range(5))
    assert question_indices(5, 0, 5, seed=2) != first or question_indices(5, 5, 5, seed=2) != question_indices(5, 5, 5, seed=1)


def test_lr_schedules():
    rl = RLSettings(warmup_steps=2, schedule="linear")
    f = lr_lambda(rl, total_updates=10)
    assert [round(f(u), 4) for u in (0, 1, 2, 6, 10)] == [round(1 / 3, 4), round(2 / 3, 4), 1.0, 0.5, 0.0]
    cos = lr_lambda(RLSettings(schedule="cosine"), total_updates=4)
    assert [round(cos(u), 4) for u in (0, 2, 4)] == [1.0, 0.5, 0.0]
    assert lr_lambda(RLSettings(), 10)(7) == 1.0


def test_deepspeed_config_is_filled_from_settings(tmp_path):
    rl = RLSettings(micro_batch_size=3, grad_clip=0.5)
    config = deepspeed_config(rl, grad_accum=4, world=2, bf16=False)
    sizes = (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"], config["train_batch_size"])
    assert sizes == (3, 4, 24)
    assert config["gradient_clipping"] == 0.5 and config["bf16"]["enabled"] is False
    assert config["zero_optimization"]["stage"] == 2
    assert deepspeed_config(RLSettings(deepspeed_config="configs/deepspeed/zero3.json"), grad_accum=1, world=1,
                            bf16=True)["bf16"]["enabled"] is True
    bad = tmp_path / "auto.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}))
    with pytest.raises(ValueError, match="auto"):
        deepspeed_config(RLSettings(deepspeed_config=str(bad)), grad_accum=1, world=1, bf16=False)
    with pytest.raises(FileNotFoundError, match="rl.deepspeed_config"):
        deepspeed_config(RLSettings(deepspeed_config="nowhere.json"), grad_accum=1, world=1, bf16=False)


def test_loss_aggregation_follows_the_algorithm():
    assert RLSettings().aggregation == "seq_mean_token_mean"
    assert RLSettings(algorithm="dr_grpo").aggregation == "seq_mean_token_sum_norm"
    assert RLSettings(loss_aggregation="token_mean", clip_eps_high=0.28).aggregation == "token_mean"
    with pytest.raises(ValueError, match="gspo"):
        RLSettings(algorithm="gspo", loss_aggregation="token_mean")


def test_engine_choice():
    assert use_deepspeed("always") and not use_deepspeed("never")
    assert use_deepspeed("auto") == torch.cuda.is_available()
    with pytest.raises(ValueError):
        use_deepspeed("sometimes")


def test_process_environment_keeps_a_launchers_values_and_removes_its_own(monkeypatch):
    """torch keeps a closed group's store listening on its port: a MASTER_PORT left in the
    environment was inherited by bench/gpu_check.sh's parts, which all failed with EADDRINUSE."""
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_EXTENSIONS_DIR")
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")  # a launcher's
    with process_environment(False):
        assert "MASTER_PORT" not in os.environ
    with pytest.raises(RuntimeError), process_environment(True):
        assert os.environ["WORLD_SIZE"] == "4" and os.environ["RANK"] == "0"
        assert 1024 <= int(os.environ["MASTER_PORT"]) <= 65535
        raise RuntimeError("the run failed")
    assert {key: os.environ.get(key) for key in keys} == {key: "4" if key == "WORLD_SIZE" else None for key in keys}


def test_rl_draws_only_questions_of_rl_hardness(warm, tmp_path):
    corpus, policy = warm
    relabelled = tmp_path / "corpus"
    shutil.copytree(corpus, relabelled)
    layout = CorpusLayout(relabelled)
    examples = list(read_jsonl(layout.split("train")))
    examples[:2] = [dataclasses.replace(ex, hardness="hard") for ex in examples[:2]]
    write_jsonl(layout.split("train"), examples)
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.steps, s.rl.questions_per_step, s.rl.hardness = "never", 2, 2, ["hard"]
    result = run_rl(s, relabelled, out_dir=tmp_path / "run", progress=False)
    drawn = {row["example_id"] for step in (1, 2) for row in _rollout_rows(result.out_dir, step)}
    assert drawn == {ex.id for ex in examples[:2]}
    for step, metrics in enumerate(result.metrics, start=1):  # groups/mixed_ex, recounted from the rollouts
        correct: dict[int, list[bool]] = {}
        for row in _rollout_rows(result.out_dir, step):
            correct.setdefault(row["group"], []).append(row["correct"])
        mixed = [0 < sum(c) < len(c) for c in correct.values()]
        assert metrics["groups/mixed_ex"] == pytest.approx(sum(mixed) / len(mixed))

    s.rl.hardness = ["extra"]
    with pytest.raises(CorpusError, match="no training examples of hardness extra"):
        run_rl(s, relabelled, out_dir=tmp_path / "none", progress=False)


def test_recipe_and_env_must_speak_one_format(warm, tmp_path):
    corpus, policy = warm
    s = school_settings(policy)
    s.rl.recipe, s.rl.env = "sql_trail", "odt_feedback"
    with pytest.raises(ValueError, match="pick a matching pair"):
        run_rl(s, corpus, out_dir=tmp_path, progress=False)



@pytest.fixture(scope="module")
def half_right(warm, tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, policy): the warm fixture's base after a longer SFT (80 steps), which samples
    the right SQL for about half of its rollouts of the four train questions (temperature 1)."""
    corpus, sft = warm
    s = half_right_sft(school_settings(), sft.parent / "base")
    out = tmp_path_factory.mktemp("half-right") / "sft"
    run_sft(s, corpus, out_dir=out, progress=False)
    return corpus, out


def _learning_settings(policy: Path):
    """GRPO as published on the four questions: the default recipe and environment (progress,
    odt_feedback), rl.negative_advantage_scale 1.0, the default loss, eight passes over each batch
    (μ = 8: the ratio clip takes effect from the second pass), 40 steps. Updates in fp32: the
    margins hold alike on a CPU with bf16 instructions and one without, and this 64-wide policy
    updates 4x faster than under bf16 autocast, whose kernels oneDNN compiles for each new shape
    at a cost products this small do not repay (bf16 updates have their own tests above)."""
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.save_rollouts, s.rl.checkpoint_every, s.rl.autocast = "never", False, 100, "off"
    s.rl.steps, s.rl.questions_per_step, s.rl.group_size, s.rl.micro_batch_size = 40, 4, 8, 16
    s.rl.lr, s.rl.updates_per_batch, s.rl.max_minutes = 3e-4, 8, 60.0
    assert s.rl.negative_advantage_scale == 1.0 and s.rl.loss_aggregation == "auto"
    return s


@pytest.fixture(scope="module")
def frozen_ex(half_right, tmp_path_factory) -> list[float]:
    """Rollout EX of each step with no learning: the same seeded rollouts (lr 1e-12, one pass)."""
    corpus, policy = half_right
    s = _learning_settings(policy)
    s.rl.lr, s.rl.updates_per_batch = 1e-12, 1
    return [m["ex"] for m in run_rl(s, corpus, out_dir=tmp_path_factory.mktemp("frozen"), progress=False).metrics]


def test_step_metrics_count_fixes_and_repeats_at_turn_2(half_right, tmp_path):
    """Issue 53: each step reports its wrong first turns fixed at turn 2 and its second turns that
    repeat the first (``eval.metrics.second_turn_counts``, as the multi-turn evaluation counts)."""
    from progress_sql.eval.metrics import second_turn_counts
    from progress_sql.rewards import Turn

    corpus, policy = half_right
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.steps, s.rl.group_size, s.rl.questions_per_step = "never", 1, 8, 4
    n = s.rl.log_episodes = s.rl.group_size * s.rl.questions_per_step  # every episode, turn by turn
    views: list[dict] = []
    (m,) = run_rl(s, corpus, out_dir=tmp_path, progress=False, on_episodes=lambda step, shown: views.extend(shown)).metrics
    episodes = [[Turn(t["output"], t["sql"], None, t["correct"]) for t in v["turns"]] for v in views]
    assert len(episodes) == n and {k: m[f"turn2/{k}"] for k in second_turn_counts(episodes)} == second_turn_counts(episodes)
    # two turns (env.max_turns): every wrong first turn gets a second, and a fix is what ex@2 adds to ex@1
    assert m["turn2/wrong_at_1"] == m["turn2/second_turns"] == round(n * (1 - m["ex@1"])) > 0
    assert m["turn2/fixed"] == round(n * (m["ex@2"] - m["ex@1"]))
    assert 0 <= m["turn2/repeats"] <= m["turn2/second_turns"]


def _mean(xs):
    return sum(xs) / len(xs)


def test_rl_raises_ex_on_its_own_questions(half_right, frozen_ex, tmp_path):
    """The loop optimises what it is paid for (``_learning_settings``): on the four train
    questions the share of right rollouts rises, beyond what the same seeded sampling gives with
    no update. (With one pass the clip never fires and the wrong rollouts' gradient, 20× the right
    ones' and almost orthogonal to raising them, takes most of each step:
    docs/experiments/2026-12-03-learning-parity-with-trl.md.)"""
    corpus, policy = half_right
    trained = [m["ex"] for m in run_rl(_learning_settings(policy), corpus, out_dir=tmp_path, progress=False).metrics]
    assert len(trained) == len(frozen_ex) == 40
    first, last, last_frozen = _mean(trained[:10]), _mean(trained[-10:]), _mean(frozen_ex[-10:])
    print(f"rollout EX: steps 1-10 {first:.3f}, steps 31-40 {last:.3f}; no update, steps 31-40 {last_frozen:.3f}")
    assert last > first + 0.12 and last > last_frozen + 0.08, (trained, frozen_ex)


def test_async_rl_raises_ex_on_its_own_questions(half_right, frozen_ex, tmp_path):
    """The same learning test with rl.async (staleness 1: every batch after the first sampled by
    the producer with weights one update behind, the decoupled loss correcting for it), held to
    the synchronous margins less a tolerance of 0.04 each (0.08 and 0.04 instead of 0.12 and 0.08):
    one step of lag on eight passes a batch is not expected to learn as fast as on-policy."""
    corpus, policy = half_right
    s = _learning_settings(policy)
    s.rl.async_.enabled, s.rl.async_.max_staleness = True, 1
    result = run_rl(s, corpus, out_dir=tmp_path, progress=False)
    trained = [m["ex"] for m in result.metrics]
    assert max(m["async/staleness_max"] for m in result.metrics) == 1
    first, last, last_frozen = _mean(trained[:10]), _mean(trained[-10:]), _mean(frozen_ex[-10:])
    print(f"async rollout EX: steps 1-10 {first:.3f}, steps 31-40 {last:.3f}; no update, steps 31-40 {last_frozen:.3f}")
    assert last > first + 0.12 - ASYNC_TOLERANCE and last > last_frozen + 0.08 - ASYNC_TOLERANCE, (trained, frozen_ex)


ASYNC_TOLERANCE = 0.04  # rollout EX, against the synchronous margins


def test_lora_rl_raises_ex_on_its_own_questions(half_right, frozen_ex, tmp_path):
    """The same learning test with rl.lora, held to full fine-tuning's margins: rank 16 on every
    linear layer and the output head (this 64-wide policy learns the task mostly there: on the
    layers alone, "all-linear", its rollout EX did not rise at lr 1e-4 to 1e-3), lr 1e-3.
    The head is tied to the input embedding, so the adapter gets an untied copy of it."""
    corpus, policy = half_right
    s = _learning_settings(policy)
    s.rl.lora.enabled, s.rl.lr = True, 1e-3
    s.rl.lora.targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    trained = [m["ex"] for m in run_rl(s, corpus, out_dir=tmp_path, progress=False).metrics]
    first, last, last_frozen = _mean(trained[:10]), _mean(trained[-10:]), _mean(frozen_ex[-10:])
    print(f"LoRA rollout EX: steps 1-10 {first:.3f}, steps 31-40 {last:.3f}; no update, steps 31-40 {last_frozen:.3f}")
    assert last > first + 0.12 and last > last_frozen + 0.08, (trained, frozen_ex)


def test_lora_on_a_tied_head_adapts_the_head_alone(warm, tmp_path):
    """An adapter on a head tied to the input embedding: the wrapped model computes what the base
    did, the merged model keeps the embedding and changes only the head, and vLLM (which would drop
    the head's adapter of a tied model) is refused."""
    from progress_sql.train.lora import adapts_tied_head, save_policy, with_lora

    corpus, policy = warm
    model, tokenizer = load_policy(policy, dtype="float32", device="cpu")
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    lora_settings = RLSettings().lora.model_copy(update={"enabled": True, "r": 4, "targets": ["q_proj", "lm_head"]})
    assert adapts_tied_head(model, lora_settings)
    ids = torch.tensor([[3, 5, 7, 11]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        lora = with_lora(model, lora_settings)
        assert torch.equal(lora(input_ids=ids).logits, before)
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.1)
        trained = lora(input_ids=ids).logits
    embedding = model.model.embed_tokens.weight.detach().clone()
    save_policy(lora, tokenizer, tmp_path / "merged")
    merged, _ = load_policy(tmp_path / "merged", dtype="float32", device="cpu")
    assert torch.equal(merged.model.embed_tokens.weight, embedding)
    assert not torch.equal(merged.lm_head.weight, embedding)
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, trained, atol=1e-5)

    s = school_settings(policy)
    s.generation.backend, s.rl.lora.enabled, s.rl.lora.targets = "vllm", True, ["lm_head"]
    from progress_sql.inference.backends import BACKEND_CLASSES

    # the refusal follows what a backend declares, not its name: an engine that loads the folder
    assert {name: cls.own_weights for name, cls in BACKEND_CLASSES.items()} == {"transformers": False, "vllm": True}
    with pytest.raises(ValueError, match="vllm backend, loading that model, would drop the head's adapter"):
        run_rl(s, corpus, out_dir=tmp_path / "rl", progress=False)
    # so is rl.async's producer, which loads the folder too, whatever the backend
    s.generation.backend, s.rl.async_.enabled = "transformers", True
    with pytest.raises(ValueError, match="producer of rl.async, loading that model, would drop the head's adapter; "
                                         "set rl.async.enabled: false or leave the head out"):
        run_rl(s, corpus, out_dir=tmp_path / "rl-async", progress=False)


def test_rl_questions_solved_draws_only_what_the_policy_answers_greedily(half_right, tmp_path):
    """rl.questions solved: RL draws exactly the train questions whose greedy answer the
    evaluation judges right (checked against run_eval on the same split), keeps them in its
    checkpoints, and a resumed run draws from the same questions without a second pass."""
    from progress_sql.eval.runner import run_eval

    corpus, policy = half_right
    extended = tmp_path / "corpus"  # plus two questions the policy never saw: at least one unsolved
    shutil.copytree(corpus, extended)
    layout = CorpusLayout(extended)
    examples = list(read_jsonl(layout.split("train")))
    examples += [Example(id="q-sum", db_id="school", question="What is the total budget of all departments?",
                         gold_sql="SELECT sum(budget) FROM department", hardness="easy", reasoning="r"),
                 Example(id="q-min", db_id="school", question="What is the age of the youngest student?",
                         gold_sql="SELECT min(age) FROM student", hardness="easy", reasoning="r")]
    write_jsonl(layout.split("train"), examples)

    s = school_settings(policy)
    s.eval.max_examples, s.eval.vote_k, s.eval.pass_k, s.eval.ts = 0, 0, 0, False
    s.model.dtype = "float32"  # the precision RL's plain engine generates in (on a GPU: not bf16)
    evaluated = run_eval(s, str(policy), extended, ["train"], tmp_path / "eval", progress=False)
    rows = [json.loads(line) for line in evaluated.files["predictions/train"].read_text().splitlines()]
    solved = {row["id"] for row in rows if row["greedy"]["ex"]}
    assert 0 < len(solved) < len(examples), rows

    s.rl.deepspeed, s.rl.questions, s.rl.steps, s.rl.checkpoint_every = "never", "solved", 2, 1
    result = run_rl(s, extended, out_dir=tmp_path / "run", progress=False)
    assert result.questions == len(solved)
    drawn = {row["example_id"] for step in (1, 2) for row in _rollout_rows(result.out_dir, step)}
    assert drawn <= solved and len(drawn) == min(len(solved), 2 * s.rl.questions_per_step)
    pass_file = result.out_dir / "solved_questions.jsonl"
    recorded = [json.loads(line) for line in pass_file.read_text().splitlines()]
    assert {row["id"] for row in recorded if row["greedy"]["ex"]} == solved and len(recorded) == len(examples)
    state = json.loads((list_checkpoints(result.out_dir)[0] / "trainer_state.json").read_text())
    assert set(state["question_pool"]) == solved  # the key checkpoints written before the rename hold

    pass_file.unlink()  # a resumed run takes the questions from the checkpoint: no second pass
    resumed = run_rl(s, extended, out_dir=tmp_path / "run", resume=list_checkpoints(result.out_dir)[0],
                     progress=False)
    assert resumed.questions == len(solved) and not pass_file.exists()
    assert [m["reward/mean"] for m in resumed.metrics] == [m["reward/mean"] for m in result.metrics]

    s.rl.steps, s.rl.solved_candidates = 1, 3  # the pass tries a seeded sample of three questions
    sampled = run_rl(s, extended, out_dir=tmp_path / "sampled", progress=False)
    tried = [json.loads(line) for line in (sampled.out_dir / "solved_questions.jsonl").read_text().splitlines()]
    assert len(tried) == 3 and sampled.questions == sum(row["greedy"]["ex"] for row in tried)
    assert {row["id"] for row in tried if row["greedy"]["ex"]} <= solved

    untrained = corpus.parent / "base"  # the warm fixture's base model: answers nothing
    s.rl.init_from = str(untrained)
    with pytest.raises(CorpusError, match="answers none of the train questions"):
        run_rl(s, extended, out_dir=tmp_path / "none", progress=False)


# ----------------------------------------------------------------------------- issue 53: questions with signal, the check
EXE = str(Path(os.path.abspath(sys.executable)).with_name("progress-sql"))  # the tests run it in other folders
CLI_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
CLI_ENV.pop("DVC_STAGE", None)


def _cli(settings, folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``progress-sql ARGS --params P`` as a user runs it, P holding ``settings`` (no MLflow)."""
    settings = settings.model_copy(deep=True)
    settings.tracking.enabled = False
    params = folder / "params.yaml"
    params.write_text(json.dumps(settings.model_dump(mode="json", by_alias=True)))  # JSON is YAML
    return subprocess.run([EXE, *args, "--params", str(params)], cwd=folder, env=CLI_ENV, capture_output=True,
                          text=True, timeout=600)


def _extended(corpus: Path, root: Path, more_train: bool = True) -> Path:
    """A copy of the school corpus with an indomain split (the four train questions under other
    ids) and, with ``more_train``, two more train questions (the policy never saw them: at least
    one unsolved)."""
    extended = root / "corpus"
    shutil.copytree(corpus, extended)
    layout = CorpusLayout(extended)
    examples = list(read_jsonl(layout.split("train")))
    write_jsonl(layout.split("indomain"), [dataclasses.replace(ex, id=f"in-{ex.id}") for ex in examples])
    if not more_train:
        return extended
    examples += [Example(id="q-sum", db_id="school", question="What is the total budget of all departments?",
                         gold_sql="SELECT sum(budget) FROM department", hardness="easy", reasoning="r"),
                 Example(id="q-min", db_id="school", question="What is the age of the youngest student?",
                         gold_sql="SELECT min(age) FROM student", hardness="easy", reasoning="r")]
    write_jsonl(layout.split("train"), examples)
    return extended


def _scores(folder: Path) -> tuple[dict, dict]:
    rows = [json.loads(line) for line in (folder / "scores.jsonl").read_text().splitlines()]
    return {row["example_id"]: row for row in rows}, json.loads((folder / "summary.json").read_text())


def test_score_command_scores_each_question_as_evaluation_judges_it(half_right, tmp_path):
    """`progress-sql train score`: k single-turn samples of each train question from the rollout
    sampler, judged as the evaluation judges. Greedy (temperature 0), every sample of a question
    gets the evaluation's greedy verdict (run_eval on the same split); at RL's temperature the
    summary counts the rates; with rl.questions all it scores nothing, at once."""
    from progress_sql.eval.runner import run_eval

    corpus, policy = half_right
    extended = _extended(corpus, tmp_path)
    s = school_settings(policy)
    s.rl.questions, s.rl.scores.out_dir, s.rl.scores.k, s.generation.temperature = "band", str(tmp_path / "sc"), 2, 0.0
    s.data.out_dir = str(extended)
    done = _cli(s, tmp_path, "train", "score", "--report-dir", str(tmp_path / "reports"))
    assert done.returncode == 0, done.stderr[-3000:]
    rows, summary = _scores(tmp_path / "sc")
    assert set(rows) == {ex.id for ex in read_jsonl(CorpusLayout(extended).split("train"))}
    assert all(row["correct"] in (0, 2) and row["rate"] == row["correct"] / 2 for row in rows.values())
    s.eval.max_examples, s.eval.vote_k, s.eval.pass_k, s.eval.ts, s.model.dtype = 0, 0, 0, False, "float32"
    evaluated = run_eval(s, str(policy), extended, ["train"], tmp_path / "eval", progress=False)
    greedy = {row["id"]: row["greedy"]["ex"] for row in
              map(json.loads, evaluated.files["predictions/train"].read_text().splitlines())}
    assert {i: row["rate"] == 1.0 for i, row in rows.items()} == greedy and 0 < sum(greedy.values()) < len(greedy)
    assert (summary["scored"], summary["at_1"], summary["between"]) == (6, sum(greedy.values()), 0)
    assert json.loads((tmp_path / "reports" / "scores.json").read_text())["scores/at_1"] == summary["at_1"]

    s.generation.temperature, s.rl.scores.k, s.rl.scores.pool = 1.0, 4, 5  # RL's sampling; a seeded pool of 5
    done = _cli(s, tmp_path, "train", "score")
    assert done.returncode == 0, done.stderr[-3000:]
    rows, summary = _scores(tmp_path / "sc")
    assert len(rows) == 5 and summary["by_correct"] == [sum(r["correct"] == c for r in rows.values()) for c in range(5)]
    assert summary["at_0"] + summary["between"] + summary["at_1"] == 5
    assert f"{summary['between']} inside the band 0 < rate < 1" in done.stdout

    s.rl.questions = "all"  # the DVC stage of the default pipeline: empty scores, no model loaded
    done = _cli(s, tmp_path, "train", "score")
    assert done.returncode == 0 and "nothing scored" in done.stdout and "Loading weights" not in done.stderr
    assert (tmp_path / "sc" / "scores.jsonl").read_text() == "" and _scores(tmp_path / "sc")[1]["scored"] == 0


def test_rl_questions_band_draws_only_inside_the_band_of_its_policys_scores(half_right, warm, tmp_path):
    """rl.questions band: RL draws only the scored questions with low < rate < high, and its
    fingerprint holds the scores (new scores start an --auto-resume run over). Missing scores,
    scores of another policy and an empty band each stop `train rl` with one line (exit 1)."""
    from progress_sql.train.resume import run_fingerprint

    corpus, policy = half_right
    extended = _extended(corpus, tmp_path)
    s = school_settings(policy)
    s.rl.questions, s.rl.scores.out_dir, s.rl.scores.k = "band", str(tmp_path / "sc"), 4
    s.data.out_dir, s.rl.deepspeed, s.rl.steps, s.rl.questions_per_step = str(extended), "never", 2, 1

    missing = _cli(s, tmp_path, "train", "rl", "--out", str(tmp_path / "rl"))
    assert missing.returncode == 1 and "progress-sql train score" in missing.stderr, missing.stderr[-2000:]
    assert f"{tmp_path / 'sc' / 'summary.json'} is missing" in missing.stderr and "Traceback" not in missing.stderr

    assert _cli(s, tmp_path, "train", "score").returncode == 0
    rows, _ = _scores(tmp_path / "sc")
    inside = {i for i, row in rows.items() if 0 < row["rate"] < 1}
    assert inside, rows  # the half-right policy is right in some of its samples of some questions
    result = run_rl(s, extended, out_dir=tmp_path / "run", progress=False)
    assert result.questions == len(inside)
    assert {row["example_id"] for step in (1, 2) for row in _rollout_rows(result.out_dir, step)} <= inside
    before = run_fingerprint(s, CorpusLayout(extended))["inputs"]["question scores"]
    (tmp_path / "sc" / "scores.jsonl").write_text("")
    assert run_fingerprint(s, CorpusLayout(extended))["inputs"]["question scores"] != before

    other = s.model_copy(deep=True)
    other.rl.init_from = str(warm[1])  # another policy than the one scored
    stale = _cli(other, tmp_path, "train", "rl", "--out", str(tmp_path / "rl"))
    assert stale.returncode == 1 and f"scored with another policy ({policy} as it was then)" in stale.stderr

    assert _cli(s, tmp_path, "train", "score", "--set", "rl.scores.k=1").returncode == 0  # rates 0 or 1 only
    s.rl.scores.k = 1
    empty = _cli(s, tmp_path, "train", "rl", "--out", str(tmp_path / "rl"))
    assert empty.returncode == 1 and "has a pass rate inside the band 0 < rate < 1" in empty.stderr


@pytest.mark.parametrize("sets, keys", [
    (["rl.scores.low=0.5", "rl.scores.high=0.5"], ["rl.scores.low", "rl.scores.high"]),
    (["rl.scores.high=1.5"], ["rl.scores.high"]),
    (["rl.scores.low=-0.1"], ["rl.scores.low"]),
    (["rl.scores.k=0"], ["rl.scores.k"]),
    (["rl.dynamic_sampling.max_rounds=0"], ["rl.dynamic_sampling.max_rounds"]),
    (["rl.dynamic_sampling.signal=loss"], ["rl.dynamic_sampling.signal"]),
    (["rl.check.final=best"], ["rl.check.final", "rl.check.every"]),
    (["rl.check.split=train"], ["rl.check.split"]),
    (["rl.check.max_questions=0"], ["rl.check.max_questions"]),
])
def test_bad_signal_and_check_settings_exit_2_naming_the_key(tmp_path, sets, keys):
    for command in (["train", "score"], ["train", "rl"]):
        done = subprocess.run([EXE, *command, *[a for kv in sets for a in ("--set", kv)]], cwd=tmp_path, env=CLI_ENV,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and all(key in done.stderr for key in keys), done.stderr
        assert "Traceback" not in done.stderr


def test_dynamic_sampling_trains_only_groups_with_signal(half_right, tmp_path):
    """rl.dynamic_sampling: a group whose episodes are equally correct is sampled, saved and
    counted, but no forward or backward pass runs over it (the update's tokens are the trained
    rollouts'); more questions are drawn, questions_per_step at a time from the next places of the
    stream, until questions_per_step groups have a signal or max_rounds draws were made; the
    stream advances by every draw the step could make."""
    corpus, policy = half_right
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.steps, s.rl.shared_prefix = "never", 3, False  # shared prefixes would save tokens
    s.rl.dynamic_sampling.enabled, s.rl.dynamic_sampling.max_rounds = True, 3
    result = run_rl(s, corpus, out_dir=tmp_path, progress=False)
    per_rank, G = s.rl.questions_per_step, s.rl.group_size  # noqa: N806
    more_draws = 0
    for step, metrics in enumerate(result.metrics, start=1):
        rows = _rollout_rows(result.out_dir, step)
        groups = [rows[g:g + G] for g in range(0, len(rows), G)]
        signal = [len({r["correct"] for r in group}) > 1 for group in groups]
        trained = [g for g, group in enumerate(groups) if group[0]["trained"]]
        assert all(len({r["trained"] for r in group}) == 1 for group in groups)
        assert trained == ([g for g, has in enumerate(signal) if has][:per_rank] or [0])
        draws = len(groups) // per_rank
        assert len(groups) % per_rank == 0 and (draws == 3 or sum(signal) >= per_rank)
        assert sum(signal[:-per_rank]) < per_rank  # no draw after the step was full
        stream = question_indices(4, (step - 1) * 3 * per_rank, draws * per_rank, s.rl.seed)
        assert [group[0]["example_id"] for group in groups] == [f"q{i}" for i in stream]
        assert (metrics["groups/drawn"], metrics["groups/signal"]) == (len(groups), sum(signal))
        assert metrics["episodes/updated"] == len(trained) * G
        assert metrics["update_tokens"] == sum(len(r["input_ids"]) for r in rows if r["trained"])
        assert metrics["episodes/useful_per_min"] > 0
        more_draws += draws > 1
    assert more_draws, "no step drew more questions: the test shows nothing"
    state = json.loads((list_checkpoints(result.out_dir)[-1] / "trainer_state.json").read_text())
    assert state["data_position"] == 3 * 3 * per_rank


def test_check_keeps_the_policy_of_the_best_check(half_right, tmp_path):
    """rl.check: every step (and the last) greedy single-turn EX on the first max_questions of
    indomain, as evaluation computes it; with final best, <out>/final is the policy of the best
    check (the later on ties), rl_run.json says which, and no other best policy is left. Here
    RL at lr 1e-3 makes the half-right policy worse on the questions after its first step."""
    from progress_sql.eval.runner import run_eval

    corpus, policy = half_right
    extended = _extended(corpus, tmp_path, more_train=False)
    s = school_settings(policy)
    s.rl.deepspeed, s.rl.steps, s.rl.keep_checkpoints = "never", 3, 3
    s.rl.check.every, s.rl.check.final, s.rl.check.max_questions = 1, "best", 4
    result = run_rl(s, extended, out_dir=tmp_path / "run", progress=False)
    checks = [m["check/ex"] for m in result.metrics]
    assert len(checks) == 3 and all(m["check/n"] == 4 for m in result.metrics)
    best = max(range(3), key=lambda i: (checks[i], i)) + 1
    assert max(checks) > min(checks), checks  # else any step is the best: the test shows nothing
    info = json.loads((result.final_dir / "rl_run.json").read_text())["final"]
    assert (info["from"], info["step"], info["check/ex"]) == ("best", best, max(checks)) == \
        (result.final_from["from"], result.final_from["step"], result.final_from["check/ex"])
    assert [c["step"] for c in info["checks"]] == [1, 2, 3]
    assert [p.name for p in (result.out_dir / "best").iterdir()] == [f"step-{best}"]
    engine = torch.load(result.out_dir / "checkpoints" / f"step-{best}" / "engine.pt", weights_only=False)
    final = _weights(result.final_dir)
    assert all(torch.equal(final[k], engine["model"][k]) for k in final)
    s.eval.max_examples, s.eval.vote_k, s.eval.pass_k, s.eval.ts, s.model.dtype = 4, 0, 0, False, "float32"
    evaluated = run_eval(s, str(result.final_dir), extended, ["indomain"], tmp_path / "eval", progress=False)
    assert evaluated.metrics["indomain"]["greedy"]["ex"] == pytest.approx(max(checks))
