"""Validation of a built corpus with a Great Expectations suite (the ``validate`` stage).

Every example of every split and robustness variant becomes one row of a pandas DataFrame.
Columns that need the project's own code are derived first (does the gold SQL parse, does it
execute on its database within ``data.gold_timeout_s``, is its result non-empty and within
``sandbox.max_rows`` rows, in how many splits does its database occur); the checks themselves
are GE expectations over those columns, each with a readable name that the report and the
failure messages use.

Records are read leniently here (plain JSON objects, ``read_json_lines``, not ``read_jsonl``) so that a bad value
becomes a failed expectation naming the rows, instead of an exception at the first one; only
a missing or unreadable file is a CorpusError.

An imported corpus (``manifest.json`` ``source: import``, ``data.importing``) runs the same
suite, with two differences: a gold may fail on its database in at most
``data.max_failing_gold_share`` of the rows (real datasets ship a few such golds; the import
dropped those of train and kept those of dev/test), and the test split may be empty when no
dataset gave one. The report counts the golds the import dropped (``import_report.json``).

An evaluation-only import (a dataset folder with its dev set alone: ``train_draw.evaluation_only``)
has an empty train split, which the suite then does not require.

A bundled corpus whose manifest records its realism (``catalogue``, each database's ``family``:
issue 51) gets four checks more: no family (a vocabulary) of dev or test reaches another split;
every table and column name of its databases is a plain identifier (nothing a gold must quote);
every text a gold compares (``=``, ``IN``, ``LIKE``) is written in its question or evidence (the
messy values stay answerable; the DK variant's rule values excepted: they are its point); and
at most ``data.max_tables_named_share`` of its questions name every table their gold reads.

The in-domain split (``indomain.jsonl``, optional: an import and an older corpus have none or
an empty one) shares the train databases by design: it is left out of the disjointness check,
and two checks of its own hold instead: its databases are train databases, and none of its
examples repeats a train example's gold SQL or question on the same database.

Before the suite, the corpus is checked against its ``manifest.json`` at full depth
(``corpus.integrity``: every file's sha256 and count, every database's header, schema and
hash): two more outcomes, "files match manifest.json" and "databases are intact SQLite files",
that fail naming each damaged file. Training and evaluation refuse such a corpus outright
(``corpus.integrity.require_intact``); here it is reported with everything else.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
from sqlglot import exp

from progress_sql.params import Settings
from progress_sql.corpus.records import (HARDNESS_LEVELS, INDOMAIN, SPLITS, CorpusError, CorpusLayout, Example,
                                         question_key, read_json_lines, read_text)
from progress_sql.corpus.integrity import corpus_damage
from progress_sql.corpus.schema import quote_identifier, read_tables_json
from progress_sql.data.generate_db import database_fingerprint
from progress_sql.data.naming import names_table
from progress_sql.files import write_text, written_aside
from progress_sql.sources import VARIANTS
from progress_sql.sql import SQLParseError, SQLPool, parse_one
from progress_sql.sql.verdict import SEMANTICS, comparison_sql

REQUIRED_FIELDS = ("id", "db_id", "question", "gold_sql", "hardness")
_EXAMPLE_FIELDS = frozenset(Example.__dataclass_fields__)
_SHOWN_OFFENDERS = 5  # offending ids named per failed expectation
REPORT_FILES = ("validation.json", "validation.md")  # what `data validate` writes in its report folder


# ----------------------------------------------------------------------------- report
@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation of the suite and how the corpus fared."""

    name: str  # readable: "ids are unique"
    expectation: str  # GE type: expect_column_values_to_be_unique
    column: str
    success: bool
    observed: str  # what was seen: "2 of 40 rows", "mean 0.91, at least 0.95 required"
    offenders: tuple[str, ...] = ()  # a few ids (or db_ids) that violate it

    def message(self) -> str:
        text = f"{self.name}: {self.observed}"
        return text + (f" (e.g. {', '.join(self.offenders)})" if self.offenders else "")


