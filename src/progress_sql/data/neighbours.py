"""Test-suite neighbour databases, and how much better TS tells wrong SQL from right than EX.

A neighbour has its original's schema and fuzzed data (the distilled test suites of Zhong et
al., 2020, in spirit): row counts change by up to ``data.fuzz_rows``; each row starts from a
random original row (so some rows are dropped and some duplicated), keeps each value with
probability ``data.fuzz_keep`` and otherwise gets a value resampled from the column's
original values, one of the literals the dev/test gold queries compare the column with
(the query-aware sampling of the test-suite paper: a boundary such as ``> 20`` vs ``>= 20``
is only tested when some row holds 20), or a perturbed number or date. Primary keys are
renumbered 1..n, foreign keys are redrawn from the neighbour's parent keys, key tuples of
link tables stay unique, NOT NULL columns stay non-null. Neighbours are written to
``neighbours/<db_id>/<k>.sqlite``.

``measure_ex_vs_ts`` mutates the gold queries of a split into wrong queries (a changed
comparison operator, a dropped WHERE predicate, a wrong column of the same type) and counts
how many EX (the original database only) and TS (original plus neighbours) still accept.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from sqlglot import exp

from progress_sql.params import Settings
from progress_sql.data.domains.spec import Column, Domain
from progress_sql.data.generate_db import Rows, parent_sampler, ref_value, write_database
from progress_sql.data.mess import shift_date
from progress_sql.data.query import Col, Select, all_conds
from progress_sql.corpus.records import CorpusLayout, read_jsonl
from progress_sql.sql import GoldCache, SQLParseError, execution_match, parse_one, test_suite_match
from progress_sql.sql.parse import DIALECT

_REDRAWS = 12  # attempts at a distinct key tuple before dropping the row


# ----------------------------------------------------------------------------- fuzzing
def _perturb(col: Column, value: object, rng: random.Random) -> object:
    if col.kind == "date" and isinstance(value, str):
        return shift_date(col, value, rng.randint(-60, 60))  # in the column's own format
    if col.kind == "year" and isinstance(value, int):
        return value + rng.randint(-3, 3)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        return max(0, round(value * rng.uniform(0.8, 1.2))) if value >= 0 else round(value * rng.uniform(0.8, 1.2))
    return round(value * rng.uniform(0.8, 1.2), 2)


Literals = dict[tuple[str, str], list]  # (table, column) → values the gold queries compare with


def query_literals(selects: Iterable[Select], domain: Domain) -> Literals:
    """The literal values each column is compared with in ``selects`` and in ``domain``'s
    domain-knowledge rules: the values a neighbour must hold for a boundary to be tested."""
    found: dict[tuple[str, str], set] = {}

    def add(table: str, column: str, value: object) -> None:
        values = value if isinstance(value, tuple) else (value,)
        found.setdefault((table, column), set()).update(v for v in values if v is not None)

    for sel in selects:
        for holder, cond in all_conds(sel):
            if isinstance(cond.left, Col) and not isinstance(cond.value, Select):
                add(holder.table_of(cond.left), cond.left.name, cond.value)
    for rule in domain.dk_rules:
        add(rule.table, rule.column, tuple(rule.value) if isinstance(rule.value, list) else rule.value)
    return {k: sorted(v, key=repr) for k, v in sorted(found.items())}


def fuzz_rows(domain: Domain, rows: Rows, rng: random.Random, keep: float, row_change: float,
              literals: Literals | None = None) -> Rows:
    """Fuzzed rows with the same schema (see the module docstring for the rules)."""
    literals = literals or {}
    out: Rows = {}
    keys: dict[str, list[int]] = {}
    for table in domain.tables:
        original = rows[table.name]
        names = [c.name for c in table.columns]
        pools = {c.name: [r[i] for r in original if r[i] is not None] for i, c in enumerate(table.columns)}
        n = max(1, round(len(original) * rng.uniform(1 - row_change, 1 + row_change)))
        samplers = {c.name: parent_sampler(keys[c.ref], rng) for c in table.foreign_keys}
        key_is_refs = all(table.column(k).kind == "ref" for k in table.primary_key)
        seen: set[tuple] = set()
        new: list[tuple] = []
        for _ in range(n):
            base = dict(zip(names, rng.choice(original)))
            row: dict[str, object] = {}
            for col in table.columns:
                if col.kind == "id":
                    row[col.name] = len(new) + 1
                elif col.kind == "ref":
                    row[col.name] = ref_value(col, samplers, row)
                else:
                    hints = literals.get((table.name, col.name), ())
                    row[col.name] = _fuzz_value(col, base[col.name], pools[col.name], hints, keep, rng)
            if key_is_refs:
                pk = tuple(row[k] for k in table.primary_key)
                tries = 0
                while pk in seen and tries < _REDRAWS:
                    for k in table.primary_key:
                        row[k] = samplers[k]()
                    pk = tuple(row[k] for k in table.primary_key)
                    tries += 1
                if pk in seen:
                    continue
                seen.add(pk)
            new.append(tuple(row[c] for c in names))
        out[table.name] = new
        if not key_is_refs:
            keys[table.name] = [r[names.index(table.primary_key[0])] for r in new]
    return out


def _fuzz_value(col: Column, value: object, pool: list, hints: Sequence, keep: float,
                rng: random.Random) -> object:
    if col.nulls and rng.random() < col.nulls:
        return None
    if value is not None and rng.random() < keep:
        return value
    if hints and rng.random() < 0.5:  # a literal of the queries: boundaries get tested
        return rng.choice(hints)
    if pool and rng.random() < 0.5:
        return rng.choice(pool)
    if value is None:
        value = rng.choice(pool) if pool else None
    return None if value is None else _perturb(col, value, rng)




def write_neighbours(layout: CorpusLayout, db_id: str, domain: Domain, rows: Rows, k: int,
                     settings: Settings, literals: Literals | None = None) -> list[Path]:
    """Write ``k`` neighbours of ``db_id`` to ``neighbours/<db_id>/<i>.sqlite``; their paths."""
    paths = []
    for i in range(1, k + 1):
        rng = random.Random(f"{settings.data.seed}:neighbour:{db_id}:{i}")
        fuzzed = fuzz_rows(domain, rows, rng, settings.data.fuzz_keep, settings.data.fuzz_rows, literals)
        path = layout.root / "neighbours" / db_id / f"{i}.sqlite"
        write_database(path, domain, fuzzed)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- mutations
MUTATION_KINDS = ("comparison", "dropped_predicate", "wrong_column")
_SWAP = {exp.GT: exp.GTE, exp.GTE: exp.GT, exp.LT: exp.LTE, exp.LTE: exp.LT, exp.EQ: exp.NEQ, exp.NEQ: exp.EQ}


def _in_join(node: exp.Expression) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Join):
            return True
        if isinstance(parent, (exp.Where, exp.Having, exp.Select)):
            return False
        parent = parent.parent
    return False


def _comparisons(tree: exp.Expression) -> list[exp.Expression]:
    return [n for n in tree.find_all(*_SWAP) if not _in_join(n)]


def _where_atoms(tree: exp.Expression) -> list[exp.Expression]:
    atoms = []
    for where in tree.find_all(exp.Where):
        cond = where.this
        atoms += list(cond.flatten()) if isinstance(cond, exp.Connector) else [where]
    return atoms


def column_types(db_path: Path) -> dict[str, dict[str, str]]:
    """table → column → declared type (upper case), read from the database."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: {r[1]: str(r[2]).upper() for r in con.execute(f"PRAGMA table_info({t})")} for t in tables}
    finally:
        con.close()


