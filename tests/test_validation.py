"""The Great Expectations suite over a corpus: a small valid corpus built here by hand (real
SQLite databases from Spider schemas) passes; each injected defect fails the expectation that
names it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from progress_sql.params import Settings, settings_from_dict
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, write_jsonl
from progress_sql.corpus.schema import create_database, read_tables_json
from progress_sql.data.validation import corpus_frame, validate_corpus
from progress_sql.sql import hardness

from conftest import SPIDER_ROWS as ROWS

# split → database, [(question, gold)]: every gold returns rows on the fixture data.
SPLIT_GOLDS = {
    "train": ("concert_singer", [
        ("How many singers are there?", "SELECT count(*) FROM singer"),
        ("Singers by age, oldest first?", "SELECT name, country, age FROM singer ORDER BY age DESC"),
        ("Age statistics of French singers?", "SELECT avg(age), min(age), max(age) FROM singer WHERE country = 'France'"),
        ("Countries of singers over 20?", "SELECT DISTINCT country FROM singer WHERE age > 20"),
        ("Stadiums for more than 11000?", "SELECT name FROM stadium WHERE capacity > 11000"),
        ("Concerts in 2014 or 2015?", "SELECT count(*) FROM concert WHERE year = 2014 OR year = 2015"),
        ("Singers who performed?",
         "SELECT T2.name FROM singer_in_concert AS T1 JOIN singer AS T2 ON T1.singer_id = T2.singer_id"),
        ("Singers per country?", "SELECT country, count(*) FROM singer GROUP BY country"),
        ("Songs of older than average singers?", "SELECT song_name FROM singer WHERE age > (SELECT avg(age) FROM singer)"),
        ("Largest stadium?", "SELECT name, capacity FROM stadium ORDER BY capacity DESC LIMIT 1"),
    ]),
    "dev": ("pets_1", [
        ("Pets heavier than 10?", "SELECT count(*) FROM pets WHERE weight > 10"),
        ("Pet types?", "SELECT DISTINCT pettype FROM pets"),
        ("Heaviest of each type?", "SELECT max(weight), petType FROM pets GROUP BY petType"),
        ("Who owns a dog?", "SELECT T1.Fname FROM student AS T1 JOIN has_pet AS T2 ON T1.stuid = T2.stuid "
                            "JOIN pets AS T3 ON T3.petid = T2.petid WHERE T3.pettype = 'dog'"),
        ("Students without pets?", "SELECT stuid FROM student EXCEPT SELECT T1.stuid FROM student AS T1 "
                                   "JOIN has_pet AS T2 ON T1.stuid = T2.stuid"),
    ]),
    "test": ("perpetrator", [
        ("People by height?", "SELECT name FROM people ORDER BY height DESC"),
        ("How many perpetrators?", "SELECT count(*) FROM perpetrator"),
        ("Who killed more than 10?", "SELECT T1.name FROM people AS T1 JOIN perpetrator AS T2 "
                                     "ON T1.people_id = T2.people_id WHERE T2.killed > 10"),
        ("Home towns of heavy people?", 'SELECT "Home Town" FROM people WHERE weight > 190'),
    ]),
}
# in-domain: new questions on the train database (no train gold or question repeated)
INDOMAIN_GOLDS = ("concert_singer", [
    ("Youngest singer?", "SELECT name FROM singer ORDER BY age LIMIT 1"),
    ("Stadiums by capacity?", "SELECT name FROM stadium ORDER BY capacity DESC"),
])
# variant → (split, index of the original, reworded question)
VARIANT_OF = {
    "syn": [("dev", 0, "Animals heavier than 10?"), ("dev", 1, "Kinds of animals?")],
    "realistic": [("dev", 3, "Who has a dog?")],
    "dk": [("test", 2, "Which perpetrator caused the most deaths over ten?")],
}
RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def _settings(**overrides) -> Settings:
    return settings_from_dict({}, overrides={f"data.{k}": v for k, v in overrides.items()})


@pytest.fixture(scope="session")
def valid_corpus(tmp_path_factory, conformance: Path) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    layout = CorpusLayout(root)
    entries = [e for e in json.loads((conformance / "tables.json").read_text()) if e["db_id"] in ROWS]
    layout.tables_json.write_text(json.dumps(entries))
    for db_id, schema in read_tables_json(layout.tables_json).items():
        create_database(schema, layout.database(db_id), rows=ROWS[db_id])
    examples: dict[str, list[Example]] = {}
    for split, (db_id, golds) in SPLIT_GOLDS.items():
        examples[split] = [Example(f"{split}-{i:03d}", db_id, q, sql, hardness(sql)) for i, (q, sql) in enumerate(golds)]
        write_jsonl(layout.split(split), examples[split])
    db_id, golds = INDOMAIN_GOLDS
    write_jsonl(layout.split("indomain"),
                [Example(f"indomain-{i:03d}", db_id, q, sql, hardness(sql)) for i, (q, sql) in enumerate(golds)])
    for variant, picks in VARIANT_OF.items():
        rows = []
        for split, i, question in picks:
            original = examples[split][i]
            rows.append(Example(f"{original.id}-{variant}", original.db_id, question, original.gold_sql,
                                original.hardness, meta={"original_id": original.id}))
        write_jsonl(layout.variant(variant), rows)
    return root


@pytest.fixture()
def corpus(tmp_path: Path, valid_corpus: Path) -> Path:
    """A private copy of the valid corpus, to damage."""
    return Path(shutil.copytree(valid_corpus, tmp_path / "corpus"))


def _edit(path: Path, change: Callable[[list[dict]], None]) -> None:
    """Rewrite a JSONL file through ``change``, which edits the list of records in place."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    change(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _failed(report) -> set[str]:
    return {o.name for o in report.outcomes if not o.success}


