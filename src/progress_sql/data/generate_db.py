"""Rows for a domain, drawn from a seed, and the SQLite file and Spider schema entry that hold them.

Keys: ``id`` columns are numbered 1..n; a foreign key draws its parent's keys with a Zipf-like
skew (a few parents get many children, as real data does), so GROUP BY counts vary; a table
whose primary key is made of foreign keys (enrolments, order lines) gets distinct key tuples.
Values are drawn clean (a date drawn after another reads it as ISO) and stored as the column
says (``mess.store``: its format and row noise). The same seed gives the same rows: every random
choice comes from one ``random.Random`` seeded with a string (hashed with SHA-512 by Python,
stable across runs and machines).
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from itertools import accumulate
from pathlib import Path
from typing import Any

from progress_sql.data.domains.spec import Column, Domain, Table, Unique
from progress_sql.data.mess import store
from progress_sql.data.naming import natural_name

Rows = dict[str, list[tuple]]  # table name → rows, values in column order

_FK_SKEW = 0.7  # exponent of the Zipf-like weights of parent keys (implementation constant)
_REDRAWS = 12  # attempts at a fresh label / a distinct key tuple before accepting a repeat


def row_count(table: Table, rng: random.Random, rows_scale: float) -> int:
    """Rows of ``table``: its declared range times ``rows_scale``, capped by Unique columns."""
    n = max(3, round(rng.randint(*table.rows) * rows_scale))
    for col in table.columns:
        if isinstance(col.gen, Unique):
            n = min(n, len(col.gen.values))
    return n


def parent_sampler(keys: list[int], rng: random.Random):
    """A draw of parent keys with Zipf-like weights over a shuffled order."""
    order = keys[:]
    rng.shuffle(order)
    cum = list(accumulate(1.0 / (rank + 1) ** _FK_SKEW for rank in range(len(order))))
    return lambda: rng.choices(order, cum_weights=cum)[0]


def generate_rows(domain: Domain, seed: int | str, rows_scale: float = 1.0) -> Rows:
    """Every table's rows, parents before children, deterministic in (seed, domain)."""
    rng = random.Random(f"{seed}:rows:{domain.name}")
    rows: Rows = {}
    keys: dict[str, list[int]] = {}
    for table in domain.tables:
        n = row_count(table, rng, rows_scale)
        samplers = {c.name: parent_sampler(keys[c.ref], rng) for c in table.foreign_keys}
        unique = {c.name: rng.sample(c.gen.values, n) for c in table.columns if isinstance(c.gen, Unique)}
        key_is_refs = all(table.column(k).kind == "ref" for k in table.primary_key)
        if key_is_refs:
            sizes = [len(keys[table.column(k).ref]) for k in table.primary_key]
            capacity = 1
            for s in sizes:
                capacity *= s
            n = min(n, capacity // 2)
        seen_keys: set[tuple] = set()
        seen_labels: set[Any] = set()
        out: list[tuple] = []
        while len(out) < n:
            row: dict[str, Any] = {}
            for col in table.columns:
                row[col.name] = _draw(col, len(out), row, rng, samplers, unique, seen_labels)
            if key_is_refs:
                pk = tuple(row[k] for k in table.primary_key)
                for _ in range(_REDRAWS):
                    if pk not in seen_keys:
                        break
                    for k in table.primary_key:
                        row[k] = samplers[k]()
                    pk = tuple(row[k] for k in table.primary_key)
                if pk in seen_keys:
                    continue  # a crowded key space: draw a whole new row
                seen_keys.add(pk)
            out.append(tuple(store(c, row[c.name], rng) for c in table.columns))
        rows[table.name] = out
        if not key_is_refs:
            keys[table.name] = [r[_index(table, table.primary_key[0])] for r in out]
    return rows


def _index(table: Table, column: str) -> int:
    return [c.name for c in table.columns].index(column)


def _draw(col: Column, i: int, row: dict, rng: random.Random, samplers: dict, unique: dict,
          seen_labels: set) -> Any:
    if col.kind == "id":
        return i + 1
    if col.kind == "ref":
        return ref_value(col, samplers, row)
    if col.name in unique:
        return unique[col.name][i]
    if col.nulls and rng.random() < col.nulls:
        return None
    value = col.gen.draw(rng, row)
    if col.kind == "label":
        for _ in range(_REDRAWS):  # names repeat in life, but rarely
            if value not in seen_labels:
                break
            value = col.gen.draw(rng, row)
        seen_labels.add(value)
    return value


# ----------------------------------------------------------------------------- SQLite
def parent_key(domain: Domain, col: Column) -> str:
    """The primary-key column of the table ``col`` refers to."""
    return domain.table(col.ref).primary_key[0]


def schema_sql(domain: Domain) -> str:
    """The DDL of every table of ``domain``, parents first."""
    return ";\n".join(_create(domain, t) for t in domain.tables) + ";\n"


def _create(domain: Domain, table: Table) -> str:
    lines = []
    for col in table.columns:
        required = col.kind in ("id", "ref", "label") or col.nulls == 0
        lines.append(f"    {col.name} {col.sqltype}{' NOT NULL' if required else ''}")
    lines.append(f"    PRIMARY KEY ({', '.join(table.primary_key)})")
    for col in table.foreign_keys:
        lines.append(f"    FOREIGN KEY ({col.name}) REFERENCES {col.ref} ({parent_key(domain, col)})")
    return f"CREATE TABLE {table.name} (\n" + ",\n".join(lines) + "\n)"


def write_database(path: Path, domain: Domain, rows: Rows) -> None:
    """Write a fresh SQLite file at ``path`` (replaced if present) with ``rows``; keys enforced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA foreign_keys = ON")  # a generator bug fails here, not in a query later
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        con.executescript(schema_sql(domain))
        for table in domain.tables:
            marks = ", ".join("?" * len(table.columns))
            con.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows[table.name])
        con.commit()
    finally:
        con.close()


def spider_schema(domain: Domain, db_id: str | None = None) -> dict:
    """The Spider ``tables.json`` entry of ``domain`` (composite keys as nested lists). Its
    natural names are Spider's: the words of the names (``Song_release_year``: "song release
    year"), not the questions' nouns, which a real schema does not ship."""
    names_original: list[list] = [[-1, "*"]]
    names: list[list] = [[-1, "*"]]
    types = ["text"]
    index: dict[tuple[str, str], int] = {}
    for ti, table in enumerate(domain.tables):
        for col in table.columns:
            index[(table.name, col.name)] = len(names_original)
            names_original.append([ti, col.name])
            names.append([ti, natural_name(col.name)])
            types.append("time" if col.kind == "date" else "number" if col.sqltype != "TEXT" else "text")
    primary: list = []
    foreign: list[list[int]] = []
    for table in domain.tables:
        pk = [index[(table.name, k)] for k in table.primary_key]
        primary.append(pk[0] if len(pk) == 1 else pk)
        for col in table.foreign_keys:
            foreign.append([index[(table.name, col.name)], index[(col.ref, parent_key(domain, col))]])
    return {
        "db_id": db_id or domain.name,
        "table_names_original": [t.name for t in domain.tables],
        "table_names": [natural_name(t.name) for t in domain.tables],
        "column_names_original": names_original,
        "column_names": names,
        "column_types": types,
        "primary_keys": primary,
        "foreign_keys": foreign,
    }


def database_fingerprint(path: Path) -> str:
    """SHA-256 of a database's content: each table's DDL and its rows in sorted order.

    Two builds from one seed give equal fingerprints even when the SQLite files' bytes differ.
    """
    digest = hashlib.sha256()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
        for name, ddl in tables:
            digest.update(f"{name}\n{ddl}\n".encode())
            width = len(con.execute(f"SELECT * FROM {name} LIMIT 0").description)
            order = ", ".join(str(i + 1) for i in range(width))
            for row in con.execute(f"SELECT * FROM {name} ORDER BY {order}"):
                digest.update(repr(row).encode())
                digest.update(b"\n")
    finally:
        con.close()
    return digest.hexdigest()


def ref_value(col: Column, samplers: dict, row: dict) -> object:
    """A foreign-key value, redrawn a few times when it must differ from another column."""
    value = samplers[col.name]()
    for _ in range(_REDRAWS):
        if not col.differs_from or value != row.get(col.differs_from):
            break
        value = samplers[col.name]()
    return value
