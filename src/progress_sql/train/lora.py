"""LoRA adapters (peft) for SFT and RL, and saving a policy so that every later stage loads it as
a plain model.

With ``sft.lora`` / ``rl.lora`` the base weights stay frozen and only the adapters train (the
optimiser holds them alone); RL's KL reference is then the same model with its adapters
disabled (``adapters_disabled``), so no second copy of the weights is kept. ``save_policy``
writes the adapters to ``<out>/adapter`` and the merged model to ``<out>``: ``eval``, the MLflow
registry and vLLM load it like any other.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import torch

from progress_sql.inference.lora import is_lora
from progress_sql.params import LoRASettings

ADAPTER_DIR = "adapter"


def adapts_tied_head(model: Any, lora: LoRASettings) -> bool:
    """Whether ``lora.targets`` name the output head of a model whose head is its input embedding
    (``tie_word_embeddings``): an adapter there must not reach the embedding (``with_lora``)."""
    if lora.targets == "all-linear" or not getattr(model.config, "tie_word_embeddings", False):
        return False
    head = model.get_output_embeddings()
    names = [name for name, module in model.named_modules() if module is head]
    return any(name == t or name.endswith("." + t) for name in names for t in lora.targets)


def refuse_a_tied_head_its_sampler_drops(model: Any, lora: LoRASettings, *, sampler: str, remedy: str) -> None:
    """Refuse adapters on ``model``'s tied output head for a ``sampler`` (e.g. "the vllm backend")
    that loads the model from its folder, which holds the tied head: it would drop the head's
    adapter and sample from another policy than the one trained."""
    if adapts_tied_head(model, lora):
        raise ValueError(f"rl.lora.targets adapt the output head of a model whose head is tied to its input embedding: "
                         f"{sampler}, loading that model, would drop the head's adapter; {remedy} or leave the head "
                         "out of rl.lora.targets")


def with_lora(model: Any, lora: LoRASettings) -> Any:
    """``model`` wrapped with fresh LoRA adapters on ``lora.targets``; only they require grad. An
    adapted head that is tied to the input embedding is untied first (its own frozen copy of the
    same values, ``tie_word_embeddings`` off): the model computes the same function, and the
    adapter, merged, changes the head alone, as it was trained to."""
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415 - only the LoRA path needs peft

    if adapts_tied_head(model, lora):
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
        model.config.tie_word_embeddings = False
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.targets, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """The base model's function for the duration (the KL reference of LoRA RL)."""
    with model.disable_adapter():
        yield


def save_policy(model: Any, tokenizer: Any, out: Path) -> None:
    """``model`` as a ``save_pretrained`` folder with its tokenizer; a LoRA model's adapters go to
    ``out/adapter`` and are then merged into it (in place: call it when training is over)."""
    out = Path(out)
    if is_lora(model):
        model.save_pretrained(str(out / ADAPTER_DIR))
        model = model.merge_and_unload()
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