# ----------------------------------------------------------------------------- valid corpus
def test_valid_corpus_passes_and_reports(valid_corpus, tmp_path):
    report = validate_corpus(valid_corpus, _settings(), tmp_path / "reports")
    assert report.failures == []
    assert report.success
    assert report.rows == {"train": 10, "dev": 5, "test": 4, "indomain": 2, "syn": 2, "realistic": 1, "dk": 1}
    names = [o.name for o in report.outcomes]
    for expected in ("in-domain examples use train databases", "in-domain examples repeat no train gold SQL or question",
                     "ids are unique", "gold SQL parses", "gold SQL executes within 2 s",
                     "at least 95% of gold results are non-empty", "splits are disjoint by database",
                     "hardness is one of easy, medium, hard, extra", "required field 'question' is present"):
        assert expected in names

    saved = json.loads((tmp_path / "reports/validation.json").read_text())
    assert saved["success"] is True and saved["failures"] == []
    assert len(saved["expectations"]) == len(report.outcomes)
    # GE's own validation result travels with the report: the checks really ran in GE.
    ge_types = {r["expectation_config"]["type"] for r in saved["great_expectations"]["results"]}
    assert {"expect_column_values_to_be_unique", "expect_column_mean_to_be_between",
            "expect_column_values_to_not_be_null", "expect_column_values_to_be_in_set"} <= ge_types
    summary = (tmp_path / "reports/validation.md").read_text()
    assert summary == report.summary()
    assert summary.startswith("# Corpus validation: PASSED")
    assert "| ids are unique | ok |" in summary


def test_corpus_frame_derived_columns(valid_corpus):
    df = corpus_frame(valid_corpus, _settings())
    assert len(df) == 25
    assert df["gold_parses"].all() and df["gold_executes"].all() and df["db_exists"].all()
    assert (df["gold_nonempty"] == 1.0).all()
    indomain = df["part"] == "indomain"
    main = ~df["is_variant"] & ~indomain
    assert (df.loc[main, "db_split_count"] == 1.0).all()
    # variants derive from dev/test, in-domain shares train's databases: neither is counted
    assert df.loc[~main, "db_split_count"].isna().all()
    assert df.loc[df["is_variant"], "variant_db_in_train"].tolist() == [False] * 4
    assert df.loc[~df["is_variant"], "variant_db_in_train"].isna().all()
    assert df.loc[indomain, "indomain_db_in_train"].tolist() == [True, True]
    assert df.loc[indomain, "indomain_repeats_train"].tolist() == [False, False]
    assert df.loc[~indomain, ["indomain_db_in_train", "indomain_repeats_train"]].isna().all().all()


# ----------------------------------------------------------------------------- injected defects
def _duplicate_id(c: Path) -> None:
    _edit(CorpusLayout(c).split("train"), lambda rs: rs[2].update(id=rs[1]["id"]))


def _unparsable_gold(c: Path) -> None:
    _edit(CorpusLayout(c).split("dev"), lambda rs: rs[2].update(gold_sql="SELECT max(weight FROM pets GROUP"))


