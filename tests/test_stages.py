"""progress_sql.stages, the one home of each pipeline stage (the CLI and the Prefect tasks call
it): validate_data runs in its own MLflow stage run and logs its report there; a stage that
fails leaves its run FAILED; with tracking off, MLflow is not even imported. The other stages
run end to end in test_cli_train_eval.py and test_flows.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402

from progress_sql import stages, tracking  # noqa: E402
from progress_sql.params import settings_from_dict  # noqa: E402
from progress_sql.corpus.records import CorpusError  # noqa: E402

CORPUS = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 6,
          "test_size": 6, "neighbours": 1, "rows_scale": 0.3}
EXPERIMENT = "stages"


# `store` (one SQLite tracking store per module) comes from conftest.py.
pytestmark = pytest.mark.usefixtures("no_active_run")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stages") / "corpus"
    manifest = stages.build_data(settings_from_dict({"data": CORPUS}), out, progress=False)
    assert manifest["splits"]["train"]["examples"] == CORPUS["train_size"]
    return out


def settings(**tracking_section):
    return settings_from_dict({"data": CORPUS, "tracking": {"experiment": EXPERIMENT, **tracking_section}})


def validate_runs() -> list:
    exp = MlflowClient().get_experiment_by_name(EXPERIMENT)
    runs = MlflowClient().search_runs([exp.experiment_id]) if exp else []
    return [r for r in runs if r.info.run_name == "validate_data"]


def test_validate_data_logs_its_report_in_its_stage_run(store, corpus, tmp_path):
    before = {r.info.run_id for r in validate_runs()}
    report = stages.validate_data(settings(), corpus, tmp_path / "reports")
    assert report.success, report.failures
    (run,) = [r for r in validate_runs() if r.info.run_id not in before]
    assert run.info.status == "FINISHED"
    assert run.data.tags["progress_sql.stage"] == "validate_data" and "mlflow.parentRunId" in run.data.tags
    assert run.data.params["data_version"] == tracking.data_version(corpus)
    client = MlflowClient()
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"validation.json", "validation.md"}
    logged = Path(client.download_artifacts(run.info.run_id, "validation.json", str(tmp_path)))
    assert json.loads(logged.read_text()) == json.loads((tmp_path / "reports" / "validation.json").read_text())


def test_a_stage_that_fails_leaves_its_run_failed(store, tmp_path):
    before = {r.info.run_id for r in validate_runs()}
    with pytest.raises(CorpusError):
        stages.validate_data(settings(), tmp_path / "no-corpus", tmp_path / "reports")
    (run,) = [r for r in validate_runs() if r.info.run_id not in before]
    assert run.info.status == "FAILED"


@pytest.mark.slow  # a fresh interpreter imports Great Expectations (~5-10 s)
def test_validate_data_without_tracking_never_imports_mlflow(corpus, tmp_path):
    raw = {"data": CORPUS, "tracking": {"enabled": False}}
    code = ("import sys; from progress_sql import stages; from progress_sql.params import settings_from_dict; "
            f"report = stages.validate_data(settings_from_dict({raw!r}), {str(corpus)!r}, 'reports'); "
            "print(report.success, 'mlflow' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]
    assert (tmp_path / "reports" / "validation.json").is_file() and not (tmp_path / "mlruns").exists()
