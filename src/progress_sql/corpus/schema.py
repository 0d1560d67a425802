"""Database schemas in Spider's ``tables.json`` format: reading, DDL text for prompts, SQLite files.

One ``tables.json`` entry describes one database: tables and columns (original and natural
names), column types, primary keys (column indexes; a nested list is a composite key) and
foreign keys (pairs of column indexes). Spider, BIRD and SynSQL all ship this format.

``render_ddl`` gives the ``{db_details}`` of the prompts (progress-sql.md, Appendix F: "the DDL
schema of the target database"), ``render_compact`` the one-line-per-table text of the compact
prompts (``env.prompt_style``); ``parse_ddl`` reads CREATE TABLE text back into a schema (for
databases without a tables.json entry); ``create_database`` builds an empty SQLite file with the
same tables, keys and column affinities, for tests and the evaluation conformance checks.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import sqlglot
from sqlglot import exp

from progress_sql.corpus.records import CorpusError, read_text

# Spider's column types → SQLite declared types (their affinity: TEXT, NUMERIC, BLOB).
_SQLITE_TYPES = {
    "text": "TEXT",
    "number": "NUMERIC",
    "time": "DATETIME",
    "boolean": "BOOLEAN",
    "others": "BLOB",
}
_REQUIRED_FIELDS = (
    "db_id",
    "table_names_original",
    "column_names_original",
    "column_types",
    "primary_keys",
    "foreign_keys",
)
_PLAIN_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Words that SQLite would misread as keywords when used bare as a name.
_KEYWORDS = frozenset(
    """abort action add after all alter analyze and as asc attach autoincrement before begin
    between by cascade case cast check collate column commit conflict constraint create cross
    current current_date current_time current_timestamp database default deferrable deferred
    delete desc detach distinct do drop each else end escape except exclusive exists explain
    fail filter for foreign from full glob group having if ignore immediate in index indexed
    initially inner insert instead intersect into is isnull join key left like limit match
    natural no not nothing notnull null of offset on or order outer over partition plan pragma
    primary query raise range recursive references regexp reindex release rename replace
    restrict right rollback row rows savepoint select set table temp temporary then to
    transaction trigger union unique update using vacuum values view virtual when where window
    with without""".split()
)


@dataclass(frozen=True)
class Column:
    name: str  # as in the database (column_names_original)
    natural_name: str  # Spider's readable name (column_names); equals name when absent
    type: str  # Spider type: text | number | time | boolean | others


@dataclass(frozen=True)
class Table:
    name: str
    natural_name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]  # column names; more than one: a composite key


@dataclass(frozen=True)
class ForeignKey:
    table: str
    column: str
    ref_table: str
    ref_column: str


@dataclass(frozen=True)
class DatabaseSchema:
    db_id: str
    tables: tuple[Table, ...]
    foreign_keys: tuple[ForeignKey, ...]

    def table(self, name: str) -> Table:
        """The table called ``name`` (case-insensitive, as SQLite resolves names)."""
        for table in self.tables:
            if table.name.lower() == name.lower():
                return table
        raise KeyError(f"{self.db_id}: no table {name!r}")


def quote_identifier(name: str) -> str:
    """``name`` as SQLite reads it: bare when plain, double-quoted otherwise."""
    if _PLAIN_IDENTIFIER.fullmatch(name) and name.lower() not in _KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


def sqlite_type(spider_type: str) -> str:
    """The declared SQLite type for a Spider column type (unknown types pass through)."""
    return _SQLITE_TYPES.get(spider_type.lower(), spider_type.upper() or "TEXT")


# ----------------------------------------------------------------------------- reading
def schema_from_spider(entry: object, where: str) -> DatabaseSchema:
    """Validate one tables.json entry; ``where`` (file and index) prefixes every error."""
    if not isinstance(entry, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    for key in _REQUIRED_FIELDS:
        if key not in entry:
            raise CorpusError(f"{where}: field '{key}' is missing")
    db_id = entry["db_id"]
    if not isinstance(db_id, str) or not db_id:
        raise CorpusError(f"{where}: field 'db_id' must be a non-empty string")
    where = f"{where} (db_id {db_id!r})"

    table_names = _string_list(entry, "table_names_original", where)
    natural_tables = _string_list(entry, "table_names", where) if "table_names" in entry else table_names
    columns = _column_list(entry, "column_names_original", where, len(table_names))
    natural_columns = (
        _column_list(entry, "column_names", where, len(table_names)) if "column_names" in entry else columns
    )
    types = _string_list(entry, "column_types", where)
    if len(natural_tables) != len(table_names):
        raise CorpusError(f"{where}: field 'table_names' has {len(natural_tables)} entries, "
                          f"table_names_original has {len(table_names)}")
    for key, values in (("column_names", natural_columns), ("column_types", types)):
        if len(values) != len(columns):
            raise CorpusError(f"{where}: field '{key}' has {len(values)} entries, "
                              f"column_names_original has {len(columns)}")

    pk_columns, fks = _keys(entry, where, table_names, columns)

    tables = []
    for t, name in enumerate(table_names):
        cols = tuple(
            Column(col_name, natural_columns[i][1], types[i])
            for i, (table_index, col_name) in enumerate(columns)
            if table_index == t
        )
        if not cols:
            raise CorpusError(f"{where}: table {name!r} has no columns")
        tables.append(Table(name, natural_tables[t], cols, tuple(pk_columns.get(t, ()))))
    return DatabaseSchema(db_id, tuple(tables), tuple(fks))


def _keys(entry: dict, where: str, table_names: list[str],
          columns: list[tuple[int, str]]) -> tuple[dict[int, list[str]], list[ForeignKey]]:
    """A tables.json entry's primary-key columns by table index, and its foreign keys."""

    def column_ref(index: object, key: str) -> tuple[int, str]:
        # Index 0 is Spider's "*" pseudo-column; keys always point at real columns.
        if isinstance(index, bool) or not isinstance(index, int) or not 0 < index < len(columns):
            raise CorpusError(f"{where}: field '{key}' refers to column index {index!r}, "
                              f"not a column of this database")
        return columns[index]

    pk_columns: dict[int, list[str]] = {}
    pk_raw = entry["primary_keys"]
    if not isinstance(pk_raw, list):
        raise CorpusError(f"{where}: field 'primary_keys' must be a list")
    for item in pk_raw:
        for index in item if isinstance(item, list) else [item]:
            table_index, name = column_ref(index, "primary_keys")
            if name not in pk_columns.setdefault(table_index, []):
                pk_columns[table_index].append(name)

    fks: list[ForeignKey] = []
    fk_raw = entry["foreign_keys"]
    if not isinstance(fk_raw, list):
        raise CorpusError(f"{where}: field 'foreign_keys' must be a list")
    for pair in fk_raw:
        if not isinstance(pair, list) or len(pair) != 2:
            raise CorpusError(f"{where}: field 'foreign_keys' holds {pair!r}, not a [column, column] pair")
        (src_t, src_c), (dst_t, dst_c) = column_ref(pair[0], "foreign_keys"), column_ref(pair[1], "foreign_keys")
        fks.append(ForeignKey(table_names[src_t], src_c, table_names[dst_t], dst_c))
    return pk_columns, fks


