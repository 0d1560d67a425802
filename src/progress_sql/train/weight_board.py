"""The trainer's newest weights in shared memory, for a sampler in another process (``rl.async``'s
rollout producer, ``train.rollout_producer``).

The trainer copies its parameters onto the board after each update, under a lock, and raises the
version; a reader takes the lock to load them, so it never sees half a copy. A reader killed
while it held the lock never lets go: the trainer waits for it in slices of ``POLL_S`` and asks
whether the reader is alive between them.
"""

from __future__ import annotations

import time
from typing import Any

import torch

POLL_S = 0.5  # how often a wait looks at the other side (an exit, a stop)


class WeightBoard:
    """The trainer's newest weights in shared memory: ``tensors`` (plain parameter names, fp32 on
    the CPU), ``version`` (optimizer steps they have taken; -1 before the first publish) and the
    lock that keeps a reader from seeing half a copy."""

    def __init__(self, weights: dict[str, torch.Tensor], ctx: Any) -> None:
        self.tensors = {name: t.detach().to("cpu", torch.float32).clone().share_memory_() for name, t in weights.items()}
        self.version = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()

    def publish(self, weights: dict[str, torch.Tensor], version: int, alive: Any = None, timeout_s: float = 0.0
                ) -> None:
        """Copy ``weights`` in as ``version``. With ``alive`` (a callable raising when the reader
        is gone) the lock is waited for in slices: a reader killed while it held it never lets go."""
        deadline = time.monotonic() + timeout_s
        while not self.lock.acquire(timeout=POLL_S):
            if alive is not None:
                alive(deadline)
        try:
            with torch.no_grad():
                for name, tensor in self.tensors.items():
                    tensor.copy_(weights[name])
            self.version.value = version
        finally:
            self.lock.release()
