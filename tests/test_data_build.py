"""The bundled corpus: domain catalogue, generated databases, examples, splits, manifest,
determinism, atomic writes, the ``data`` CLI and the DVC stage."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from progress_sql.cli import app
from progress_sql.cli.common import parse_overrides
from progress_sql.params import SettingsError, settings_from_dict
from progress_sql.corpus import integrity
from progress_sql.data import build as build_module
from progress_sql.data import drafting
from progress_sql.data.build import build_corpus, split_domains
from progress_sql.data.domains import CATALOGUE, get_domain
from progress_sql.data.domains.spec import Choice
from progress_sql.data.drafting import level_quotas
from progress_sql.data.generate_db import (
    database_fingerprint, generate_rows, schema_sql, spider_schema, write_database,
)
from progress_sql.data.patterns import FAMILIES, LEVELS, Family
from progress_sql.corpus.records import INDOMAIN, SPLITS, CorpusError, CorpusLayout, question_key, read_jsonl
from progress_sql.sources import VARIANTS
from progress_sql.corpus.schema import read_tables_json
from progress_sql.sql import execute, hardness

from conftest import REPO

SMALL = {
    "n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1,
    "train_size": 60, "dev_size": 30, "test_size": 30, "neighbours": 2, "indomain_size": 24,
}


def small_settings(**data):
    return settings_from_dict({"data": {**SMALL, **data}})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[CorpusLayout, dict]:
    out = tmp_path_factory.mktemp("build") / "corpus"
    manifest = build_corpus(small_settings(), out, progress=False)
    return CorpusLayout(out), manifest


def examples(layout: CorpusLayout, split: str):
    return list(read_jsonl(layout.split(split)))


# ----------------------------------------------------------------------------- catalogue
def test_catalogue_has_enough_distinct_domains_with_keys():
    assert len(CATALOGUE) >= max(12, small_settings().data.n_databases)
    assert len({d.name for d in CATALOGUE}) == len(CATALOGUE)
    for d in CATALOGUE:
        d.check()
        assert 3 <= len(d.tables) <= 8
        assert any(t.foreign_keys for t in d.tables), d.name
        assert d.dk_rules, d.name
    with pytest.raises(KeyError, match="known"):
        get_domain("atlantis")


@pytest.mark.parametrize("domain", CATALOGUE, ids=lambda d: d.name)
def test_generated_database_holds_hundreds_to_thousands_of_rows_with_valid_keys(domain, tmp_path):
    rows = generate_rows(domain, seed=0)
    total = sum(len(r) for r in rows.values())
    assert 300 <= total <= 10_000
    path = tmp_path / "db.sqlite"
    write_database(path, domain, rows)  # PRIMARY KEY / NOT NULL / FOREIGN KEY are enforced here
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
        for table in domain.tables:
            n, = con.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()
            assert n == len(rows[table.name]) > 0
            label = table.label
            if label is not None and not isinstance(label.gen, Choice):  # names: few repeats
                distinct, = con.execute(f"SELECT COUNT(DISTINCT {label.name}) FROM {table.name}").fetchone()
                assert distinct >= 0.3 * n
    finally:
        con.close()


def test_rows_scale_and_seed_drive_the_rows():
    domain = get_domain("library")
    full, half = generate_rows(domain, 0), generate_rows(domain, 0, rows_scale=0.5)
    assert sum(map(len, half.values())) < 0.7 * sum(map(len, full.values()))
    assert generate_rows(domain, 0) == full != generate_rows(domain, 1)


def test_data_settings_keep_the_kept_empty_share_under_the_validated_maximum():
    with pytest.raises(SettingsError, match="empty_gold_share"):
        settings_from_dict({"data": {"empty_gold_share": 0.1, "max_empty_gold_share": 0.05}})
    with pytest.raises(SettingsError, match="hardness_mix"):
        settings_from_dict({"data": {"hardness_mix": {"easy": 0, "medium": 0, "hard": 0, "extra": 0}}})


def test_spider_schema_entry_describes_the_database(tmp_path):
    domain = get_domain("university")
    path = tmp_path / "tables.json"
    path.write_text(json.dumps([spider_schema(domain)]))
    schema = read_tables_json(path)["university"]
    assert [t.name for t in schema.tables] == [t.name for t in domain.tables]
    enrolment = spider_schema(domain)
    names = [c for _, c in enrolment["column_names_original"]]
    assert any(isinstance(pk, list) and len(pk) == 2 for pk in enrolment["primary_keys"])  # (stu_id, course_id)
    assert all(names[child] == names[parent] for child, parent in enrolment["foreign_keys"])
    assert "FOREIGN KEY (dept_id) REFERENCES department (dept_id)" in schema_sql(domain)


# ----------------------------------------------------------------------------- splits
def test_split_domains_are_disjoint_sized_and_seeded():
    s = small_settings(renamed_copies=0)  # the copies: test_renaming
    split = split_domains(s)
    names = {k: {d.name for d in v} for k, v in split.items()}
    assert [len(names[k]) for k in SPLITS] == [2, 1, 1]
    assert not (names["train"] & names["dev"] or names["train"] & names["test"] or names["dev"] & names["test"])
    others = [split_domains(small_settings(seed=k)) for k in range(1, 6)]
    assert any({d.name for d in o["dev"]} != names["dev"] for o in others)
    with pytest.raises(CorpusError, match="catalogue has"):
        split_domains(small_settings(n_databases=len(CATALOGUE) + 1))


def test_level_quotas_follow_the_mix_and_sum_to_the_size():
    s = small_settings()
    q = level_quotas(30, s)
    assert sum(q.values()) == 30 and set(q) == set(LEVELS)
    assert q["medium"] >= q["easy"] >= q["hard"] > 0
    only_hard = settings_from_dict({"data": {"hardness_mix": {"easy": 0, "medium": 0, "hard": 1, "extra": 0}}})
    assert level_quotas(7, only_hard) == {"easy": 0, "medium": 0, "hard": 7, "extra": 0}


def test_families_cover_every_hardness_level_and_sql_feature():
    assert {f.level for f in FAMILIES} == set(LEVELS)
    assert len({f.name for f in FAMILIES}) == len(FAMILIES) >= 20


# ----------------------------------------------------------------------------- the corpus
def test_corpus_layout_counts_and_disjoint_splits(corpus):
    layout, manifest = corpus
    sizes = {"train": 60, "dev": 30, "test": 30}
    dbs = {}
    ids = []
    for split in SPLITS:
        exs = examples(layout, split)
        assert len(exs) == sizes[split] == manifest["splits"][split]["examples"]
        dbs[split] = {e.db_id for e in exs}
        assert dbs[split] == set(manifest["splits"][split]["databases"])
        ids += [e.id for e in exs]
    assert len(ids) == len(set(ids))
    assert not (dbs["train"] & (dbs["dev"] | dbs["test"])) and not (dbs["dev"] & dbs["test"])
    for db_id in set().union(*dbs.values()):
        assert layout.database(db_id).is_file()
    assert set(read_tables_json(layout.tables_json)) == set().union(*dbs.values())
    for db_id in dbs["dev"] | dbs["test"]:
        assert len(layout.neighbours(db_id)) == 2
    for db_id in dbs["train"]:
        assert layout.neighbours(db_id) == []
    assert all(layout.variant(v).is_file() for v in VARIANTS)
    for rel, digest in manifest["files"].items():
        assert integrity.sha256_file(layout.root / rel) == digest


def test_hardness_is_computed_by_spider_rules_and_covers_all_levels(corpus):
    layout, manifest = corpus
    for split in SPLITS:
        exs = examples(layout, split)
        assert all(e.hardness == hardness(e.gold_sql) for e in exs)
        counts = Counter(e.hardness for e in exs)
        assert counts == Counter(level_quotas(len(exs), small_settings()))
        assert manifest["splits"][split]["hardness"] == {k: counts.get(k, 0) for k in LEVELS}


def test_gold_sql_executes_mostly_non_empty_and_reads_like_an_annotators(corpus):
    layout, manifest = corpus
    s = small_settings()
    for split in SPLITS:
        exs = examples(layout, split)
        empty = 0
        for e in exs:
            res = execute(layout.database(e.db_id), e.gold_sql, timeout_s=s.data.gold_timeout_s)
            assert res.ok, (e.gold_sql, res.message)
            empty += not res.rows
            assert not re.search(r"\b(select|from|where|join|group by|order by|having|limit)\b", e.gold_sql)
            if " JOIN " in e.gold_sql.split(" INTERSECT ")[0].split(" UNION ")[0].split(" EXCEPT ")[0]:
                assert re.search(r"FROM \w+ AS T1 JOIN \w+ AS T2 ON T\d\.\w+ = T\d\.\w+", e.gold_sql), e.gold_sql
        assert empty == manifest["splits"][split]["empty_gold"] <= int(len(exs) * s.data.empty_gold_share)


def test_questions_vary_and_carry_values_from_the_data(corpus):
    layout, _ = corpus
    exs = examples(layout, "train")
    assert all(e.question[0].isupper() and e.question[-1] in "?." for e in exs)
    assert len({e.question for e in exs}) == len(exs)
    openings = Counter(" ".join(e.question.split()[:2]) for e in exs)
    assert len(openings) >= 15  # many verbs and templates, not one per SQL shape
    by_pattern: dict[str, set[str]] = {}
    for e in exs:
        by_pattern.setdefault(e.meta["pattern"], set()).add(e.question.split()[0])
    assert max(len(v) for v in by_pattern.values()) >= 3
    # a string literal of a gold query appears in its question
    with_literal = [e for e in exs if re.search(r"= '([^']+)'", e.gold_sql) and not e.evidence]
    hits = [e for e in with_literal if re.search(r"= '([^']+)'", e.gold_sql).group(1) in e.question]
    assert with_literal and len(hits) >= 0.7 * len(with_literal)


def test_reasoning_trace_follows_the_gold_structure(corpus):
    layout, _ = corpus
    for e in examples(layout, "dev") + examples(layout, "train"):
        assert e.reasoning.startswith("Tables: ") and "Output: " in e.reasoning
        if " JOIN " in e.gold_sql:
            assert "joined on T1." in e.reasoning
        if " GROUP BY " in e.gold_sql:
            assert "Group by: " in e.reasoning
        if " WHERE " in e.gold_sql:
            assert "Filter: " in e.reasoning


def test_evidence_states_the_domain_knowledge_the_gold_uses(tmp_path):
    layout_dir = tmp_path / "c"
    # Catalogue domains only (renamed copies' rules follow the rename: test_renaming).
    settings = small_settings(evidence_share=1.0, train_size=80, renamed_copies=0)
    build_corpus(settings, layout_dir, progress=False)
    exs = examples(CorpusLayout(layout_dir), "train")
    with_evidence = [e for e in exs if e.evidence]
    assert len(with_evidence) >= 5
    databases = {d.name: d for ds in split_domains(settings).values() for d in ds}  # the rules in the databases' names
    for e in with_evidence:
        rules = [r for r in databases[e.db_id].dk_rules if r.evidence in e.evidence.split("; ")]
        assert rules, e.evidence
        assert all(r.column in e.gold_sql for r in rules)


# ----------------------------------------------------------------------------- determinism, atomicity
def _table_dump(path: Path) -> dict[str, list]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        out = {}
        for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
            width = len(con.execute(f"SELECT * FROM {name} LIMIT 0").description)
            order = ", ".join(str(i + 1) for i in range(width))
            out[name] = con.execute(f"SELECT * FROM {name} ORDER BY {order}").fetchall()
        return out
    finally:
        con.close()


def test_same_seed_gives_identical_corpus_content(corpus, tmp_path):
    layout, manifest = corpus
    again = CorpusLayout(tmp_path / "again")
    build_corpus(small_settings(), again.root, progress=False)
    files = ["tables.json", "manifest.json", *(f"{s}.jsonl" for s in (*SPLITS, INDOMAIN)),
             *(f"variants/{v}.jsonl" for v in VARIANTS)]
    for rel in files:
        assert (layout.root / rel).read_bytes() == (again.root / rel).read_bytes(), rel
    for db_id in manifest["databases"]:
        for a, b in zip(layout.test_suite(db_id), again.test_suite(db_id)):
            assert _table_dump(a) == _table_dump(b)
            assert database_fingerprint(a) == database_fingerprint(b)
    other = tmp_path / "other"
    build_corpus(small_settings(seed=1), other, progress=False)
    assert (other / "train.jsonl").read_bytes() != layout.split("train").read_bytes()


def test_indomain_split_asks_new_questions_on_the_train_databases(corpus):
    layout, manifest = corpus
    train, indomain = examples(layout, "train"), examples(layout, INDOMAIN)
    assert len(indomain) == 24 == manifest["splits"][INDOMAIN]["examples"]
    assert "indomain.jsonl" in manifest["files"]
    assert {e.db_id for e in indomain} <= {e.db_id for e in train}  # the train databases, renamed copies included
    assert set(manifest["splits"][INDOMAIN]["databases"]) == set(manifest["splits"]["train"]["databases"])
    assert len({e.db_id for e in indomain}) > 1  # balanced over the databases, not one
    golds = {(e.db_id, e.gold_sql) for e in train}
    questions = {question_key(e.db_id, e.question) for e in train}
    assert not [e.id for e in indomain if (e.db_id, e.gold_sql) in golds or question_key(e.db_id, e.question) in questions]
    assert len({(e.db_id, e.gold_sql) for e in indomain}) == len(indomain)  # no repeats among themselves
    assert all(e.id.startswith("bundled-indomain-") for e in indomain)
    assert Counter(e.hardness for e in indomain) == {k: v for k, v in manifest["splits"][INDOMAIN]["hardness"].items() if v}
    assert all(manifest["splits"][INDOMAIN]["hardness"][k] for k in LEVELS)  # every level, by data.hardness_mix


def test_indomain_draw_repeats_no_train_example_even_when_the_draw_would(tmp_path):
    """The exclusion itself: a draw seeded exactly like train's (same stream, same databases)
    would repeat every train example; with train excluded it repeats none."""
    settings = small_settings()
    layout = CorpusLayout(tmp_path / "c")
    build_corpus(settings, layout.root, progress=False)
    train = examples(layout, "train")
    from progress_sql.data.patterns import DbContext
    from progress_sql.data.build import split_domains as domains_of

    contexts = [DbContext(d.name, d, generate_rows(d, 0), layout.database(d.name)) for d in domains_of(settings)["train"]]
    same, _ = drafting.draw_examples("train", contexts, len(train), settings)
    assert [d.example for d in same] == train  # the very stream train was drawn from
    excluded, stats = drafting.draw_examples("train", contexts, len(train), settings, exclude=train)
    assert len(excluded) == len(train)
    golds = {(e.db_id, e.gold_sql) for e in train}
    questions = {question_key(e.db_id, e.question) for e in train}
    assert not [d for d in excluded if (d.ctx.db_id, d.example.gold_sql) in golds
                or question_key(d.ctx.db_id, d.example.question) in questions]
    assert stats.rejected["duplicate"] > 0


def test_indomain_size_leaves_train_dev_and_test_unchanged(corpus, tmp_path):
    layout, _ = corpus
    none = CorpusLayout(tmp_path / "none")
    manifest = build_corpus(small_settings(indomain_size=0), none.root, progress=False)
    for split in SPLITS:
        assert none.split(split).read_bytes() == layout.split(split).read_bytes(), split
    assert none.split(INDOMAIN).read_text() == "" and manifest["splits"][INDOMAIN]["examples"] == 0


def test_failed_build_leaves_previous_corpus_and_no_temporary_folder(tmp_path, monkeypatch):
    out = tmp_path / "corpus"

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(build_module, "build_variants", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build_corpus(small_settings(), out, progress=False)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    build_corpus(small_settings(), out, progress=False)
    before = (out / "manifest.json").read_bytes()
    monkeypatch.setattr(build_module, "build_variants", boom)
    with pytest.raises(RuntimeError):
        build_corpus(small_settings(seed=3), out, progress=False)
    assert (out / "manifest.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]


def test_impossible_draw_ends_with_a_message_naming_the_split(tmp_path, monkeypatch):
    never = Family("never", "easy", lambda ctx, rng: None, FAMILIES[0].ask)
    monkeypatch.setattr(drafting, "families_for", lambda level: [never])
    with pytest.raises(CorpusError, match=r"train: drew only 0 of 60 examples"):
        build_corpus(small_settings(), tmp_path / "corpus", progress=False)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- CLI
def test_parse_overrides_reads_yaml_values():
    assert parse_overrides(["data.train_size=200", "data.hardness_mix={easy: 1}", "data.out_dir=x/y"]) == {
        "data.train_size": 200, "data.hardness_mix": {"easy": 1}, "data.out_dir": "x/y"}
    import typer
    with pytest.raises(typer.BadParameter):
        parse_overrides(["no-equals-sign"])
    with pytest.raises(typer.BadParameter):
        parse_overrides(["data.seed=[unclosed"])


def _cli_args(tmp_path: Path) -> list[str]:
    args = ["--params", str(REPO / "params.yaml")]
    for key, value in SMALL.items():
        args += ["--set", f"data.{key}={value}"]
    return args


def test_cli_build_then_validate_and_fail_on_a_broken_corpus(tmp_path):
    runner = CliRunner()
    out = tmp_path / "corpus"
    result = runner.invoke(app, ["data", "build", "--out", str(out), "--no-progress", *_cli_args(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"built {out}" in result.output and "variants:" in result.output
    assert len(examples(CorpusLayout(out), "train")) == 60

    report = tmp_path / "report"
    args = ["data", "validate", "--corpus", str(out), "--report-dir", str(report), *_cli_args(tmp_path),
            "--set", "tracking.enabled=false"]  # no MLflow store in the working directory
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (report / "validation.json").is_file() and (report / "validation.md").is_file()

    dev = out / "dev.jsonl"
    first = dev.read_text().splitlines()[0]
    dev.write_text(dev.read_text() + first + "\n")  # a duplicate id
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "failed expectation: ids are unique" in result.output


def test_cli_build_reports_a_bad_override(tmp_path):
    result = CliRunner().invoke(app, ["data", "build", "--out", str(tmp_path / "c"), "--params",
                                      str(REPO / "params.yaml"), "--set", "data.train_size=-5"])
    assert result.exit_code == 2
    assert "data.train_size" in result.output
    assert not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------- DVC
def _dvc(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["dvc", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


# `progress-sql ARGS...` run in-process, then the files of the package modules it imported
RECORD_IMPORTS = textwrap.dedent("""
    import sys
    from progress_sql.cli import main
    listing, sys.argv = sys.argv[1], ["progress-sql", *sys.argv[2:]]
    try:
        main()
    finally:
        with open(listing, "w") as f:
            f.write("\\n".join(m.__file__ for n, m in list(sys.modules.items()) if n.split(".")[0] == "progress_sql"))
