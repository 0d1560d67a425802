"""Code that runs inside vLLM's engine processes: the weight loader the trainer calls.

vLLM imports this module in each worker (``backends.vllm`` names it as ``worker_extension_cls``)
before it loads the model. On CPU, vLLM repacks every linear layer's weight into a
kernel-private buffer (oneDNN / SGL) captured by a closure, and drops the weight tensor, so
weights loaded later never reach the kernel. Here the CPU workers keep each weight tensor
beside its packed copy and remember the layer; after ``load_weights`` writes the new values
into the kept tensors, the layers are repacked with vLLM's own dispatch. GPU workers are left
as they are.
"""

from __future__ import annotations

import torch
from vllm.platforms import current_platform

_PACKED_LAYERS: list[torch.nn.Module] = []  # CPU: the layers whose weights vLLM packed, to repack after a load

if current_platform.is_cpu():
    import vllm.model_executor.layers.utils as _layer_utils

    _vllm_dispatch = _layer_utils.dispatch_cpu_unquantized_gemm

    def _dispatch_keeping_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
        _vllm_dispatch(layer, remove_weight=False)  # the weight stays loadable; memory: one more copy
        _PACKED_LAYERS.append(layer)

    _layer_utils.dispatch_cpu_unquantized_gemm = _dispatch_keeping_weights


class VLLMWeightLoader:
    """Mixed into vLLM's worker: loads weights that the trainer wrote to a safetensors file (on
    /dev/shm: memory, not disk) into the running model. A file, not the RPC message: vLLM's RPC
    pickles nothing unless told to (VLLM_ALLOW_INSECURE_SERIALIZATION)."""

    def progress_sql_load_weights(self, path: str) -> int:
        from safetensors.torch import load_file  # noqa: PLC0415

        weights = load_file(path)
        self.model_runner.get_model().load_weights(weights.items())  # type: ignore[attr-defined]
        with torch.no_grad():
            for layer in _PACKED_LAYERS:  # the packed copies still hold the old values
                _vllm_dispatch(layer, remove_weight=False)
        return len(weights)
