"""Inference: model loading, the generation backends (transformers, vLLM) and the one policy
adapter, ``ChatModel``, that rollouts, evaluation, SFT checks and serving generate with.

>>> from progress_sql.envs import Request
>>> from progress_sql.inference import ChatModel
>>> model = ChatModel.load("outputs/rl", settings.generation)              # doctest: +SKIP
>>> model.complete([Request(messages, "think_sql")], n=1, temperature=0.0,
...                top_p=1.0, seed=None)[0][0].text                         # doctest: +SKIP

Modules: ``models`` (loading), ``backends`` (sampling; one module per backend), ``policy``
(``ChatModel`` and the token-exact ``TokenPolicy`` of rollouts), ``ask`` (answering users'
questions), ``settings`` (params.yaml ``generation`` and the registry of backends;
torch-free). The names below are imported on first use, so ``import
progress_sql.inference.settings`` does not import torch; the task module below this package
(sql, odt, formats, rewards, envs) never does.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BackendUnavailable": "backends", "GenerationBackend": "backends", "NonFiniteLogits": "backends", "Sample": "backends",
    "TransformersBackend": "backends", "VLLMBackend": "backends", "make_backend": "backends",
    "BUNDLED_MODELS": "models", "PolicyLoadError": "models", "chat_prompt_ids": "models", "load_policy": "models",
    "PROMPT_TOO_LONG": "policy", "ChatModel": "policy", "TokenPolicy": "policy", "ConversationTokens": "policy",
    "GenerationSettings": "settings", "BACKENDS": "settings",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'progress_sql.inference' has no attribute {name!r}")
    return getattr(importlib.import_module(f"progress_sql.inference.{_EXPORTS[name]}"), name)
