"""The resident memory of a training process: glibc's heap against tensors of changing shapes.

glibc serves an allocation below its mmap threshold from its heap, and raises that threshold
(up to 32 MiB) each time a larger mapped block is freed. A training step allocates and frees
activations of every size, their shapes changing with each batch: freed heap blocks stay
resident and fragment, and the process grows to several times what is live (SmolLM2's SFT step:
0.65 GB more at its peak than with the threshold fixed, which leaves 0.2 GB; bench/bench_cores.py).
With the threshold fixed at ``MMAP_THRESHOLD`` every block that large is a mapping of its own,
given back to the system when the tensor is freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# Blocks of 1 MiB and more get their own mapping: a SmolLM2 activation of one token row is 1.1 KB
# (576 bf16 values), of a batch megabytes; below this, the heap (fast, and what Python objects use).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def map_large_blocks() -> bool:
    """Fix this process's mmap threshold at ``MMAP_THRESHOLD`` (which also stops its rise);
    False where the C library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
