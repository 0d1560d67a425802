"""Spider (Yu et al., 2018) as released: tables.json, train_spider.json / train_others.json,
dev.json, test.json, and the SQLite files under database/ (test: test_database/).

Each record holds ``db_id``, ``question`` and the gold ``query`` (plus tokenisations and a parsed
``sql`` tree that we do not need). Ids are ``spider-<split>-<index>`` in file order; for train the
index runs on from train_spider.json into train_others.json.
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.data.loaders.reading import ExampleCollector, LoadResult, RecordAt, iter_json_array, require_file
from progress_sql.corpus.records import CorpusError

# split → (question files, the first one required; database folder; tables file)
_LAYOUT = {
    "train": (("train_spider.json", "train_others.json"), "database", "tables.json"),
    "dev": (("dev.json",), "database", "tables.json"),
    "test": (("test.json",), "test_database", "test_tables.json"),
}


def _layout(split: str) -> tuple[tuple[str, ...], str, str]:
    if split not in _LAYOUT:
        raise ValueError(f"Spider split must be one of {sorted(_LAYOUT)}, got {split!r}")
    return _LAYOUT[split]


def spider_database_path(root: Path, db_id: str, split: str = "train") -> Path:
    """Where Spider keeps the SQLite file of ``db_id`` for ``split``."""
    return Path(root) / _layout(split)[1] / db_id / f"{db_id}.sqlite"


def spider_tables_path(root: Path, split: str = "train") -> Path:
    """The tables.json that describes the databases of ``split``."""
    return Path(root) / _layout(split)[2]


def load_spider(root: Path, split: str) -> LoadResult:
    """Load one Spider split as Examples (source ``spider``, hardness from the gold SQL)."""
    root = Path(root)
    files, db_folder, _ = _layout(split)
    paths = [require_file(root / files[0])] + [root / f for f in files[1:] if (root / f).is_file()]
    if not (root / db_folder).is_dir():
        raise CorpusError(f"{root / db_folder}: database folder not found")
    tables = str(spider_tables_path(root, split))
    collector = ExampleCollector("spider", split, tuple(paths))
    n = 0
    for path in paths:
        for index, data in iter_json_array(path):
            rec = RecordAt(path, index, data)
            db_id = rec.text("db_id")
            collector.add(
                n,
                id=f"spider-{split}-{n:06d}",
                db_id=db_id,
                question=rec.text("question"),
                gold_sql=rec.text("query"),
                db_path=spider_database_path(root, db_id, split),
                meta={"tables_json": tables, "file": path.name},
                where=rec.where,
            )
            n += 1
    return collector.finish()
