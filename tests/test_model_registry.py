"""The model registry on a real SQLite MLflow store with a real tiny Qwen2 policy: the champion
gate both ways (worse and tied candidates do not move `champion`, a better one does), manual
promotion, listing, and `models:/<name>@champion` loading a model that answers a question
(as a local folder, as an MLflow pyfunc, served by `mlflow models serve` and through
`progress-sql ask`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

import httpx  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from progress_sql import tracking  # noqa: E402
from progress_sql.cli import app  # noqa: E402
from progress_sql.params import settings_from_dict  # noqa: E402
from progress_sql.servers import QUIET_ENV, free_port, start, stop, wait_healthy  # noqa: E402
from corpora import small_corpus  # noqa: E402
from progress_sql.corpus.records import Example  # noqa: E402
from progress_sql.envs.db_details import SchemaTexts, ddl_from_sqlite  # noqa: E402
from progress_sql.envs.prompts import round1_messages  # noqa: E402
from progress_sql.inference.models import chat_prompt_ids, load_policy  # noqa: E402
from progress_sql.train.tiny import build_tiny_model  # noqa: E402

GATE = "dev/greedy/ex"
CORPUS = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 4,
          "test_size": 4, "neighbours": 0, "rows_scale": 0.3}
TINY = {"vocab_size": 512, "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 2048, "copy_warmup": {"steps": 0}}
QUESTION = "How many students are there?"
SQL = "SELECT count(*) FROM student"
ANSWER = f"<think>count the students</think><sql>{SQL}</sql>"


# `store` (one SQLite tracking store per module) comes from conftest.py.
pytestmark = pytest.mark.usefixtures("no_active_run")


def make_settings(store: Path, **sections):
    return settings_from_dict({"data": CORPUS, "model": TINY, "generation": {"max_new_tokens": 48},
                               **sections, "tracking": {"model_cache_dir": str(store / "cache"),
                                                        **sections.get("tracking", {})}})


@pytest.fixture(scope="module")
def model_dir(store, tmp_path_factory):
    """The untrained tiny policy of the project (tokenizer trained on a small bundled corpus)."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("tiny")
    small_corpus(root / "corpus", make_settings(store))
    return build_tiny_model(root / "corpus", make_settings(store), root / "base")


def ask_messages(db: Path, settings) -> list[dict]:
    """The prompt `ask` and the pyfunc model build from the DDL they are given (compact style:
    the DDL rendered as table lines, as the environments render it)."""
    example = Example(id="q", db_id="school", question=QUESTION, gold_sql="", hardness="")
    schema = SchemaTexts(prompt_style=settings.env.prompt_style)("school", db)
    assert settings.env.prompt_style == "compact" and "CREATE" not in schema
    return round1_messages(example, schema, "think_sql", settings.env)


