"""BIRD (Li et al., 2023) as released: ``train/train.json`` with ``train/train_databases/`` and
``train/train_tables.json``; ``dev/dev.json`` likewise (the dev download unpacks to a dated folder
such as dev_20240627/: pass that folder, or its parent renamed/linked as dev/).

Records hold ``db_id``, ``question``, ``evidence`` (external knowledge) and the gold ``SQL``;
dev records add ``question_id`` and ``difficulty`` (simple / moderate / challenging).
Examples are judged under the ``"bird"`` semantics (``sql.verdict``: BIRD's official EX).
"""

from __future__ import annotations

from pathlib import Path

from progress_sql.corpus.records import CorpusError
from progress_sql.sources.base import DatasetSource, TrainSet
from progress_sql.sources.reading import ExampleCollector, LoadResult, RecordAt, iter_json_array
from progress_sql.sql.verdict import Semantics

SEMANTICS: Semantics = "bird"  # BIRD's official EX: sets of rows
BIRD_SPLITS = ("train", "dev")
BIRD_DIFFICULTIES = ("simple", "moderate", "challenging")


def bird_split_dir(root: Path, split: str) -> Path:
    """The folder holding ``<split>.json``: ``root`` itself or ``root/<split>``."""
    if split not in BIRD_SPLITS:
        raise ValueError(f"BIRD split must be one of {list(BIRD_SPLITS)}, got {split!r}")
    root = Path(root)
    for folder in (root / split, root):
        if (folder / f"{split}.json").is_file():
            return folder
    raise CorpusError(f"{root / split / f'{split}.json'}: file not found (nor {root / f'{split}.json'})")


def has_bird_split(root: Path, split: str) -> bool:
    """Whether ``root`` holds ``<split>.json`` (itself or under ``<split>/``)."""
    return any((folder / f"{split}.json").is_file() for folder in (Path(root) / split, Path(root)))


def bird_database_path(root: Path, split: str, db_id: str) -> Path:
    """Where BIRD keeps the SQLite file of ``db_id``: ``<split>_databases/<db_id>/<db_id>.sqlite``."""
    return bird_split_dir(root, split) / f"{split}_databases" / db_id / f"{db_id}.sqlite"


def load_bird(root: Path, split: str) -> LoadResult:
    """Load one BIRD split as Examples (evidence kept, BIRD difficulty in ``difficulty``)."""
    folder = bird_split_dir(root, split)
    path = folder / f"{split}.json"
    databases = folder / f"{split}_databases"
    if not databases.is_dir():
        raise CorpusError(f"{databases}: database folder not found")
    collector = ExampleCollector("bird", split, (path,), SEMANTICS, folder / f"{split}_tables.json")
    for index, data in iter_json_array(path):
        rec = RecordAt(path, index, data)
        db_id = rec.text("db_id")
        difficulty = rec.optional_text("difficulty")
        if difficulty and difficulty not in BIRD_DIFFICULTIES:
            raise CorpusError(f"{rec.where}: field 'difficulty' must be one of "
                              f"{list(BIRD_DIFFICULTIES)}, got {difficulty!r}")
        question_id = rec.get("question_id")
        collector.add(rec, index, id=f"bird-{split}-{index:06d}", db_id=db_id, question=rec.text("question"),
                      gold_sql=rec.text("SQL"), evidence=rec.optional_text("evidence"), difficulty=difficulty,
                      db_path=databases / db_id / f"{db_id}.sqlite",
                      meta={} if question_id is None else {"question_id": question_id})
    return collector.finish()


SOURCE = DatasetSource(
    name="bird",
    about="BIRD folder holding train/ (train.json, train_databases/, train_tables.json) and dev/",
    semantics=SEMANTICS,
    train=lambda root: TrainSet.read_at_once(load_bird(root, "train")),
    evaluation=lambda root: {"dev": load_bird(root, "dev")},
    share=0.4,
    holds_train=lambda root: has_bird_split(root, "train"),
)
