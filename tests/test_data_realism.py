"""The bundled corpus looks like the world's databases (issue 51): a catalogue composed from
parts, names in a naming style drawn per database, distractors, messy values that leave the
questions answerable, questions that do not repeat the schema's names, families kept apart
between train and dev/test, all deterministic in the seed."""

from __future__ import annotations

import random
import re
import sqlite3
from collections import Counter
from datetime import date

import pytest
from sqlglot import exp
from typer.testing import CliRunner

from progress_sql.cli import app
from progress_sql.corpus.records import SPLITS, CorpusLayout, read_jsonl
from progress_sql.corpus.schema import quote_identifier, read_tables_json
from progress_sql.data import mess
from progress_sql.data.build import build_corpus, split_domains
from progress_sql.data.domains import CATALOGUE, HAND_WRITTEN, get_domain
from progress_sql.data.domains.compose import VARIANTS
from progress_sql.data.domains.sectors import SECTORS
from progress_sql.data.domains.spec import Column, Dates
from progress_sql.data.naming import NamingStyle, names_table, natural_name, split_words
from progress_sql.data.realize import realize
from progress_sql.odt import diagnose
from progress_sql.params import settings_from_dict
from progress_sql.sql import execute, execution_match, hardness, parse_one

from conftest import REPO

# Six databases in six families: enough for every split, naming style and kind of mess to show.
SIX = {"n_databases": 6, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 160, "dev_size": 80,
       "test_size": 80, "indomain_size": 0, "neighbours": 1, "rows_scale": 0.5}


def settings(**data):
    return settings_from_dict({"data": {**SIX, **data}})


@pytest.fixture(scope="module")
def messy(tmp_path_factory) -> tuple[CorpusLayout, dict, dict]:
    """A corpus whose every database is messy; its manifest and its databases as built."""
    s = settings(messy_share=1.0, seed=5)
    out = tmp_path_factory.mktemp("messy") / "corpus"
    manifest = build_corpus(s, out, progress=False)
    return CorpusLayout(out), manifest, {d.name: d for ds in split_domains(s).values() for d in ds}


# ----------------------------------------------------------------------------- the catalogue
def test_the_catalogue_composes_over_a_hundred_domains_from_sectors_and_archetypes():
    composed = CATALOGUE[len(HAND_WRITTEN):]
    assert len(CATALOGUE) >= 100 and len(composed) == len(SECTORS) * VARIANTS
    assert len({d.name for d in CATALOGUE}) == len(CATALOGUE)
    assert {d.family_name for d in composed} == {s.name for s in SECTORS}
    hand_topics = {d.name for d in HAND_WRITTEN}
    assert not hand_topics & {s.name for s in SECTORS}  # a family is one topic
    for sector in SECTORS:
        variants = [get_domain(f"{sector.name}_{k + 1}") for k in range(VARIANTS)]
        schemas = {tuple((t.name, tuple(c.name for c in t.columns)) for t in d.tables) for d in variants}
        assert len(schemas) == VARIANTS, sector.name  # the variants differ, sharing a vocabulary
        for d in variants:
            assert d.dk_rules and any(t.foreign_keys for t in d.tables)


# ----------------------------------------------------------------------------- names
def test_a_style_joins_words_the_way_real_schemas_do():
    words = ["song", "release", "year"]
    assert [NamingStyle(case).join(words) for case in ("snake", "camel", "pascal", "upper", "capitalised")] == [
        "song_release_year", "songReleaseYear", "SongReleaseYear", "SONG_RELEASE_YEAR", "Song_release_year"]
    assert NamingStyle("pascal").join(["singer", "id"]) == "SingerID"
    assert NamingStyle("pascal", prefix="tbl").table(["record", "label"]) == "tblRecordLabel"
    assert NamingStyle("snake", prefix="t").table(["song"]) == "t_song"
    assert split_words("tblRecordLabels") == ["tbl", "record", "labels"]
    assert split_words("SINGER_ID") == ["singer", "id"] and natural_name("Song_release_year") == "song release year"
    assert names_table("How many songs are there?", "tblSong") and names_table("List every song.", "SONGS")
    assert not names_table("How many tracks are there?", "tblSong")