def _empty_golds(c: Path) -> None:
    def change(rs):
        for r in rs[:3]:  # 3 of 25 rows return nothing: 12% > 5%
            r["gold_sql"] = "SELECT name FROM singer WHERE age > 100"
    _edit(CorpusLayout(c).split("train"), change)


def _dev_database_in_train(c: Path) -> None:
    _edit(CorpusLayout(c).split("train"), lambda rs: rs.append(
        dict(rs[0], id="train-leak", db_id="pets_1", gold_sql="SELECT count(*) FROM pets", question="How many pets?")))


def _null_question(c: Path) -> None:
    _edit(CorpusLayout(c).split("test"), lambda rs: rs[1].update(question=None))


def _blank_gold(c: Path) -> None:
    _edit(CorpusLayout(c).split("test"), lambda rs: rs[0].update(gold_sql="   "))


def _bad_hardness(c: Path) -> None:
    _edit(CorpusLayout(c).split("dev"), lambda rs: rs[0].update(hardness="trivial"))


def _runaway_gold(c: Path) -> None:
    _edit(CorpusLayout(c).split("test"), lambda rs: rs[1].update(gold_sql=RUNAWAY))


def _missing_database(c: Path) -> None:
    CorpusLayout(c).database("perpetrator").unlink()


def _variant_on_train_database(c: Path) -> None:
    _edit(CorpusLayout(c).variant("syn"), lambda rs: rs.append(
        dict(rs[0], id="train-000-syn", db_id="concert_singer", gold_sql="SELECT count(*) FROM singer")))


def _extra_field(c: Path) -> None:
    _edit(CorpusLayout(c).split("dev"), lambda rs: rs[4].update(answer="1003"))


def _indomain_repeats_a_train_gold(c: Path) -> None:
    _edit(CorpusLayout(c).split("indomain"), lambda rs: rs[0].update(gold_sql="SELECT count(*) FROM singer"))


def _indomain_repeats_a_train_question(c: Path) -> None:  # case and spacing do not hide it
    _edit(CorpusLayout(c).split("indomain"), lambda rs: rs[1].update(question="how many  singers are there?"))


def _indomain_on_a_dev_database(c: Path) -> None:
    _edit(CorpusLayout(c).split("indomain"), lambda rs: rs.append(
        dict(rs[0], id="indomain-leak", db_id="pets_1", gold_sql="SELECT count(*) FROM pets", question="How many pets?")))


def _empty_test_split(c: Path) -> None:
    CorpusLayout(c).split("test").write_text("")


TOO_LARGE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10001) SELECT x FROM c"
FITS_MAX_ROWS = ("gold results have at most sandbox.max_rows ({:,}) rows (else no answer can be judged: raise "
                 "sandbox.max_rows or fix the question)")


def _gold_past_max_rows(c: Path) -> None:  # 10,001 rows: one more than the default sandbox.max_rows
    _edit(CorpusLayout(c).split("test"), lambda rs: rs[1].update(gold_sql=TOO_LARGE))


