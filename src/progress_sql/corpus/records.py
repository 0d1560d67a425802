"""The example record every dataset is normalised to, and the on-disk corpus layout."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from progress_sql.sql.hardness import HARDNESS_LEVELS  # noqa: F401  (re-exported for data code)
from progress_sql.sql.verdict import SEMANTICS, Semantics

SPLITS = ("train", "dev", "test")  # split by database: dev and test databases never occur in train
# Unseen questions on the train databases (no gold SQL or question of train): how far the policy
# gets where it knows the schema, beside dev/test, where it must read a new one. The bundled build
# draws it (data.indomain_size); an imported corpus writes it empty (its dev sets are the measure).
INDOMAIN = "indomain"
CORPUS_SPLITS = (*SPLITS, INDOMAIN)  # the split files <name>.jsonl; the variants' names are sources.VARIANTS


class CorpusError(ValueError):
    """A corpus or dataset file is missing or malformed; the message names file and field."""


@dataclass(frozen=True)
class Example:
    id: str
    db_id: str
    question: str
    gold_sql: str
    hardness: str  # Spider hardness of gold_sql: easy | medium | hard | extra
    evidence: str = ""  # BIRD-style external knowledge; empty when none
    reasoning: str = ""  # short trace derived from the gold structure (SFT warm start)
    source: str = "bundled"  # bundled, or the dataset an import read it from (spider | bird | synsql: sources/)
    difficulty: str = ""  # dataset's own label when it has one (BIRD: simple/moderate/challenging)
    meta: dict = field(default_factory=dict)
    # What "correct" means for this example (sql.verdict): "spider" (Spider test-suite: bags,
    # DISTINCT removed, order when the gold orders) or "bird" (BIRD's EX: sets of rows). Rewards
    # and evaluation both read it, so RL optimises what evaluation measures.
    semantics: Semantics = "spider"

    def __post_init__(self) -> None:
        if self.semantics not in SEMANTICS:
            raise ValueError(f"{self.id}: semantics must be one of {', '.join(SEMANTICS)}, got {self.semantics!r}")

    def to_json(self) -> str:
        """One JSONL line. ``semantics`` is written only when it is not ``"spider"``, so a
        corpus written before the field existed (the bundled one) reads and writes the same."""
        record = asdict(self)
        if record["semantics"] == "spider":
            del record["semantics"]
        return json.dumps(record, ensure_ascii=False, sort_keys=True)


def question_key(db_id: str, question: str) -> tuple[str, str]:
    """A question as duplicates are recognised: its database and its text, case and spacing folded."""
    return db_id, " ".join(question.casefold().split())


_REQUIRED = ("id", "db_id", "question", "gold_sql", "hardness")


def example_from_dict(obj: object, where: str) -> Example:
    if not isinstance(obj, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in _REQUIRED:
        if not isinstance(obj.get(key), str) or not obj.get(key):
            raise CorpusError(f"{where}: field '{key}' is missing or not a non-empty string")
    known = {f for f in Example.__dataclass_fields__}
    unknown = set(obj) - known
    if unknown:
        raise CorpusError(f"{where}: unknown field(s) {sorted(unknown)}")
    if "semantics" in obj and obj["semantics"] not in SEMANTICS:
        raise CorpusError(f"{where}: field 'semantics' must be one of {', '.join(SEMANTICS)}, got {obj['semantics']!r}")
    return Example(**obj)


def read_text(path: Path) -> str:
    """A corpus or dataset file's text; CorpusError naming the file when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CorpusError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CorpusError(f"{path}: cannot read ({err})") from None


def write_jsonl(path: Path, examples: Iterable[Example]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for ex in examples:
            fh.write(ex.to_json() + "\n")
            n += 1
    tmp.replace(path)  # atomic: a crash never leaves a half-written split
    return n


def read_json_lines(path: Path) -> Iterator[tuple[str, dict]]:
    """The JSON objects of a JSONL file, each with where it stands (``path:line``), blank lines
    skipped: the one JSONL reader (corpus splits, validation's lenient rows, prediction files).
    CorpusError naming the file, and the line, when it cannot be read or a line is not a JSON object."""
    path = Path(path)
    try:
        with path.open("r", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise CorpusError(f"{where}: not valid JSON ({err.msg})") from None
                if not isinstance(obj, dict):
                    raise CorpusError(f"{where}: expected a JSON object, got {type(obj).__name__}")
                yield where, obj
    except FileNotFoundError:
        raise CorpusError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise CorpusError(f"{path}: cannot read ({err})") from None


def read_jsonl(path: Path) -> Iterator[Example]:
    """The examples of a split or variant file (``read_json_lines``, each checked by ``example_from_dict``)."""
    for where, obj in read_json_lines(path):
        yield example_from_dict(obj, where)


@dataclass(frozen=True)
class CorpusLayout:
    """Where a built corpus keeps its parts (root = params ``data.out_dir``)."""

    root: Path

    @property
    def databases(self) -> Path:  # databases/<db_id>/<db_id>.sqlite
        return self.root / "databases"

    def database(self, db_id: str) -> Path:
        return self.databases / db_id / f"{db_id}.sqlite"

    @property
    def tables_json(self) -> Path:  # Spider-format schemas of every database
        return self.root / "tables.json"

    def split(self, name: str) -> Path:  # train.jsonl, dev.jsonl, test.jsonl, indomain.jsonl
        return self.root / f"{name}.jsonl"

    def variant(self, name: str) -> Path:  # variants/syn.jsonl, ...
        return self.root / "variants" / f"{name}.jsonl"

    def neighbours(self, db_id: str) -> list[Path]:  # test-suite databases of db_id
        folder = self.root / "neighbours" / db_id
        return sorted(folder.glob("*.sqlite")) if folder.exists() else []

    def test_suite(self, db_id: str) -> list[Path]:
        """The original database first, then its neighbours: what TS evaluates on."""
        return [self.database(db_id), *self.neighbours(db_id)]

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def import_report(self) -> Path:  # an imported corpus: golds that failed, records dropped
        return self.root / "import_report.json"