def test_naming_styles_are_drawn_per_database_and_names_stay_plain_identifiers():
    s = settings(n_databases=20, n_dev_databases=2, n_test_databases=2)
    databases = [d for ds in split_domains(s).values() for d in ds]
    cases = Counter(d.style.split("+")[0] for d in databases)
    assert len(cases) >= 4, cases
    assert any("tbl_" in d.style or "t_" in d.style for d in databases)
    assert any("abbreviated" in d.style for d in databases) and any("table-prefixed" in d.style for d in databases)
    mixed = [c.name for d in databases for t in d.tables for c in t.columns if c.name != c.name.lower()]
    assert len(mixed) > 50  # mixed-case names, as 54 % of a real-world set's columns are
    for d in databases:
        for t in d.tables:
            assert quote_identifier(t.name) == t.name  # no name a gold would have to quote
            assert all(quote_identifier(c.name) == c.name for c in t.columns), (d.name, t.name)
    only_snake = [d for ds in split_domains(settings(naming_styles=["snake"])).values() for d in ds]
    assert {d.style.split("+")[0] for d in only_snake} == {"snake"}


def test_distractor_tables_and_columns_are_in_the_schema_never_in_a_question(tmp_path):
    s = settings(n_databases=12, n_dev_databases=2, n_test_databases=2, train_size=200)
    databases = {d.name: d for ds in split_domains(s).values() for d in ds}
    distractors = {(db, t.name) for db, d in databases.items() for t in d.tables if t.distractor}
    extras = {(db, c.name) for db, d in databases.items() for t in d.tables for c in t.columns if c.kind == "extra"}
    assert distractors and len(extras) >= 10
    build_corpus(s, tmp_path / "c", progress=False)
    layout = CorpusLayout(tmp_path / "c")
    tables = read_tables_json(layout.tables_json)
    assert all(t in {x.name for x in tables[db].tables} for db, t in distractors)
    for split in SPLITS:
        for ex in read_jsonl(layout.split(split)):
            used = set(re.findall(r"\w+", ex.gold_sql))
            assert not {t for db, t in distractors if db == ex.db_id} & used, ex.gold_sql
            assert not {c for db, c in extras if db == ex.db_id} & used, ex.gold_sql


# ----------------------------------------------------------------------------- questions
def test_questions_name_their_gold_tables_at_most_70_percent_of_the_time(tmp_path):
    manifest = build_corpus(settings(), tmp_path / "c", progress=False)
    for split in SPLITS:
        named = manifest["splits"][split]["names_tables"]
        assert named["tables"] <= 0.70 and named["all"] <= named["tables"] <= named["any"], (split, named)
        # the manifest's share, recomputed from the files with the gold's tables as parsed
        hits = []
        for ex in read_jsonl(CorpusLayout(tmp_path / "c").split(split)):
            hits += [names_table(ex.question, t) for t in {t.name for t in parse_one(ex.gold_sql).find_all(exp.Table)}]
        assert named["tables"] == pytest.approx(sum(hits) / len(hits), abs=0.002)
    # a corpus whose questions always use the schema's word names its tables far more often
    plain = build_corpus(settings(schema_word_share=1.0), tmp_path / "plain", progress=False)
    assert plain["splits"]["train"]["names_tables"]["tables"] > manifest["splits"]["train"]["names_tables"]["tables"]


def test_families_of_dev_and_test_never_reach_train_for_any_seed():
    for seed in range(8):
        split = split_domains(settings(seed=seed, n_databases=30, n_dev_databases=3, n_test_databases=3,
                                       renamed_copies=1))
        families = {k: {d.family_name for d in v} for k, v in split.items()}
        assert not families["train"] & (families["dev"] | families["test"]), seed
        assert not families["dev"] & families["test"]
        assert len(split["train"]) == 24 * 2  # 24 databases and a renamed copy of each


def test_a_catalogue_too_small_for_the_request_is_a_clear_error():
    from progress_sql.corpus.records import CorpusError

    with pytest.raises(CorpusError, match="catalogue has 142 domains in 49 families"):
        split_domains(settings(n_databases=140, n_dev_databases=20, n_test_databases=20))