@pytest.mark.parametrize(
    "damage, failed, offender",
    [
        (_duplicate_id, {"ids are unique"}, "train-001"),
        (_unparsable_gold, {"gold SQL parses", "gold SQL executes within 2 s"}, "dev-002"),
        (_empty_golds, {"at least 95% of gold results are non-empty"}, "train-000"),
        # pets_1 is now a train database, so the dev variants on it leak too
        (_dev_database_in_train, {"splits are disjoint by database", "variants use no train database"},
         "pets_1 in train+dev"),
        (_null_question, {"required field 'question' is present"}, "test-001"),
        (_blank_gold, {"required field 'gold_sql' is present", "gold SQL parses", "gold SQL executes within 2 s"},
         "test-000"),
        (_bad_hardness, {"hardness is one of easy, medium, hard, extra"}, "dev-000"),
        (_missing_database, {"database file exists", "gold SQL executes within 2 s", "databases are intact SQLite files"},
         "test-003 (no_database)"),
        (_variant_on_train_database, {"variants use no train database"}, "concert_singer in train+indomain+syn"),
        (_extra_field, {"records carry only Example fields"}, "dev-004"),
        (_empty_test_split, {"every split has examples"}, "missing: test"),
        (_gold_past_max_rows, {FITS_MAX_ROWS.format(10_000)}, "test-001"),
        (_indomain_repeats_a_train_gold, {"in-domain examples repeat no train gold SQL or question"}, "indomain-000"),
        (_indomain_repeats_a_train_question, {"in-domain examples repeat no train gold SQL or question"},
         "indomain-001"),
        (_indomain_on_a_dev_database, {"in-domain examples use train databases"}, "pets_1 in dev+indomain"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_each_defect_fails_its_expectation(corpus, tmp_path, damage, failed, offender):
    damage(corpus)
    report = validate_corpus(corpus, _settings(), tmp_path / "reports")
    assert not report.success
    assert _failed(report) == failed
    messages = [f for f in report.failures if f.startswith(tuple(failed))]
    assert len(messages) == len(failed) == len(report.failures)
    assert any(offender in m for m in messages), report.failures
    saved = json.loads((tmp_path / "reports/validation.json").read_text())
    assert saved["success"] is False and saved["failures"] == report.failures
    summary = (tmp_path / "reports/validation.md").read_text()
    assert summary.startswith("# Corpus validation: FAILED")
    assert all(f"- {f}" in summary for f in report.failures)


def test_gold_that_times_out(corpus, tmp_path):
    _runaway_gold(corpus)
    report = validate_corpus(corpus, _settings(gold_timeout_s=0.3), tmp_path)
    assert _failed(report) == {"gold SQL executes within 0.3 s"}
    assert "test-001 (timeout)" in report.failures[0]


def test_data_validate_flags_golds_past_sandbox_max_rows(corpus, tmp_path):
    """Issue 49: such a gold makes every answer wrong; ``progress-sql data validate`` (the real
    command) names the questions before training or evaluation counts them."""
    params = tmp_path / "params.yaml"
    params.write_text("tracking:\n  enabled: false\n")
    out = subprocess.run(["progress-sql", "data", "validate", "--corpus", str(corpus), "--report-dir",
                          str(tmp_path / "reports"), "--params", str(params), "--set", "sandbox.max_rows=1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    # the fixture's tables hold a few rows each: the 11 golds that list more than one
    assert out.stderr.splitlines() == [f"failed expectation: {FITS_MAX_ROWS.format(1)}: 11 of 25 rows violate it "
                                       "(e.g. train-001, train-003, train-006, train-007, dev-001)"]


def test_empty_share_threshold_comes_from_settings(corpus, tmp_path):
    _edit(CorpusLayout(corpus).split("dev"), lambda rs: rs[1].update(gold_sql="SELECT pettype FROM pets WHERE 0"))
    assert validate_corpus(corpus, _settings(), tmp_path).success  # 1 of 25 empty: 4% ≤ 5%
    # The build may keep no empty golds either: empty_gold_share never exceeds the threshold.
    strict = validate_corpus(corpus, _settings(max_empty_gold_share=0.0, empty_gold_share=0.0), tmp_path)
    assert _failed(strict) == {"at least 100% of gold results are non-empty"}
    assert "share 0.960, 1 empty (e.g. dev-001)" in strict.failures[0]


def test_variants_and_the_indomain_split_are_optional(corpus, tmp_path):
    shutil.rmtree(corpus / "variants")
    CorpusLayout(corpus).split("indomain").write_text("")  # an imported corpus: written empty
    report = validate_corpus(corpus, _settings(), tmp_path)
    assert report.success and report.rows == {"train": 10, "dev": 5, "test": 4}
    CorpusLayout(corpus).split("indomain").unlink()  # a corpus built before the split existed
    assert validate_corpus(corpus, _settings(), tmp_path).success


def test_unreadable_files_raise_corpus_error(corpus, tmp_path):
    layout = CorpusLayout(corpus)
    layout.split("dev").write_text(layout.split("dev").read_text() + "{not json\n")
    with pytest.raises(CorpusError, match=re.escape(f"{layout.split('dev')}:6: not valid JSON")):
        validate_corpus(corpus, _settings(), tmp_path)
    layout.split("dev").write_text('["a list"]\n')
    with pytest.raises(CorpusError, match=r"dev\.jsonl:1: expected a JSON object"):
        validate_corpus(corpus, _settings(), tmp_path)
    layout.split("train").unlink()
    with pytest.raises(CorpusError, match=re.escape(f"{layout.split('train')}: file not found")):
        validate_corpus(corpus, _settings(), tmp_path)
