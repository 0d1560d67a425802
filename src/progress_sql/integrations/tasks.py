"""The rows every adapter's dataset is made of: one example's round-1 prompt, its database and
its gold query, as plain values a framework can store (parquet, ``datasets``, JSON).

A row: ``prompt`` (the round-1 chat messages the project's environment builds for the
recipe's output format: system prompt, schema, question), ``db_path`` (absolute), ``gold_sql``,
``db_id``, ``question``, ``difficulty`` (the example's label, else its Spider hardness),
``evidence``, ``example_id`` and ``semantics`` (how its answers are judged: ``spider`` or
``bird``, ``sql.verdict``). ``example_from_row`` turns such columns back into the
``Example`` an environment is reset with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from progress_sql import envs
from progress_sql.corpus.records import CorpusLayout, Example, read_jsonl
from progress_sql.envs.db_details import SchemaTexts
from progress_sql.integrations.scoring import resolve_recipe, task_settings
from progress_sql.rewards.types import Recipe

ROW_COLUMNS = ("prompt", "db_path", "gold_sql", "db_id", "question", "difficulty", "evidence", "example_id",
               "semantics")


def task_rows(
    corpus_dir: str | Path,
    split: str = "train",
    recipe: str | Recipe = "progress",
    settings: Any = None,
    *,
    env: str = "single_turn",
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """One row per example of ``split`` of the corpus at ``corpus_dir`` (the first ``limit``; None
    or 0: all, as ``eval.max_examples``), its prompt the one project environment ``env`` starts
    with for ``recipe``'s format."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a whole number ≥ 1, or 0 for all (got {limit!r})")
    recipe = resolve_recipe(recipe)
    settings = task_settings(settings)
    layout = CorpusLayout(Path(corpus_dir).resolve())
    examples = list(read_jsonl(layout.split(split)))[:limit or None]
    environment = envs.get(env)(settings, fmt=recipe.fmt,
                                schema_texts=SchemaTexts.for_corpus(layout, settings.env.prompt_style))
    rows = []
    for ex in examples:
        db_path = layout.database(ex.db_id)
        messages = environment.reset(ex, db_path)
        rows.append({
            "prompt": [dict(m) for m in messages],
            "db_path": str(db_path),
            "gold_sql": ex.gold_sql,
            "db_id": ex.db_id,
            "question": ex.question,
            "difficulty": ex.difficulty or ex.hardness,
            "evidence": ex.evidence,
            "example_id": ex.id,
            "semantics": ex.semantics,
        })
    return rows


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def example_from_row(gold_sql: str, *, db_id: Any = "", question: Any = "", difficulty: Any = "",
                     evidence: Any = "", example_id: Any = "", hardness: Any = "", semantics: Any = "") -> Example:
    """The ``Example`` a row describes (missing or non-text columns read as ''; no semantics:
    ``spider``)."""
    return Example(
        id=_text(example_id) or "example",
        db_id=_text(db_id),
        question=_text(question),
        gold_sql=gold_sql,
        hardness=_text(hardness),
        evidence=_text(evidence),
        difficulty=_text(difficulty),
        semantics=_text(semantics) or "spider",
    )