@dataclass
class ValidationReport:
    corpus_dir: str
    success: bool
    outcomes: list[ExpectationOutcome]
    rows: dict[str, int]  # examples per split / variant
    thresholds: dict[str, float]
    ge_result: dict[str, Any] = field(default_factory=dict, repr=False)  # GE's own JSON result
    imported: dict[str, Any] | None = None  # an imported corpus: import_report.json (gold check, failing golds)

    @property
    def failures(self) -> list[str]:
        """One line per violated expectation: its name, what was seen, a few offenders."""
        return [o.message() for o in self.outcomes if not o.success]

    def summary(self) -> str:
        """The readable report (Markdown), also written as validation.md."""
        status = "PASSED" if self.success else "FAILED"
        n_ok = sum(o.success for o in self.outcomes)
        lines = [
            f"# Corpus validation: {status}",
            "",
            f"Corpus: `{self.corpus_dir}`; {n_ok} of {len(self.outcomes)} expectations met.",
            "",
            "| part | examples |",
            "|---|---|",
            *(f"| {part} | {n} |" for part, n in self.rows.items()),
            "",
            "| expectation | result | observed |",
            "|---|---|---|",
            *(f"| {o.name} | {'ok' if o.success else 'FAILED'} | {o.observed} |" for o in self.outcomes),
        ]
        if self.failures:
            lines += ["", "## Violations", "", *(f"- {f}" for f in self.failures)]
        if self.imported is not None:
            gold = self.imported["gold_check"]
            lines += ["", "## Import", "",
                      f"{gold['checked']} gold queries checked at import, {gold['failing']} fail on their databases "
                      f"({gold['share']:.2%}; at most {gold['max_share']:.0%} allowed): {gold['dropped_from_train']} "
                      f"dropped from train, {gold['kept_in_eval']} kept in dev/test; {gold['unparsed_dropped']} records "
                      "dropped whose gold does not parse.", ""]
            lines += [f"- {f['id']} ({f['split']}, {f['action']}): {f['error']}: {f['message']}"
                      for f in self.imported["failing"]]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "corpus_dir": self.corpus_dir,
            "success": self.success,
            "failures": self.failures,
            "rows": self.rows,
            "thresholds": self.thresholds,
            "expectations": [
                {
                    "name": o.name,
                    "expectation": o.expectation,
                    "column": o.column,
                    "success": o.success,
                    "observed": o.observed,
                    "offenders": list(o.offenders),
                }
                for o in self.outcomes
            ],
            "great_expectations": self.ge_result,
            "import": self.imported,
        }

    def write(self, report_dir: Path) -> None:
        """Write report_dir/validation.json and report_dir/validation.md, both or neither (a full
        disk leaves the previous pair; ``files.written_aside``)."""
        with written_aside(report_dir, owned=REPORT_FILES) as aside:
            write_text(aside / "validation.json", json.dumps(self.to_dict(), indent=2, default=str) + "\n")
            write_text(aside / "validation.md", self.summary())


# ----------------------------------------------------------------------------- the table
def _read_rows(path: Path, part: str) -> list[dict[str, Any]]:
    """The records of one JSONL file as plain dicts; blank or non-string required fields → None."""
    rows = []
    for _, obj in read_json_lines(path):
        row: dict[str, Any] = {
            key: obj.get(key) if isinstance(obj.get(key), str) and obj.get(key).strip() else None
            for key in REQUIRED_FIELDS
        }
        row["semantics"] = obj.get("semantics", "spider")  # written only when not "spider"
        row["evidence"] = obj.get("evidence") if isinstance(obj.get("evidence"), str) else ""
        extra = sorted(set(obj) - _EXAMPLE_FIELDS)
        row.update(part=part, is_variant=part in VARIANTS, extra_fields=", ".join(extra) if extra else None)
        rows.append(row)
    return rows


def _gold_parses(sql: str) -> bool:
    try:
        parse_one(sql)
    except SQLParseError:
        return False
    return True


