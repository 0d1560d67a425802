"""The resident memory of a training process: glibc's heap against tensors of changing shapes.

glibc serves an allocation below its mmap threshold from its heap, and raises that threshold
(up to 32 MiB) each time a larger mapped block is freed. A training step allocates and frees
activations of every size, their shapes changing with each batch: freed heap blocks stay
resident and fragment, and the process grows to several times what is live (SmolLM2's SFT step:
0.65 GB more at its peak than with the threshold fixed, which leaves 0.2 GB; bench/bench_cores.py).
With the threshold fixed at ``MMAP_THRESHOLD`` every block that large is a mapping of its own,
given back to the system when the tensor is freed; what a step frees below it goes back
before the optimizer step (``release_free_heap``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from collections.abc import Callable

# Blocks of 1 MiB and more get their own mapping: a SmolLM2 activation of one token row is 1.1 KB
# (576 bf16 values), of a batch megabytes; below this, the heap (fast, and what Python objects use).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
# A trim and the page faults after it cost a tiny model's step (tens of ms) a third of its time
# when done every step; SmolLM2's steps take seconds. At most one a second bounds both.
RELEASE_INTERVAL_S = 1.0
_last_release = float("-inf")


@functools.cache  # find_library runs ldconfig: once a process, not once a step
def _glibc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name``, or None where the C library is not glibc."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def map_large_blocks() -> bool:
    """Fix this process's mmap threshold at ``MMAP_THRESHOLD`` (which also stops its rise);
    False where the C library is not glibc (nothing changed)."""
    mallopt = _glibc_function("mallopt")
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``); whether any went
    back (False where the C library is not glibc). Called after the backward pass, before the
    optimizer step: the activations are freed by then, and the step's own temporaries come on
    top of what stays resident. Blocks below ``MMAP_THRESHOLD`` come from the heap's arenas, and
    what a step frees there stays resident: SmolLM2's SFT crept up ~6 MB a step without it, flat
    with it; RL's trainer held 6.5 GiB between steps without it, 2.5 with it
    (docs/experiments/2026-12-07-training-memory.md); trimmed before the step rather than after
    it, SFT's peak went from 2.90 to 2.79 GiB (2026-12-07-heap-before-the-step.md). At most once
    every ``RELEASE_INTERVAL_S``."""
    global _last_release
    now = time.monotonic()
    if now - _last_release < RELEASE_INTERVAL_S:
        return False
    _last_release = now
    malloc_trim = _glibc_function("malloc_trim")
    return malloc_trim is not None and bool(malloc_trim(0))
