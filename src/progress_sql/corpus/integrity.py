"""Is a corpus what its ``manifest.json`` says it is? The one check, for every reader.

``data build`` and ``data import`` write the manifest: the sha256 of every split and variant
file and of tables.json, each split's and variant's example count, and per database (and per
test-suite neighbour) either its content fingerprint (bundled: ``generate_db.database_fingerprint``,
since rebuilt SQLite files differ in bytes) or the sha256 and size of its bytes (imported).

Two depths:

* ``require_intact`` (the train, sft and evaluate stages call it before anything is written):
  every listed file's sha256 and count; every database and neighbour present, starting with
  the SQLite header, its schema readable with the tables (and, bundled, the row counts) that
  the manifest names; an imported database's size. Database bytes are not hashed here: an
  imported corpus holds gigabytes (BIRD's train databases alone ~10 GB, SynSQL's thousands of
  files), which would cost minutes per run, while header + schema + size catch a missing,
  replaced or truncated file in milliseconds. On the default corpus (data/corpus: 8 databases,
  20 neighbours, 5 MB) this check takes ~35 ms; the full one ~0.5 s. What it cannot see: rows
  changed in place (an UPDATE keeps the row counts, and often the size), which pass it; only
  the full check (``data validate``) finds them. The README says so where it describes it.
* ``corpus_damage(..., full=True)`` (``data validate``): also every database's hash.

A corpus without a manifest (built before it existed, or by hand) has nothing to compare its
files against: it is used with a warning, its databases (those its split files name) checked
by header and schema only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from progress_sql.corpus.records import CORPUS_SPLITS, CorpusError, CorpusLayout

log = logging.getLogger(__name__)

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 file
_SHOWN = 5  # damaged files named in a refusal (data validate lists every one)


@dataclass(frozen=True)
class Damage:
    """One way a corpus differs from its manifest (or is unreadable): the file and what."""

    path: Path
    what: str
    kind: Literal["file", "database"]  # a listed file (JSONL, tables.json) or a SQLite database

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_tree(folder: Path) -> str:
    """One sha256 over the names and contents of the files under ``folder`` (bytecode caches aside)."""
    lines = [f"{p.relative_to(folder).as_posix()} {sha256_file(p)}" for p in sorted(Path(folder).rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts]
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def require_intact(corpus_dir: str | Path) -> None:
    """Refuse a damaged corpus: a CorpusError naming each file that differs from the manifest
    and each database that is missing or not SQLite. A missing folder is left to the loaders
    (they name the file they cannot find)."""
    root = Path(corpus_dir)
    if not root.is_dir():
        return
    layout = CorpusLayout(root)
    if not layout.manifest.is_file():
        log.warning("%s: no manifest.json (a corpus built by hand or before manifests): its files cannot be "
                    "checked against one; only its databases are (SQLite header and schema)", root)
    damage = corpus_damage(root)
    if damage:
        shown = "; ".join(str(d) for d in damage[:_SHOWN])
        more = f" (and {len(damage) - _SHOWN} more)" if len(damage) > _SHOWN else ""
        raise CorpusError(f"corpus {root} is damaged: {shown}{more}. Rebuild it (progress-sql data build) or "
                          "restore these files; progress-sql data validate lists every difference")


def corpus_damage(corpus_dir: str | Path, *, full: bool = False,
                  fingerprint: Callable[[Path], str] | None = None) -> list[Damage]:
    """Everything that makes the corpus differ from its manifest, in file order; [] when intact.

    ``full`` also hashes every database: its bytes (imported) or, with ``fingerprint``
    (``data.generate_db.database_fingerprint``, from the layer above), its content (bundled).
    """
    layout = CorpusLayout(Path(corpus_dir))
    if not layout.manifest.is_file():
        return _unlisted_damage(layout)
    try:
        manifest = json.loads(layout.manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [Damage(layout.manifest, f"cannot be read ({err})", "file")]
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return [Damage(layout.manifest, "lists no files: not a manifest written by progress-sql data build", "file")]
    damage = _file_damage(layout, manifest)
    imported = manifest.get("source") == "import"
    for db_id, info in sorted((manifest.get("databases") or {}).items()):
        tables = sorted(info.get("rows") or {})  # bundled: rows per table
        damage += _database_damage(layout.database(db_id), tables, info.get("rows"), info.get("bytes"),
                                   _expected_hash(info, imported, full, fingerprint), imported, fingerprint)
    for db_id, digests in sorted((manifest.get("neighbours") or {}).items()):
        info = (manifest.get("databases") or {}).get(db_id, {})
        tables = sorted(info.get("rows") or {})  # a neighbour has its database's tables
        for k, digest in enumerate(digests, 1):  # neighbours/<db_id>/<k>.sqlite, k from 1
            expected = digest if full and (imported or fingerprint is not None) else None
            damage += _database_damage(layout.root / "neighbours" / db_id / f"{k}.sqlite", tables, None, None,
                                       expected, imported, fingerprint)
    return damage


def _expected_hash(info: dict[str, Any], imported: bool, full: bool,
                   fingerprint: Callable[[Path], str] | None) -> str | None:
    if not full:
        return None
    if imported:
        return info.get("sha256")
    return info.get("fingerprint") if fingerprint is not None else None


def _file_damage(layout: CorpusLayout, manifest: dict[str, Any]) -> list[Damage]:
    """The listed files against their sha256 and (split and variant files) example counts."""
    counts = {f"{s}.jsonl": info.get("examples") for s, info in (manifest.get("splits") or {}).items()}
    counts |= {f"variants/{v}.jsonl": info.get("examples") for v, info in (manifest.get("variants") or {}).items()}
    damage = []
    for rel, digest in sorted(manifest["files"].items()):
        path = layout.root / rel
        if not path.is_file():
            damage.append(Damage(path, "file not found (manifest.json lists it)", "file"))
            continue
        actual, lines = _hash_and_count(path)
        expected = counts.get(rel)
        if expected is not None and lines != expected:
            damage.append(Damage(path, f"holds {lines} examples, manifest.json says {expected} (cut or extended "
                                       "since the build)", "file"))
        elif actual != digest:
            damage.append(Damage(path, f"content differs from manifest.json (sha256 {actual[:12]}…, expected "
                                       f"{digest[:12]}…): edited since the build", "file"))
    return damage


def _hash_and_count(path: Path) -> tuple[str, int]:
    """sha256 of the file and its count of non-blank lines (records, for JSONL), in one read."""
    digest, lines = hashlib.sha256(), 0
    with path.open("rb") as fh:
        for line in fh:
            digest.update(line)
            lines += bool(line.strip())
    return digest.hexdigest(), lines


def _database_damage(path: Path, tables: Sequence[str], rows: dict[str, int] | None, size: int | None,
                     expected_hash: str | None, imported: bool,
                     fingerprint: Callable[[Path], str] | None) -> list[Damage]:
    problem = sqlite_problem(path, tables, rows)
    if problem is None and size is not None and path.stat().st_size != size:
        problem = f"{path.stat().st_size} bytes, manifest.json says {size}"
    if problem is None and expected_hash is not None:
        actual = sha256_file(path) if imported else fingerprint(path)  # type: ignore[misc]
        if actual != expected_hash:
            what = "bytes differ" if imported else "content differs"
            problem = f"{what} from manifest.json ({actual[:12]}…, expected {expected_hash[:12]}…)"
    return [Damage(path, problem, "database")] if problem else []


def sqlite_problem(path: Path, tables: Sequence[str] = (), rows: dict[str, int] | None = None) -> str | None:
    """Why ``path`` is not a readable SQLite database with ``tables`` (and, when given, these
    row counts per table); None when it is. Read-only: the file is never changed."""
    try:
        with path.open("rb") as fh:
            header = fh.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return "database not found"
    except OSError as err:
        return f"database not readable ({err.strerror or err})"
    if header != SQLITE_HEADER:
        return "not a SQLite database (no SQLite header)"
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            present = {name.casefold(): name for (name,) in
                       con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not present:
                return "the database has no tables"
            missing = [t for t in tables if t.casefold() not in present]
            if missing:
                return f"lacks table(s) {', '.join(missing)}"
            for table, expected in (rows or {}).items():
                (count,) = con.execute(f'SELECT count(*) FROM "{present[table.casefold()]}"').fetchone()
                if count != expected:
                    return f"table {table} holds {count} rows, manifest.json says {expected}"
        finally:
            con.close()
    except sqlite3.DatabaseError as err:
        return f"cannot read its schema ({err})"
    return None


def _unlisted_damage(layout: CorpusLayout) -> list[Damage]:
    """No manifest: the databases the split and variant files name, by header and schema."""
    db_ids: set[str] = set()
    for path in [layout.split(s) for s in CORPUS_SPLITS] + sorted((layout.root / "variants").glob("*.jsonl")):
        if not path.is_file():
            continue  # a missing split is the loaders' to name
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                db_id = json.loads(line).get("db_id") if line.strip() else None
            except (json.JSONDecodeError, AttributeError):
                continue  # a malformed record is the loaders' (and validation's) to name
            if isinstance(db_id, str) and db_id:
                db_ids.add(db_id)
    damage = []
    for db_id in sorted(db_ids):
        for path in layout.test_suite(db_id):
            problem = sqlite_problem(path)
            if problem:
                damage.append(Damage(path, problem, "database"))
    return damage


__all__ = ["SQLITE_HEADER", "Damage", "corpus_damage", "require_intact", "sha256_file", "sqlite_problem"]