def corpus_frame(corpus_dir: Path, settings: Settings) -> pd.DataFrame:
    """One row per example of every split and variant, with the derived columns the suite checks.

    Gold queries run in an SQLPool on their database with ``data.gold_timeout_s`` and the
    sandbox's row cap, as evaluation will run them (their comparison view under the example's
    semantics, ``sql.verdict.comparison_sql``); each distinct (database, SQL) pair runs once
    (variants share their original's gold).
    """
    layout = CorpusLayout(Path(corpus_dir))
    df = pd.DataFrame(_corpus_rows(layout),
                      columns=[*REQUIRED_FIELDS, "semantics", "evidence", "part", "is_variant", "extra_fields"])
    _add_gold_columns(df, layout, settings)
    _add_split_columns(df)
    return df


def _corpus_rows(layout: CorpusLayout) -> list[dict[str, Any]]:
    """The rows of every split and of the variants and in-domain split the corpus has."""
    rows: list[dict[str, Any]] = []
    for split in SPLITS:
        rows += _read_rows(layout.split(split), split)
    if layout.split(INDOMAIN).exists():  # optional: an imported or older corpus has none
        rows += _read_rows(layout.split(INDOMAIN), INDOMAIN)
    for variant in VARIANTS:
        if layout.variant(variant).exists():  # variants are optional (a Spider-only corpus has none)
            rows += _read_rows(layout.variant(variant), variant)
    return rows


def _add_gold_columns(df: pd.DataFrame, layout: CorpusLayout, settings: Settings) -> None:
    """Does each row's database exist, its gold parse, execute (and on what), return rows."""
    df["db_exists"] = [isinstance(d, str) and layout.database(d).is_file() for d in df["db_id"]]
    parses = {sql: _gold_parses(sql) for sql in set(df["gold_sql"].dropna())}  # variants repeat golds
    df["gold_parses"] = [parses.get(sql, False) for sql in df["gold_sql"]]

    runnable = df["db_exists"] & df["gold_sql"].notna()
    # What evaluation executes: the gold's comparison view under its semantics (Spider's joins a
    # spaced "! =", as the test-suite evaluator does before running the gold).
    views = [comparison_sql(sql, sem) if isinstance(sql, str) and sem in SEMANTICS else sql
             for sql, sem in zip(df["gold_sql"], df["semantics"])]
    pairs = sorted({(db, view) for db, view, ok in zip(df["db_id"], views, runnable) if ok})
    results = dict(zip(pairs, _execute(layout, pairs, settings)))
    outcome = [results.get((db, view)) for db, view in zip(df["db_id"], views)]
    df["gold_executes"] = [r is not None and r.ok for r in outcome]
    df["gold_executes_share"] = df["gold_executes"].astype(float)  # the imported corpora's threshold
    df["gold_error"] = [
        (None if r.ok else f"{r.error}: {r.message}") if r is not None
        else "no_database: database file missing" if not exists else "no gold SQL"
        for r, exists in zip(outcome, df["db_exists"])
    ]
    # 1/0 for executed golds, NaN otherwise: the share of non-empty results is the column mean
    # over golds that ran (one that fails to run is the "executes" expectation's business).
    df["gold_nonempty"] = [float(bool(r.rows)) if r is not None and r.ok else math.nan for r in outcome]
    # A gold past sandbox.max_rows cannot be judged (sql.verdict.too_large_reason): flagged here,
    # before training floors it and evaluation leaves it out of EX. None: the gold did not run.
    df["gold_fits_max_rows"] = [not r.truncated if r is not None and r.ok else None for r in outcome]