# ----------------------------------------------------------------------------- messy values
def test_dates_round_trip_through_every_format():
    day = date(2021, 3, 5)
    shown = {name: mess.format_date(day, f"date:{name}", 3600) for name in mess.DATE_FORMATS}
    assert shown["dmy"] == "05/03/2021" and shown["long"] == "Mar 05, 2021" and shown["stamp"] == "2021-03-05 01:00:00"
    for name, text in shown.items():
        col = Column("d", "TEXT", "date", "date", Dates("2020-01-01", "2022-01-01"), fmt=f"date:{name}")
        assert mess.parse_date(text, col.fmt).date() == day
        assert mess.parse_date(mess.shift_date(col, text, 30), col.fmt).date() == date(2021, 4, 4)
        assert mess.sorts(col) == mess.DATE_FORMATS[name][1]
        assert mess.allows(col, "=") and mess.allows(col, ">") == mess.sorts(col)
    noisy = Column("n", "TEXT", "label", "name", noise=1.0)
    assert [mess.allows(noisy, op) for op in ("=", "IN", "LIKE")] == [False, False, True]
    rng = random.Random(0)
    assert {mess.store(noisy, "Ann Lee", rng) for _ in range(40)} >= {" Ann Lee", "ann lee", "ANN LEE"}


def test_messy_databases_hold_real_mess(messy):
    layout, manifest, databases = messy
    assert manifest["naming"]["messy_databases"] == len(databases)
    found = Counter()
    for db, d in databases.items():
        con = sqlite3.connect(layout.database(db))
        try:
            for t in d.tables:
                for c in t.columns:
                    values = [v for (v,) in con.execute(f"SELECT {c.name} FROM {t.name}")]
                    found["null"] += None in values and c.kind != "extra"
                    text = [v for v in values if isinstance(v, str)]
                    found["spaces"] += any(v != v.strip() for v in text)
                    found["case"] += c.kind == "label" and any(v.isupper() or v.islower() for v in text)
                    found["upper"] += c.fmt == "upper" and bool(text) and all(v.isupper() for v in text)
                    found["dates"] += c.kind == "date" and any(not re.fullmatch(r"\d{4}-\d\d-\d\d", v) for v in text)
        finally:
            con.close()
    assert all(found[k] > 0 for k in ("null", "spaces", "case", "upper", "dates")), found


def test_messy_golds_stay_correct_and_answerable(messy):
    layout, _, databases = messy
    checked = 0
    for split in SPLITS:
        for ex in read_jsonl(layout.split(split)):
            d = databases[ex.db_id]
            assert execute(layout.database(ex.db_id), ex.gold_sql).ok, ex.gold_sql
            for t in d.tables:
                for c in t.columns:
                    pattern = rf"\b{re.escape(c.name)}\s*(=|!=|IN|NOT IN|>=|<=|>|<|BETWEEN|LIKE)\s*('%?)?"
                    for m in re.finditer(pattern, ex.gold_sql):
                        checked += 1
                        if c.noise and c.kind == "label":  # stray spaces and cases: '%word%' only
                            assert (m.group(1), m.group(2)) == ("LIKE", "'%"), ex.gold_sql
                        if not mess.sorts(c):  # 15/03/2021 is found as written, not by range
                            assert m.group(1) in ("=", "!="), ex.gold_sql
            # every text the gold compares for equality is written in the question
            for literal in re.findall(r"(?:=|IN \(|, ) '((?:[^']|'')*)'", ex.gold_sql):
                assert literal.replace("''", "'") in ex.question or ex.evidence, (ex.question, ex.gold_sql)
    assert checked > 100


def test_messy_test_suite_neighbours_keep_the_golds_right(messy, tmp_path):
    from progress_sql.data.neighbours import measure_ex_vs_ts

    layout, _, _ = messy
    report = measure_ex_vs_ts(layout.root, settings(messy_share=1.0, seed=5), split="dev")
    assert report.golds == report.gold_self_ts == 80


