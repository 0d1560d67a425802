"""A catalogue domain as one database of a build: distractor columns and tables, messy values
(``data.mess``) and names in a naming style (``data.naming``), all drawn from the seed.

The catalogue says what a domain is about in the words its questions use; a database of a
build spells it the way real ones do: ``tblSongs.Song_release_year`` for the songs' release
year, an archive table beside the one asked about, a ``created_at`` column nobody asks for,
``ROCK`` where the catalogue says Rock. Distractors are in the schema and the data only: the
question families never pick a distractor table or an ``extra`` column.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Sequence

from progress_sql.data import mess, naming
from progress_sql.data.domains.renaming import renamed
from progress_sql.data.domains.spec import (
    Choice, Code, Column, Dates, Domain, Number, Person, Table, extra, key, table,
)

# How a database gets its distractors (implementation constants).
_AUDIT_SHARE = 0.5  # tables given one audit column
_LOOKALIKE_SHARE = 0.25  # tables given a look-alike of one of their value columns
_DISTRACTOR_TABLE_SHARE = 0.4  # databases given a distractor table (an archive or a change log)


def audit_columns() -> tuple[Column, ...]:
    """Columns real tables carry and questions rarely ask about."""
    return (
        replace(extra("created_at", Dates("2015-01-01", "2024-12-31"), "creation time"), fmt="date:stamp"),
        replace(extra("updated_at", Dates("2020-01-01", "2024-12-31"), "update time", nulls=0.2), fmt="date:stamp"),
        extra("updated_by", Person(), "editor", nulls=0.1),
        extra("notes", Choice(("see file", "checked", "follow up", "n/a", "duplicate?", "legacy record", "ok")),
              "notes", nulls=0.6),
        extra("legacy_code", Code("@@-####"), "legacy code"),
        extra("row_version", Number(1, 9), "row version", "INTEGER"),
        extra("source_system", Choice(("web", "import", "manual", "api")), "source system"),
        extra("is_deleted", Choice((0, 1), (0.95, 0.05)), "deleted flag", "INTEGER"),
    )


def realize(domain: Domain, seed: int | str, cases: Sequence[str], messy_share: float,
            schema_word_share: float) -> Domain:
    """``domain`` as a database of the build seeded by ``seed``: distractors, then (for
    ``messy_share`` of the databases) messy values, then names in a style whose case is one of
    ``cases``; its questions use a table's or column's schema word ``schema_word_share`` of the time."""
    rng = random.Random(f"{seed}:realize:{domain.name}")
    style = naming.draw_style(rng, cases)
    logical = with_distractors(domain, rng)
    messy = rng.random() < messy_share
    if messy:
        logical = mess.mess_up(logical, rng)
    names = naming.physical_names(logical, style, rng)
    database = renamed(logical, names.tables, names.columns, names.nouns)
    database = replace(database, style=style.label, messy=messy, schema_word_share=schema_word_share)
    database.check()
    return database


def with_distractors(domain: Domain, rng: random.Random) -> Domain:
    """``domain`` with audit and look-alike columns on some tables and, in some databases, an
    archive of one table or a change log."""
    audit = audit_columns()
    tables = []
    for t in domain.tables:
        added: list[Column] = []
        if rng.random() < _AUDIT_SHARE:
            added.append(rng.choice(audit))
        values = [c for c in t.columns if c.kind in ("number", "category", "date", "year") and c.gen is not None]
        if values and rng.random() < _LOOKALIKE_SHARE:
            added.append(_lookalike(rng.choice(values), rng))
        taken = {c.name for c in t.columns}
        tables.append(replace(t, columns=t.columns + tuple(c for c in added if c.name not in taken)))
    if rng.random() < _DISTRACTOR_TABLE_SHARE:
        more = _archive(rng.choice(tables), rng) if rng.random() < 0.5 else _change_log(domain)
        if more.name not in {t.name for t in tables}:
            tables.append(more)
    return replace(domain, tables=tuple(tables))


def _lookalike(col: Column, rng: random.Random) -> Column:
    """Another column of the same kind of values: ``previous_price`` beside ``price``."""
    words = ("previous", "original", "estimated", "target") if col.kind == "number" else ("previous", "original")
    word = rng.choice(words)
    return replace(col, name=f"{word}_{col.name}", kind="extra", noun=f"{word} {col.noun}", synonyms=(),
                   implicit={}, nulls=max(col.nulls, 0.3), additive=False)


def _archive(t: Table, rng: random.Random) -> Table:
    """An archive of ``t``: its value columns as distractors, fewer rows, no keys to other tables."""
    cols = [key(f"archive_{t.primary_key[0]}" if t.primary_key[0].endswith("id") else "archive_id")]
    cols += [replace(c, kind="extra", synonyms=(), implicit={}) for c in t.columns
             if c.kind in ("label", "category", "number", "year", "date", "flag")]
    suffix = rng.choice(("archive", "history", "backup"))
    return table(f"{t.name}_{suffix}", f"{t.singular} {suffix}", f"{t.singular} {suffix}s", (5, 40), *cols,
                 primary_key=(cols[0].name,), distractor=True)


def _change_log(domain: Domain) -> Table:
    """A log of changes to the domain's tables."""
    return table("change_log", "change log entry", "change log entries", (40, 120),
                 key("log_id"),
                 extra("table_name", Choice(tuple(t.name for t in domain.tables)), "table name"),
                 extra("action", Choice(("insert", "update", "delete"), (5, 8, 1)), "action"),
                 replace(extra("changed_at", Dates("2020-01-01", "2024-12-31"), "change time"), fmt="date:stamp"),
                 extra("changed_by", Person(), "editor"),
                 distractor=True)


__all__ = ["audit_columns", "realize", "with_distractors"]