def _add_split_columns(df: pd.DataFrame) -> None:
    """How each row's database sits among the splits: in how many main splits, in train (variants,
    in-domain), and whether an in-domain row repeats a train gold or question."""
    indomain = df["part"] == INDOMAIN
    main = ~df["is_variant"] & ~indomain & df["db_id"].notna()  # in-domain shares train's databases
    splits_per_db = df[main].groupby("db_id")["part"].nunique()
    df["db_split_count"] = [
        float(splits_per_db[db]) if is_main else math.nan for db, is_main in zip(df["db_id"], main)
    ]
    train_dbs = set(df.loc[df["part"] == "train", "db_id"].dropna())
    df["variant_db_in_train"] = [
        (db in train_dbs) if variant and db is not None else None
        for db, variant in zip(df["db_id"], df["is_variant"])
    ]
    df["indomain_db_in_train"] = [(db in train_dbs) if inside and db is not None else None
                                  for db, inside in zip(df["db_id"], indomain)]
    train = df[df["part"] == "train"]
    train_golds = set(zip(train["db_id"], train["gold_sql"]))
    train_questions = {question_key(db, q) for db, q in zip(train["db_id"], train["question"])
                       if isinstance(db, str) and isinstance(q, str)}
    df["indomain_repeats_train"] = [
        ((db, sql) in train_golds or (isinstance(db, str) and isinstance(q, str)
                                      and question_key(db, q) in train_questions)) if inside else None
        for db, sql, q, inside in zip(df["db_id"], df["gold_sql"], df["question"], indomain)
    ]


def _realism(manifest: dict[str, Any] | None) -> bool:
    """Whether the corpus is a bundled one whose manifest records its realism (issue 51)."""
    return bool(manifest) and manifest.get("source") == "bundled" and "catalogue" in manifest


def _add_realism_columns(df: pd.DataFrame, layout: CorpusLayout, manifest: dict[str, Any]) -> None:
    """The columns of the bundled corpus's realism checks (module notes); NaN / None where a row
    is not checked."""
    family = {db: info.get("family") for db, info in (manifest.get("databases") or {}).items()}
    df["family"] = [family.get(db) for db in df["db_id"]]
    main = df["part"].isin(SPLITS) & df["family"].notna()
    parts_per_family = df[main].groupby("family")["part"].nunique()
    df["family_split_count"] = [float(parts_per_family[f]) if m else math.nan for f, m in zip(df["family"], main)]
    schemas = read_tables_json(layout.tables_json) if layout.tables_json.is_file() else {}
    plain = {db: all(quote_identifier(n) == n for t in schema.tables for n in (t.name, *(c.name for c in t.columns)))
             for db, schema in schemas.items()}
    df["names_plain"] = [plain.get(db) for db in df["db_id"]]
    asked = df["part"].isin((*SPLITS, INDOMAIN))
    df["gold_tables_named"] = [_all_tables_named(q, sql) if a else math.nan
                               for q, sql, a in zip(df["question"], df["gold_sql"], asked)]
    df["values_in_question"] = [
        None if part == "dk" or not isinstance(sql, str) else
        all(v in f"{q} {e}" for v in _compared_texts(sql))
        for part, q, e, sql in zip(df["part"], df["question"], df["evidence"], df["gold_sql"])
    ]


def _all_tables_named(question: Any, sql: Any) -> float:
    """1.0 when the question names every table the gold reads (``naming.names_table``); NaN
    when there is no question or the gold does not parse."""
    try:
        tables = {t.name for t in parse_one(sql).find_all(exp.Table)} if isinstance(question, str) else None
    except SQLParseError:
        tables = None
    return math.nan if not tables else float(all(names_table(question, t) for t in tables))


def _compared_texts(sql: str) -> list[str]:
    """The text literals a query compares a column with (``=``, ``!=``, ``IN``, ``LIKE`` less its %)."""
    try:
        tree = parse_one(sql)
    except SQLParseError:
        return []
    texts = []
    for node in tree.find_all(exp.EQ, exp.NEQ, exp.In, exp.Like):
        values = node.expressions if isinstance(node, exp.In) else [node.expression]
        texts += [v.this.strip("%") for v in values if isinstance(v, exp.Literal) and v.is_string]
    return [t for t in texts if t]


def _execute(layout: CorpusLayout, pairs: list[tuple[str, str]], settings: Settings) -> list:
    if not pairs:
        return []
    jobs = [(layout.database(db), sql) for db, sql in pairs]
    with SQLPool(settings.sandbox.workers, settings=settings.sandbox) as pool:
        return pool.map(jobs, timeout_s=settings.data.gold_timeout_s)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None