@pytest.fixture(scope="module")
def taught_dir(model_dir, store, tmp_path_factory):
    """The tiny policy overfitted on one question about the school database, so that its greedy
    answer is known: the answer's tokens (and eos) after the exact prompt `ask` builds."""
    db = tmp_path_factory.mktemp("db") / "school.sqlite"
    _school(db)
    model, tok = load_policy(model_dir)
    prompt = chat_prompt_ids(tok, ask_messages(db, make_settings(store)))
    target = tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([prompt + target])
    labels = torch.tensor([[-100] * len(prompt) + target])
    torch.manual_seed(0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(200):  # ~40 steps: until teacher-forced argmax is the answer, with margin
        out = model(input_ids=ids, labels=labels)
        if out.logits[0, len(prompt) - 1:-1].argmax(-1).tolist() == target and out.loss.item() < 0.3:
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    else:
        pytest.fail("the tiny policy did not learn the answer")
    out = tmp_path_factory.mktemp("taught") / "policy"
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, db


def _school(path: Path) -> None:
    import sqlite3

    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE student (stu_id INTEGER PRIMARY KEY, name TEXT, age INTEGER);")
    con.executemany("INSERT INTO student VALUES (?,?,?)", [(i, f"s{i}", 17 + i % 8) for i in range(1, 31)])
    con.commit()
    con.close()


def version_tags(name: str, version: int) -> dict:
    return MlflowClient().get_model_version(name, str(version)).tags


# ----------------------------------------------------------------------------- the gate
def test_gate_promotes_first_and_better_versions_only(store, model_dir):
    settings = make_settings(store)
    name = "gate-both-ways"
    decisions = []
    for value in (0.30, 0.20, 0.30, 0.45):
        version = tracking.register_model(model_dir, name, settings=settings, metrics={GATE: value})
        decisions.append(tracking.promote_if_better(name, version, GATE, value, settings))
    first, worse, tie, better = decisions
    assert (first.promoted, first.champion_version, first.previous_version) == (True, 1, None)
    assert "first champion" in first.reason
    assert (worse.promoted, worse.champion_version) == (False, 1) and "does not beat champion v1" in worse.reason
    assert (tie.promoted, tie.champion_version, tie.champion_value) == (False, 1, 0.30)
    assert (better.promoted, better.champion_version, better.previous_version) == (True, 4, 1)
    assert better.reason == f"{GATE} 0.4500 beats champion v1 (0.3000)"
    assert int(MlflowClient().get_model_version_by_alias(name, "champion").version) == 4
    assert [version_tags(name, v)["promotion.decision"] for v in (1, 2, 3, 4)] == ["promoted", "kept", "kept", "promoted"]
    assert version_tags(name, 2)["gate.value"] == "0.2" and version_tags(name, 2)["gate.metric"] == GATE


def test_gate_reads_the_run_metric_and_respects_min_delta(store, model_dir):
    name = "gate-from-run"
    strict = make_settings(store, tracking={"gate_min_delta": 0.1})
    v1 = tracking.register_model(model_dir, name, settings=strict, metrics={GATE: 0.5})
    assert tracking.promote_if_better(name, v1, GATE, None, strict).candidate_value == 0.5
    v2 = tracking.register_model(model_dir, name, settings=strict, metrics={GATE: 0.55})
    small = tracking.promote_if_better(name, v2, GATE, None, strict)
    assert not small.promoted and small.champion_version == v1
    v3 = tracking.register_model(model_dir, name, settings=strict)  # no metrics at all
    missing = tracking.promote_if_better(name, v3, GATE, None, strict)
    assert not missing.promoted and "has no dev/greedy/ex" in missing.reason
    nan = tracking.promote_if_better(name, v3, GATE, float("nan"), strict)
    assert not nan.promoted and nan.candidate_value is None
    again = tracking.promote_if_better(name, v1, GATE, 0.9, strict)
    assert not again.promoted and "already holds" in again.reason


def test_manual_promotion_and_show(store, model_dir):
    settings = make_settings(store)
    name = "manual"
    for value in (0.2, 0.6, 0.4):
        version = tracking.register_model(model_dir, name, settings=settings, metrics={GATE: value, "test/greedy/ex": 0.1})
        tracking.promote_if_better(name, version, GATE, value, settings)
    assert tracking.promote(name, 3, settings) == 2
    assert int(MlflowClient().get_model_version_by_alias(name, "champion").version) == 3
    assert version_tags(name, 3)["promotion.decision"] == "manual"
    with pytest.raises(tracking.TrackingError, match="no version 9"):
        tracking.promote(name, 9, settings)
    rows = tracking.show(name, settings)
    assert [(r.version, r.aliases, r.metrics[GATE], r.decision) for r in rows] == [
        (3, ("champion",), 0.4, "manual"), (2, (), 0.6, "promoted"), (1, (), 0.2, "promoted")]
    assert rows[0].metrics["test/greedy/ex"] == 0.1 and rows[0].run_id
    with pytest.raises(tracking.TrackingError, match="no registered model"):
        tracking.show("never-registered", settings)


def test_registering_a_folder_without_a_model_fails_clearly(store, tmp_path):
    with pytest.raises(tracking.TrackingError, match="not a model directory"):
        tracking.register_model(tmp_path, "empty", settings=make_settings(store))


# ----------------------------------------------------------------------------- champion in use
@pytest.mark.slow  # shares the taught policy (~40 optimiser steps on a 770-token prompt)
def test_champion_uri_loads_the_registered_policy(store, taught_dir):
    settings = make_settings(store)
    policy, _db = taught_dir
    name = "answering"
    version = tracking.register_model(policy, name, settings=settings, metrics={GATE: 0.7})
    assert tracking.promote_if_better(name, version, GATE, 0.7, settings).promoted
    folder = tracking.local_model_dir(f"models:/{name}@champion", settings)
    assert folder.is_relative_to(store / "cache" / name / f"v{version}")
    assert (folder / "model.safetensors").read_bytes() == (policy / "model.safetensors").read_bytes()
    assert tracking.local_model_dir(f"models:/{name}/{version}", settings) == folder  # cached download
    assert tracking.local_model_dir(str(policy), settings) == policy
    model, tok = load_policy(folder)
    assert tok.chat_template and model.config.hidden_size == TINY["hidden_size"]
    with pytest.raises(tracking.TrackingError, match="cannot resolve"):
        tracking.local_model_dir(f"models:/{name}@nobody", settings)
    card = MlflowClient().get_model_version(name, str(version)).description
    assert card.startswith(f"# {settings.tracking.model_name}") and f"**{GATE}** (gate) | 0.7000" in card


@pytest.mark.slow  # shares the taught policy (~40 optimiser steps on a 770-token prompt)
def test_champion_pyfunc_answers_a_question(store, taught_dir):
    settings = make_settings(store)
    policy, db = taught_dir
    name = "pyfunc"
    version = tracking.register_model(policy, name, settings=settings)
    tracking.promote(name, version, settings)
    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    out = model.predict([{"question": QUESTION, "schema": ddl_from_sqlite(db)}])
    assert out == [{"sql": SQL, "text": ANSWER}]


@pytest.mark.slow  # shares the taught policy; `mlflow models serve` loads torch and the model (~30 s)
def test_the_served_champion_answers_mlflows_usual_payloads(store, taught_dir, tmp_path):
    """`mlflow models serve` of the champion, as docs/serving.md's "Serving the champion" runs it: each usual
    payload gets the SQL beside the raw text; a row without `schema` a 400 that names it."""
    settings = make_settings(store)
    policy, db = taught_dir
    name = "served"
    tracking.promote(name, tracking.register_model(policy, name, settings=settings), settings)
    ddl = ddl_from_sqlite(db)
    port = free_port()
    bin_dir = Path(sys.executable).absolute().parent  # mlflow starts `uvicorn` by name: this one
    cmd = [str(bin_dir / "mlflow"), "models", "serve", "-m", f"models:/{name}@champion", "--env-manager", "local",
           "--host", "127.0.0.1", "--port", str(port)]
    env = {**QUIET_ENV, **os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = start("mlflow models serve", cmd, env, tmp_path / "serve.log", cwd=tmp_path)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/ping", server, timeout_s=180)

        def invoke(body: dict) -> httpx.Response:
            return httpx.post(f"http://127.0.0.1:{port}/invocations", json=body, timeout=120)

        answer = {"predictions": [{"sql": SQL, "text": ANSWER}]}
        records = invoke({"dataframe_records": [{"question": QUESTION, "schema": ddl}]})
        assert (records.status_code, records.json()) == (200, answer), records.text
        inputs = invoke({"inputs": [{"question": QUESTION, "schema": ddl}]})
        assert (inputs.status_code, inputs.json()) == (200, answer), inputs.text
        split = invoke({"dataframe_split": {"columns": ["question", "schema"], "data": [[QUESTION, ddl]]}})
        assert (split.status_code, split.json()) == (200, answer), split.text
        missing = invoke({"dataframe_records": [{"question": QUESTION}]})
        assert missing.status_code == 400 and "Model is missing inputs ['schema']" in missing.json()["message"]
        empty = invoke({"dataframe_records": [{"question": QUESTION, "schema": ddl}, {"question": QUESTION, "schema": ""}]})
        assert empty.status_code == 400 and "row 1 has no 'schema' (the database DDL)" in empty.json()["message"]
    finally:
        stop(server)


@pytest.mark.slow  # shares the taught policy (~40 optimiser steps on a 770-token prompt)
def test_ask_answers_through_the_champion(store, taught_dir, tmp_path):
    settings = make_settings(store)
    policy, db = taught_dir
    name = "ask"
    tracking.promote(name, tracking.register_model(policy, name, settings=settings), settings)
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps(settings.model_dump(mode="json")))  # JSON is YAML
    result = CliRunner().invoke(app, ["ask", "--model", f"models:/{name}@champion", "--db", str(db),
                                      "--params", str(params), QUESTION])
    assert result.exit_code == 0, result.output
    assert ANSWER in result.output
    assert "SQL: SELECT count(*) FROM student" in result.output
    assert "count(*)\n30" in result.output


def test_ask_prints_garbage_and_exits_zero_for_an_untrained_model(store, model_dir, school_db):
    result = CliRunner().invoke(app, ["ask", "--model", str(model_dir), "--db", str(school_db),
                                      "--set", "generation.max_new_tokens=8", "--params", "missing.yaml",
                                      "Which students are older than 20?"])
    # an explicit --params that does not exist is a settings error
    assert result.exit_code == 2
    result = CliRunner().invoke(app, ["ask", "--model", str(model_dir), "--db", str(school_db),
                                      "--set", "generation.max_new_tokens=8", "Which students are older than 20?"])
    assert result.exit_code == 0, result.output
    assert "model output (" in result.output
    assert "SQL: none found" in result.output or "result:" in result.output


def test_ask_reports_a_bad_database_or_model(store, model_dir, tmp_path):
    bad = tmp_path / "nope.sqlite"
    result = CliRunner().invoke(app, ["ask", "--model", str(model_dir), "--db", str(bad), "q?"])
    assert result.exit_code == 1 and "error:" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    db = tmp_path / "ok.sqlite"
    _school(db)
    result = CliRunner().invoke(app, ["ask", "--model", str(empty), "--db", str(db), "q?"])
    assert result.exit_code == 1 and "not a model directory" in result.output


# ----------------------------------------------------------------------------- the CLI
def test_registry_cli_register_show_promote(store, model_dir, tmp_path):
    settings = make_settings(store)
    params = tmp_path / "params.yaml"
    params.write_text(json.dumps(settings.model_dump(mode="json")))
    runner = CliRunner()
    name = "cli-model"
    for i, value in enumerate((0.4, 0.3)):
        metrics = tmp_path / f"metrics{i}.json"
        metrics.write_text(json.dumps({"dev": {"greedy": {"ex": value, "ts": value}, "n": 4}}))
        report = tmp_path / f"registry{i}.json"
        result = runner.invoke(app, ["registry", "register", "--model-dir", str(model_dir), "--metrics", str(metrics),
                                     "--out", str(report), "--name", name, "--params", str(params)])
        assert result.exit_code == 0, result.output
        decision = json.loads(report.read_text())
        assert (decision["version"], decision["promoted"]) == (i + 1, i == 0)
    assert "not champion" in result.output and "does not beat champion v1" in result.output

    result = runner.invoke(app, ["registry", "show", "--name", name, "--params", str(params)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "2 version(s)" in lines[0]
    assert lines[2].split()[:5] == ["2", "-", "0.3000", "kept", lines[2].split()[4]]
    assert lines[4].split()[:4] == ["1", "champion", "0.4000", "promoted"]

    result = runner.invoke(app, ["registry", "promote", "--version", "2", "--name", name, "--params", str(params)])
    assert result.exit_code == 0 and "champion → v2 (previous champion: v1)" in result.output
    result = runner.invoke(app, ["registry", "promote", "--version", "7", "--name", name, "--params", str(params)])
    assert result.exit_code == 1 and "no version 7" in result.output
    result = runner.invoke(app, ["registry", "show", "--name", "unknown-model", "--params", str(params)])
    assert result.exit_code == 1 and "no registered model" in result.output


def test_registry_cli_without_tracking(store, model_dir, tmp_path):
    off = tmp_path / "registry.json"
    result = CliRunner().invoke(app, ["registry", "register", "--model-dir", str(model_dir), "--out", str(off),
                                      "--set", "tracking.enabled=false"])
    assert result.exit_code == 0 and json.loads(off.read_text())["registered"] is False
    result = CliRunner().invoke(app, ["registry", "show", "--set", "tracking.enabled=false"])
    assert result.exit_code == 2 and "tracking.enabled is false" in result.output
    result = CliRunner().invoke(app, ["registry", "register", "--model-dir", str(tmp_path), "--name", "x"])
    assert result.exit_code == 1 and "not a model directory" in result.output
