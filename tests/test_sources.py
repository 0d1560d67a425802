"""The dataset sources (``progress_sql.sources``): the readers of downloaded Spider, BIRD,
SynSQL-2.5M and Spider's variants, on tiny datasets built here in their exact release formats
(real JSON files, real SQLite databases from Spider schemas); the registry, which the settings,
the ``data import`` options and the import are composed from; and the mix of a train draw."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sqlite3
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import typer

from progress_sql import sources
from progress_sql.cli import app
from progress_sql.params import DataSettings, default_settings
from progress_sql.data.mix import plan_mix
from progress_sql.sources import iter_json_array, reading
from progress_sql.sources.bird import bird_database_path, load_bird
from progress_sql.sources.spider import load_spider, spider_database_path, spider_tables_path
from progress_sql.sources.spider_variants import load_spider_variant
from progress_sql.sources.synsql import count_synsql_records, load_synsql, synsql_database_path
from progress_sql.corpus.records import CorpusError, Example
from progress_sql.corpus.schema import create_database, read_tables_json
from progress_sql.sql import hardness

from conftest import REPO
from conftest import SPIDER_ROWS as ROWS


BAD_SQL = "SELECT name FROM singer WHERE (age >"


@pytest.fixture(scope="module")
def spider_tables(conformance: Path) -> dict:
    """The raw tables.json entries of the databases the fixtures use."""
    entries = json.loads((conformance / "tables.json").read_text())
    return {e["db_id"]: e for e in entries if e["db_id"] in ROWS}


def _write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))
    return path


def _databases(folder: Path, spider_tables: dict, db_ids, tables_file: Path) -> None:
    _write_json(tables_file, [spider_tables[d] for d in db_ids])
    schemas = read_tables_json(tables_file)
    for db_id in db_ids:
        create_database(schemas[db_id], folder / db_id / f"{db_id}.sqlite", rows=ROWS[db_id])


def _spider_record(db_id: str, query: str, question: str) -> dict:
    # Every field of a Spider release record; the loader needs only three of them.
    return {
        "db_id": db_id,
        "query": query,
        "query_toks": query.split(),
        "query_toks_no_value": query.lower().split(),
        "question": question,
        "question_toks": question.split(),
        "sql": {"select": [False, []], "from": {"table_units": [], "conds": []}, "where": [],
                "groupBy": [], "having": [], "orderBy": [], "limit": None,
                "intersect": None, "union": None, "except": None},
    }


SPIDER_TRAIN = [
    ("concert_singer", "SELECT count(*) FROM singer", "How many singers do we have?"),
    ("concert_singer", "SELECT name ,  country ,  age FROM singer ORDER BY age DESC",
     "Show name, country, age of singers by age."),
    ("concert_singer", BAD_SQL, "A question whose gold SQL is broken."),
    ("concert_singer", "SELECT T2.name FROM singer_in_concert AS T1 JOIN singer AS T2 ON T1.singer_id = T2.singer_id "
                       "WHERE T1.concert_id IN (SELECT concert_id FROM concert WHERE YEAR = 2014)", "Singers in 2014 concerts?"),
]
SPIDER_OTHERS = [("pets_1", "SELECT count(*) FROM pets WHERE weight  >  10", "How many pets weigh more than 10?")]
SPIDER_DEV = [
    ("pets_1", "SELECT DISTINCT pettype FROM pets", "What types of pets are there?"),
    ("pets_1", "SELECT max(weight) ,  petType FROM pets GROUP BY petType", "Heaviest pet of each type?"),
]


@pytest.fixture()
def spider_root(tmp_path: Path, spider_tables: dict) -> Path:
    root = tmp_path / "spider"
    _databases(root / "database", spider_tables, ["concert_singer", "pets_1"], root / "tables.json")
    _databases(root / "test_database", spider_tables, ["perpetrator"], root / "test_tables.json")
    _write_json(root / "train_spider.json", [_spider_record(*r) for r in SPIDER_TRAIN])
    _write_json(root / "train_others.json", [_spider_record(*r) for r in SPIDER_OTHERS])
    _write_json(root / "dev.json", [_spider_record(*r) for r in SPIDER_DEV])
    _write_json(root / "test.json", [_spider_record("perpetrator", "SELECT name FROM people", "Names of people?")])
    return root


# ----------------------------------------------------------------------------- Spider
def test_spider_train_reads_both_files_and_skips_unparsable_gold(spider_root, caplog):
    with caplog.at_level(logging.WARNING):
        loaded = load_spider(spider_root, "train")
    assert [e.id for e in loaded.examples] == ["spider-train-000000", "spider-train-000001",
                                               "spider-train-000003", "spider-train-000004"]
    assert [s.index for s in loaded.skipped] == [2]
    assert loaded.skipped[0].id == "spider-train-000002"
    assert loaded.skipped[0].reason.startswith("gold does not parse")
    assert loaded.skip_counts() == {"gold does not parse": 1}
    assert "4 examples" in loaded.summary() and "1 skipped (gold does not parse: 1)" in loaded.summary()
    assert loaded.summary() in caplog.text  # the skip is reported, not silent

    first = loaded.examples[0]
    assert (first.db_id, first.question, first.gold_sql, first.source) == (
        "concert_singer", "How many singers do we have?", "SELECT count(*) FROM singer", "spider")
    assert first.hardness == "easy" and first.evidence == "" and first.difficulty == ""
    for record in loaded.records:
        assert record.example.hardness == hardness(record.example.gold_sql)
        assert record.db_path == spider_database_path(spider_root, record.example.db_id, "train")
        assert record.tables_json == spider_root / "tables.json"
    # what the corpus keeps of the record: its file and its position; the source's paths stay out
    assert loaded.examples[-1].meta == {"file": "train_others.json", "source_index": 4}
    assert loaded.records[-1].index == 4
    assert loaded.records[-1].where == f"{spider_root / 'train_others.json'}: record 0"
    # The database path is real: the gold runs on it.
    con = sqlite3.connect(loaded.records[1].db_path)
    assert con.execute(loaded.examples[1].gold_sql).fetchall()[0] == ("Joe Sharp", "Netherlands", 52)
    con.close()


def test_spider_dev_and_test_layouts(spider_root):
    dev = load_spider(spider_root, "dev")
    assert [e.id for e in dev.examples] == ["spider-dev-000000", "spider-dev-000001"]
    assert not dev.skipped
    test = load_spider(spider_root, "test")
    assert test.records[0].db_path == spider_root / "test_database/perpetrator/perpetrator.sqlite"
    assert spider_tables_path(spider_root, "test") == spider_root / "test_tables.json"
    with pytest.raises(ValueError, match="Spider split must be one of"):
        load_spider(spider_root, "validation")


def test_spider_train_others_is_optional(spider_root):
    (spider_root / "train_others.json").unlink()
    assert len(load_spider(spider_root, "train")) == 3


def test_spider_missing_database_is_skipped_and_counted(spider_root):
    (spider_root / "database/pets_1/pets_1.sqlite").unlink()
    dev = load_spider(spider_root, "dev")
    assert dev.examples == []
    assert dev.skip_counts() == {"database missing": 2}
    assert "pets_1.sqlite" in dev.skipped[0].reason


def test_spider_missing_files_are_named(spider_root):
    (spider_root / "dev.json").unlink()
    with pytest.raises(CorpusError, match=re.escape(f"{spider_root / 'dev.json'}: file not found")):
        load_spider(spider_root, "dev")
    for p in sorted((spider_root / "database").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (spider_root / "database").rmdir()
    with pytest.raises(CorpusError, match=re.escape(f"{spider_root / 'database'}: database folder not found")):
        load_spider(spider_root, "train")


def test_spider_record_missing_field_names_file_record_and_field(spider_root):
    records = [_spider_record(*r) for r in SPIDER_DEV]
    del records[1]["query"]
    _write_json(spider_root / "dev.json", records)
    with pytest.raises(CorpusError, match=re.escape(f"{spider_root / 'dev.json'}: record 1: field 'query' is missing")):
        load_spider(spider_root, "dev")
    records[1]["query"] = 42
    _write_json(spider_root / "dev.json", records)
    with pytest.raises(CorpusError, match="record 1: field 'query' must be a non-empty string"):
        load_spider(spider_root, "dev")
    _write_json(spider_root / "dev.json", [records[0], "not a record"])
    with pytest.raises(CorpusError, match="record 1: expected a JSON object, got str"):
        load_spider(spider_root, "dev")


def test_spider_malformed_json_names_line_and_column(spider_root):
    text = (spider_root / "dev.json").read_text().splitlines()
    text[3] = text[3].replace('": "', '" "', 1)  # drop a colon on line 4
    (spider_root / "dev.json").write_text("\n".join(text))
    with pytest.raises(CorpusError, match=re.escape(f"{spider_root / 'dev.json'}:4:") + r"\d+: not valid JSON \(Expecting ':'"):
        load_spider(spider_root, "dev")


# ----------------------------------------------------------------------------- BIRD
@pytest.fixture()
def bird_root(tmp_path: Path, spider_tables: dict) -> Path:
    root = tmp_path / "bird"
    _databases(root / "train/train_databases", spider_tables, ["concert_singer"], root / "train/train_tables.json")
    _databases(root / "dev/dev_databases", spider_tables, ["pets_1"], root / "dev/dev_tables.json")
    _write_json(root / "train/train.json", [
        {"db_id": "concert_singer", "question": "Which singers are older than 30?",
         "evidence": "older than 30 refers to Age > 30", "SQL": "SELECT Name FROM singer WHERE Age > 30"},
        {"db_id": "concert_singer", "question": "How many stadiums?", "evidence": "", "SQL": "SELECT COUNT(*) FROM stadium"},
    ])
    _write_json(root / "dev/dev.json", [
        {"question_id": 0, "db_id": "pets_1", "question": "Average weight of dogs?",
         "evidence": "dogs refers to PetType = 'dog'", "SQL": "SELECT AVG(weight) FROM Pets WHERE PetType = 'dog'",
         "difficulty": "simple"},
        {"question_id": 1, "db_id": "pets_1", "question": "Students with a cat and a dog?", "evidence": "",
         "SQL": "SELECT T1.Fname FROM Student AS T1 JOIN Has_Pet AS T2 ON T1.StuID = T2.StuID JOIN Pets AS T3 "
                "ON T3.PetID = T2.PetID WHERE T3.PetType = 'cat' INTERSECT SELECT T1.Fname FROM Student AS T1 "
                "JOIN Has_Pet AS T2 ON T1.StuID = T2.StuID JOIN Pets AS T3 ON T3.PetID = T2.PetID WHERE T3.PetType = 'dog'",
         "difficulty": "challenging"},
    ])
    return root


def test_bird_train_and_dev(bird_root):
    train = load_bird(bird_root, "train")
    assert [e.id for e in train.examples] == ["bird-train-000000", "bird-train-000001"]
    ex = train.examples[0]
    assert (ex.source, ex.evidence, ex.difficulty) == ("bird", "older than 30 refers to Age > 30", "")
    assert train.records[0].db_path == bird_database_path(bird_root, "train", "concert_singer")
    assert train.records[0].tables_json == bird_root / "train/train_tables.json"
    assert ex.meta == {"source_index": 0}  # train records have no question_id
    dev = load_bird(bird_root, "dev")
    assert [e.difficulty for e in dev.examples] == ["simple", "challenging"]
    assert [e.meta["question_id"] for e in dev.examples] == [0, 1]
    assert [e.hardness for e in dev.examples] == [hardness(e.gold_sql) for e in dev.examples]
    assert dev.records[0].db_path.is_file()


def test_bird_split_folder_may_be_the_root(bird_root):
    assert len(load_bird(bird_root / "dev", "dev")) == 2  # e.g. the unpacked dev_20240627/


def test_bird_errors_name_file_and_field(bird_root):
    with pytest.raises(ValueError, match="BIRD split must be one of"):
        load_bird(bird_root, "test")
    (bird_root / "train/train_databases").rename(bird_root / "train/databases")
    with pytest.raises(CorpusError, match=r"train/train_databases: database folder not found"):
        load_bird(bird_root, "train")
    (bird_root / "train/train.json").unlink()
    with pytest.raises(CorpusError, match=re.escape(str(bird_root / "train/train.json")) + ": file not found"):
        load_bird(bird_root, "train")
    records = json.loads((bird_root / "dev/dev.json").read_text())
    records[0]["difficulty"] = "hard"
    _write_json(bird_root / "dev/dev.json", records)
    with pytest.raises(CorpusError, match=r"dev\.json: record 0: field 'difficulty' must be one of"):
        load_bird(bird_root, "dev")
    del records[0]["difficulty"], records[1]["SQL"]
    _write_json(bird_root / "dev/dev.json", records)
    with pytest.raises(CorpusError, match=r"dev\.json: record 1: field 'SQL' is missing"):
        load_bird(bird_root, "dev")
    records[1]["SQL"], records[1]["evidence"] = "SELECT 1", ["not", "text"]
    _write_json(bird_root / "dev/dev.json", records)
    with pytest.raises(CorpusError, match=r"record 1: field 'evidence' must be a string, got list"):
        load_bird(bird_root, "dev")


# ----------------------------------------------------------------------------- SynSQL
def _synsql_record(db_id: str, sql: str, question: str, knowledge: str = "") -> dict:
    return {
        "db_id": db_id,
        "sql_complexity": "Moderate",
        "question_style": "Formal",
        "question": question,
        "external_knowledge": knowledge,
        "cot": "To answer, count the rows of the table.",
        "sql": sql,
    }


@pytest.fixture()
def synsql_root(tmp_path: Path, spider_tables: dict) -> Path:
    root = tmp_path / "SynSQL-2.5M"
    _databases(root / "databases", spider_tables, ["perpetrator", "pets_1"], root / "tables.json")
    _write_json(root / "data.json", [
        _synsql_record("perpetrator", "SELECT Name FROM people WHERE Height > 6.35", "Who is taller than 6.35?",
                       knowledge="tall means Height > 6.35"),
        _synsql_record("pets_1", "SELECT COUNT(*) FROM Pets", "How many pets are there?"),
        _synsql_record("pets_1", "SELECT FROM", "Broken gold."),
        _synsql_record("pets_1", "SELECT PetType, COUNT(*) FROM Pets GROUP BY PetType", "Pets per type?"),
    ])
    return root


def test_synsql_fields_are_normalised(synsql_root):
    loaded = load_synsql(synsql_root)
    assert [e.id for e in loaded.examples] == ["synsql-0000000", "synsql-0000001", "synsql-0000003"]
    assert loaded.skip_counts() == {"gold does not parse": 1}
    ex = loaded.examples[0]
    assert (ex.source, ex.evidence, ex.difficulty) == ("synsql", "tall means Height > 6.35", "Moderate")
    assert ex.meta["question_style"] == "Formal" and ex.meta["cot"].startswith("To answer")
    assert loaded.records[0].db_path == synsql_database_path(synsql_root, "perpetrator")
    assert ex.hardness == hardness(ex.gold_sql)


def test_synsql_limit_reads_only_what_it_needs(synsql_root):
    # A broken tail is never reached when the limit is met before it: the file is streamed.
    data = synsql_root / "data.json"
    text = data.read_text().rstrip().rstrip("]") + ', {"db_id": "pets_1", "sql": oops}\n]'
    data.write_text(text)
    assert [e.id for e in load_synsql(synsql_root, limit=2).examples] == ["synsql-0000000", "synsql-0000001"]
    assert len(load_synsql(synsql_root, limit=3)) == 3  # the skipped record does not count
    assert len(load_synsql(synsql_root, limit=0)) == 0
    with pytest.raises(CorpusError, match=re.escape(str(data)) + r":\d+:\d+: not valid JSON"):
        load_synsql(synsql_root)
    with pytest.raises(ValueError, match="non-negative"):
        load_synsql(synsql_root, limit=-1)


def test_synsql_missing_parts(synsql_root):
    (synsql_root / "data.json").unlink()
    with pytest.raises(CorpusError, match=r"data\.json: file not found"):
        load_synsql(synsql_root)


# ----------------------------------------------------------------------------- streaming JSON
def test_iter_json_array_across_tiny_chunks(tmp_path, monkeypatch):
    records = [{"i": i, "text": "x" * (i * 7), "nested": {"n": [1.5, -2e3, None, True]}} for i in range(40)]
    path = _write_json(tmp_path / "data.json", records)
    monkeypatch.setattr(reading, "_CHUNK_CHARS", 5)
    assert [r for _, r in iter_json_array(path)] == records
    path.write_text("[1, 23, 456]")  # numbers cut by chunk boundaries
    assert [r for _, r in iter_json_array(path)] == [1, 23, 456]
    lines = json.dumps(records, indent=1).splitlines()
    bad_line = next(i for i, line in enumerate(lines) if '"i": 30' in line)
    lines[bad_line] = lines[bad_line].replace(":", "")
    path.write_text("\n".join(lines))
    with pytest.raises(CorpusError, match=rf":{bad_line + 1}:\d+: not valid JSON"):
        list(iter_json_array(path))


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty file"),
        ('{"a": 1}', "expected a JSON array"),
        ("[1, 2", "the array is not closed"),
        ("[1 2]", "expected ',' or ']'"),
        ("[1]\n[2]", "extra data after the array"),
        ('[{"a": "unterminated}]', "Unterminated string"),
    ],
)
def test_iter_json_array_errors(tmp_path, text, message):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(CorpusError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        list(iter_json_array(path))


def test_iter_json_array_empty_and_not_utf8(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(" [ ] \n")
    assert list(iter_json_array(path)) == []
    path.write_bytes(b'[{"a": "\xff\xfe"}]')
    with pytest.raises(CorpusError, match="not UTF-8"):
        list(iter_json_array(path))


# ----------------------------------------------------------------------------- mix
def _examples(source: str, n: int) -> list[Example]:
    return [Example(f"{source}-{i}", "db", f"q{i}", "SELECT 1", "easy", source=source) for i in range(n)]


def test_plan_mix_paper_shares():
    ratios = default_settings().data.mix
    plan = plan_mix({"bird": 9428, "spider": 8659, "synsql": 2_500_000}, ratios, default_settings().data.mix_total)
    assert plan == {"bird": 8000, "spider": 6000, "synsql": 6000}


def test_plan_mix_renormalises_and_fills_shortfalls(caplog):
    ratios = {"bird": 0.4, "spider": 0.3, "synsql": 0.3}
    assert plan_mix({"bird": 100, "spider": 100}, ratios, 70) == {"bird": 40, "spider": 30}
    # spider has fewer than its share (30): all 10 are taken, the others split the remaining 90 as 4:3
    assert plan_mix({"bird": 500, "spider": 10, "synsql": 500}, ratios, 100) == {"bird": 51, "spider": 10, "synsql": 39}
    # asking for more than exists takes everything
    assert plan_mix({"bird": 5, "spider": 3}, ratios, 100) == {"bird": 5, "spider": 3}
    # a zero ratio takes nothing, even when the others run short
    assert plan_mix({"bird": 5, "spider": 50}, {"bird": 1.0, "spider": 0.0}, 20) == {"bird": 5, "spider": 0}
    # shares always sum to the total (largest remainder)
    assert sum(plan_mix({"a": 99, "b": 99, "c": 99}, {"a": 1, "b": 1, "c": 1}, 10).values()) == 10


def test_plan_mix_rejects_bad_ratios():
    with pytest.raises(ValueError, match=r"no mix ratio for source\(s\) \['wikisql'\]"):
        plan_mix({"wikisql": 3}, {"bird": 1.0}, 2)
    with pytest.raises(ValueError, match="non-negative"):
        plan_mix({"bird": 3}, {"bird": -1.0}, 2)
    with pytest.raises(ValueError, match="ratio 0"):
        plan_mix({"bird": 3}, {"bird": 0.0}, 2)
    with pytest.raises(ValueError, match="total must be non-negative"):
        plan_mix({"bird": 3}, {"bird": 1.0}, -1)


def test_loaded_datasets_name_their_database_files(spider_root, bird_root, synsql_root):
    loaded = [*load_spider(spider_root, "train").records, *load_bird(bird_root, "train").records,
              *load_synsql(synsql_root).records]
    assert {r.example.source for r in loaded} == {"spider", "bird", "synsql"}
    assert all(r.db_path.is_file() for r in loaded)


# ----------------------------------------------------------------------------- for the import
def test_readers_name_the_record_they_skip_and_give_the_datasets_semantics(spider_root, bird_root, synsql_root):
    train = load_spider(spider_root, "train")
    assert train.skipped[0].where == f"{spider_root / 'train_spider.json'}: record 2"
    assert {e.semantics for e in train.examples} == {"spider"}
    assert {e.semantics for e in load_bird(bird_root, "dev").examples} == {"bird"}  # BIRD's EX: sets of rows
    assert {e.semantics for e in load_synsql(synsql_root).examples} == {"bird"}  # OmniSQL compares sets too


def test_synsql_indices_convert_only_the_chosen_records(synsql_root):
    assert count_synsql_records(synsql_root) == 4
    chosen = load_synsql(synsql_root, indices=[3, 0, 2])
    assert [r.index for r in chosen.records] == [e.meta["source_index"] for e in chosen.examples] == [0, 3]
    assert [s.index for s in chosen.skipped] == [2]  # record 2's gold does not parse
    assert load_synsql(synsql_root, indices=[]).examples == []


def test_spider_variants_read_their_published_files(spider_root, tmp_path):
    dev = [_spider_record(*r) for r in SPIDER_DEV]
    syn = [{"db_id": r["db_id"], "query": r["query"], "SpiderQuestion": r["question"],
            "SpiderSynQuestion": r["question"].replace("pets", "animals")} for r in dev]
    _write_json(tmp_path / "Spider-Syn" / "dev.json", syn)
    loaded = load_spider_variant(tmp_path / "Spider-Syn", "syn", spider_root)
    assert [e.id for e in loaded.examples] == ["spider-syn-000000", "spider-syn-000001"]
    assert loaded.examples[0].question == "What types of animals are there?"
    assert loaded.examples[0].meta["original_question"] == "What types of pets are there?"
    assert loaded.records[0].db_path == spider_database_path(spider_root, "pets_1")
    _write_json(tmp_path / "Spider-DK.json", dev[:1])
    assert load_spider_variant(tmp_path / "Spider-DK.json", "dk", spider_root).examples[0].meta["variant"] == "dk"
    # no Spider folder and no database/ beside the file: the record is skipped as database missing
    assert load_spider_variant(tmp_path / "Spider-DK.json", "dk").skip_counts() == {"database missing": 1}
    with pytest.raises(CorpusError, match="expected a file, or a folder holding spider-realistic.json"):
        load_spider_variant(tmp_path, "realistic", spider_root)


# ----------------------------------------------------------------------------- the registry
def test_the_settings_and_the_import_options_come_from_the_registry():
    fields = DataSettings.model_fields
    for source in sources.SOURCES:
        assert fields[source.setting].annotation is str and fields[source.setting].default == ""
    choices = {key: typing.get_args(typing.get_args(fields[key].annotation)[0]) for key in ("import_train", "import_eval")}
    assert choices == {"import_train": tuple(s.name for s in sources.with_train()),
                       "import_eval": tuple(s.name for s in sources.with_evaluation())}
    assert choices["import_train"][:3] == ("spider", "bird", "synsql") and choices["import_eval"][:2] == ("spider", "bird")
    assert default_settings().data.mix.model_dump() == {s.name: s.share for s in sources.with_train()}
    assert sources.VARIANTS == tuple(s.variant for s in sources.SOURCES if s.variant)
    assert sources.VARIANTS[:3] == ("syn", "realistic", "dk")
    command = typer.main.get_command(app).commands["data"].commands["import"]
    options = {param.opts[0]: param.help for param in command.params}
    assert all(options[f"--{s.option}"].endswith(f"(data.{s.setting})") for s in sources.SOURCES)
    with pytest.raises(KeyError, match="unknown dataset source 'wikisql'; known: spider, bird, synsql, spider_syn"):
        sources.get("wikisql")


def test_each_source_gives_its_sets_under_its_semantics(spider_root, bird_root, synsql_root):
    roots = {"spider": spider_root, "bird": bird_root, "synsql": synsql_root}
    for name, root in roots.items():
        source = sources.get(name)
        train = source.train(root)
        taken, _ = train.take(range(train.size))
        held_out = source.evaluation(root) if source.evaluation else {}
        records = [*taken.values(), *(r for loaded in held_out.values() for r in loaded.records)]
        assert records and {r.example.semantics for r in records} == {source.semantics}, name
    assert set(sources.get("spider").evaluation(spider_root)) == {"dev", "test"}
    assert set(sources.get("bird").evaluation(bird_root)) == {"dev"} and sources.get("synsql").evaluation is None
    # a set read whole: its positions are those of the records kept, and its skips come with it
    spider_train = sources.get("spider").train(spider_root)
    taken, load = spider_train.take([3, 0])
    assert load is None and [taken[p].example.id for p in (3, 0)] == ["spider-train-000004", "spider-train-000000"]
    assert spider_train.size == 4 and [s.index for s in spider_train.whole.skipped] == [2]
    # SynSQL's 4 records are counted, not read; a take converts only the asked positions
    synsql_train = sources.get("synsql").train(synsql_root)
    taken, load = synsql_train.take([3, 2])
    assert synsql_train.size == 4 and synsql_train.whole is None
    assert sorted(taken) == [3] and [s.index for s in load.skipped] == [2]  # record 2's gold does not parse


def test_a_registered_source_needs_no_other_change(bird_root, tmp_path):
    """A source added to ``SOURCES`` alone (here a second BIRD-shaped one) has its setting, its
    ``data import`` option, its share and its place in the import's manifest, and the project's
    params.yaml draws from it as it is (data.import_train / import_eval take every source)."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    code = f"""
import dataclasses, sys
from progress_sql import sources
new = dataclasses.replace(sources.get("bird"), name="toy_bird", about="a BIRD-shaped folder", share=0.5)
sources.SOURCES = (*sources.SOURCES, new)
sources._BY_NAME[new.name] = new
from typer.testing import CliRunner
from progress_sql.cli import app
result = CliRunner().invoke(app, ["data", "import", "--toy-bird", {str(bird_root)!r}, "--out", "corpus", "--no-progress",
                                  "--set", "data.import_sampling=shares", "--set", "data.mix_total=1"])
print(result.output)
sys.exit(result.exit_code)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((tmp_path / "corpus/manifest.json").read_text())
    assert manifest["datasets"] == {"toy_bird": str(bird_root)}
    assert manifest["settings"]["import_toy_bird"] == str(bird_root) and manifest["settings"]["mix"]["toy_bird"] == 0.5
    assert manifest["train_draw"]["planned"] == {"toy_bird": 1} and manifest["splits"]["dev"]["examples"] == 2
