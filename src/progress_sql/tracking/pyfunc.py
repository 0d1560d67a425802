"""The pyfunc wrapper every registered model version is logged with: MLflow loads it and
answers questions with ``inference.ask.answer_questions``, as ``progress-sql ask`` does.

Its input is rows of ``question``, ``schema`` (the database DDL) and optionally ``evidence``
(``SIGNATURE``); served by ``mlflow models serve``, MLflow reads them from its usual payloads
(``dataframe_records``, ``dataframe_split``, ``inputs``) and answers a row without one of the
required columns with a 400 that names it. Each row's answer is ``{"sql": ..., "text": ...}``:
the SQL parsed from the output (None when it holds none) and the raw output."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

HF_ARTIFACT = "hf_model"
_REQUIREMENTS = ("torch", "transformers", "tokenizers", "sqlglot", "pydantic", "pyyaml")
REQUIRED = {"question": "the question", "schema": "the database DDL"}
# An explicit column signature (not type hints: MLflow takes only ``inputs`` for a model typed
# by hints) makes MLflow check the columns and read every usual payload into a DataFrame.
SIGNATURE = ModelSignature(
    inputs=Schema([*(ColSpec("string", name) for name in REQUIRED), ColSpec("string", "evidence", required=False)]),
    outputs=Schema([ColSpec("string", "sql", required=False), ColSpec("string", "text")]),
)


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


class PolicyModel(mlflow.pyfunc.PythonModel):
    """A registered policy as an MLflow pyfunc: ``predict`` takes rows (a DataFrame, a dict or
    a list of dicts) of ``question``, ``schema`` and optionally ``evidence`` and returns one
    ``{"sql", "text"}`` per row, greedily, in the model's output format."""

    def load_context(self, context: Any) -> None:
        from progress_sql.params import settings_from_dict
        from progress_sql.inference.policy import ChatModel

        config = dict(context.model_config or {})
        self._fmt = config.get("format", "think_sql")
        overrides = {"generation.backend": "transformers"}
        for key in ("max_new_tokens", "max_prompt_tokens"):
            if key in config:
                overrides[f"generation.{key}"] = config[key]
        self._settings = settings_from_dict({}, "pyfunc model config", overrides)
        self._model = ChatModel.load(Path(context.artifacts[HF_ARTIFACT]), self._settings.generation)

    # The DataFrame hint keeps MLflow from deriving a signature from the hints (SIGNATURE is it).
    def predict(self, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> list[dict[str, str | None]]:
        from progress_sql.formats import parse_output
        from progress_sql.inference.ask import answer_questions

        questions = [(r["question"], r["schema"], r.get("evidence") or "") for r in _rows(model_input)]
        samples = answer_questions(self._model, questions, self._fmt, self._settings.env, self._settings.seed)
        return [{"sql": parse_output(s.text, self._fmt).sql, "text": s.text} for s in samples]


def _rows(model_input: Any) -> list[dict]:
    """The input as row dicts; MlflowException (a 400 when served) naming the first row that
    lacks a required field (a null in a DataFrame column MLflow let through)."""
    if isinstance(model_input, pd.DataFrame):
        rows = model_input.to_dict(orient="records")
    elif isinstance(model_input, dict):
        rows = [model_input]
    else:
        rows = list(model_input)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise MlflowException.invalid_parameter_value(f"row {i} is a {type(row).__name__}, not an object with "
                                                          f"{' and '.join(map(repr, REQUIRED))}")
        for name, what in REQUIRED.items():
            if not isinstance(row.get(name), str) or not row[name].strip():
                raise MlflowException.invalid_parameter_value(f"row {i} has no {name!r} ({what})")
    return rows