# ----------------------------------------------------------------------------- the suite
@dataclass(frozen=True)
class _Check:
    name: str
    column: str
    offender_column: str = "id"


def _suite(gx: Any, settings: Settings, manifest: dict[str, Any] | None = None) -> tuple[Any, list[_Check]]:
    """The expectation suite, and per expectation (in order) its readable name; ``manifest``:
    the corpus's, which says whether it was imported (see the module notes)."""
    E = gx.expectations
    min_nonempty = 1.0 - settings.data.max_empty_gold_share
    imported = bool(manifest) and manifest.get("source") == "import"
    parts = list(SPLITS)
    if imported:  # no dataset may have given a test set, nor (evaluation only) a train set
        evaluation_only = (manifest.get("train_draw") or {}).get("evaluation_only", False)
        parts = [s for s in SPLITS if (s != "test" or manifest.get("splits", {}).get("test", {}).get("examples"))
                 and (s != "train" or not evaluation_only)]
    timeout = settings.data.gold_timeout_s
    if imported:
        max_failing = settings.data.max_failing_gold_share
        executes = (_Check(f"at most {max_failing:.0%} of gold SQL fails to execute within {timeout:g} s",
                           "gold_executes_share"),
                    E.ExpectColumnMeanToBeBetween(column="gold_executes_share", min_value=1.0 - max_failing,
                                                  max_value=1.0))
    else:
        executes = (_Check(f"gold SQL executes within {timeout:g} s", "gold_executes"),
                    E.ExpectColumnValuesToBeInSet(column="gold_executes", value_set=[True]))
    specs: list[tuple[_Check, Any]] = [
        (_Check(f"required field '{f}' is present", f), E.ExpectColumnValuesToNotBeNull(column=f))
        for f in REQUIRED_FIELDS
    ]
    specs += [
        (_Check("records carry only Example fields", "extra_fields"),
         E.ExpectColumnValuesToBeNull(column="extra_fields")),
        (_Check("every split has examples", "part", offender_column=""),
         E.ExpectColumnDistinctValuesToContainSet(column="part", value_set=parts)),
        (_Check("ids are unique", "id"), E.ExpectColumnValuesToBeUnique(column="id")),
        (_Check(f"hardness is one of {', '.join(HARDNESS_LEVELS)}", "hardness"),
         E.ExpectColumnValuesToBeInSet(column="hardness", value_set=list(HARDNESS_LEVELS))),
        (_Check("database file exists", "db_exists"),
         E.ExpectColumnValuesToBeInSet(column="db_exists", value_set=[True])),
        (_Check("gold SQL parses", "gold_parses"),
         E.ExpectColumnValuesToBeInSet(column="gold_parses", value_set=[True])),
        executes,
        (_Check(f"gold results have at most sandbox.max_rows ({settings.sandbox.max_rows:,}) rows "
                "(else no answer can be judged: raise sandbox.max_rows or fix the question)", "gold_fits_max_rows"),
         E.ExpectColumnValuesToBeInSet(column="gold_fits_max_rows", value_set=[True])),
        (_Check(f"semantics is one of {', '.join(SEMANTICS)}", "semantics"),
         E.ExpectColumnValuesToBeInSet(column="semantics", value_set=list(SEMANTICS))),
        (_Check(f"at least {min_nonempty:.0%} of gold results are non-empty", "gold_nonempty"),
         E.ExpectColumnMeanToBeBetween(column="gold_nonempty", min_value=min_nonempty, max_value=1.0)),
        (_Check("splits are disjoint by database", "db_split_count", offender_column="db_id"),
         E.ExpectColumnValuesToBeInSet(column="db_split_count", value_set=[1.0])),
        (_Check("variants use no train database", "variant_db_in_train", offender_column="db_id"),
         E.ExpectColumnValuesToBeInSet(column="variant_db_in_train", value_set=[False])),
        (_Check("in-domain examples use train databases", "indomain_db_in_train", offender_column="db_id"),
         E.ExpectColumnValuesToBeInSet(column="indomain_db_in_train", value_set=[True])),
        (_Check("in-domain examples repeat no train gold SQL or question", "indomain_repeats_train"),
         E.ExpectColumnValuesToBeInSet(column="indomain_repeats_train", value_set=[False])),
    ]
    if _realism(manifest):
        specs += _realism_specs(E, settings)
    suite = gx.ExpectationSuite(name="progress_sql_corpus")
    for check, expectation in specs:
        expectation.meta = {"name": check.name}
        suite.add_expectation(expectation)
    return suite, [check for check, _ in specs]