""")


def test_build_data_stage_depends_on_every_module_a_real_build_imports(tmp_path):
    """A real `progress-sql data build`: every package module it imported, inside functions
    too, is a dep of the stage (scripts/stage_deps.py writes them; tests/test_stage_deps.py
    holds every stage to what it runs)."""
    listing = tmp_path / "imported.txt"
    sizes = [f"--set=data.{key}={value}" for key, value in SMALL.items()]
    args = ["data", "build", "--out", str(tmp_path / "corpus"), "--params", str(REPO / "params.yaml"), "--no-progress"]
    build = subprocess.run([sys.executable, "-c", RECORD_IMPORTS, str(listing), *args, *sizes],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["build_data"]
    deps = [REPO / d for d in stage["deps"]]
    files = listing.read_text().split()
    assert REPO / "src/progress_sql/data/build.py" in map(Path, files)
    for f in map(Path, files):
        assert any(f == d or f.is_relative_to(d) for d in deps), f"{f} is not a dep of build_data"
    assert stage["outs"] == ["${data.out_dir}"]


@pytest.mark.slow
def test_dvc_repro_builds_once_skips_unchanged_and_reruns_on_a_param_change(tmp_path):
    if shutil.which("dvc", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}") is None:
        pytest.skip("dvc is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(REPO / "dvc.yaml", repo / "dvc.yaml")
    shutil.copy(REPO / ".dvcignore", repo / ".dvcignore")
    shutil.copytree(REPO / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    shutil.copytree(REPO / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update(SMALL)
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)

    first = _dvc(repo, "repro", "build_data")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Running stage 'build_data'" in first.stdout
    assert len(examples(CorpusLayout(repo / "data" / "corpus"), "train")) == 60
    assert (repo / "dvc.lock").is_file()

    cache = repo / "src/progress_sql/data/patterns/__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "base.cpython-311.pyc").write_bytes(b"bytecode is not a dependency")
    second = _dvc(repo, "repro", "build_data")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "didn't change, skipping" in second.stdout
    assert "Running stage" not in second.stdout

    params["data"]["train_size"] = 40
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    third = _dvc(repo, "repro", "build_data")
    assert third.returncode == 0, third.stdout + third.stderr
    assert "Running stage 'build_data'" in third.stdout
    assert len(examples(CorpusLayout(repo / "data" / "corpus"), "train")) == 40
