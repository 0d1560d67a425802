"""The pyfunc wrapper every registered model version is logged with: MLflow loads it and
answers questions with ``inference.ask.answer_questions``, as ``progress-sql ask`` does."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow

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


class PolicyModel(mlflow.pyfunc.PythonModel):
    """A registered policy as an MLflow pyfunc. ``predict`` takes rows (a DataFrame, a dict
    or a list of dicts) with ``question`` and ``schema`` (the database DDL) and optionally
    ``evidence``, and returns the greedy outputs in the model's output format."""

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

    # MLflow derives the model signature from these type hints (a list of string dicts in,
    # one string per row out) and converts a DataFrame input to such a list.
    def predict(self, model_input: list[dict[str, str]], params: dict[str, Any] | None = None) -> list[str]:
        from progress_sql.inference.ask import answer_questions

        rows = _rows(model_input)
        questions = [(str(r["question"]), str(r["schema"]), str(r.get("evidence") or "")) for r in rows]
        return [c.text for c in answer_questions(self._model, questions, self._fmt, self._settings.env,
                                                          self._settings.seed)]


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