def _table_of(column: exp.Column, types: dict[str, dict[str, str]]) -> str | None:
    select = column.find_ancestor(exp.Select)
    if select is None:
        return None
    tables = [t for t in select.find_all(exp.Table) if t.find_ancestor(exp.Select) is select]
    if column.table:
        return next((t.name for t in tables if (t.alias or t.name) == column.table), None)
    owners = [t.name for t in tables if column.name in types.get(t.name, {})]
    return owners[0] if len(owners) == 1 else None


def mutate(gold_sql: str, kind: str, types: dict[str, dict[str, str]], rng: random.Random) -> str | None:
    """A wrong version of ``gold_sql`` of the given kind, or None when the query has no place
    for it. ``types`` is ``column_types`` of its database (for a wrong column of the same type)."""
    try:
        tree = parse_one(gold_sql)
    except SQLParseError:
        return None
    if kind == "comparison":
        targets = _comparisons(tree)
        if not targets:
            return None
        node = rng.choice(targets)
        node.replace(_SWAP[type(node)](this=node.this.copy(), expression=node.expression.copy()))
    elif kind == "dropped_predicate":
        atoms = _where_atoms(tree)
        if not atoms:
            return None
        atom = rng.choice(atoms)
        if isinstance(atom, exp.Where):
            atom.pop()
        else:
            parent = atom.parent
            other = parent.expression if parent.this is atom else parent.this
            parent.replace(other.copy())
    elif kind == "wrong_column":
        choices = []
        for col in tree.find_all(exp.Column):
            if _in_join(col) or col.find_ancestor(exp.Group) is not None:
                continue
            table = _table_of(col, types)
            if table is None or col.name not in types.get(table, {}):
                continue
            same = [c for c, t in types[table].items() if t == types[table][col.name] and c != col.name]
            if same:
                choices.append((col, sorted(same)))
        if not choices:
            return None
        col, same = rng.choice(choices)
        col.set("this", exp.to_identifier(rng.choice(same)))
    else:
        raise ValueError(f"unknown mutation kind {kind!r}; expected one of {MUTATION_KINDS}")
    mutated = tree.sql(dialect=DIALECT)
    return mutated if mutated != parse_one(gold_sql).sql(dialect=DIALECT) else None


