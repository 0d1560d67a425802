"""The one policy adapter: a model behind a generation backend, speaking chat messages.

``ChatModel`` (backend + tokenizer + generation settings) is what rollouts, evaluation, SFT
checks and serving generate with:

- ``complete(requests, n=...)``: ``n`` samples of each conversation (greedy at temperature 0),
  a prompt over ``generation.max_prompt_tokens`` answered by an empty ``prompt_too_long``
  sample; evaluation's Vote@k and pass@k and ``progress-sql ask`` use it.
- ``policy(...)``: a ``TokenPolicy``, the ``envs.Policy`` that ``envs.rollout`` drives, which
  keeps every conversation's exact token sequence (the trainer trains on it; evaluation's
  multi-turn protocol reads only the texts).

The environments speak messages; the trainer needs the token ids the model saw and sampled.
``TokenPolicy`` keeps one token record per conversation and only ever *appends* to it:

    round 1    chat_prompt_ids(system, user) + generation prompt        mask 0
    turn t     the sampled ids, exactly as sampled (eos included)        mask 1
    turn t+1   end-of-turn tokens the sample lacks, the environment's    mask 0
               new messages (feedback / observation), generation prompt

Assistant text is never re-tokenised. The tokens of the new environment messages come from
the chat template rendered around a fixed dummy conversation (``TemplateDeltas``): the text
the template adds after a finished assistant turn, tokenised on its own. It starts and ends
at special tokens for ChatML, Llama-3 and the like, so its tokens are the ones a full render
would give (a test checks this prefix property for the tiny tokenizer's ChatML template).

End of turn: a sample that stopped at the eos token already holds ``<|im_end|>`` (sampled,
mask 1: the model is trained to stop); one that stopped at a stop string or the length limit
gets the template's end-of-turn tokens appended with mask 0 (not sampled, so not trained).

Records are kept by episode: each request carries its ``episode_id`` (``envs.rollout`` gives
one per episode), and ``TokenPolicy.record(episode_id)`` is that episode's record, which
``envs.rollout`` hands the episode (``Episode.tokens``: the trainer reads it there). A
request's messages must continue its record's conversation (the reply the policy gave, then
the environment's new messages), or it is an error.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from progress_sql.envs.base import PROMPT_TOO_LONG, Request, episode_of
from progress_sql.envs.prompts import Message
from progress_sql.formats import FormatName, stop_strings
from progress_sql.inference.backends import GenerationBackend, Sample, make_backend
from progress_sql.inference.models import BUNDLED_MODELS, chat_prompt_ids, load_policy
from progress_sql.inference.settings import GenerationSettings


# ----------------------------------------------------------------------------- template deltas
_DUMMY = "\u2060PROGRESS_SQL_DUMMY_{}\u2060"  # word joiners: text no template or message contains


class TemplateDeltas:
    """Token ids the chat template adds around a finished assistant turn.

    ``eot``: after the assistant's content (ChatML: ``<|im_end|>\\n``); ``continuation(msgs)``:
    the new user/tool messages plus the generation prompt that follow ``eot``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._prefix = [
            {"role": "system", "content": _DUMMY.format("S")},
            {"role": "user", "content": _DUMMY.format("U")},
            {"role": "assistant", "content": _DUMMY.format("A")},
        ]
        text = self._render(self._prefix, add_generation_prompt=False)
        marker = _DUMMY.format("A")
        if marker not in text:
            raise ValueError("the chat template does not render assistant content verbatim")
        self._prefix_text = text
        self.eot = self._encode(text[text.rindex(marker) + len(marker):])

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def continuation(self, messages: Sequence[Message]) -> list[int]:
        """Tokens of ``messages`` (the environment's reply) and the generation prompt."""
        full = self._render(self._prefix + [dict(m) for m in messages], add_generation_prompt=True)
        if not full.startswith(self._prefix_text):
            raise ValueError("the chat template renders earlier turns differently once new messages follow; "
                             "token-exact multi-turn rollouts need a template that only appends")
        return self._encode(full[len(self._prefix_text):])

    def missing_eot(self, sampled: Sequence[int]) -> list[int]:
        """The end-of-turn tokens not already at the end of ``sampled`` (a sampled eos counts)."""
        for k in range(min(len(self.eot), len(sampled)), 0, -1):
            if list(sampled[-k:]) == self.eot[:k]:
                return self.eot[k:]
        return list(self.eot)


