"""What an RL run holds from its start to its end (``RLRun``) and how it is opened
(``open_run``): the corpus's train questions, the policy behind its engine (the optimiser's) and
its sampler (the generation backend), the KL reference, the reward recipe and the environments.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from progress_sql import envs, rewards
from progress_sql.corpus.records import CorpusLayout, Example
from progress_sql.envs.db_details import SchemaTexts
from progress_sql.inference.backends import GenerationBackend, backend_class, make_backend, resolved_generation
from progress_sql.inference.models import load_policy
from progress_sql.inference.policy import ChatModel
from progress_sql.params import Settings
from progress_sql.train.distributed import Engine, make_engine, process_environment, rank, use_deepspeed, world_size
from progress_sql.train.lora import refuse_a_tied_head_its_sampler_drops, with_lora
from progress_sql.train.memory import map_large_blocks
from progress_sql.train.packing import use_packed_attention
from progress_sql.train.question_scores import train_questions
from progress_sql.train.resume import run_fingerprint
from progress_sql.train.trajectories import max_sequence_tokens


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout so that sampling (eval mode) and training (train mode) agree."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if isinstance(getattr(model.config, name, None), float):
            setattr(model.config, name, 0.0)


def env_factory_for(settings: Settings, recipe: rewards.Recipe, schema: SchemaTexts) -> Callable[[], envs.Env]:
    """Fresh ``rl.env`` environments speaking ``recipe``'s output format (a mismatch is refused)."""
    env_cls = envs.get(settings.rl.env)
    if recipe.fmt not in env_cls.formats:
        raise ValueError(f"rl.recipe {recipe.name!r} scores {recipe.fmt} outputs but rl.env {settings.rl.env!r} "
                         f"prompts for {', '.join(env_cls.formats)}; pick a matching pair")
    return lambda: env_cls(settings, fmt=recipe.fmt, schema_texts=schema)


@dataclass
class RLRun:
    """What a run holds from its start to its end: the settings, the corpus, the policy behind
    its engine and sampler, the reward and the environments (``open_run``)."""

    settings: Settings
    out: Path
    layout: CorpusLayout
    train: list[Example]  # the train questions of rl.hardness (rl.questions may keep fewer: rl_questions)
    fingerprint: dict[str, Any]
    engine: Engine
    backend: GenerationBackend  # the sampler, holding the policy's current weights
    chat: ChatModel
    reference: torch.nn.Module | None  # the frozen starting policy of the KL term (rl.kl_beta > 0, no LoRA)
    recipe: rewards.Recipe
    judge: Any  # Reasoning-SQL's LLM judge, or None
    env_factory: Callable[[], envs.Env]
    max_turns: int
    max_tokens: int  # the length limit of a trajectory

    @property
    def is_rank0(self) -> bool:
        """Whether this process is rank 0, which alone writes the run's files and reports."""
        return rank() == 0


def open_run(settings: Settings, layout: CorpusLayout, out: Path, resources: contextlib.ExitStack) -> RLRun:
    """Load the policy behind its engine and sampler; what it opens goes on ``resources``."""
    rl, gen = settings.rl, settings.generation
    train = train_questions(settings, layout)
    fingerprint = run_fingerprint(settings, layout)
    deepspeed = use_deepspeed(rl.deepspeed)
    resources.enter_context(process_environment(deepspeed))  # left until the engine has closed
    if not deepspeed and world_size() > 1:
        raise ValueError("several processes train together only through DeepSpeed: "
                         "set rl.deepspeed to auto or always")
    seed_everything(rl.seed)
    map_large_blocks()  # freed activations leave the process (train.memory), as in SFT
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
    model, tokenizer = load_policy(rl.init_from, dtype="float32", device=device)  # fp32 master weights
    # generation.backend auto resolved once for this policy: the run and its rollout producer agree
    gen = resolved_generation(gen, model, rl.init_from)
    settings = settings.model_copy(update={"generation": gen})
    if rl.packing:
        use_packed_attention(model)
    reference = None
    if rl.lora.enabled:  # the base frozen, the adapters trained; the reference is the adapters off
        if rl.async_.enabled:
            refuse_a_tied_head_its_sampler_drops(model, rl.lora, sampler="the rollout producer of rl.async",
                                                 remedy="set rl.async.enabled: false")
        if backend_class(gen.backend).own_weights:
            refuse_a_tied_head_its_sampler_drops(model, rl.lora, sampler=f"the {gen.backend} backend",
                                                 remedy="generate with the transformers backend")
        model = with_lora(model, rl.lora)
    elif rl.kl_beta > 0:  # a frozen copy of the starting policy; β = 0 keeps none
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            reference = reference.to(torch.bfloat16)
    disable_dropout(model)
    recipe = rewards.get(rl.recipe)
    # Reasoning-SQL's LLM judge, when its judge_backend names one (None: off, weight redistributed)
    judge = rewards.make_judge(recipe.settings_of(settings).weights) if recipe.uses_judge else None
    env_factory = env_factory_for(settings, recipe, SchemaTexts.for_corpus(layout, settings.env.prompt_style))
    max_turns = env_factory().max_turns
    grad_accum = math.ceil(rl.questions_per_step * rl.group_size / rl.micro_batch_size)
    engine = make_engine(model, rl, deepspeed=deepspeed, total_updates=rl.steps * rl.updates_per_batch,
                         grad_accum=grad_accum)
    resources.callback(engine.close)
    # rl.async: the rollout producer samples with generation.backend in its own process; the
    # trainer's sampler (the rl.questions solved pass) is the transformers backend over its own
    # module, which costs nothing (no second vLLM engine)
    own = gen.model_copy(update={"backend": "transformers"}) if rl.async_.enabled else gen
    backend = make_backend(own, engine.module, tokenizer, rl.init_from, seed=settings.seed)
    resources.callback(backend.close)
    return RLRun(settings, out, layout, train, fingerprint, engine, backend,
                 ChatModel(rl.init_from, backend, tokenizer, own), reference, recipe, judge, env_factory,
                 max_turns, max_sequence_tokens(gen, max_turns))
