"""What evaluation generates with: a policy model (``inference.ChatModel``) or the oracle.

A ``Generator`` completes requests (``envs.Request``: a conversation and its output format):
``complete(requests, n=..., temperature=...)`` gives ``n`` outputs per request, each with
``.text``, ``.n_tokens`` and ``.finish_reason``. Two kinds:

- ``inference.ChatModel``: a model behind a generation backend, the adapter training uses.
- ``OracleGenerator``: answers every request with its example's gold SQL in the format's tags.
  It is the upper bound of the metrics path: EX and TS must be 1.0 on every split (a lower
  value points at the gold data, e.g. a gold query that errors or returns more rows than
  ``sandbox.max_rows``). ``--model oracle`` on the command line.

``RequestPolicy`` adapts a generator to the environments' ``Policy`` protocol (greedy, one
output per request) for the multi-turn protocol, counting each episode's generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from progress_sql.params import Settings
from progress_sql.corpus.records import Example
from progress_sql.envs.base import Request, episode_of
from progress_sql.formats import FormatName, answer_text

ORACLE = "oracle"
_ORACLE_REASONING = "The reference query."



class Generator(Protocol):
    name: str

    def complete(
        self, requests: Sequence[Request], *, n: int, temperature: float, top_p: float, seed: int | None
    ) -> list[list[Any]]: ...

    def close(self) -> None:
        """Release what generating holds (a model's engine); called by whoever made it."""
        ...


@dataclass(frozen=True)
class Completion:
    """One output of a generator that is not a model (the oracle, test doubles): ``text``,
    ``n_tokens`` (whitespace-separated words for the oracle), ``finish_reason``."""

    text: str
    n_tokens: int
    finish_reason: str


def oracle_answer(example: Example, fmt: FormatName) -> str:
    """The gold SQL of ``example`` as a well-formed output in format ``fmt`` (``trail``: the
    final ``<solution>`` at once)."""
    reasoning = " ".join(example.reasoning.split()) or _ORACLE_REASONING
    if "<" in reasoning:  # a tag-like character would break the format check
        reasoning = _ORACLE_REASONING
    return answer_text(fmt, reasoning, example.gold_sql)


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

    def close(self) -> None:
        """Nothing to release."""


def make_generator(model: str, settings: Settings) -> Generator:
    """``oracle``, or a policy (a model folder, a hub id or a bundled model's name)."""
    if model == ORACLE:
        return OracleGenerator()
    from progress_sql.inference.policy import ChatModel  # torch only when a model is used

    return ChatModel.load(model, settings.generation, dtype=settings.model.dtype, seed=settings.seed)


class RequestPolicy:
    """The environments' ``Policy`` over a generator: greedy, one output per request (which
    carries its example, for the oracle). ``tokens[episode_id]``: the tokens generated for
    each episode so far."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.tokens: dict[int, int] = {}

    def generate(self, requests: list[Request]) -> list[Any]:
        """The next assistant output of every request's conversation."""
        outputs = [row[0] for row in self.generator.complete(requests, n=1, temperature=0.0, top_p=1.0, seed=None)]
        for request, output in zip(requests, outputs):
            episode = episode_of(request, "RequestPolicy")
            self.tokens[episode] = self.tokens.get(episode, 0) + int(getattr(output, "n_tokens", 0))
        return outputs
