"""The ``{db_details}`` of the prompts: a database's schema as DDL (or compact) text.

A corpus describes its databases in a Spider-format ``tables.json``; its entry rendered by
``render_ddl`` is the preferred text (keys, and natural column names as comments). A database
without an entry (or no tables.json at all) falls back to the ``CREATE`` statements stored in
the SQLite file itself, read through the read-only sandbox. With the ``compact`` prompt style
(``env.prompt_style``) either source is rendered by ``render_compact`` instead.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from progress_sql.envs.settings import default_task_settings
from progress_sql.corpus.records import CorpusError, CorpusLayout
from progress_sql.corpus.schema import DatabaseSchema, parse_ddl, read_tables_json, render_compact, render_ddl
from progress_sql.sql import execute

# sqlite_master in creation order; SQLite's own objects (sqlite_sequence, ...) and the
# automatic indexes (sql IS NULL) are not part of the user's schema.
_SCHEMA_SQL = (
    "SELECT sql FROM sqlite_master WHERE type IN ('table', 'view') AND sql IS NOT NULL "
    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid"
)


def ddl_from_sqlite(db_path: str | os.PathLike) -> str:
    """The CREATE TABLE/VIEW statements stored in a SQLite file, blank-line separated.

    Read-only (through ``progress_sql.sql.execute``); a missing, unreadable or empty database
    is a CorpusError naming the file.
    """
    result = execute(db_path, _SCHEMA_SQL)
    if not result.ok:
        raise CorpusError(f"{db_path}: cannot read the schema ({result.error}: {result.message})")
    if not result.rows:
        raise CorpusError(f"{db_path}: the database has no tables")
    return "\n\n".join(row[0].strip().rstrip(";") + ";" for row in result.rows)


class SchemaTexts:
    """db_details by database: from a tables.json when it has the db_id, else from the file.

    Texts are cached (a database's file by path, mtime and size, so a rebuilt file is read
    again); one instance is meant to be shared by every environment of a run. ``prompt_style``
    is ``env.prompt_style`` (default: the default settings'): ``paper`` renders DDL, ``compact``
    ``- table: column, ...`` lines.
    """

    def __init__(self, tables_json: str | os.PathLike | None = None, prompt_style: str | None = None) -> None:
        prompt_style = prompt_style or default_task_settings().env.prompt_style
        if prompt_style not in ("paper", "compact"):
            raise ValueError(f"unknown prompt style {prompt_style!r}: paper | compact")
        self.prompt_style = prompt_style
        self._schemas: dict[str, DatabaseSchema] = read_tables_json(Path(tables_json)) if tables_json else {}
        self._cache: dict[tuple, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_corpus(cls, layout: CorpusLayout, prompt_style: str | None = None) -> "SchemaTexts":
        """Schema texts of a built corpus (its tables.json; the files where it is missing)."""
        return cls(layout.tables_json if layout.tables_json.exists() else None, prompt_style)

    def __call__(self, db_id: str, db_path: str | os.PathLike) -> str:
        """The schema text (of ``prompt_style``) of database ``db_id`` stored at ``db_path``."""
        schema = self._schemas.get(db_id)
        if schema is not None:
            key: tuple = ("tables.json", db_id)
        else:
            try:
                st = os.stat(db_path)
            except OSError as err:
                raise CorpusError(f"{db_path}: database not readable ({err.strerror or err})") from None
            key = ("file", os.path.realpath(db_path), st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        if self.prompt_style == "compact":
            text = render_compact(schema if schema is not None else parse_ddl(ddl_from_sqlite(db_path), db_id))
        else:
            text = render_ddl(schema) if schema is not None else ddl_from_sqlite(db_path)
        with self._lock:
            self._cache[key] = text
        return text
