"""Spider-format schemas: reading tables.json, DDL text for prompts, SQLite databases from it."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import sqlglot

from progress_sql.corpus.records import CorpusError
from progress_sql.corpus.schema import (
    create_database,
    parse_ddl,
    quote_identifier,
    read_tables_json,
    render_compact,
    render_ddl,
    schema_from_spider,
    sqlite_type,
)


@pytest.fixture(scope="module")
def spider_schemas(conformance: Path):
    return read_tables_json(conformance / "tables.json")


def _entry(**changes):
    """A small valid tables.json entry (two tables, composite key, one foreign key)."""
    entry = {
        "db_id": "shop",
        "table_names": ["customer", "order item"],
        "table_names_original": ["customer", "order_item"],
        "column_names": [[-1, "*"], [0, "customer id"], [0, "full name"], [1, "order id"],
                         [1, "line"], [1, "customer id"], [1, "amount"]],
        "column_names_original": [[-1, "*"], [0, "cust_id"], [0, "name"], [1, "order_id"],
                                  [1, "line"], [1, "cust_id"], [1, "Group"]],
        "column_types": ["text", "number", "text", "number", "number", "number", "number"],
        "primary_keys": [1, [3, 4]],
        "foreign_keys": [[5, 1]],
    }
    entry.update(changes)
    return entry


# ----------------------------------------------------------------------------- reading
def test_reads_every_conformance_database(spider_schemas):
    assert len(spider_schemas) == 166
    perp = spider_schemas["perpetrator"]
    assert [t.name for t in perp.tables] == ["perpetrator", "people"]
    people = perp.table("PEOPLE")  # SQLite resolves names case-insensitively; so does table()
    assert [c.name for c in people.columns] == ["People_ID", "Name", "Height", "Weight", "Home Town"]
    assert people.primary_key == ("People_ID",)
    fk = perp.foreign_keys[0]
    assert (fk.table, fk.column, fk.ref_table, fk.ref_column) == ("perpetrator", "People_ID", "people", "People_ID")


def test_composite_keys_nested_and_flat():
    schema = schema_from_spider(_entry(), "t")
    assert schema.table("order_item").primary_key == ("order_id", "line")
    # Older Spider files list a composite key as separate indexes of the same table.
    flat = schema_from_spider(_entry(primary_keys=[1, 3, 4]), "t")
    assert flat.table("order_item").primary_key == ("order_id", "line")
    with pytest.raises(KeyError, match="no table 'nope'"):
        schema.table("nope")


def test_natural_names_default_to_original_names():
    entry = _entry()
    del entry["table_names"], entry["column_names"]
    schema = schema_from_spider(entry, "t")
    assert schema.table("customer").columns[1].natural_name == "name"
    assert "--" not in render_ddl(schema)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"db_id": ""}, "field 'db_id' must be a non-empty string"),
        ({"column_types": ["text"]}, "field 'column_types' has 1 entries"),
        ({"table_names": ["only one"]}, "field 'table_names' has 1 entries"),
        ({"foreign_keys": [[5, 99]]}, "field 'foreign_keys' refers to column index 99"),
        ({"foreign_keys": [[5]]}, "not a \\[column, column\\] pair"),
        ({"primary_keys": [0]}, "field 'primary_keys' refers to column index 0"),
        ({"primary_keys": "1"}, "field 'primary_keys' must be a list"),
        ({"column_names_original": [[-1, "*"], [5, "x"]]}, "field 'column_names_original' must be a list"),
        ({"table_names_original": ["customer", 3]}, "field 'table_names_original' must be a list of strings"),
        ({"table_names_original": ["customer", "order_item", "empty"], "table_names": ["a", "b", "c"]},
         "table 'empty' has no columns"),
    ],
)
def test_malformed_entries_name_the_field(changes, message):
    with pytest.raises(CorpusError, match=message) as err:
        schema_from_spider(_entry(**changes), "tables.json: record 4")
    assert "tables.json: record 4" in str(err.value)


def test_missing_field_is_named():
    entry = _entry()
    del entry["foreign_keys"]
    with pytest.raises(CorpusError, match=r"record 0: field 'foreign_keys' is missing"):
        schema_from_spider(entry, "record 0")
    with pytest.raises(CorpusError, match="expected a JSON object"):
        schema_from_spider(["db"], "record 0")


def test_file_errors_name_file_and_position(tmp_path):
    missing = tmp_path / "none" / "tables.json"
    with pytest.raises(CorpusError, match=f"{re.escape(str(missing))}: file not found"):
        read_tables_json(missing)
    bad = tmp_path / "tables.json"
    bad.write_text('[\n  {"db_id": "a",\n   "table_names" ["x"]}\n]\n')
    with pytest.raises(CorpusError, match=rf"{re.escape(str(bad))}:3:18: not valid JSON"):
        read_tables_json(bad)
    bad.write_text('{"db_id": "a"}')
    with pytest.raises(CorpusError, match="expected a JSON list"):
        read_tables_json(bad)
    bad.write_text(json.dumps([_entry(), _entry()]))
    with pytest.raises(CorpusError, match="record 1: db_id 'shop' appears twice"):
        read_tables_json(bad)
    entry = _entry()
    del entry["column_types"]
    bad.write_text(json.dumps([_entry(db_id="ok"), entry]))
    with pytest.raises(CorpusError, match=rf"{re.escape(str(bad))}: record 1: field 'column_types' is missing"):
        read_tables_json(bad)


# ----------------------------------------------------------------------------- DDL
def test_render_ddl_text():
    ddl = render_ddl(schema_from_spider(_entry(), "t"))
    assert ddl == (
        "CREATE TABLE customer (\n"
        "    cust_id NUMERIC, -- customer id\n"
        "    name TEXT, -- full name\n"
        "    PRIMARY KEY (cust_id)\n"
        ");\n"
        "\n"
        "CREATE TABLE order_item (\n"
        "    order_id NUMERIC,\n"
        "    line NUMERIC,\n"
        "    cust_id NUMERIC, -- customer id\n"
        '    "Group" NUMERIC, -- amount\n'
        "    PRIMARY KEY (order_id, line),\n"
        "    FOREIGN KEY (cust_id) REFERENCES customer (cust_id)\n"
        ");"
    )


def test_ddl_comment_never_swallows_a_comma():
    entry = _entry(column_names_original=[[-1, "*"], [0, "cust_id"], [0, "a -- b"], [1, "order_id"],
                                          [1, "line"], [1, "cust_id"], [1, "Group"]])
    schema = schema_from_spider(entry, "t")
    for with_comments in (True, False):
        con = sqlite3.connect(":memory:")
        # Comments end at the line's end, so the DDL must still be valid with them.
        con.executescript(render_ddl(schema, comments=with_comments))
        assert [r[1] for r in con.execute("PRAGMA table_info(customer)")] == ["cust_id", "a -- b"]
        con.close()


def test_ddl_of_every_conformance_database_parses(spider_schemas):
    for schema in spider_schemas.values():
        for with_comments in (True, False):
            statements = sqlglot.parse(render_ddl(schema, comments=with_comments), read="sqlite")
            assert len(statements) == len(schema.tables), schema.db_id
            assert all(isinstance(s, sqlglot.exp.Create) for s in statements)


def test_render_compact_and_parse_ddl_agree_with_tables_json():
    schema = schema_from_spider(_entry(), "t")
    assert render_compact(schema) == (
        "- customer: cust_id, name\n- order_item: order_id, line, cust_id, \"Group\"\n- order_item.cust_id = customer.cust_id"
    )
    for with_comments in (True, False):
        back = parse_ddl(render_ddl(schema, comments=with_comments), "t")
        assert render_compact(back) == render_compact(schema)
        assert [t.primary_key for t in back.tables] == [("cust_id",), ("order_id", "line")]
    inline = parse_ddl("CREATE TABLE a (x INTEGER PRIMARY KEY, y INT REFERENCES b(z)); CREATE TABLE b (z INT);")
    assert render_compact(inline) == "- a: x, y\n- b: z\n- a.y = b.z"
    assert inline.tables[0].primary_key == ("x",)
    assert parse_ddl("this is not ddl (").tables == ()  # unreadable: no tables, no exception
    assert parse_ddl("SELECT 1; CREATE VIEW v AS SELECT 1").tables == ()


def test_compact_schema_of_every_conformance_database(spider_schemas):
    for schema in spider_schemas.values():
        assert render_compact(parse_ddl(render_ddl(schema), schema.db_id)) == render_compact(schema), schema.db_id


def test_quote_identifier_round_trips_through_sqlite():
    names = ["plain", "Home Town", "18_49_Rating_Share", "%_Change_2007", "order", 'say "hi"', "Official_ratings_(millions)"]
    assert quote_identifier("plain") == "plain"
    assert quote_identifier("order") == '"order"'
    assert quote_identifier('say "hi"') == '"say ""hi"""'
    con = sqlite3.connect(":memory:")
    con.execute(f"CREATE TABLE t ({', '.join(quote_identifier(n) + ' TEXT' for n in names)})")
    assert [row[1] for row in con.execute("PRAGMA table_info(t)")] == names
    con.execute(f"SELECT {', '.join(map(quote_identifier, names))} FROM t")


