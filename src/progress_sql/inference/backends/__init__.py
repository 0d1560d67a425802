"""Generation backends: sample continuations of tokenised prompts and keep the sampled ids.

One module per backend, each a ``GenerationBackend`` (``base``: the protocol, ``Sample`` and
the sampling contract every backend keeps: token-exact ids, raw log-probabilities, seeds,
stop strings):

- ``transformers``: ``TransformersBackend``, a KV-cached sampling loop over the training model
  itself; keeps a conversation's cache between its turns.
- ``vllm``: ``VLLMBackend``, a vLLM engine in its own processes (``vllm_worker`` runs there),
  the training model's weights loaded into it after each update.

The backend called ``name`` in ``inference.settings.BACKENDS`` (the torch-free list of names and
settings sections, ``generation.<name>``) is the module ``inference.backends.<name>``, which
declares its class in one line, ``BACKEND = <class>``; ``BACKEND_CLASSES`` reads them, so a new
backend is listed once. An optional dependency is imported by the class's ``create``.
``make_backend`` builds the one ``generation.backend`` names; ``auto`` is resolved here
(``resolved_backend``: the first of ``inference.settings.AUTO_ORDER`` whose class's
``unavailable`` finds nothing against the model, said once on stderr). Callers reach a backend
through the one policy adapter, ``inference.policy.ChatModel``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from progress_sql.inference.backends.base import (
    BackendUnavailable,
    FinishReason,
    GenerationBackend,
    NonFiniteLogits,
    Sample,
    StopChecker,
    completes_stop,
    decode,
    eos_token_ids,
    sample_text,
    stop_index,
)
from progress_sql.inference.backends.transformers import TransformersBackend, cache_kwarg
from progress_sql.inference.backends.vllm import VLLMBackend, VLLMEngineDied
from progress_sql.inference.settings import AUTO, AUTO_ORDER, BACKENDS, GenerationSettings

__all__ = [
    "BACKEND_CLASSES", "BackendUnavailable", "FinishReason", "GenerationBackend", "NonFiniteLogits", "Sample", "StopChecker",
    "TransformersBackend", "VLLMBackend", "VLLMEngineDied", "cache_kwarg", "completes_stop", "decode",
    "backend_class", "eos_token_ids", "make_backend", "resolved_backend", "resolved_generation", "sample_text",
    "stop_index",
]


def _declared_class(name: str) -> type[GenerationBackend]:
    """The ``BACKEND`` that the module of the backend called ``name`` declares."""
    return importlib.import_module(f"{__name__}.{name}").BACKEND


# The backends by class, under their names in inference.settings.BACKENDS.
BACKEND_CLASSES: dict[str, type[GenerationBackend]] = {name: _declared_class(name) for name in BACKENDS}


def backend_class(name: str) -> type[GenerationBackend]:
    """The class of the backend called ``name`` (``generation.backend``)."""
    return BACKEND_CLASSES[name]


_SAID: set[str] = set()  # the auto choices said on stderr so far (each once a process)


def resolved_backend(generation: GenerationSettings, model: Any = None,
                     model_path: str | os.PathLike | None = None) -> str:
    """The name of the backend ``generation.backend`` means for ``model`` (loaded from
    ``model_path``): itself, or for ``auto`` the first of ``AUTO_ORDER`` that can serve it here,
    with why the ones before cannot (said once)."""
    if generation.backend != AUTO:
        return generation.backend
    passed = []
    for name in AUTO_ORDER:
        reason = backend_class(name).unavailable(generation, model, model_path)
        if reason is None:
            line = f"generation.backend auto: {name}" + (f" ({'; '.join(passed)})" if passed else "")
            if line not in _SAID:
                _SAID.add(line)
                print(line, file=sys.stderr, flush=True)
            return name
        passed.append(f"{name}: {reason}")
    raise BackendUnavailable(f"generation.backend auto: no backend can serve this model ({'; '.join(passed)})")


def resolved_generation(generation: GenerationSettings, model: Any = None,
                        model_path: str | os.PathLike | None = None) -> GenerationSettings:
    """``generation`` with ``auto`` resolved (``resolved_backend``), for code that holds the
    settings beyond one backend (an RL run hands them to its rollout producer)."""
    name = resolved_backend(generation, model, model_path)
    return generation if name == generation.backend else generation.model_copy(update={"backend": name})


def make_backend(generation: GenerationSettings, model: Any, tokenizer: Any,
                 model_path: str | os.PathLike | None = None, *, seed: int = 0) -> GenerationBackend:
    """The backend ``generation.backend`` names (``auto`` resolved for ``model``), built by its
    class's ``create`` (the transformers backend generates with ``model`` itself; vLLM loads
    ``model_path`` into its own engine, seeded with ``seed``)."""
    generation = resolved_generation(generation, model, model_path)
    return backend_class(generation.backend).create(generation, model, tokenizer, model_path, seed=seed)