# ----------------------------------------------------------------------------- records
@dataclass
class ConversationTokens:
    """One conversation's token record: ``input_ids``, ``loss_mask`` (1 = sampled by the
    policy) and ``logprobs`` (the sampler's, at mask-1 positions; 0.0 elsewhere);
    ``samples``: the sampled turns in order; ``n_messages``: how many messages of the
    conversation the record holds (its last sampled reply included)."""

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    n_messages: int = 0

    @property
    def turns(self) -> int:
        return len(self.samples)

    def extend(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        ids = [int(i) for i in ids]
        self.input_ids += ids
        self.loss_mask += [mask] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)


# ----------------------------------------------------------------------------- the policy
class TokenPolicy:
    """The ``envs.Policy`` of training rollouts: samples with ``backend`` and keeps token records.

    ``gen``: temperature, top-p, max_new_tokens; ``stop``: stop strings; ``max_tokens``: a
    conversation never grows past it (a turn's budget is what is left, an empty output when
    nothing is); ``max_prompt_tokens``: a conversation longer than this is not generated from
    (an empty ``prompt_too_long`` output; None: no such limit); ``seed``: every generate call is
    seeded from (seed, call number), so the same seed replays the same rollouts. One instance
    serves one ``envs.rollout`` call; ``record(episode_id)`` is each episode's tokens (an
    ``envs.TokenRecorder``: the rollout hands them to its episodes).
    """

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer: Any,
        gen: GenerationSettings,
        stop: Sequence[str] = (),
        *,
        max_tokens: int | None = None,
        max_prompt_tokens: int | None = None,
        seed: int = 0,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.gen = gen
        self.stop = tuple(stop)
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.seed = int(seed)
        self.deltas = TemplateDeltas(tokenizer)
        self.calls = 0
        self.generate_s = 0.0  # wall-clock spent in the backend's generate (the rest is the environment's)
        self._records: dict[int, ConversationTokens] = {}

    def record(self, episode_id: int) -> ConversationTokens | None:
        """The token record of episode ``episode_id`` (None: nothing generated for it)."""
        return self._records.get(episode_id)

    def _record_for(self, request: Request) -> ConversationTokens:
        """The record of the request's episode, extended by the messages it adds."""
        episode, messages = episode_of(request, "TokenPolicy"), request.messages
        conv = self._records.get(episode)
        if conv is None:
            if any(m["role"] == "assistant" for m in messages):
                raise ValueError(f"TokenPolicy: episode {episode} is new but its conversation has assistant turns")
            conv = self._records[episode] = ConversationTokens()
            conv.extend(chat_prompt_ids(self.tokenizer, messages, add_generation_prompt=True), 0)
            return conv
        seen = conv.n_messages
        reply = {"role": "assistant", "content": conv.samples[-1].text}
        if len(messages) < seen or dict(messages[seen - 1]) != reply:
            raise ValueError(f"TokenPolicy: episode {episode}'s conversation does not continue the one it "
                             "generated for (its history was changed)")
        if len(messages) == seen:
            raise ValueError(f"TokenPolicy: episode {episode}'s conversation ends with its reply; nothing to answer")
        conv.extend(self.deltas.missing_eot(conv.samples[-1].token_ids), 0)
        conv.extend(self.deltas.continuation(messages[seen:]), 0)
        return conv

    def _budget(self, conv: ConversationTokens) -> int:
        if self.max_tokens is None:
            return self.gen.max_new_tokens
        return max(0, min(self.gen.max_new_tokens, self.max_tokens - len(conv.input_ids)))

    def call_seed(self, call: int, budget: int) -> int:
        """The seed of one backend call: a function of (seed, call number, budget) only."""
        return int(np.random.SeedSequence([self.seed, call, budget]).generate_state(1)[0])

    def generate(self, requests: list[Request]) -> list[Sample]:
        """One sampled turn per request, in order (each also appended to its episode's record)."""
        convs = [self._record_for(request) for request in requests]
        call = self.calls
        self.calls += 1
        samples: list[Sample | None] = [None] * len(convs)
        by_budget: dict[int, list[int]] = defaultdict(list)
        for i, conv in enumerate(convs):
            if self.max_prompt_tokens is not None and len(conv.input_ids) > self.max_prompt_tokens:
                samples[i] = Sample(list(conv.input_ids), [], "", [], PROMPT_TOO_LONG)
                continue
            by_budget[self._budget(conv)].append(i)
        for budget, rows in sorted(by_budget.items()):
            if budget == 0:  # no room left: an empty turn (the environment scores it as wrong)
                for i in rows:
                    samples[i] = Sample(list(convs[i].input_ids), [], "", [], "length")
                continue
            started = time.perf_counter()
            outs = self.backend.generate(
                [convs[i].input_ids for i in rows], n=1, temperature=self.gen.temperature,
                top_p=self.gen.top_p, max_new_tokens=budget, stop=self.stop, seed=self.call_seed(call, budget),
            )
            self.generate_s += time.perf_counter() - started
            for i, out in zip(rows, outs):
                samples[i] = out[0]
        outputs = []
        for request, conv, sample in zip(requests, convs, samples):
            assert sample is not None
            if len(sample.logprobs) != len(sample.token_ids):
                raise ValueError(f"the backend gave {len(sample.logprobs)} logprobs for {len(sample.token_ids)} tokens")
            conv.extend(sample.token_ids, 1, sample.logprobs)
            conv.samples.append(sample)
            conv.n_messages = len(request.messages) + 1
            outputs.append(sample)
        return outputs