# ----------------------------------------------------------------------------- measurement
@dataclass
class TSReport:
    """EX and TS acceptance of wrong (mutated) gold queries on one split."""

    split: str
    golds: int = 0
    gold_self_ts: int = 0  # golds that match themselves on every test-suite database
    mutants: dict[str, int] = field(default_factory=lambda: {k: 0 for k in MUTATION_KINDS})
    ex_accept: dict[str, int] = field(default_factory=lambda: {k: 0 for k in MUTATION_KINDS})
    ts_accept: dict[str, int] = field(default_factory=lambda: {k: 0 for k in MUTATION_KINDS})

    @property
    def n_mutants(self) -> int:
        return sum(self.mutants.values())

    @property
    def ex_share(self) -> float:
        return sum(self.ex_accept.values()) / self.n_mutants if self.n_mutants else 0.0

    @property
    def ts_share(self) -> float:
        return sum(self.ts_accept.values()) / self.n_mutants if self.n_mutants else 0.0

    def summary(self) -> str:
        lines = [f"{self.split}: {self.golds} gold queries, {self.gold_self_ts} match themselves under TS; "
                 f"{self.n_mutants} wrong mutants: EX accepts {self.ex_share:.1%}, TS accepts {self.ts_share:.1%}"]
        for k in MUTATION_KINDS:
            n = self.mutants[k]
            if n:
                lines.append(f"  {k:18s} n={n:4d}  EX {self.ex_accept[k] / n:6.1%}  TS {self.ts_accept[k] / n:6.1%}")
        return "\n".join(lines)


def measure_ex_vs_ts(corpus_dir: Path, settings: Settings, split: str = "dev", per_kind: int = 1) -> TSReport:
    """Mutate each gold query of ``split`` (up to ``per_kind`` mutants per kind) and count how
    many wrong mutants EX and TS accept; also count golds that match themselves under TS."""
    layout = CorpusLayout(Path(corpus_dir))
    report = TSReport(split)
    cache = GoldCache(settings=settings.sandbox)
    timeout = settings.data.gold_timeout_s
    types: dict[str, dict[str, dict[str, str]]] = {}
    for ex in read_jsonl(layout.split(split)):
        db = layout.database(ex.db_id)
        suite = layout.test_suite(ex.db_id)
        if ex.db_id not in types:
            types[ex.db_id] = column_types(db)
        report.golds += 1
        report.gold_self_ts += test_suite_match(suite, ex.gold_sql, ex.gold_sql, timeout_s=timeout, gold_cache=cache)
        rng = random.Random(f"{settings.data.seed}:mutate:{ex.id}")
        for kind in MUTATION_KINDS:
            made: set[str] = set()
            for _ in range(per_kind * 3):
                if len(made) == per_kind:
                    break
                wrong = mutate(ex.gold_sql, kind, types[ex.db_id], rng)
                if wrong is None:
                    break
                made.add(wrong)
            for wrong in sorted(made):
                report.mutants[kind] += 1
                ex_ok = execution_match(db, wrong, ex.gold_sql, timeout_s=timeout, gold_cache=cache)
                report.ex_accept[kind] += ex_ok
                # TS on the original alone is EX: only a mutant EX accepts can survive TS.
                report.ts_accept[kind] += ex_ok and test_suite_match(
                    suite, wrong, ex.gold_sql, timeout_s=timeout, gold_cache=cache)
    return report


__all__ = ["MUTATION_KINDS", "TSReport", "column_types", "fuzz_rows", "measure_ex_vs_ts", "mutate", "query_literals",
           "write_neighbours"]
