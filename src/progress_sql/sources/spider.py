"""Spider (Yu et al., 2018) as released: tables.json, train_spider.json / train_others.json,
dev.json, test.json, and the SQLite files under database/ (test: test_database/); the test-suite
databases (Zhong et al., 2020) under test_suite_database/ when present.

Each record holds ``db_id``, ``question`` and the gold ``query`` (plus tokenisations and a parsed
``sql`` tree that we do not need). Ids are ``spider-<split>-<index>`` in file order; for train the
index runs on from train_spider.json into train_others.json. Examples are judged under the
``"spider"`` semantics (``sql.verdict``: the test-suite evaluator's rules).
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.corpus.records import CorpusError
from progress_sql.sources.base import DatasetSource, TrainSet
from progress_sql.sources.reading import ExampleCollector, LoadResult, RecordAt, iter_json_array, require_file
from progress_sql.sql.verdict import Semantics

SEMANTICS: Semantics = "spider"
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
    collector = ExampleCollector("spider", split, tuple(paths), SEMANTICS, spider_tables_path(root, split))
    n = 0
    for path in paths:
        for index, data in iter_json_array(path):
            rec = RecordAt(path, index, data)
            db_id = rec.text("db_id")
            collector.add(rec, n, id=f"spider-{split}-{n:06d}", db_id=db_id, question=rec.text("question"),
                          gold_sql=rec.text("query"), db_path=spider_database_path(root, db_id, split),
                          meta={"file": path.name})
            n += 1
    return collector.finish()


def _evaluation(root: Path) -> dict[str, LoadResult]:
    sets = {"dev": load_spider(root, "dev")}
    if (Path(root) / "test.json").is_file():  # released later, and not in every copy
        sets["test"] = load_spider(root, "test")
    return sets


SOURCE = DatasetSource(
    name="spider",
    about="Spider folder (tables.json, train_spider.json, train_others.json, dev.json, test.json, database/)",
    semantics=SEMANTICS,
    train=lambda root: TrainSet.read_at_once(load_spider(root, "train")),
    evaluation=_evaluation,
    share=0.3,
    test_suite="test_suite_database",
    holds_train=lambda root: (Path(root) / _LAYOUT["train"][0][0]).is_file(),  # train_spider.json
)
