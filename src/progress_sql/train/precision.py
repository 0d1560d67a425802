"""The precision of a training forward pass, for SFT (``sft.autocast``) and RL (``rl.autocast``).

``auto`` runs the forward pass under bf16 autocast where the device has bf16 matrix units (a
GPU that supports bf16; a CPU with AVX512-BF16 or AMX) and the weights are fp32; ``bf16``
always; ``off`` never. Weights, gradients and the optimiser state keep their own dtype (fp32
master weights: an AdamW step below bf16's resolution would be lost in bf16 weights).
Measured on the 2-core AVX512-BF16 CPU: SFT steps 1.46x faster with the same loss
(bench/bench_sft_precision.py), RL updates of SmolLM2 in bench/bench_cores.py.
"""

from __future__ import annotations

import contextlib
import os
from typing import Literal

import torch

from progress_sql.inference.models import has_bf16

AutocastMode = Literal["auto", "bf16", "off"]
# oneDNN (and ideep above it) compile a bf16 matrix-product kernel for each shape and cache up to
# 1,024 of each; a training step's token count changes with every batch, so a run's resident
# memory grew ~25 MB a step with SmolLM2 (to GBs over a run). 64 holds the ~15 kernels of a step
# (forward and backward of each projection) and a few steps more, at the same speed.
KERNEL_CACHE = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def autocast_dtype(mode: AutocastMode, device: torch.device, weights: torch.dtype = torch.float32
                   ) -> torch.dtype | None:
    """The dtype the forward pass autocasts to under ``mode``, or None for the weights' own."""
    if mode not in ("auto", "bf16", "off"):
        raise ValueError(f"autocast must be auto, bf16 or off, got {mode!r}")
    if mode == "auto":
        mode = "bf16" if weights == torch.float32 and has_bf16(device) else "off"
    if mode == "off":
        return None
    if device.type == "cpu":
        bound_kernel_caches()
    return torch.bfloat16


def bound_kernel_caches() -> None:
    """Bound oneDNN's caches of compiled kernels (``KERNEL_CACHE``) where the user set no size.
    They read the variables when first used: call it before the process's first bf16 product."""
    for key, value in KERNEL_CACHE.items():
        os.environ.setdefault(key, value)


def autocast(device: torch.device, dtype: torch.dtype | None, *, cache: bool = True) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type; nothing for None. ``cache``: each
    weight's cast kept until the region ends (torch's default)."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype, cache_enabled=cache)


def training_autocast(mode: AutocastMode, device: torch.device, weights: torch.dtype
                      ) -> contextlib.AbstractContextManager:
    """The context of an SFT forward pass under ``mode`` (``autocast_dtype``), without autocast's
    cache: with the layers checkpointed (``sft.gradient_checkpointing``) nothing else holds the
    bf16 copy of every weight through the forward pass (SmolLM2's SFT: 0.09 GiB of the step's peak);
    a layer casts its weights again when it runs, a pass over them."""
    return autocast(device, autocast_dtype(mode, device, weights), cache=False)
