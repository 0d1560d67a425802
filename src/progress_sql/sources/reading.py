"""What every dataset reader shares: streaming JSON arrays, field access, turning records into
``Loaded`` examples.

Errors name the file and, where it applies, the line and column (malformed JSON) or the record
index and field (a record that lacks what the format promises). Records whose gold SQL does not
parse, or whose database file is missing, are skipped and counted rather than fatal: released
datasets carry a few such records, and one must not stop a load of thousands.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from progress_sql.corpus.records import CorpusError, Example
from progress_sql.sql import SQLParseError, hardness
from progress_sql.sql.verdict import Semantics

log = logging.getLogger(__name__)

_CHUNK_CHARS = 1 << 20
# A record this large is not a record but a broken file (an unterminated string, say):
# stop buffering and report the position instead of reading gigabytes into memory.
_MAX_RECORD_CHARS = 64 << 20

_decoder = json.JSONDecoder()


def require_file(path: Path) -> Path:
    """``path`` itself, or a CorpusError naming it when it is not an existing file."""
    if not path.is_file():
        raise CorpusError(f"{path}: file not found")
    return path


def iter_json_array(path: Path) -> Iterator[tuple[int, object]]:
    """Yield ``(index, record)`` from a file holding one JSON array, reading it incrementally.

    SynSQL-2.5M's data.json is gigabytes, so the array is decoded record by record from 1 MiB
    chunks; a loader that needs only the first N records reads only those.
    """
    require_file(path)
    with path.open("r", encoding="utf-8") as fh:
        reader = _ArrayReader(path, fh)
        yield from reader.records()


class _ArrayReader:
    def __init__(self, path: Path, fh) -> None:
        self.path = path
        self.fh = fh
        self.buf = ""
        self.pos = 0
        self.line_base = 1  # line number of buf[0]
        self.eof = False

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.fh.read(_CHUNK_CHARS)
        except UnicodeDecodeError as err:
            raise CorpusError(f"{self.path}: not UTF-8 text ({err.reason})") from None
        if not chunk:
            self.eof = True
            return False
        # Drop what is consumed, keeping the line count of the dropped text.
        self.line_base += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def _where(self, pos: int) -> str:
        line = self.line_base + self.buf.count("\n", 0, pos)
        col = pos - (self.buf.rfind("\n", 0, pos) + 1) + 1
        return f"{self.path}:{line}:{col}"

    def _next_char(self) -> str:
        """The next non-blank character (not consumed), or "" at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos : self.pos + 1]

    def _fail(self, what: str, pos: int | None = None) -> CorpusError:
        return CorpusError(f"{self._where(self.pos if pos is None else pos)}: not valid JSON ({what})")

    def records(self) -> Iterator[tuple[int, object]]:
        if self._next_char() != "[":
            if self.pos >= len(self.buf):
                raise CorpusError(f"{self.path}: empty file, expected a JSON array of records")
            raise self._fail("expected a JSON array of records")
        self.pos += 1
        index = 0
        if self._next_char() == "]":
            self.pos += 1
        else:
            while True:
                yield index, self._decode_value()
                index += 1
                c = self._next_char()
                if c == ",":
                    self.pos += 1
                    continue
                if c == "]":
                    self.pos += 1
                    break
                raise self._fail("expected ',' or ']' after a record" if c else "the array is not closed")
        if self._next_char():
            raise self._fail("extra data after the array")

    def _decode_value(self) -> object:
        if not self._next_char():
            raise self._fail("the array is not closed")
        while True:
            try:
                value, end = _decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                # Maybe only the buffer ends mid-record: read on, unless the record is
                # implausibly long already or the file has nothing more.
                if len(self.buf) - self.pos < _MAX_RECORD_CHARS and self._more():
                    continue
                raise self._fail(err.msg, err.pos) from None
            if end == len(self.buf) and not self.eof and self._more():
                continue  # a number could go on in the next chunk: decode again
            self.pos = end
            return value