def _string_list(entry: dict, key: str, where: str) -> list[str]:
    value = entry[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorpusError(f"{where}: field '{key}' must be a list of strings")
    return value


def _column_list(entry: dict, key: str, where: str, n_tables: int) -> list[tuple[int, str]]:
    value = entry[key]
    out: list[tuple[int, str]] = []
    if isinstance(value, list):
        for item in value:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or isinstance(item[0], bool)
                or not isinstance(item[0], int)
                or not isinstance(item[1], str)
                or not -1 <= item[0] < n_tables
            ):
                break
            out.append((item[0], item[1]))
        else:
            return out
    raise CorpusError(f"{where}: field '{key}' must be a list of [table index, name] pairs "
                      f"with table indexes below {n_tables}")


def read_tables_json(path: Path) -> dict[str, DatabaseSchema]:
    """Every database of a Spider-format tables.json, by db_id."""
    path = Path(path)
    text = read_text(path)
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
    if not isinstance(entries, list):
        raise CorpusError(f"{path}: expected a JSON list of databases, got {type(entries).__name__}")
    schemas: dict[str, DatabaseSchema] = {}
    for index, entry in enumerate(entries):
        schema = schema_from_spider(entry, f"{path}: record {index}")
        if schema.db_id in schemas:
            raise CorpusError(f"{path}: record {index}: db_id {schema.db_id!r} appears twice")
        schemas[schema.db_id] = schema
    return schemas


# ----------------------------------------------------------------------------- DDL text
def _create_table(table: Table, fks: Iterable[ForeignKey], comments: bool) -> str:
    items: list[tuple[str, str]] = []  # (definition, comment): commas go between definitions
    for col in table.columns:
        comment = " ".join(col.natural_name.split()) if comments and _informative(col) else ""
        items.append((f"{quote_identifier(col.name)} {sqlite_type(col.type)}", comment))
    if table.primary_key:
        items.append((f"PRIMARY KEY ({', '.join(quote_identifier(c) for c in table.primary_key)})", ""))
    for fk in fks:
        items.append((
            f"FOREIGN KEY ({quote_identifier(fk.column)}) "
            f"REFERENCES {quote_identifier(fk.ref_table)} ({quote_identifier(fk.ref_column)})",
            "",
        ))
    lines = [
        f"    {definition}{',' if i < len(items) - 1 else ''}" + (f" -- {comment}" if comment else "")
        for i, (definition, comment) in enumerate(items)
    ]
    return f"CREATE TABLE {quote_identifier(table.name)} (\n" + "\n".join(lines) + "\n);"


