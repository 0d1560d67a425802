"""Code that runs inside vLLM's engine processes: the weight loader the trainer calls.

vLLM imports this module in each worker (``worker_extension_cls``) before it loads the model.
On CPU, vLLM repacks every linear layer's weight into a kernel-private buffer captured by a
closure (oneDNN / SGL) and drops the weight tensor, so weights loaded later never reach the
kernel. Here the CPU workers keep plain weights and use ``torch.nn.functional.linear``
(vLLM's own fallback), so that ``load_weights`` after an RL update takes effect. GPU workers
are left as they are.
"""

from __future__ import annotations

import torch
from vllm.platforms import current_platform

if current_platform.is_cpu():
    import vllm.model_executor.layers.utils as _layer_utils

    def _plain_cpu_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear  # weights stay in layer.weight, loadable

    _layer_utils.dispatch_cpu_unquantized_gemm = _plain_cpu_linear


class VLLMWeightLoader:
    """Mixed into vLLM's worker: loads weights that the trainer wrote to a safetensors file (on
    /dev/shm: memory, not disk) into the running model. A file, not the RPC message: vLLM's RPC
    pickles nothing unless told to (VLLM_ALLOW_INSECURE_SERIALIZATION)."""

    def progress_sql_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file  # noqa: PLC0415

        weights = load_file(path)
        self.model_runner.get_model().load_weights(weights.items())  # type: ignore[attr-defined]
        return len(weights)
