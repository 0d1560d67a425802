"""LLM-as-a-judge for Reasoning-SQL: a partial score in [0, 1] for a wrong SQL.

Backends (``rewards.reasoning_sql.judge_backend``): ``off`` (no judge: the recipe
redistributes its weight), ``openai`` (any OpenAI-compatible chat-completions endpoint, called
with the standard library's urllib), ``local`` (any Python callable, e.g. a local model).
The paper's judge prompt (its Appendix A.3) did not survive in our copy; ``JUDGE_PROMPT`` is
ours, built on the criteria the paper names: logical consistency, structural similarity and
semantic correctness.
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.error
import urllib.request
from typing import Any, Callable

from progress_sql.rewards.types import Judge


class JudgeError(RuntimeError):
    """The judge could not produce a score (network, malformed reply, out-of-range value)."""


JUDGE_PROMPT = """You are grading a SQL query written for a question against a reference query.
The candidate's execution result does NOT match the reference. Grade how close it comes, from
0 (unrelated or nonsense) to 1 (equivalent in intent, minor slip), considering:
- logical consistency: does it follow the question's logic (filters, grouping, aggregation)?
- structural similarity: does it use the same tables, joins and clauses as the reference?
- semantic correctness: would it answer the question with small fixes?

Database schema:
{schema}

Question: {question}

Reference SQL:
{gold_sql}

Candidate SQL:
{pred_sql}

Reply with one line of the form "Score: <number between 0 and 1>"."""

# The last "score: x" in the reply (the model may reason first), else a bare number reply.
_SCORE_RE = re.compile(r"score\**\s*[:=]\s*\**\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"[-+]?\d+(?:\.\d+)?")


def check_score(value: float) -> float:
    """``value`` as a float when it is a finite number in [0, 1]; JudgeError otherwise."""
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise JudgeError(f"judge score {value!r} is not a number in [0, 1]")
    return float(value)


def parse_score(reply: str) -> float:
    """The score a judge reply states; JudgeError when it states none in [0, 1]."""
    matches = _SCORE_RE.findall(reply or "")
    if matches:
        return check_score(float(matches[-1]))
    bare = (reply or "").strip()
    if _NUMBER_RE.fullmatch(bare):
        return check_score(float(bare))
    raise JudgeError(f"no 'Score: x' in judge reply: {bare[:120]!r}")


def build_prompt(question: str, schema: str, pred_sql: str, gold_sql: str) -> str:
    """The judge's user message for one candidate."""
    return JUDGE_PROMPT.format(
        question=question or "(not given)", schema=schema or "(not given)", pred_sql=pred_sql, gold_sql=gold_sql
    )


class OpenAIJudge:
    """A judge behind an OpenAI-compatible ``/chat/completions`` endpoint (greedy decoding)."""

    def __init__(self, endpoint: str, model: str, timeout_s: float, api_key: str | None = None) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"judge endpoint must be an http(s) URL, got {endpoint!r}")
        if not model:
            raise ValueError("judge model name is empty (rewards.reasoning_sql.judge_model)")
        base = endpoint.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.api_key = api_key

    def score(self, question: str, schema: str, pred_sql: str, gold_sql: str) -> float:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": build_prompt(question, schema, pred_sql, gold_sql)}],
            "temperature": 0.0,  # greedy: the same candidate gets the same score
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as err:  # HTTPError, timeouts, bad JSON
            raise JudgeError(f"judge request to {self.url} failed: {err}") from None
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(f"judge reply has no choices[0].message.content: {str(payload)[:200]}") from None
        return parse_score(str(content))


class LocalJudge:
    """Wraps any callable ``fn(question, schema, pred_sql, gold_sql) -> float`` as a Judge."""

    def __init__(self, fn: Callable[[str, str, str, str], float]) -> None:
        if not callable(fn):
            raise TypeError("a local judge must be callable")
        self.fn = fn

    def score(self, question: str, schema: str, pred_sql: str, gold_sql: str) -> float:
        try:
            value = float(self.fn(question, schema, pred_sql, gold_sql))
        except (TypeError, ValueError) as err:
            raise JudgeError(f"local judge did not return a number: {err}") from None
        return check_score(value)


def make_judge(
    settings: Any,
    local: Callable[[str, str, str, str], float] | None = None,
) -> Judge | None:
    """The judge ``settings`` ask for (the ``reasoning_sql`` weights, the rewards section, or
    settings that hold one); None when ``judge_backend`` is ``off``.

    ``openai`` reads the API key, if any, from the OPENAI_API_KEY environment variable;
    ``local`` needs the callable ``local``.
    """
    if hasattr(settings, "rewards"):
        settings = settings.rewards
    if hasattr(settings, "reasoning_sql"):
        settings = settings.reasoning_sql
    backend = settings.judge_backend
    if backend == "off":
        return None
    if backend == "openai":
        return OpenAIJudge(
            settings.judge_endpoint, settings.judge_model, settings.judge_timeout_s, os.environ.get("OPENAI_API_KEY")
        )
    if local is None:
        raise ValueError("judge_backend is 'local' but no callable was given to make_judge(local=...)")
    return LocalJudge(local)
