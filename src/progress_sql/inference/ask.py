"""Answering users' questions: ``answer_questions`` (greedy outputs for question / schema
pairs, what the served model ``tracking.pyfunc`` returns) and ``answer_on_database`` (one
question about a SQLite file → the output, its SQL and the SQL's result from the read-only
sandbox, what ``progress-sql ask`` prints)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Sequence

from progress_sql.corpus.records import Example
from progress_sql.corpus.schema import parse_ddl, render_compact
from progress_sql.envs.db_details import ddl_from_sqlite
from progress_sql.envs.prompts import round1_messages
from progress_sql.envs.settings import EnvSettings
from progress_sql.formats import FormatName, parse_output
from progress_sql.inference.backends import Sample
from progress_sql.inference.policy import ChatModel, Request
from progress_sql.sql import execute_isolated
from progress_sql.sql.result import ExecResult
from progress_sql.sql.settings import SandboxSettings


@dataclass(frozen=True)
class AskAnswer:
    """``text``: the model output; ``sql``: the SQL parsed from it (None when there is none);
    ``well_formed``: the output follows its format; ``result``: the sandbox's result of
    ``sql`` (None when there was no SQL to run); ``finish_reason`` of the generation."""

    text: str
    sql: str | None
    well_formed: bool
    result: ExecResult | None
    finish_reason: str


@functools.lru_cache(maxsize=64)
def _compact_schema(ddl: str) -> str:
    """``ddl`` as compact table lines (parsed once per distinct schema); unreadable text as it is."""
    parsed = parse_ddl(ddl)
    return render_compact(parsed) if parsed.tables else ddl


def _request(question: str, schema: str, fmt: FormatName, env: EnvSettings, evidence: str = "") -> Request:
    if env.prompt_style == "compact":  # the DDL users send, as the policy was trained to read it
        schema = _compact_schema(schema)
    example = Example(id="ask", db_id="ask", question=question, gold_sql="", hardness="", evidence=evidence)
    return Request(round1_messages(example, schema, fmt, env), fmt, example)


def answer_questions(model: ChatModel, questions: Sequence[tuple[str, str, str]], fmt: FormatName,
                     env: EnvSettings, seed: int = 0) -> list[Sample]:
    """Greedy outputs of ``(question, schema DDL, evidence)`` triples in format ``fmt``, with
    the prompts of ``env`` (its prompt style)."""
    requests = [_request(q, schema, fmt, env, evidence) for q, schema, evidence in questions]
    return [row[0] for row in model.complete(requests, n=1, temperature=0.0, top_p=1.0, seed=seed)]


def answer_on_database(model: ChatModel, db_path: str | os.PathLike, question: str, fmt: FormatName,
                       env: EnvSettings, sandbox: SandboxSettings, *, evidence: str = "", seed: int = 0) -> AskAnswer:
    """Answer ``question`` about the SQLite file ``db_path`` greedily in format ``fmt`` and run
    the SQL read-only. CorpusError when the database cannot be read."""
    schema = ddl_from_sqlite(db_path)
    sample = answer_questions(model, [(question, schema, evidence)], fmt, env, seed)[0]
    parsed = parse_output(sample.text, fmt)
    result = execute_isolated(db_path, parsed.sql, settings=sandbox) if parsed.sql else None
    return AskAnswer(sample.text, parsed.sql, parsed.well_formed, result, sample.finish_reason)