@dataclass(frozen=True)
class RecordAt:
    """One record of a dataset file and where it came from, for error messages."""

    path: Path
    index: int
    data: object

    @property
    def where(self) -> str:
        return f"{self.path}: record {self.index}"

    def _obj(self) -> dict:
        if not isinstance(self.data, dict):
            raise CorpusError(f"{self.where}: expected a JSON object, got {type(self.data).__name__}")
        return self.data

    def text(self, key: str) -> str:
        """A required non-empty string field."""
        obj = self._obj()
        if key not in obj:
            raise CorpusError(f"{self.where}: field '{key}' is missing")
        value = obj[key]
        if not isinstance(value, str) or not value.strip():
            raise CorpusError(f"{self.where}: field '{key}' must be a non-empty string, got {value!r:.60}")
        return value

    def optional_text(self, key: str) -> str:
        """An optional string field: "" when absent or null."""
        value = self._obj().get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise CorpusError(f"{self.where}: field '{key}' must be a string, got {type(value).__name__}")
        return value

    def get(self, key: str) -> object:
        return self._obj().get(key)

    def has(self, key: str) -> bool:
        return key in self._obj()


@dataclass(frozen=True)
class Skipped:
    """A record left out of a load, and why; ``where``: its file and record number."""

    index: int
    id: str
    reason: str
    where: str = ""


@dataclass(frozen=True)
class Loaded:
    """One dataset record as read: the corpus example, and what the import needs of the source
    that the corpus does not keep (the source's database and tables file, where the record is)."""

    example: Example
    db_path: Path  # the SQLite file its gold runs on, in the source
    tables_json: Path | None  # the tables.json entry of its database is taken from here (None: none)
    index: int  # its position in the source: a train draw asks for positions
    where: str  # its file and record number, for messages


@dataclass
class LoadResult:
    """The examples of one dataset split, plus the records skipped and why."""

    source: str
    split: str
    paths: tuple[Path, ...]
    records: list[Loaded] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def examples(self) -> list[Example]:
        return [record.example for record in self.records]

    def __len__(self) -> int:
        return len(self.records)

    def skip_counts(self) -> dict[str, int]:
        """Skipped records by reason kind (the text before the first ':')."""
        return dict(Counter(s.reason.split(":", 1)[0] for s in self.skipped))

    def summary(self) -> str:
        files = ", ".join(str(p) for p in self.paths)
        text = f"{self.source} {self.split}: {len(self.records)} examples from {files}"
        if self.skipped:
            kinds = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.skip_counts().items()))
            text += f"; {len(self.skipped)} skipped ({kinds})"
        return text


class ExampleCollector:
    """Builds the examples of one load: hardness from the gold SQL, database present, skips counted.
    Every example is judged under ``semantics`` (``sql.verdict``), its dataset's EX rule."""

    def __init__(self, source: str, split: str, paths: tuple[Path, ...], semantics: Semantics,
                 tables_json: Path | None) -> None:
        self.result = LoadResult(source, split, paths)
        self.semantics, self.tables_json = semantics, tables_json
        self._db_exists: dict[Path, bool] = {}

    def add(self, rec: RecordAt, index: int, *, id: str, db_id: str, question: str, gold_sql: str,
            db_path: Path, evidence: str = "", difficulty: str = "", meta: dict | None = None) -> bool:
        """Add the example of ``rec``; return False (and record why) when it is skipped. ``index``
        is its position in the source; ``meta``, what the corpus keeps of the record beside the
        example's fields (its position is always kept)."""
        if db_path not in self._db_exists:
            self._db_exists[db_path] = db_path.is_file()
        if not self._db_exists[db_path]:
            self.result.skipped.append(Skipped(index, id, f"database missing: {db_path}", rec.where))
            return False
        try:
            level = hardness(gold_sql)
        except SQLParseError as err:
            self.result.skipped.append(Skipped(index, id, f"gold does not parse: {err}", rec.where))
            return False
        example = Example(id=id, db_id=db_id, question=question.strip(), gold_sql=gold_sql.strip(), hardness=level,
                          evidence=evidence.strip(), source=self.result.source, difficulty=difficulty,
                          meta={"source_index": index, **(meta or {})}, semantics=self.semantics)
        self.result.records.append(Loaded(example, db_path, self.tables_json, index, rec.where))
        return True

    def finish(self) -> LoadResult:
        """The result; its summary is logged (as a warning when records were skipped)."""
        result = self.result
        (log.warning if result.skipped else log.info)("%s", result.summary())
        return result
