"""Dataset import (``progress-sql data import``, ``data.source: import``) on Spider-, BIRD- and
SynSQL-shaped folders built here with the published key names and layouts (real SQLite files
from Spider schemas of the conformance ``tables.json``), then validate → one RL step → eval;
the Spider-shaped fixture from the conformance corpus (166 schemas, 322 real dev golds, rows
generated); bad input; the train draw; the per-dataset EX semantics in rewards and evaluation."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from progress_sql import envs, stages
from progress_sql.cli import app
from progress_sql.params import settings_from_dict
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, read_jsonl
from progress_sql.corpus.schema import create_database, schema_from_spider
from progress_sql.data.importing import import_corpus
from progress_sql.sql import hardness

from conftest import REPO, SPIDER_ROWS
from spider_conformance import literals, read_pairs, spider_rows  # generated rows for Spider schemas

# ----------------------------------------------------------------------------- the datasets
SPIDER_TRAIN = [
    ("concert_singer", "SELECT count(*) FROM singer", "How many singers do we have?"),
    ("concert_singer", "SELECT name ,  country ,  age FROM singer ORDER BY age DESC", "Singers by age?"),
    ("concert_singer", "SELECT DISTINCT country FROM singer WHERE age  >  20", "Countries of singers over 20?"),
    ("concert_singer", "SELECT name FROM stadium WHERE capacity  >  11000", "Stadiums over 11000?"),
    ("concert_singer", "SELECT country ,  count(*) FROM singer GROUP BY country", "Singers per country?"),
]
SPIDER_OTHERS = [("concert_singer", "SELECT avg(age) FROM singer", "Average singer age?")]
SPIDER_DEV = [
    ("pets_1", "SELECT count(*) FROM pets WHERE weight  >  10", "How many pets weigh more than 10?"),
    ("pets_1", "SELECT DISTINCT pettype FROM pets", "What types of pets are there?"),
    ("pets_1", "SELECT max(weight) ,  petType FROM pets GROUP BY petType", "Heaviest pet of each type?"),
    ("pets_1", "SELECT T1.Fname FROM student AS T1 JOIN has_pet AS T2 ON T1.stuid  =  T2.stuid JOIN pets AS T3 "
               "ON T3.petid  =  T2.petid WHERE T3.pettype  =  'dog'", "Who owns a dog?"),
]
SPIDER_TEST = [
    ("perpetrator", "SELECT name FROM people ORDER BY height DESC", "People by height?"),
    ("perpetrator", "SELECT count(*) FROM perpetrator", "How many perpetrators?"),
]
FAILING_GOLD = "SELECT Nonexistent FROM country"
BIRD_TRAIN = [
    ("world_1", "SELECT COUNT(*) FROM city", "How many cities?", ""),
    ("world_1", "SELECT Name, Population FROM city ORDER BY Population DESC LIMIT 3", "Three largest cities?",
     "largest refers to MAX(Population)"),
    ("world_1", "SELECT Continent, COUNT(*) FROM country GROUP BY Continent", "Countries per continent?", ""),
    ("world_1", "SELECT DISTINCT Language FROM countrylanguage", "Languages spoken?", ""),
    ("world_1", FAILING_GOLD, "A gold that fails on the shipped database.", ""),
    ("world_1", "SELECT MAX(SurfaceArea) FROM country", "Largest surface area?", ""),
]
BIRD_DEV = [
    ("tvshow", "SELECT COUNT(*) FROM Cartoon", "How many cartoons?", "", "simple"),
    ("tvshow", "SELECT Title FROM Cartoon ORDER BY Title", "Cartoon titles?", "", "simple"),
    ("tvshow", "SELECT Country, COUNT(*) FROM TV_Channel GROUP BY Country", "Channels per country?",
     "per country refers to GROUP BY Country", "moderate"),
    ("tvshow", "SELECT DISTINCT Directed_by FROM Cartoon", "Directors?", "", "challenging"),
]
SYNSQL = [
    ("flight_2", "SELECT COUNT(*) FROM airlines", "How many airlines?"),
    ("flight_2", "SELECT City, COUNT(*) FROM airports GROUP BY City", "Airports per city?"),
    ("flight_2", "SELECT FROM", "A broken gold."),
    ("flight_2", "SELECT COUNT(*) FROM flights", "How many flights?"),
    ("flight_2", "SELECT Airline FROM airlines ORDER BY Airline", "Airline names?"),
]


def _write(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))
    return path


def _spider_record(db_id: str, query: str, question: str) -> dict:
    return {"db_id": db_id, "query": query, "query_toks": query.split(), "query_toks_no_value": query.lower().split(),
            "question": question, "question_toks": question.split(), "sql": {}}


@pytest.fixture(scope="module")
def entries(conformance: Path) -> dict[str, dict]:
    return {e["db_id"]: e for e in json.loads((conformance / "tables.json").read_text())}


def _database(entries: dict, db_id: str, path: Path, queries=(), seed: int = 0) -> None:
    schema = schema_from_spider(entries[db_id], db_id)
    if db_id in SPIDER_ROWS and seed == 0:
        rows = SPIDER_ROWS[db_id]
    else:
        rows = spider_rows(schema, literals(list(queries)), random.Random(f"{db_id}:{seed}"))
    create_database(schema, path, rows=rows)


@pytest.fixture(scope="module")
def sources(tmp_path_factory, entries) -> dict[str, Path]:
    """Spider (with test split, test-suite databases, Syn / Realistic / DK files), BIRD and
    SynSQL-2.5M folders in their published layouts, built once."""
    base = tmp_path_factory.mktemp("datasets")
    spider = base / "spider"
    _write(spider / "tables.json", [entries[d] for d in ("concert_singer", "pets_1")])
    _write(spider / "test_tables.json", [entries["perpetrator"]])
    for db_id in ("concert_singer", "pets_1"):
        _database(entries, db_id, spider / "database" / db_id / f"{db_id}.sqlite")
    _database(entries, "perpetrator", spider / "test_database" / "perpetrator" / "perpetrator.sqlite")
    suite = spider / "test_suite_database" / "pets_1"
    suite.mkdir(parents=True)
    shutil.copy(spider / "database/pets_1/pets_1.sqlite", suite / "pets_1.sqlite")
    _database(entries, "pets_1", suite / "pets_1_1.sqlite", [q for _, q, _ in SPIDER_DEV], seed=1)
    _write(spider / "train_spider.json", [_spider_record(*r) for r in SPIDER_TRAIN])
    _write(spider / "train_others.json", [_spider_record(*r) for r in SPIDER_OTHERS])
    _write(spider / "dev.json", [_spider_record(*r) for r in SPIDER_DEV])
    _write(spider / "test.json", [_spider_record(*r) for r in SPIDER_TEST])
    _write(base / "Spider-Syn" / "dev.json", [
        {"db_id": d, "query": q, "SpiderQuestion": question, "SpiderSynQuestion": question.replace("pets", "animals")}
        for d, q, question in SPIDER_DEV[:2]])
    _write(base / "spider-realistic" / "spider-realistic.json", [_spider_record(*SPIDER_DEV[3])])
    _write(base / "Spider-DK" / "Spider-DK.json", [_spider_record("pets_1", SPIDER_DEV[2][1], "Heaviest of each kind?")])

    bird = base / "bird"
    _write(bird / "train/train_tables.json", [entries["world_1"]])
    _database(entries, "world_1", bird / "train/train_databases/world_1/world_1.sqlite", [r[1] for r in BIRD_TRAIN])
    _write(bird / "train/train.json", [{"db_id": d, "question": q, "evidence": e, "SQL": sql}
                                       for d, sql, q, e in BIRD_TRAIN])
    _write(bird / "dev/dev_tables.json", [entries["tvshow"]])
    _database(entries, "tvshow", bird / "dev/dev_databases/tvshow/tvshow.sqlite", [r[1] for r in BIRD_DEV])
    _write(bird / "dev/dev.json", [{"question_id": i, "db_id": d, "question": q, "evidence": e, "SQL": sql,
                                    "difficulty": level} for i, (d, sql, q, e, level) in enumerate(BIRD_DEV)])

    synsql = base / "SynSQL-2.5M"
    _write(synsql / "tables.json", [entries["flight_2"]])
    _database(entries, "flight_2", synsql / "databases/flight_2/flight_2.sqlite", [r[1] for r in SYNSQL])
    _write(synsql / "data.json", [{"db_id": d, "sql_complexity": "Simple", "question_style": "Formal", "question": q,
                                   "external_knowledge": "", "cot": "Count the rows.", "sql": sql}
                                  for d, sql, q in SYNSQL])
    return {"spider": spider, "bird": bird, "synsql": synsql, "syn": base / "Spider-Syn",
            "realistic": base / "spider-realistic" / "spider-realistic.json", "dk": base / "Spider-DK"}


def _import_settings(sources: dict[str, Path], **data):
    raw = {"source": "import", "import_spider": str(sources["spider"]), "import_bird": str(sources["bird"]),
           "import_synsql": str(sources["synsql"]), "import_spider_syn": str(sources["syn"]),
           "import_spider_realistic": str(sources["realistic"]), "import_spider_dk": str(sources["dk"]),
           "max_failing_gold_share": 0.2, **data}
    return settings_from_dict({"data": raw, "tracking": {"enabled": False}})


def _snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder``: size, mtime and content hash (to prove nothing was written)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns,
                                         hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder")
            for p in sorted(folder.rglob("*"))}


# ----------------------------------------------------------------------------- import → validate → RL → eval
@pytest.fixture(scope="module")
def imported(sources, tmp_path_factory) -> tuple[Path, dict]:
    before = _snapshot(sources["spider"].parent)
    out = tmp_path_factory.mktemp("imported") / "corpus"
    manifest = stages.build_data(_import_settings(sources), out, progress=False)  # data.source: import
    assert _snapshot(sources["spider"].parent) == before  # nothing written to the sources
    return out, manifest


def test_import_writes_the_corpus_layout(imported, sources):
    out, manifest = imported
    layout = CorpusLayout(out)
    train, dev, test = (list(read_jsonl(layout.split(s))) for s in ("train", "dev", "test"))
    # the union of the train sets (6 Spider, 6 BIRD with one failing gold, 5 SynSQL with one
    # unparsable gold) is smaller than mix_total: all usable ones, failing and unparsable dropped
    assert Counter(ex.source for ex in train) == {"spider": 6, "bird": 5, "synsql": 4}
    assert FAILING_GOLD not in {ex.gold_sql for ex in train}
    assert [ex.id for ex in dev] == [f"spider-dev-{i:06d}" for i in range(4)] + [f"bird-dev-{i:06d}" for i in range(4)]
    assert [ex.db_id for ex in test] == ["perpetrator", "perpetrator"]
    assert {ex.db_id: ex.semantics for ex in train + dev} == {"concert_singer": "spider", "pets_1": "spider",
                                                              "world_1": "bird", "tvshow": "bird", "flight_2": "bird"}
    bird_dev = [ex for ex in dev if ex.source == "bird"]
    assert [ex.difficulty for ex in bird_dev] == ["simple", "simple", "moderate", "challenging"]
    assert bird_dev[2].evidence == "per country refers to GROUP BY Country"
    assert all(ex.hardness == hardness(ex.gold_sql) for ex in train + dev + test)
    assert all("db_path" not in ex.meta and "tables_json" not in ex.meta for ex in train + dev)  # no source paths
    # the given variant files are the syn / realistic / dk splits
    syn = list(read_jsonl(layout.variant("syn")))
    assert [ex.question for ex in syn] == ["How many animals weigh more than 10?", "What types of animals are there?"]
    assert syn[0].meta["original_question"] == SPIDER_DEV[0][2]
    assert [len(list(read_jsonl(layout.variant(v)))) for v in ("realistic", "dk")] == [1, 1]
    # databases copied, tables.json entries carried over, test-suite databases as neighbours
    assert sorted(p.name for p in layout.databases.iterdir()) == ["concert_singer", "flight_2", "perpetrator",
                                                                  "pets_1", "tvshow", "world_1"]
    assert (layout.database("tvshow").read_bytes()
            == (sources["bird"] / "dev/dev_databases/tvshow/tvshow.sqlite").read_bytes())
    assert sorted(e["db_id"] for e in json.loads(layout.tables_json.read_text())) == sorted(manifest["databases"])
    assert [p.name for p in layout.neighbours("pets_1")] == ["1.sqlite"] and layout.neighbours("tvshow") == []
    # the manifest records the semantics, the draw and the gold check; the report lists failures by id
    assert manifest["source"] == "import" and manifest["semantics"] == "mixed"
    assert manifest["splits"]["dev"]["semantics"] == {"bird": 4, "spider": 4}
    assert manifest["train_draw"]["available"] == {"bird": 6, "spider": 6, "synsql": 5}
    gold = manifest["gold_check"]
    assert (gold["failing"], gold["dropped_from_train"], gold["kept_in_eval"], gold["unparsed_dropped"]) == (1, 1, 0, 1)
    report = json.loads(layout.import_report.read_text())
    (failure,) = report["failing"]
    assert failure["id"] == "bird-train-000004" and failure["error"] == "runtime"
    assert "no such column: Nonexistent" in failure["message"] and failure["action"] == "dropped from train"
    assert report["dropped"][0]["id"] == "synsql-0000002" and "gold does not parse" in report["dropped"][0]["reason"]


def test_imported_corpus_validates_trains_one_rl_step_and_evaluates(imported, tmp_path):
    torch = pytest.importorskip("torch")
    from progress_sql.eval.runner import run_eval
    from progress_sql.train.tiny import build_tiny_model
    from progress_sql.train.trainer import run_rl

    out, _ = imported
    settings = settings_from_dict({
        "data": {"max_failing_gold_share": 0.2},
        "model": {"vocab_size": 512, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                  "intermediate_size": 64, "copy_warmup": {"steps": 0}},
        "env": {"max_turns": 2},
        "rl": {"steps": 1, "group_size": 2, "questions_per_step": 2, "micro_batch_size": 4, "deepspeed": "never",
               "checkpoint_every": 1, "keep_checkpoints": 1},
        "generation": {"max_new_tokens": 8, "batch_size": 8},
        "eval": {"vote_k": 2, "pass_k": 0, "batch_size": 8, "max_examples": 3},
        "tracking": {"enabled": False},
    })
    report = stages.validate_data(settings, out, tmp_path / "reports")
    assert report.success, report.failures
    assert report.imported["gold_check"]["dropped_from_train"] == 1
    assert "bird-train-000004 (train, dropped from train): runtime" in (tmp_path / "reports/validation.md").read_text()

    torch.set_num_threads(2)
    base = build_tiny_model(out, settings, tmp_path / "base")
    settings.rl.init_from = str(base)
    result = run_rl(settings, out, out_dir=tmp_path / "rl", progress=False)
    assert len(result.metrics) == 1

    evaluated = run_eval(settings, str(Path(result.out_dir) / "final"), out, ["dev"], tmp_path / "eval", progress=False)
    assert evaluated.metrics["dev"]["n"] == 3 and evaluated.metrics["dev"]["semantics"] == "spider"

    settings.eval.max_examples = 0
    oracle = run_eval(settings, "oracle", out, ["dev", "test", "syn", "realistic", "dk"], tmp_path / "oracle",
                      progress=False)
    metrics = oracle.metrics
    assert metrics["dev"]["semantics"] == "mixed:bird=4,spider=4" and metrics["test"]["semantics"] == "spider"
    for split in ("dev", "test", "syn", "realistic", "dk"):
        assert metrics[split]["greedy"]["ex"] == 1.0 and metrics[split]["vote_at_2"]["ex"] == 1.0, split
    assert metrics["dev"]["greedy"]["ts"] == 1.0 and metrics["dev"]["greedy"]["ts_n"] == 4  # pets_1's test suite
    assert set(metrics["dev"]["greedy"]["by_difficulty"]) == {"simple", "moderate", "challenging"}
    header = (tmp_path / "oracle/report.md").read_text().split("## ")[0]
    assert "Dev mixed:bird=4,spider=4" in header and "bird: BIRD's EX, set(pred rows) == set(gold rows)" in header


def test_cli_import_prints_the_figures_and_failing_golds(sources, tmp_path):
    out = tmp_path / "corpus"
    result = CliRunner().invoke(app, ["data", "import", "--bird", str(sources["bird"]), "--out", str(out),
                                      "--no-progress", "--set", "data.max_failing_gold_share=0.2",
                                      "--set", "data.mix_total=3"])
    assert result.exit_code == 0, result.output
    assert f"imported {out}" in result.output and "semantics bird" in result.output
    assert "train drawn (random, 3 asked) from bird 6: bird 3" in result.output
    manifest = json.loads(CorpusLayout(out).manifest.read_text())
    assert manifest["semantics"] == "bird" and manifest["splits"]["test"]["examples"] == 0
    report = tmp_path / "report"
    result = CliRunner().invoke(app, ["data", "validate", "--corpus", str(out), "--report-dir", str(report),
                                      "--set", "tracking.enabled=false", "--set", "data.max_failing_gold_share=0.2"])
    assert result.exit_code == 0, result.output  # no test split needed: BIRD has none


def test_symlinked_databases_are_not_copied(sources, tmp_path):
    settings = settings_from_dict({"data": {"source": "import", "import_bird": str(sources["bird"]),
                                            "import_databases": "symlink", "max_failing_gold_share": 0.2}})
    manifest = import_corpus(settings, tmp_path / "c", progress=False)
    database = CorpusLayout(tmp_path / "c").database("tvshow")
    assert database.is_symlink() and database.resolve() == (sources["bird"] / "dev/dev_databases/tvshow/tvshow.sqlite")
    assert manifest["databases"]["tvshow"]["sha256"] == hashlib.sha256(database.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- the train draw
def test_train_draw_is_seeded_uniform_over_the_union_or_fixed_shares(sources, tmp_path):
    def draw(**data) -> list[str]:
        manifest = import_corpus(_import_settings(sources, **data), tmp_path / "c", progress=False)
        train = [ex.id for ex in read_jsonl(CorpusLayout(tmp_path / "c").split("train"))]
        assert len(train) == manifest["splits"]["train"]["examples"]
        return train

    first = draw(mix_total=8, seed=3)
    assert len(first) == 8 and first == draw(mix_total=8, seed=3)
    assert first != draw(mix_total=8, seed=4)
    # fixed shares: plan_mix over the given sizes (6, 6, 5) with data.mix 0.4 / 0.3 / 0.3 of 10
    shares = draw(mix_total=10, import_sampling="shares")
    assert Counter(i.split("-")[0] for i in shares) == {"bird": 4, "spider": 3, "synsql": 3}
    assert "bird-train-000004" not in shares  # a failing gold is replaced by the next drawn BIRD one
    assert Counter(i.split("-")[0] for i in draw(mix_total=10, import_train=["bird"])) == {"bird": 5}


def test_failing_golds_above_the_share_stop_the_import(sources, tmp_path):
    with pytest.raises(CorpusError, match=r"1 of \d+ gold queries \(\d+\.\d%\) fail on their databases, above "
                                          r"data.max_failing_gold_share 1\.0%: bird-train-000004 \(runtime: no such column"):
        import_corpus(_import_settings(sources, max_failing_gold_share=0.01), tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists() and not list(tmp_path.iterdir())  # no corpus, no temporary folder


# ----------------------------------------------------------------------------- bad input
@pytest.fixture()
def spider_copy(sources, tmp_path) -> Path:
    return Path(shutil.copytree(sources["spider"], tmp_path / "spider"))


def _import_spider(spider: Path, out: Path) -> dict:
    settings = settings_from_dict({"data": {"source": "import", "import_spider": str(spider)}})
    return import_corpus(settings, out, progress=False)


def test_bad_input_is_an_error_naming_file_and_record(spider_copy, tmp_path):
    out = tmp_path / "out"
    records = [_spider_record(*r) for r in SPIDER_DEV]
    del records[2]["query"]
    _write(spider_copy / "dev.json", records)
    with pytest.raises(CorpusError, match=re.escape(f"{spider_copy / 'dev.json'}: record 2: field 'query' is missing")):
        _import_spider(spider_copy, out)

    records[2]["query"], records[1]["db_id"] = SPIDER_DEV[2][1], "no_such_db"
    _write(spider_copy / "dev.json", records)
    with pytest.raises(CorpusError, match=re.escape(f"{spider_copy / 'dev.json'}: record 1: db_id has no database (")
                       + ".*no_such_db.sqlite not found"):
        _import_spider(spider_copy, out)

    _write(spider_copy / "dev.json", [_spider_record(*r) for r in SPIDER_DEV])
    (spider_copy / "database/pets_1/pets_1.sqlite").write_text("CREATE TABLE pets (x);\n")
    with pytest.raises(CorpusError, match=re.escape(f"{spider_copy / 'database/pets_1/pets_1.sqlite'}: not a SQLite "
                                                    "database (used by spider-dev-000000")):
        _import_spider(spider_copy, out)

    (spider_copy / "dev.json").unlink()
    with pytest.raises(CorpusError, match=re.escape(f"{spider_copy / 'dev.json'}: file not found")):
        _import_spider(spider_copy, out)
    assert not out.exists()


def test_bird_record_without_sql_and_outputs_inside_the_source(sources, tmp_path):
    bird = Path(shutil.copytree(sources["bird"], tmp_path / "bird"))
    records = json.loads((bird / "dev/dev.json").read_text())
    del records[3]["SQL"]
    _write(bird / "dev/dev.json", records)
    settings = settings_from_dict({"data": {"source": "import", "import_bird": str(bird)}})
    with pytest.raises(CorpusError, match=re.escape(f"{bird / 'dev/dev.json'}: record 3: field 'SQL' is missing")):
        import_corpus(settings, tmp_path / "out", progress=False)
    with pytest.raises(CorpusError, match="overlap; sources are read-only"):
        import_corpus(settings, bird / "corpus", progress=False)
    with pytest.raises(ValueError, match="data.source is import: set data.import_spider"):
        settings_from_dict({"data": {"source": "import"}})


# ----------------------------------------------------------------------------- the conformance corpus
@pytest.mark.conformance
def test_spider_fixture_from_the_conformance_corpus_imports_every_gold(conformance, tmp_path, capsys):
    """Spider's real tables.json (166 databases) and its 322 dev golds: the databases they use
    get generated rows; every gold imports, executes and gets its Spider hardness."""
    pairs = read_pairs(conformance)
    root = tmp_path / "spider"
    root.mkdir()
    shutil.copy(conformance / "tables.json", root / "tables.json")
    entries = {e["db_id"]: e for e in json.loads((root / "tables.json").read_text())}
    used = sorted({db for _, db, _ in pairs})
    for db_id in used:
        _database(entries, db_id, root / "database" / db_id / f"{db_id}.sqlite", [g for g, d, _ in pairs if d == db_id])
    train_dbs = {"flight_2", "tvshow"}  # train and dev are disjoint by database, as in Spider
    _write(root / "train_spider.json", [_spider_record(db, g, f"q{i}") for i, (g, db, _) in enumerate(pairs)
                                        if db in train_dbs])
    _write(root / "dev.json", [_spider_record(db, g, f"q{i}") for i, (g, db, _) in enumerate(pairs)
                               if db not in train_dbs])
    manifest = _import_spider(root, tmp_path / "corpus")
    layout = CorpusLayout(tmp_path / "corpus")
    examples = [ex for split in ("train", "dev") for ex in read_jsonl(layout.split(split))]
    assert len(entries) == 166 and len(pairs) == 322
    assert sorted(ex.gold_sql for ex in examples) == sorted(g for g, _, _ in pairs)  # every gold imported
    assert manifest["gold_check"]["checked"] == 322 and manifest["gold_check"]["failing"] == 0  # and executes
    assert all(ex.hardness == hardness(ex.gold_sql) and ex.semantics == "spider" for ex in examples)
    levels = Counter(ex.hardness for ex in examples)
    by_split = {s: manifest["splits"][s]["hardness"] for s in ("train", "dev")}
    assert {k: by_split["train"][k] + by_split["dev"][k] for k in levels} == levels
    assert sorted(manifest["databases"]) == used
    with capsys.disabled():
        print(f"\nconformance Spider fixture: {len(examples)} golds imported, {manifest['gold_check']['checked']} "
              f"executed, 0 failing; hardness {dict(sorted(levels.items()))}; train {by_split['train']}, "
              f"dev {by_split['dev']}")


# ----------------------------------------------------------------------------- semantics in the rewards
def test_the_reward_judges_by_the_examples_semantics(tmp_path, entries):
    """The environments (the rewards' turns) judge under ``Example.semantics``, as evaluation
    does: a prediction with duplicate rows is right under BIRD's sets, wrong under Spider's bags."""
    db = tmp_path / "pets_1.sqlite"
    _database(entries, "pets_1", db)
    gold = "SELECT pettype FROM pets GROUP BY pettype"  # cat, dog
    pred = "<think>types</think><sql>SELECT pettype FROM pets</sql>"  # cat, dog, dog
    env_cls = envs.get("single_turn")
    verdicts = {}
    for semantics in ("spider", "bird"):
        env = env_cls()
        example = Example("q", "pets_1", "Pet types?", gold, hardness(gold), semantics=semantics)
        env.reset(example, db)
        verdicts[semantics] = env.step(pred).info["correct"]
        assert env.semantics == semantics
    assert verdicts == {"spider": False, "bird": True}
    with pytest.raises(ValueError, match="semantics must be one of spider, bird"):
        Example("q", "pets_1", "?", gold, "easy", semantics="wikisql")


# ----------------------------------------------------------------------------- evaluation only
EXE = str(Path(sys.executable).absolute().with_name("progress-sql"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
ENV.pop("DVC_STAGE", None)
SHOP_DEV = [  # written here: no benchmark's questions or databases
    ("How many customers are there?", "SELECT count(*) FROM Customer"),
    ("Which customers live in Oslo?", "SELECT Name FROM Customer WHERE City = 'Oslo'"),
    ("What is the total amount ordered by Ann Lee?",
     "SELECT sum(T2.Amount) FROM Customer AS T1 JOIN Orders AS T2 ON T1.CustomerID = T2.CustomerID "
     "WHERE T1.Name = 'Ann Lee'"),
]


def _dev_only_spider(root: Path) -> Path:
    """A Spider-format folder holding its dev set alone: tables.json, dev.json and
    database/shop/shop.sqlite (no train_spider.json, no test set)."""
    db = root / "database" / "shop" / "shop.sqlite"
    db.parent.mkdir(parents=True)
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE Customer (CustomerID INTEGER PRIMARY KEY, Name TEXT, City TEXT);"
                      "CREATE TABLE Orders (OrderID INTEGER PRIMARY KEY, CustomerID INTEGER REFERENCES "
                      "Customer (CustomerID), Amount REAL);")
    con.executemany("INSERT INTO Customer VALUES (?, ?, ?)", [(1, "Ann Lee", "Oslo"), (2, "Bo Kim", "Rome")])
    con.executemany("INSERT INTO Orders VALUES (?, ?, ?)", [(1, 1, 10.5), (2, 1, 4.0), (3, 2, 7.25)])
    con.commit()
    con.close()
    _write(root / "tables.json", [{
        "db_id": "shop", "table_names_original": ["Customer", "Orders"], "table_names": ["customer", "orders"],
        "column_names_original": [[-1, "*"], [0, "CustomerID"], [0, "Name"], [0, "City"], [1, "OrderID"],
                                  [1, "CustomerID"], [1, "Amount"]],
        "column_names": [[-1, "*"], [0, "customer id"], [0, "name"], [0, "city"], [1, "order id"],
                         [1, "customer id"], [1, "amount"]],
        "column_types": ["text", "number", "text", "text", "number", "number", "number"],
        "primary_keys": [1, 4], "foreign_keys": [[5, 1]]}])
    _write(root / "dev.json", [_spider_record("shop", sql, q) for q, sql in SHOP_DEV])
    return root


def test_a_dev_only_spider_folder_imports_into_its_own_corpus_and_evaluates(tmp_path):
    """docs/datasets.md's evaluation-only commands, run as written: `data import --spider DIR` with a
    dev.json alone (it asked for train_spider.json), into data/imported (it wrote over the
    bundled data/corpus), then `data validate --corpus` and `eval --corpus`."""
    spider = _dev_only_spider(tmp_path / "spider-dev")
    params = ["--params", str(REPO / "params.yaml"), "--set", "tracking.enabled=false"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([EXE, *args, *params], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                              timeout=600)

    imported = run("data", "import", "--spider", str(spider), "--no-progress")
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert "train: none, evaluation only (no train set in spider" in imported.stdout
    assert not (tmp_path / "data" / "corpus").exists()  # the bundled corpus's folder untouched
    layout = CorpusLayout(tmp_path / "data" / "imported")
    manifest = json.loads(layout.manifest.read_text())
    assert manifest["splits"]["train"]["examples"] == 0 and manifest["splits"]["dev"]["examples"] == 3
    assert manifest["train_draw"]["evaluation_only"] is True
    assert [ex.question for ex in read_jsonl(layout.split("dev"))] == [q for q, _ in SHOP_DEV]

    validated = run("data", "validate", "--corpus", "data/imported", "--report-dir", "reports/data")
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
    evaluated = run("eval", "--model", "oracle", "--corpus", "data/imported", "--split", "dev", "--out",
                    "reports/eval-dev", "--no-progress")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((tmp_path / "reports/eval-dev/metrics.json").read_text())
    assert metrics["dev"]["greedy"]["ex"] == 1.0