def test_sqlite_types():
    assert [sqlite_type(t) for t in ("text", "number", "time", "boolean", "others", "Number")] == [
        "TEXT", "NUMERIC", "DATETIME", "BOOLEAN", "BLOB", "NUMERIC"]
    assert sqlite_type("varchar(20)") == "VARCHAR(20)"


# ----------------------------------------------------------------------------- databases
def test_create_every_conformance_database(spider_schemas, tmp_path):
    for schema in spider_schemas.values():
        path = create_database(schema, tmp_path / schema.db_id / f"{schema.db_id}.sqlite")
        con = sqlite3.connect(path)
        try:
            for table in schema.tables:
                if table.name.lower().startswith("sqlite_"):
                    continue  # SQLite's own table; it makes it itself when needed
                info = con.execute(f"PRAGMA table_info({quote_identifier(table.name)})").fetchall()
                assert [r[1] for r in info] == [c.name for c in table.columns], (schema.db_id, table.name)
                pk = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]]
                assert pk == list(table.primary_key), (schema.db_id, table.name)
            n_fk = sum(len(con.execute(f"PRAGMA foreign_key_list({quote_identifier(t.name)})").fetchall())
                       for t in schema.tables if not t.name.lower().startswith("sqlite_"))
            assert n_fk == len(schema.foreign_keys), schema.db_id
        finally:
            con.close()


def test_create_database_with_rows_and_no_overwrite(tmp_path):
    schema = schema_from_spider(_entry(), "t")
    path = create_database(schema, tmp_path / "shop.sqlite",
                           rows={"customer": [(1, "Ann"), (2, "Bo")], "ORDER_ITEM": [(10, 1, 2, 5.5)]})
    con = sqlite3.connect(path)
    assert con.execute(
        'SELECT c.name, o."Group" FROM customer c JOIN order_item o ON c.cust_id = o.cust_id').fetchall() == [("Bo", 5.5)]
    con.close()
    with pytest.raises(FileExistsError, match="already exists"):
        create_database(schema, path)


def test_failed_create_leaves_no_file(tmp_path):
    schema = schema_from_spider(_entry(), "t")
    target = tmp_path / "shop.sqlite"
    with pytest.raises(sqlite3.IntegrityError):  # duplicate primary key
        create_database(schema, target, rows={"customer": [(1, "Ann"), (1, "Bo")]})
    assert not target.exists()
    with pytest.raises(KeyError):
        create_database(schema, target, rows={"nope": [(1,)]})
    assert not target.exists()