def _informative(col: Column) -> bool:
    """A natural name worth showing: it says more than the column name itself."""
    def squash(s: str) -> str:
        return re.sub(r"[\s_]+", "", s.lower())

    return bool(col.natural_name.strip()) and squash(col.natural_name) != squash(col.name)


def render_ddl(schema: DatabaseSchema, comments: bool = True) -> str:
    """The ``{db_details}`` text: one CREATE TABLE per table with keys, blank-line separated.

    With ``comments``, a column whose natural name says more than its name carries it as a
    ``-- comment`` (as OmniSQL's prompts do). Without comments the text is valid SQLite DDL.
    """
    by_table: dict[str, list[ForeignKey]] = {}
    for fk in schema.foreign_keys:
        by_table.setdefault(fk.table, []).append(fk)
    return "\n\n".join(_create_table(t, by_table.get(t.name, ()), comments) for t in schema.tables)


def render_compact(schema: DatabaseSchema) -> str:
    """The compact ``{db_details}``: ``- table: column, ...`` per table, then one
    ``- table.column = table.column`` line per foreign key. A fifth of the DDL's tokens, and every
    name follows a space as it does after SELECT, FROM or a comma in a query, so a byte-level
    tokenizer gives it the same tokens in the schema as in the SQL: the tiny CPU policy copies
    tokens, and learns to within its budget."""
    q = quote_identifier  # names as a query must write them
    lines = [f"- {q(t.name)}: {', '.join(q(c.name) for c in t.columns)}" for t in schema.tables]
    lines += [f"- {q(fk.table)}.{q(fk.column)} = {q(fk.ref_table)}.{q(fk.ref_column)}" for fk in schema.foreign_keys]
    return "\n".join(lines)


def parse_ddl(ddl: str, db_id: str = "") -> DatabaseSchema:
    """The tables, columns, primary keys and foreign keys of CREATE TABLE statements (SQLite
    dialect); statements sqlglot cannot read, and other statements, are skipped. Columns have
    no natural names (the name is repeated) and type ``others`` (DDL types are not Spider's)."""
    try:
        statements = sqlglot.parse(ddl, read="sqlite")
    except sqlglot.errors.SqlglotError:
        statements = []
    tables: list[Table] = []
    fks: list[ForeignKey] = []
    for stmt in statements:
        if not isinstance(stmt, exp.Create) or not isinstance(stmt.this, exp.Schema):
            continue
        name = stmt.this.this.name if isinstance(stmt.this.this, exp.Table) else ""
        if not name:
            continue
        columns, primary = [], []
        for item in stmt.this.expressions:
            if isinstance(item, exp.ColumnDef):  # col TYPE [PRIMARY KEY] [REFERENCES t(c)]
                columns.append(Column(item.name, item.name, "others"))
                for constraint in item.constraints:
                    if isinstance(constraint.kind, exp.PrimaryKeyColumnConstraint):
                        primary.append(item.name)
                    elif isinstance(constraint.kind, exp.Reference):
                        fks += _references(name, [item], constraint.kind)
            elif isinstance(item, exp.PrimaryKey):
                primary += [e.name for e in item.expressions]
            elif isinstance(item, exp.ForeignKey) and item.args.get("reference") is not None:
                fks += _references(name, item.expressions, item.args["reference"])
        tables.append(Table(name, name, tuple(columns), tuple(primary)))
    return DatabaseSchema(db_id, tuple(tables), tuple(fks))


def _references(table: str, columns: Sequence[Any], reference: Any) -> list[ForeignKey]:
    """The foreign keys of ``REFERENCES t (c, ...)`` from ``columns`` of ``table``."""
    target = reference.this
    if not (isinstance(target, exp.Schema) and isinstance(target.this, exp.Table)):
        return []  # REFERENCES t without columns: the referenced key is not named
    return [ForeignKey(table, src.name, target.this.name, dst.name) for src, dst in zip(columns, target.expressions)]


# ----------------------------------------------------------------------------- databases
def create_database(
    schema: DatabaseSchema,
    path: Path,
    rows: Mapping[str, Sequence[Sequence[object]]] | None = None,
) -> Path:
    """Create a SQLite file with the schema's tables (and ``rows``, table → tuples, if given).

    Refuses to overwrite an existing file. Rows are inserted in one transaction; the file is
    removed again when anything fails, so no half-built database is left behind.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path}: database already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = sqlite3.connect(path)
        try:
            with con:
                # sqlite_* names are SQLite's own (sqlite_sequence appears in Spider dumps);
                # SQLite refuses to create them and makes sqlite_sequence itself when needed.
                user_tables = tuple(t for t in schema.tables if not t.name.lower().startswith("sqlite_"))
                con.executescript(render_ddl(replace(schema, tables=user_tables), comments=False))
                for table_name, table_rows in (rows or {}).items():
                    table = schema.table(table_name)
                    marks = ", ".join("?" for _ in table.columns)
                    con.executemany(f"INSERT INTO {quote_identifier(table.name)} VALUES ({marks})", table_rows)
        finally:
            con.close()
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