# ----------------------------------------------------------------------------- SQL on mixed-case names
def test_mixed_case_golds_read_the_same_to_the_odt_the_sandbox_and_hardness(messy):
    layout, _, _ = messy
    golds = [ex for split in SPLITS for ex in read_jsonl(layout.split(split))]
    mixed = [ex for ex in golds if re.search(r"\b[a-z]+[A-Z]|\b[A-Z]{2,}[a-z_]*\b(?<!SELECT)", ex.gold_sql)]
    assert len(mixed) > 20
    for ex in mixed:
        parts = re.split(r"('(?:[^']|'')*')", ex.gold_sql)
        lower = "".join(p if p.startswith("'") else p.lower() for p in parts)
        assert diagnose(lower, ex.gold_sql).score == 1.0, ex.gold_sql
        assert execution_match(layout.database(ex.db_id), lower, ex.gold_sql)
        assert hardness(lower) == hardness(ex.gold_sql) == ex.hardness


# ----------------------------------------------------------------------------- determinism, summary
def test_the_same_seed_spells_the_same_databases_and_another_seed_does_not():
    a, b = split_domains(settings(seed=3)), split_domains(settings(seed=3))
    assert a == b
    again = realize(get_domain("music"), 3, ["snake", "pascal"], 0.5, 0.6)
    assert again == realize(get_domain("music"), 3, ["snake", "pascal"], 0.5, 0.6)
    styles = {realize(get_domain("music"), seed, ["snake", "camel", "pascal", "upper"], 0.5, 0.6).style
              for seed in range(8)}
    assert len(styles) > 3


def test_data_build_prints_the_catalogue_the_naming_and_the_table_mentions(tmp_path):
    args = ["data", "build", "--out", str(tmp_path / "c"), "--params", str(REPO / "params.yaml"), "--no-progress"]
    args += [f"--set=data.{k}={v}" for k, v in SIX.items()]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "catalogue: 142 domains in 49 families; 6 databases" in result.output
    assert re.search(r"dev\s+80 examples on 1 databases in 1 families .*names its gold tables \d+% \(all \d+%, "
                     r"one \d+%\)", result.output), result.output
    assert re.search(r"naming: (\w+ \d+(, )?)+ databases", result.output)


# ----------------------------------------------------------------------------- data validate
REALISM = ("dev and test share no family (vocabulary) with another split",
           "table and column names are plain identifiers (a gold quotes none)",
           "every text a gold compares is written in its question or evidence",
           "at most 70% of questions name every table their gold reads")


def test_data_validate_checks_the_realism_of_a_bundled_corpus(tmp_path):
    import json

    from progress_sql.corpus.integrity import sha256_file
    from progress_sql.data.validation import validate_corpus

    s = settings(train_size=60, dev_size=30, test_size=30)
    out = tmp_path / "corpus"
    build_corpus(s, out, progress=False)
    report = validate_corpus(out, s, tmp_path / "ok")
    assert report.success and set(REALISM) <= {o.name for o in report.outcomes}, report.failures

    layout = CorpusLayout(out)
    manifest = json.loads(layout.manifest.read_text())
    dev_db = manifest["splits"]["dev"]["databases"][0]
    train_db = manifest["splits"]["train"]["databases"][0]
    manifest["databases"][train_db]["family"] = manifest["databases"][dev_db]["family"]  # a dev vocabulary in train
    records = [json.loads(line) for line in layout.split("train").read_text().splitlines()]
    asked = next(r for r in records if re.search(r"= '[^']+'", r["gold_sql"]) and not r["evidence"])
    asked["question"] = "Which ones are they?"  # the value its gold compares is no longer said
    layout.split("train").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    manifest["files"]["train.jsonl"] = sha256_file(layout.split("train"))
    layout.manifest.write_text(json.dumps(manifest))
    strict = settings_from_dict({"data": {**SIX, "train_size": 60, "dev_size": 30, "test_size": 30,
                                          "max_tables_named_share": 0.2}})
    failed = validate_corpus(out, strict, tmp_path / "bad").failures
    assert [f.split(":")[0] for f in failed] == [
        "dev and test share no family (vocabulary) with another split",
        "every text a gold compares is written in its question or evidence",
        "at most 20% of questions name every table their gold reads"], failed
    assert f"{dev_db} in dev" in failed[0] and asked["id"] in failed[1]
