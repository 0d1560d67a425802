"""SynSQL-2.5M (OmniSQL, Li et al., 2025) as released: ``data.json`` (one JSON array of 2.5M
records), ``tables.json`` and ``databases/<db_id>/<db_id>.sqlite``.

Records hold ``db_id``, ``question``, ``sql``, ``external_knowledge``, ``sql_complexity``
(Simple / Moderate / Complex / Highly Complex), ``question_style`` and ``cot`` (a worked
solution). The file is read incrementally, so ``limit`` bounds both time and memory.
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.data.loaders.reading import (
    ExampleCollector,
    LoadResult,
    RecordAt,
    iter_json_array,
    require_file,
)
from progress_sql.corpus.records import CorpusError


def synsql_database_path(root: Path, db_id: str) -> Path:
    """Where SynSQL keeps the SQLite file of ``db_id``."""
    return Path(root) / "databases" / db_id / f"{db_id}.sqlite"


def load_synsql(root: Path, limit: int | None = None) -> LoadResult:
    """Load SynSQL-2.5M as Examples: the first ``limit`` usable records (all when None).

    ``external_knowledge`` becomes ``evidence``, ``sql_complexity`` becomes ``difficulty``,
    and ``question_style`` and ``cot`` go to ``meta``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be non-negative, got {limit}")
    root = Path(root)
    path = require_file(root / "data.json")
    if not (root / "databases").is_dir():
        raise CorpusError(f"{root / 'databases'}: database folder not found")
    tables = str(root / "tables.json")
    collector = ExampleCollector("synsql", "train", (path,))
    if limit == 0:
        return collector.finish()
    for index, data in iter_json_array(path):
        rec = RecordAt(path, index, data)
        db_id = rec.text("db_id")
        meta = {"tables_json": tables}
        for key in ("question_style", "cot"):
            if value := rec.optional_text(key):
                meta[key] = value
        added = collector.add(
            index,
            id=f"synsql-{index:07d}",
            db_id=db_id,
            question=rec.text("question"),
            gold_sql=rec.text("sql"),
            evidence=rec.optional_text("external_knowledge"),
            difficulty=rec.optional_text("sql_complexity"),
            db_path=synsql_database_path(root, db_id),
            meta=meta,
        )
        if added and limit is not None and len(collector.result.examples) >= limit:
            break
    return collector.finish()
