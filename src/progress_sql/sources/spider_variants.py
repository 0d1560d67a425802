"""Spider's robustness sets as released, over Spider's dev databases; each is one split of the
corpus (``syn``, ``realistic``, ``dk``), judged, like Spider, under the ``"spider"`` semantics:

- Spider-Syn (Gan et al., 2021): ``Spider-Syn/dev.json``, Spider records whose question is
  ``SpiderSynQuestion`` (the original wording is ``SpiderQuestion``);
- Spider-Realistic (Deng et al., 2021): ``spider-realistic.json``, Spider records (``question``);
- Spider-DK (Gan et al., 2021): ``Spider-DK.json``, Spider records (``question``), with its
  own ``tables.json`` and ``database/`` beside it in some copies.

Each gives the gold ``query`` and the ``db_id``. A setting may name the file or the folder that
holds it. A database is looked up beside the file first (``database/<db_id>/<db_id>.sqlite``),
then in the Spider folder (``database/``, then ``test_database/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from progress_sql.corpus.records import CorpusError
from progress_sql.sources.base import DatasetSource
from progress_sql.sources.reading import ExampleCollector, LoadResult, RecordAt, iter_json_array
from progress_sql.sql.verdict import Semantics

SEMANTICS: Semantics = "spider"
# variant → (file names looked for in a folder, question fields in order of preference)
VARIANT_FILES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "syn": (("dev.json", "Spider-Syn/dev.json"), ("SpiderSynQuestion", "question")),
    "realistic": (("spider-realistic.json",), ("question",)),
    "dk": (("Spider-DK.json",), ("question",)),
}


def spider_variant_file(path: Path, variant: str) -> Path:
    """The JSON file of ``variant`` that ``path`` names (the file itself, or its folder)."""
    if variant not in VARIANT_FILES:
        raise ValueError(f"Spider variant must be one of {sorted(VARIANT_FILES)}, got {variant!r}")
    path = Path(path)
    if path.is_file():
        return path
    names = VARIANT_FILES[variant][0]
    for name in names:
        if (path / name).is_file():
            return path / name
    raise CorpusError(f"{path}: file not found (expected a file, or a folder holding {' or '.join(names)})")


def load_spider_variant(path: Path, variant: str, spider_root: Path | None = None) -> LoadResult:
    """Load Spider-Syn (``syn``), Spider-Realistic (``realistic``) or Spider-DK (``dk``) as
    Examples with ids ``spider-<variant>-<index>`` and ``meta["variant"]``; a record whose
    database is found nowhere is skipped as ``database missing`` (the caller decides)."""
    file = spider_variant_file(path, variant)
    question_keys = VARIANT_FILES[variant][1]
    folders: list[Path] = [file.parent / "database"]
    if spider_root is not None:
        folders += [Path(spider_root) / "database", Path(spider_root) / "test_database"]
    tables = [file.parent / "tables.json"] + ([Path(spider_root) / "tables.json"] if spider_root else [])
    tables_json = next((t for t in tables if t.is_file()), None)
    collector = ExampleCollector("spider", variant, (file,), SEMANTICS, tables_json)
    for index, data in iter_json_array(file):
        rec = RecordAt(file, index, data)
        db_id = rec.text("db_id")
        key = next((k for k in question_keys if rec.has(k)), question_keys[0])
        meta: dict = {"variant": variant, "file": file.name}
        if variant == "syn" and rec.optional_text("SpiderQuestion"):
            meta["original_question"] = rec.optional_text("SpiderQuestion")
        collector.add(rec, index, id=f"spider-{variant}-{index:06d}", db_id=db_id, question=rec.text(key),
                      gold_sql=rec.text("query"), db_path=_find_database(folders, db_id), meta=meta)
    return collector.finish()


def _find_database(folders: Sequence[Path], db_id: str) -> Path:
    candidates = [folder / db_id / f"{db_id}.sqlite" for folder in folders]
    return next((c for c in candidates if c.is_file()), candidates[0])


def _source(variant: str, about: str) -> DatasetSource:
    return DatasetSource(name=f"spider_{variant}", about=about, semantics=SEMANTICS, variant=variant,
                         read_variant=lambda path, given: load_spider_variant(path, variant, given.get("spider")))


SOURCES = (
    _source("syn", "Spider-Syn dev.json or its folder: the syn split"),
    _source("realistic", "spider-realistic.json or its folder: the realistic split"),
    _source("dk", "Spider-DK.json or its folder: the dk split"),
)
