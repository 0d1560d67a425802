"""SynSQL-2.5M (OmniSQL, Li et al., 2025) as released: ``data.json`` (one JSON array of 2.5M
records), ``tables.json`` and ``databases/<db_id>/<db_id>.sqlite``; a train set only.

Records hold ``db_id``, ``question``, ``sql``, ``external_knowledge``, ``sql_complexity``
(Simple / Moderate / Complex / Highly Complex), ``question_style`` and ``cot`` (a worked
solution). The file is read incrementally, so ``limit`` bounds both time and memory, and
``indices`` turns only the chosen records into Examples (a seeded sample of 2.5M records costs
one pass over the file, not 2.5M hardness parses).

Examples are judged under the ``"bird"`` semantics (sets of rows): OmniSQL, which made
SynSQL-2.5M, compares execution results as sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection

from progress_sql.corpus.records import CorpusError
from progress_sql.sources.base import DatasetSource, TrainSet
from progress_sql.sources.reading import ExampleCollector, LoadResult, RecordAt, iter_json_array, require_file
from progress_sql.sql.verdict import Semantics

SEMANTICS: Semantics = "bird"


def synsql_database_path(root: Path, db_id: str) -> Path:
    """Where SynSQL keeps the SQLite file of ``db_id``."""
    return Path(root) / "databases" / db_id / f"{db_id}.sqlite"


def synsql_data_path(root: Path) -> Path:
    """The records file of a SynSQL-2.5M folder (``data.json``); CorpusError when missing."""
    return require_file(Path(root) / "data.json")


def count_synsql_records(root: Path) -> int:
    """How many records ``data.json`` holds (one streaming pass; nothing is converted)."""
    return sum(1 for _ in iter_json_array(synsql_data_path(root)))


def load_synsql(root: Path, limit: int | None = None, indices: Collection[int] | None = None) -> LoadResult:
    """Load SynSQL-2.5M as Examples: the first ``limit`` usable records (all when None), or,
    with ``indices``, exactly the records at those positions of ``data.json`` (the rest are
    read past, not converted).

    ``external_knowledge`` becomes ``evidence``, ``sql_complexity`` becomes ``difficulty``,
    and ``question_style`` and ``cot`` go to ``meta``.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be non-negative, got {limit}")
    root = Path(root)
    path = synsql_data_path(root)
    wanted = None if indices is None else set(indices)
    last = max(wanted, default=-1) if wanted is not None else None
    if not (root / "databases").is_dir():
        raise CorpusError(f"{root / 'databases'}: database folder not found")
    collector = ExampleCollector("synsql", "train", (path,), SEMANTICS, root / "tables.json")
    if limit == 0 or wanted == set():
        return collector.finish()
    for index, data in iter_json_array(path):
        if wanted is not None:
            if index > last:
                break  # nothing wanted lies further on
            if index not in wanted:
                continue
        rec = RecordAt(path, index, data)
        db_id = rec.text("db_id")
        meta = {}
        for key in ("question_style", "cot"):
            if value := rec.optional_text(key):
                meta[key] = value
        added = collector.add(rec, index, id=f"synsql-{index:07d}", db_id=db_id, question=rec.text("question"),
                              gold_sql=rec.text("sql"), evidence=rec.optional_text("external_knowledge"),
                              difficulty=rec.optional_text("sql_complexity"),
                              db_path=synsql_database_path(root, db_id), meta=meta)
        if added and limit is not None and len(collector.result.records) >= limit:
            break
    return collector.finish()


SOURCE = DatasetSource(
    name="synsql",
    about="SynSQL-2.5M folder (data.json, tables.json, databases/)",
    semantics=SEMANTICS,
    # 2.5M records: counted in one pass, and only the drawn ones converted
    train=lambda root: TrainSet.read_by_position(count_synsql_records(root),
                                                 lambda positions: load_synsql(root, indices=positions)),
    share=0.3,
)
