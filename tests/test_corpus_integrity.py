"""A corpus that differs from its manifest.json is refused (issue 33, item 2): each recipe of
the issue rerun through the CLI on a real built corpus, with a real tiny policy to train and
a real MLflow store to log to. Training and evaluation stop with an error naming the file and
exit 1 before writing anything; ``data validate`` fails naming it."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from progress_sql import tracking  # noqa: E402
from progress_sql.cli import app  # noqa: E402
from progress_sql.params import settings_from_dict  # noqa: E402
from progress_sql.corpus.integrity import corpus_damage, require_intact  # noqa: E402
from progress_sql.corpus.records import CorpusError, CorpusLayout  # noqa: E402
from corpora import small_corpus  # noqa: E402
from progress_sql.data.generate_db import database_fingerprint  # noqa: E402
from progress_sql.data.validation import FILES_MATCH  # noqa: E402

TINY = {
    "data": {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 4,
             "test_size": 4, "neighbours": 1, "rows_scale": 0.3},
    "model": {"vocab_size": 512, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
              "intermediate_size": 64, "max_position_embeddings": 2048, "copy_warmup": {"steps": 0}},
    "sft": {"epochs": 0.5, "batch_size": 4, "max_examples": 8, "max_seq_len": 2048, "copy_rows": 0},
    "rl": {"env": "single_turn", "steps": 2, "group_size": 2, "questions_per_step": 1, "micro_batch_size": 2,
           "checkpoint_every": 1, "keep_checkpoints": 1},
    "generation": {"max_new_tokens": 8, "batch_size": 4},
    "eval": {"splits": ["dev"], "vote_k": 0, "pass_k": 0, "batch_size": 4},
    "tracking": {"experiment": "corpus-integrity"},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """params.yaml with tiny settings, a pristine built corpus and a tiny untrained policy."""
    from progress_sql.train.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("project")
    raw = json.loads(json.dumps(TINY))
    raw["data"]["out_dir"] = str(root / "pristine")
    raw["sft"].update(init_from=str(root / "base"), out_dir=str(root / "sft"))
    raw["rl"].update(init_from=str(root / "base"), out_dir=str(root / "rl"))
    settings = settings_from_dict(raw)
    (root / "params.yaml").write_text(json.dumps(settings.model_dump(mode="json")))  # JSON is YAML
    small_corpus(root / "pristine", settings)
    build_tiny_model(root / "pristine", settings, root / "base")
    return root


@pytest.fixture()
def corpus(project, tmp_path, monkeypatch):
    """A private copy of the built corpus to damage; the MLflow store and outputs in tmp_path."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return shutil.copytree(project / "pristine", tmp_path / "corpus")


def cli(project, *args: str):
    return CliRunner().invoke(app, [*args, "--params", str(project / "params.yaml")])


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _a_database_of(corpus, split: str):
    return CorpusLayout(corpus).database(_records(CorpusLayout(corpus).split(split))[0]["db_id"])


def _nothing_written(tmp_path, *outputs) -> None:
    """No MLflow store was even opened, and no output folder or report exists."""
    assert not (tmp_path / "mlflow.db").exists(), "an MLflow run was started"
    for path in outputs:
        assert not path.exists(), f"{path} was written"


def test_the_built_corpus_is_intact(project):
    layout = CorpusLayout(project / "pristine")
    require_intact(layout.root)
    assert corpus_damage(layout.root, full=True, fingerprint=database_fingerprint) == []


# ----------------------------------------------------------------------------- the recipes
def test_train_refuses_a_text_file_in_place_of_a_train_database(project, corpus, tmp_path):
    database = _a_database_of(corpus, "train")
    database.write_text("this is not a database\n")
    for stage, command in (("train", "rl"), ("sft", "sft")):
        result = cli(project, "train", command, "--corpus", str(corpus), "--out", str(tmp_path / command),
                     "--report-dir", str(tmp_path / "reports"), "--no-progress")
        assert result.exit_code == 1, result.output
        assert f"error: stage {stage} failed: corpus {corpus} is damaged" in result.output
        assert f"{database}: not a SQLite database" in result.output
    _nothing_written(tmp_path, tmp_path / "rl", tmp_path / "sft", tmp_path / "reports")


def test_eval_refuses_a_text_file_in_place_of_a_dev_database(project, corpus, tmp_path):
    database = _a_database_of(corpus, "dev")
    database.write_text("this is not a database\n")
    result = cli(project, "eval", "--model", "oracle", "--corpus", str(corpus), "--out", str(tmp_path / "eval"),
                 "--no-progress")
    assert result.exit_code == 1, result.output
    assert f"error: stage evaluate failed: corpus {corpus} is damaged: {database}: not a SQLite database" \
        in result.output
    _nothing_written(tmp_path, tmp_path / "eval")


