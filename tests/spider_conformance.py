"""Spider conformance data for the tests: the dev pairs of ``../shared/conformance/spider``,
databases generated for their schemas (rows that make the queries' filters select something),
and predictions mutated from a gold query. ``conftest.py`` turns them into the ``spider``
fixture; ``tests/test_importing.py`` builds its Spider-shaped folders with the same rows."""

from __future__ import annotations

import random
import re
from pathlib import Path

import sqlglot
from sqlglot import exp

from progress_sql.corpus.schema import DatabaseSchema, create_database, read_tables_json

ROWS_PER_TABLE = 6
SEED = 0


# ----------------------------------------------------------------------------- databases
_COMPARISON = re.compile(
    r"(\w+)\s*(?:=|!=|<>|>=|<=|>|<|\blike\b|\bin\s*\()\s*(?:\"([^\"]*)\"|'([^']*)'|(-?\d+(?:\.\d+)?))",
    re.IGNORECASE,
)


def literals(queries: list[str]) -> dict[str, list]:
    """Column name (lower case) → the literals the queries compare it with, so that the
    generated rows make the filters select something."""
    found: dict[str, set] = {}
    for query in queries:
        for column, dq, sq, number in _COMPARISON.findall(query):
            if number:
                value = float(number)
                literal = int(value) if value.is_integer() else value
            else:
                literal = (dq or sq).strip("%")
            found.setdefault(column.lower(), set()).add(literal)
    return {col: sorted(vals, key=repr) for col, vals in found.items()}


def spider_rows(schema: DatabaseSchema, literals: dict[str, list], rng: random.Random) -> dict[str, list[tuple]]:
    refs = {(fk.table.lower(), fk.column.lower()): (fk.ref_table.lower(), fk.ref_column.lower())
            for fk in schema.foreign_keys}
    columns: dict[tuple[str, str], list] = {}

    def generate(table, col, position) -> list:
        key = (table.name.lower(), col.name.lower())
        if key in columns:
            return columns[key]
        unique = bool(table.primary_key) and col.name == table.primary_key[0]
        target = refs.get(key)
        mine = literals.get(col.name.lower(), [])
        if target is not None and not unique:
            ref_table = schema.table(target[0])
            ref_col = next(c for c in ref_table.columns if c.name.lower() == target[1])
            pool = generate(ref_table, ref_col, ref_table.columns.index(ref_col))
            values = [rng.choice(pool) for _ in range(ROWS_PER_TABLE)]
        elif col.type in ("number", "others", "boolean"):
            numbers = [v for v in mine if not isinstance(v, str)]
            if unique:
                values = list(range(1, ROWS_PER_TABLE + 1))
            else:
                # values around each literal (below, at, above), and some of the column's own
                pool = [10 * (position + 1) + v for v in range(2)]
                pool += [n + d for n in rng.sample(numbers, min(3, len(numbers))) for d in (-1, 0, 1)]
                values = [rng.choice(pool) for _ in range(ROWS_PER_TABLE)]
        else:
            texts = [v for v in mine if isinstance(v, str)]
            own = [f"{col.name}_{v}" for v in range(ROWS_PER_TABLE)]
            picked = rng.sample(texts, min(4, len(texts)))
            if unique:
                values = list(dict.fromkeys(picked + own))[:ROWS_PER_TABLE]
            else:
                pool = own[:2] + picked
                values = [rng.choice(pool) for _ in range(ROWS_PER_TABLE)]
        columns[key] = values
        return values

    out = {}
    for table in schema.tables:
        if table.name.lower().startswith("sqlite_"):
            continue
        cols = [generate(table, c, i) for i, c in enumerate(table.columns)]
        out[table.name] = list(zip(*cols))
    return out


def read_pairs(folder: Path) -> list[tuple[str, str, str]]:
    """(gold, db_id, prediction) for the 322 examples, aligned line by line."""
    gold_lines = (folder / "dev_gold.txt").read_text().splitlines()
    pred_lines = (folder / "dev_predict.txt").read_text().splitlines()
    assert len(gold_lines) == len(pred_lines)
    pairs = []
    for gold_line, pred in zip(gold_lines, pred_lines):
        if gold_line.strip():
            gold, db_id = gold_line.rsplit("\t", 1)
            pairs.append((gold, db_id.strip(), pred))
    return pairs


def spider_databases(conformance: Path, folder: Path) -> tuple[list[tuple[str, str, str]], dict[str, Path]]:
    """The dev pairs and, in ``folder``, one generated database per db_id they use."""
    pairs = read_pairs(conformance)
    schemas = read_tables_json(conformance / "tables.json")
    dbs = {}
    for db_id in sorted({db for _, db, _ in pairs}):
        found = literals([q for g, d, p in pairs if d == db_id for q in (g, p)])
        rng = random.Random(f"{SEED}:{db_id}")
        dbs[db_id] = create_database(schemas[db_id], folder / f"{db_id}.sqlite", rows=spider_rows(schemas[db_id], found, rng))
    return pairs, dbs


# ----------------------------------------------------------------------------- mutations
def _top_select(query: str) -> exp.Select | None:
    try:
        tree = sqlglot.parse_one(query, read="sqlite")
    except Exception:  # noqa: BLE001
        return None
    return tree if isinstance(tree, exp.Select) else None


def _sql(tree: exp.Expression) -> str:
    return tree.sql(dialect="sqlite")


def _with(select: exp.Select, key: str, value) -> exp.Select:
    changed = select.copy()
    changed.set(key, value)
    return changed


def mutations(gold: str) -> dict[str, str]:
    """Predictions derived from ``gold`` for the cases of the issue."""
    out = {
        # duplicate rows: every row twice
        "duplicate_rows": f"SELECT * FROM ({gold}) UNION ALL SELECT * FROM ({gold})",
    }
    select = _top_select(gold)
    if select is None:
        return out
    items = select.expressions
    if len(items) > 1 and not any(isinstance(i, exp.Star) for i in items):
        out["columns_reordered"] = _sql(_with(select, "expressions", [i.copy() for i in reversed(items)]))
    if select.args.get("distinct"):
        out["distinct_removed"] = _sql(_with(select, "distinct", None))
    else:
        out["distinct_added"] = _sql(_with(select, "distinct", exp.Distinct()))
    order = select.args.get("order")
    if order is None:
        # different row order, and ORDER BY added, where the gold has none
        out["order_by_added"] = _sql(select.copy().order_by("1 DESC"))
        out["rows_reversed_unordered_gold"] = f"SELECT * FROM ({gold}) ORDER BY 1 DESC"
    else:
        out["order_by_removed"] = _sql(_with(select, "order", None))
        flipped = select.copy()
        for key in flipped.args["order"].expressions:
            key.set("desc", not key.args.get("desc"))
        out["order_reversed"] = _sql(flipped)
    return out