# ----------------------------------------------------------------------------- the adapter
class ChatModel:
    """A policy model behind a generation backend: the one adapter every caller generates with.

    ``name``: how reports call it (its folder or hub id); ``generation``: max_new_tokens,
    max_prompt_tokens, temperature and top-p of rollouts (``policy`` overrides the last two).
    """

    def __init__(self, name: str, backend: GenerationBackend, tokenizer: Any, generation: GenerationSettings) -> None:
        self.name = name
        self.backend = backend
        self.tokenizer = tokenizer
        self.generation = generation

    @classmethod
    def load(cls, name: str | os.PathLike, generation: GenerationSettings, *, dtype: str = "auto",
             seed: int = 0) -> "ChatModel":
        """The policy ``name`` (a model folder, a hub id or a bundled model's name) in ``dtype``,
        behind the backend ``generation.backend`` names."""
        name = str(name)
        model, tokenizer = load_policy(name, dtype=dtype)
        path = None if name in BUNDLED_MODELS else name  # vLLM loads a folder or hub id itself
        return cls(name, make_backend(generation, model, tokenizer, path, seed=seed), tokenizer, generation)

    def close(self) -> None:
        """Release the backend (vLLM's engine process and its shared-memory folder): a loaded
        model is closed by whoever loaded it, here or by ``with``, or vLLM's exit hook kills the
        engine mid-way and leaves the folder behind."""
        self.backend.close()

    def __enter__(self) -> "ChatModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(
        self, requests: Sequence[Request], *, n: int, temperature: float, top_p: float, seed: int | None
    ) -> list[list[Sample]]:
        """``n`` samples of each request's conversation (temperature 0: greedy), stopped at its
        format's stop strings; a prompt over ``max_prompt_tokens`` gets ``n`` empty samples
        with finish reason ``prompt_too_long`` (scored as wrong, counted in reports)."""
        prompts = [chat_prompt_ids(self.tokenizer, r.messages) for r in requests]
        out = [[Sample(p, [], "", [], PROMPT_TOO_LONG)] * n for p in prompts]
        fits = [i for i, p in enumerate(prompts) if len(p) <= self.generation.max_prompt_tokens]
        stop = sorted({s for r in requests for s in stop_strings(r.fmt)})
        if fits:
            samples = self.backend.generate(
                [prompts[i] for i in fits], n=n, temperature=temperature, top_p=top_p,
                max_new_tokens=self.generation.max_new_tokens, stop=stop, seed=seed,
            )
            for i, row in zip(fits, samples):
                out[i] = row
        return out

    def policy(
        self,
        fmt: FormatName,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        limit_prompt: bool = False,
        seed: int = 0,
    ) -> TokenPolicy:
        """A ``TokenPolicy`` for one ``envs.rollout`` of an environment in format ``fmt``:
        ``generation``'s sampling unless ``temperature`` / ``top_p`` are given (0: greedy);
        ``limit_prompt``: conversations over ``max_prompt_tokens`` get an empty output."""
        gen = self.generation
        updates = {k: v for k, v in (("temperature", temperature), ("top_p", top_p)) if v is not None}
        if updates:
            gen = gen.model_copy(update=updates)
        return TokenPolicy(self.backend, self.tokenizer, gen, stop_strings(fmt), max_tokens=max_tokens,
                           max_prompt_tokens=gen.max_prompt_tokens if limit_prompt else None, seed=seed)