def test_train_refuses_a_deleted_train_database_before_its_first_step(project, corpus, tmp_path):
    database = _a_database_of(corpus, "train")
    shutil.rmtree(database.parent)
    result = cli(project, "train", "rl", "--corpus", str(corpus), "--out", str(tmp_path / "rl"),
                 "--report-dir", str(tmp_path / "reports"), "--no-progress")
    assert result.exit_code == 1, result.output
    assert f"{database}: database not found" in result.output
    _nothing_written(tmp_path, tmp_path / "rl", tmp_path / "reports")


def _validate(project, corpus, tmp_path):
    return cli(project, "data", "validate", "--corpus", str(corpus), "--report-dir", str(tmp_path / "validation"),
               "--set", "tracking.enabled=false")


def test_validate_fails_on_a_train_split_cut_at_a_line_break(project, corpus, tmp_path):
    train = CorpusLayout(corpus).split("train")
    lines = train.read_text().splitlines(keepends=True)
    kept = len(lines) * 3 // 4  # the 1,500 of 2,000 lines
    train.write_text("".join(lines[:kept]))
    result = _validate(project, corpus, tmp_path)
    assert result.exit_code == 1, result.output
    assert f"failed expectation: {FILES_MATCH}: 1 damaged (e.g. {train}: holds {kept} examples, manifest.json " \
           f"says {len(lines)}" in result.output
    report = json.loads((tmp_path / "validation" / "validation.json").read_text())
    assert report["success"] is False and len(report["failures"]) == 1  # the rest of the suite passes


def test_validate_and_training_fail_on_a_rewritten_gold(project, corpus, tmp_path):
    train = CorpusLayout(corpus).split("train")
    records = _records(train)
    records[0]["gold_sql"] = "SELECT 1"  # parses, runs, returns a row: only the manifest can tell
    train.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records))
    result = _validate(project, corpus, tmp_path)
    assert result.exit_code == 1, result.output
    (failure,) = json.loads((tmp_path / "validation" / "validation.json").read_text())["failures"]
    assert failure.startswith(f"{FILES_MATCH}: 1 damaged (e.g. {train}: content differs from manifest.json")
    result = cli(project, "train", "rl", "--corpus", str(corpus), "--out", str(tmp_path / "rl"), "--no-progress")
    assert result.exit_code == 1 and f"{train}: content differs from manifest.json" in result.output
    _nothing_written(tmp_path, tmp_path / "rl")


# ----------------------------------------------------------------------------- depths, no manifest
def test_run_time_checks_rows_and_schema_validation_also_the_content(project, corpus):
    """A row deleted changes a count the manifest holds (refused at run time); a value changed
    keeps schema and counts, so only the full check (data validate's fingerprint) sees it."""
    database = _a_database_of(corpus, "train")
    con = sqlite3.connect(database)
    table, column = con.execute("SELECT m.name, c.name FROM sqlite_master AS m, pragma_table_info(m.name) AS c "
                                "WHERE m.type = 'table' AND c.type = 'TEXT' ORDER BY 1, 2").fetchone()
    con.execute(f'UPDATE "{table}" SET "{column}" = "{column}" || \'x\' WHERE rowid = 1')
    con.commit()
    require_intact(corpus)  # size, header, schema and counts unchanged: the cheap check passes
    (damage,) = corpus_damage(corpus, full=True, fingerprint=database_fingerprint)
    assert damage.path == database and damage.what.startswith("content differs from manifest.json")
    con.execute(f'DELETE FROM "{table}" WHERE rowid = 1')
    con.commit()
    con.close()
    with pytest.raises(CorpusError, match=f"{database}: table {table} holds"):
        require_intact(corpus)


def test_a_corpus_without_a_manifest_is_used_with_a_warning_its_databases_checked(corpus, caplog):
    CorpusLayout(corpus).manifest.unlink()
    with caplog.at_level(logging.WARNING, logger="progress_sql.corpus.integrity"):
        require_intact(corpus)
    assert f"{corpus}: no manifest.json" in caplog.text
    neighbour = CorpusLayout(corpus).test_suite(_a_database_of(corpus, "dev").parent.name)[1]
    neighbour.write_bytes(b"")
    with pytest.raises(CorpusError, match=f"{neighbour}: not a SQLite database"):
        require_intact(corpus)


def test_a_manifest_that_lists_a_file_no_longer_there(corpus):
    CorpusLayout(corpus).variant("dk").unlink()
    with pytest.raises(CorpusError, match=r"variants/dk\.jsonl: file not found \(manifest.json lists it\)"):
        require_intact(corpus)
    assert [d.kind for d in corpus_damage(corpus)] == ["file"]
