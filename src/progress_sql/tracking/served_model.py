"""The registered model put to use: the pyfunc wrapper every version is logged with, and
``ask`` (``progress-sql ask``): one question about a SQLite database → the generated output,
its SQL and the SQL's result from the read-only sandbox."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow

from progress_sql.config import Settings, default_settings
from progress_sql.sql.result import ExecResult

HF_ARTIFACT = "hf_model"
_REQUIREMENTS = ("torch", "transformers", "tokenizers", "sqlglot", "pydantic", "pyyaml")


def pyfunc_requirements() -> list[str]:
    """Pinned requirements of a logged policy (the installed versions, local labels dropped),
    given explicitly so MLflow does not infer them by loading the model in a subprocess."""
    out = []
    for name in _REQUIREMENTS:
        try:
            out.append(f"{name}=={metadata.version(name).split('+')[0]}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


@dataclass(frozen=True)
class Answer:
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
    from progress_sql.data.schema import parse_ddl, render_compact

    parsed = parse_ddl(ddl)
    return render_compact(parsed) if parsed.tables else ddl


def _request(question: str, schema: str, fmt: str, settings: Settings, evidence: str = "") -> Any:
    from progress_sql.data.records import Example
    from progress_sql.envs.prompts import round1_messages
    from progress_sql.eval.policies import Request

    if settings.env.prompt_style == "compact":  # the DDL users send, as the policy was trained to read it
        schema = _compact_schema(schema)
    example = Example(id="ask", db_id="ask", question=question, gold_sql="", hardness="", evidence=evidence)
    return Request(example, round1_messages(example, schema, fmt, settings.env), fmt)


def answer_questions(generator: Any, questions: list[tuple[str, str, str]], fmt: str, settings: Settings) -> list[Any]:
    """Greedy completions (``eval.policies.Completion``) of ``(question, schema, evidence)``."""
    requests = [_request(q, schema, fmt, settings, evidence) for q, schema, evidence in questions]
    return [row[0] for row in generator.complete(requests, n=1, temperature=0.0, top_p=1.0, seed=settings.seed)]


def ask(model: str | os.PathLike, db_path: str | os.PathLike, question: str, settings: Settings | None = None,
        *, evidence: str = "") -> Answer:
    """Answer ``question`` about the SQLite file ``db_path`` with the policy ``model`` (a
    folder, a hub id or a ``models:/name@alias`` URI) greedily, in the output format of
    ``rl.recipe``, and run the SQL read-only. Errors: CorpusError (unreadable database),
    PolicyLoadError (model), TrackingError (registry URI)."""
    from progress_sql import rewards
    from progress_sql.envs.db_details import ddl_from_sqlite
    from progress_sql.rewards.formats import parse_output
    from progress_sql.sql import execute
    from progress_sql.eval.runner import make_generator
    from progress_sql.tracking.registry import local_model_dir

    settings = settings or default_settings()
    schema = ddl_from_sqlite(db_path)
    generator = make_generator(str(local_model_dir(model, settings)), settings)
    fmt = rewards.get(settings.rl.recipe).fmt
    completion = answer_questions(generator, [(question, schema, evidence)], fmt, settings)[0]
    parsed = parse_output(completion.text, fmt)
    result = execute(db_path, parsed.sql, settings=settings.sandbox) if parsed.sql else None
    return Answer(completion.text, parsed.sql, parsed.well_formed, result, completion.finish_reason)


class PolicyModel(mlflow.pyfunc.PythonModel):
    """A registered policy as an MLflow pyfunc. ``predict`` takes rows (a DataFrame, a dict
    or a list of dicts) with ``question`` and ``schema`` (the database DDL) and optionally
    ``evidence``, and returns the greedy outputs in the model's output format."""

    def load_context(self, context: Any) -> None:
        from progress_sql.config import settings_from_dict
        from progress_sql.eval.policies import ModelGenerator
        from progress_sql.train.generation import make_backend
        from progress_sql.train.policy import load_policy

        config = dict(context.model_config or {})
        self._fmt = config.get("format", "think_sql")
        overrides = {"generation.backend": "transformers"}
        for key in ("max_new_tokens", "max_prompt_tokens"):
            if key in config:
                overrides[f"generation.{key}"] = config[key]
        self._settings = settings_from_dict({}, "pyfunc model config", overrides)
        folder = Path(context.artifacts[HF_ARTIFACT])
        model, tokenizer = load_policy(folder)
        backend = make_backend(self._settings, model, tokenizer, folder)
        self._generator = ModelGenerator(str(folder), backend, tokenizer, self._settings.generation)

    # MLflow derives the model signature from these type hints (a list of string dicts in,
    # one string per row out) and converts a DataFrame input to such a list.
    def predict(self, model_input: list[dict[str, str]], params: dict[str, Any] | None = None) -> list[str]:
        rows = _rows(model_input)
        questions = [(str(r["question"]), str(r["schema"]), str(r.get("evidence") or "")) for r in rows]
        return [c.text for c in answer_questions(self._generator, questions, self._fmt, self._settings)]


def _rows(model_input: Any) -> list[dict]:
    if hasattr(model_input, "to_dict"):  # a pandas DataFrame
        rows = model_input.to_dict(orient="records")
    elif isinstance(model_input, dict):
        rows = [model_input]
    else:
        rows = list(model_input)
    for row in rows:
        if not isinstance(row, dict) or "question" not in row or "schema" not in row:
            raise ValueError("each input row needs 'question' and 'schema' (the database DDL)")
    return rows
