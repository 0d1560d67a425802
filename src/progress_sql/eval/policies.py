"""What evaluation generates with: a model behind a generation backend, or the oracle.

A ``Generator`` completes chat conversations: ``complete(requests, n=..., temperature=...)``
gives ``n`` completions per request. Two kinds:

- ``ModelGenerator``: a transformers policy (or vLLM) through ``train.generation``; the
  conversation is rendered with the tokenizer's chat template, exactly as in training.
- ``OracleGenerator``: answers every request with its example's gold SQL in the output format's
  tags. It is the upper bound of the metrics path: EX and TS must be 1.0 on every split (a
  lower value points at the gold data, e.g. a gold query that errors or returns more rows
  than ``sandbox.max_rows``). ``--model oracle`` on the command line.

``RolloutPolicy`` adapts a generator to the environments' ``Policy`` protocol (greedy, one
output per conversation) for the multi-turn protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from progress_sql.config import GenerationSettings
from progress_sql.data.records import Example
from progress_sql.envs.prompts import Message
from progress_sql.rewards.formats import FormatName

ORACLE = "oracle"

# The closing tag of each format's answer blocks: generation stops there (the rest is ignored
# by parse_output anyway, and an early stop saves most of max_new_tokens).
STOP_STRINGS: dict[str, tuple[str, ...]] = {
    "think_sql": ("</sql>",),
    "reasoning_answer": ("</answer>",),
    "trail": ("</sql>", "</solution>"),
}

PROMPT_TOO_LONG = "prompt_too_long"


@dataclass(frozen=True)
class Request:
    """One conversation to continue, the example it is about (only the oracle reads it) and
    the output format its prompt asks for."""

    example: Example
    messages: list[Message]
    fmt: FormatName


@dataclass(frozen=True)
class Completion:
    """One generated output: ``text`` (what the environments parse), ``n_tokens`` (its length
    in model tokens; whitespace-separated words for the oracle), ``finish_reason``."""

    text: str
    n_tokens: int
    finish_reason: str


class Generator(Protocol):
    name: str

    def complete(
        self, requests: Sequence[Request], *, n: int, temperature: float, top_p: float, seed: int | None
    ) -> list[list[Completion]]: ...


class ModelGenerator:
    """A policy model behind a generation backend (``train.generation``).

    A prompt longer than ``generation.max_prompt_tokens`` is not generated: its completions
    are empty with finish reason ``prompt_too_long`` (scored as wrong, counted in the report).
    """

    def __init__(self, name: str, backend: Any, tokenizer: Any, generation: GenerationSettings) -> None:
        self.name = name
        self.backend = backend
        self.tokenizer = tokenizer
        self.generation = generation

    def complete(
        self, requests: Sequence[Request], *, n: int, temperature: float, top_p: float, seed: int | None
    ) -> list[list[Completion]]:
        """``n`` completions per request (temperature 0: greedy)."""
        from progress_sql.train.policy import chat_prompt_ids  # torch only when a model is used

        prompts = [chat_prompt_ids(self.tokenizer, r.messages) for r in requests]
        fits = [i for i, p in enumerate(prompts) if len(p) <= self.generation.max_prompt_tokens]
        out: list[list[Completion]] = [[Completion("", 0, PROMPT_TOO_LONG)] * n for _ in requests]
        stop = sorted({s for r in requests for s in STOP_STRINGS[r.fmt]})
        if fits:
            samples = self.backend.generate(
                [prompts[i] for i in fits], n=n, temperature=temperature, top_p=top_p,
                max_new_tokens=self.generation.max_new_tokens, stop=stop, seed=seed,
            )
            for i, row in zip(fits, samples):
                out[i] = [Completion(s.text, len(s.token_ids), s.finish_reason) for s in row]
        return out


_ORACLE_ANSWER = {
    "think_sql": "<think>{reasoning}</think>\n<sql>{sql}</sql>",
    "reasoning_answer": "<reasoning>{reasoning}</reasoning>\n<answer>{sql}</answer>",
    "trail": "<think>{reasoning}</think>\n<solution>{sql}</solution>",
}
_ORACLE_REASONING = "The reference query."


def oracle_answer(example: Example, fmt: FormatName) -> str:
    """The gold SQL of ``example`` as a well-formed output in format ``fmt`` (``trail``: the
    final ``<solution>`` at once)."""
    reasoning = " ".join(example.reasoning.split()) or _ORACLE_REASONING
    if "<" in reasoning:  # a tag-like character would break the format check
        reasoning = _ORACLE_REASONING
    return _ORACLE_ANSWER[fmt].format(reasoning=reasoning, sql=example.gold_sql.strip())


class OracleGenerator:
    """Returns the gold SQL in the request's format for every request, n times."""

    name = ORACLE

    def complete(
        self, requests: Sequence[Request], *, n: int, temperature: float, top_p: float, seed: int | None
    ) -> list[list[Completion]]:
        """``n`` copies of each request's gold answer."""
        out = []
        for r in requests:
            text = oracle_answer(r.example, r.fmt)
            out.append([Completion(text, len(text.split()), "stop")] * n)
        return out


def first_user_message(messages: Sequence[Message]) -> str:
    """The round-1 user prompt of a conversation: it identifies the example."""
    return next((m["content"] for m in messages if m.get("role") == "user"), "")


class RolloutPolicy:
    """The environments' ``Policy`` over a generator: greedy, one completion per conversation.

    ``examples`` maps each round-1 user prompt to its example (two examples with the same
    prompt have the same inputs, so either one answers for both); ``fmt`` is the environment's
    output format.
    """

    def __init__(self, generator: Generator, examples: dict[str, Example], fmt: FormatName) -> None:
        self.generator = generator
        self.examples = examples
        self.fmt = fmt

    def generate(self, messages_batch: list[list[Message]]) -> list[Completion]:
        """The next assistant output of every conversation."""
        requests = []
        for messages in messages_batch:
            key = first_user_message(messages)
            if key not in self.examples:
                raise KeyError("RolloutPolicy: a conversation whose first user message matches no example")
            requests.append(Request(self.examples[key], messages, self.fmt))
        return [row[0] for row in self.generator.complete(requests, n=1, temperature=0.0, top_p=1.0, seed=None)]