def _realism_specs(E: Any, settings: Settings) -> list[tuple[_Check, Any]]:
    """The bundled corpus's realism checks (module notes)."""
    most = settings.data.max_tables_named_share
    return [
        (_Check("dev and test share no family (vocabulary) with another split", "family_split_count",
                offender_column="db_id"),
         E.ExpectColumnValuesToBeInSet(column="family_split_count", value_set=[1.0])),
        (_Check("table and column names are plain identifiers (a gold quotes none)", "names_plain",
                offender_column="db_id"),
         E.ExpectColumnValuesToBeInSet(column="names_plain", value_set=[True])),
        (_Check("every text a gold compares is written in its question or evidence", "values_in_question"),
         E.ExpectColumnValuesToBeInSet(column="values_in_question", value_set=[True])),
        (_Check(f"at most {most:.0%} of questions name every table their gold reads", "gold_tables_named"),
         E.ExpectColumnMeanToBeBetween(column="gold_tables_named", min_value=0.0, max_value=most)),
    ]


@lru_cache(maxsize=1)
def _great_expectations() -> tuple[Any, Any]:
    """GE and a batch definition for in-memory DataFrames, made once per process.

    Imported here, not at module level: importing GE takes seconds, and only this stage needs it.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no usage statistics sent anywhere
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch_definition = (
        context.data_sources.add_pandas("progress_sql_corpus")
        .add_dataframe_asset("examples")
        .add_batch_definition_whole_dataframe("all_examples")
    )
    return gx, batch_definition


def _offenders(check: _Check, bad: pd.DataFrame, df: pd.DataFrame) -> tuple[str, ...]:
    """A few offending ids (or databases, with the parts they occur in) for a failure message."""
    if check.offender_column == "db_id":
        names = []
        # The split check counts train/dev/test only, so only those are named for it.
        scope = df[~df["is_variant"]] if check.column in ("db_split_count", "family_split_count") else df
        for db in dict.fromkeys(bad["db_id"]):
            parts = dict.fromkeys(scope.loc[scope["db_id"] == db, "part"])
            names.append(f"{db} in {'+'.join(parts)}")
    elif check.column == "gold_executes":
        names = [f"{i} ({str(err).split(':')[0]})" for i, err in zip(bad["id"], bad["gold_error"])]
    else:
        names = [str(v) for v in dict.fromkeys(bad[check.offender_column])]
    return tuple(names[:_SHOWN_OFFENDERS])


def _outcome(check: _Check, result: Any, df: pd.DataFrame) -> ExpectationOutcome:
    config = result.expectation_config
    res = result.result or {}
    if result.exception_info and result.exception_info.get("raised_exception"):
        observed = f"could not be evaluated ({result.exception_info.get('exception_message')})"
        return ExpectationOutcome(check.name, config.type, check.column, False, observed)
    offenders: tuple[str, ...] = ()
    if "unexpected_count" in res:
        observed = f"{res['unexpected_count']} of {res.get('element_count', len(df))} rows violate it"
        if not result.success:
            offenders = _offenders(check, df.loc[list(res.get("partial_unexpected_index_list") or [])], df)
    elif check.column == "part":
        missing = res.get("partial_missing_list") or []
        observed = f"missing: {', '.join(map(str, missing))}" if missing else "all present"
    elif check.column == "gold_executes_share":  # an imported corpus: failing golds within a share
        failing = df[~df["gold_executes"]]
        observed = f"{len(failing)} of {len(df)} rows fail"
        offenders = tuple(f"{i} ({str(e).split(':')[0]})" for i, e in
                          zip(failing["id"][:_SHOWN_OFFENDERS], failing["gold_error"][:_SHOWN_OFFENDERS]))
    elif check.column == "gold_tables_named":
        mean = res.get("observed_value")
        observed = "no question checked" if mean is None or pd.isna(mean) else f"share {float(mean):.3f}"
    else:  # the non-empty share
        mean = res.get("observed_value")
        observed = "no gold executed" if mean is None or pd.isna(mean) else f"share {float(mean):.3f}"
        if not result.success:
            empty = df.loc[df[check.column] == 0.0, "id"].dropna()
            offenders = tuple(str(v) for v in empty[:_SHOWN_OFFENDERS])
            observed += f", {len(empty)} empty"
    return ExpectationOutcome(check.name, config.type, check.column, bool(result.success), observed, offenders)


FILES_MATCH = "files match manifest.json"
DATABASES_INTACT = "databases are intact SQLite files"


def _integrity_outcomes(layout: CorpusLayout) -> list[ExpectationOutcome]:
    """The corpus against its manifest at full depth (database hashes too), as two outcomes
    beside the suite's: its listed files, its databases; the offenders name the files."""
    damage = corpus_damage(layout.root, full=True, fingerprint=database_fingerprint)
    listed = layout.manifest.is_file()
    outcomes = []
    for kind, name in (("file", FILES_MATCH), ("database", DATABASES_INTACT)):
        bad = [d for d in damage if d.kind == kind]
        if bad:
            observed = f"{len(bad)} damaged"
        elif not listed:
            observed = "no manifest.json: not checked" if kind == "file" else "SQLite header and schema read"
        else:
            observed = "all as manifest.json lists them"
        outcomes.append(ExpectationOutcome(name, "corpus_integrity", f"{kind}s", not bad, observed,
                                           tuple(str(d) for d in bad[:_SHOWN_OFFENDERS])))
    return outcomes


