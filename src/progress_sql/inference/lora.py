"""A policy with LoRA adapters, as inference sees it: whether a model holds adapters, the model
under them, and the weights of the function it computes (adapters merged) under the plain
model's names, which a sampler loads (the vLLM backend's weight sync, the asynchronous
producer's shared weights). Training adapters is ``train.lora``'s."""

from __future__ import annotations

from typing import Any

import torch


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model holding adapters."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def base_model(model: Any) -> Any:
    """The model a peft wrapper holds (its config, its forward), or ``model`` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def merged_weights(model: Any) -> dict[str, torch.Tensor]:
    """``model``'s parameters on the CPU under the plain model's names (those a ``save_pretrained``
    of the base model writes, and vLLM's ``load_weights`` takes); a LoRA model's adapters merged
    into copies of the weights they adapt (base + scale·B·A, computed aside: the policy itself is
    never merged and unmerged, which would move its frozen weights by rounding at every sync).
    Under ZeRO-3 call it with the full parameters in place (``engine.gathered()``): a partitioned
    parameter holds only this rank's share."""
    if any(hasattr(p, "ds_id") and p.numel() != p.ds_numel for p in model.parameters()):
        raise RuntimeError("ZeRO-3 parameters are partitioned: sync the weights inside engine.gathered()")
    lora = is_lora(model)

    def plain(name: str) -> str:
        return name.removeprefix("base_model.model.").replace(".base_layer", "").replace("modules_to_save.default.", "")

    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if lora and (model.prefix in name or "original_module" in name):
            continue  # the adapters themselves: the plain model has no such parameters
        out[plain(name)] = param.detach().to("cpu").contiguous().clone()
    if lora:
        with torch.no_grad():
            for name, module in model.named_modules():
                if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
                    key = plain(name) + ".weight"
                    delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                    out[key] = (out[key] + delta.to("cpu", out[key].dtype)).contiguous()
    return out