def validate_corpus(corpus_dir: Path, settings: Settings, report_dir: Path) -> ValidationReport:
    """Run the GE suite over the corpus at ``corpus_dir``; write validation.json/.md to ``report_dir``.

    A missing or unreadable split file raises CorpusError naming it; everything else that is
    wrong with the corpus shows up as a failed expectation in the returned report.
    """
    corpus_dir = Path(corpus_dir)
    layout = CorpusLayout(corpus_dir)
    integrity = _integrity_outcomes(layout)
    df = corpus_frame(corpus_dir, settings)
    manifest = _read_json(layout.manifest) if layout.manifest.is_file() else None
    if _realism(manifest):
        _add_realism_columns(df, layout, manifest)
    imported = None
    if manifest and manifest.get("source") == "import":
        imported = _read_json(layout.import_report) if layout.import_report.is_file() else None
        if imported is None:
            raise CorpusError(f"{layout.import_report}: file not found (the manifest says the corpus was imported)")
    gx, batch_definition = _great_expectations()
    suite, checks = _suite(gx, settings, manifest)
    batch = batch_definition.get_batch(batch_parameters={"dataframe": df})
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 20})
    by_name = {r.expectation_config.meta["name"]: r for r in result.results}
    outcomes = integrity + [_outcome(check, by_name[check.name], df) for check in checks]
    report = ValidationReport(
        corpus_dir=str(corpus_dir),
        success=bool(result.success) and all(o.success for o in integrity),
        outcomes=outcomes,
        rows={part: int(n) for part in (*SPLITS, INDOMAIN, *VARIANTS)
              if (n := (df["part"] == part).sum()) or part in SPLITS},
        thresholds={
            "max_empty_gold_share": settings.data.max_empty_gold_share,
            "gold_timeout_s": settings.data.gold_timeout_s,
            **({"max_failing_gold_share": settings.data.max_failing_gold_share} if imported is not None else {}),
        },
        ge_result=result.to_json_dict(),
        imported=imported,
    )
    report.write(Path(report_dir))
    return report
