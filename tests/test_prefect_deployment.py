"""The UI path as a user walks it: ``progress-sql ui`` (the documented command) on ports other
than Prefect's and MLflow's defaults, started from a folder outside the repository with a
temporary PREFECT_HOME and MLflow store; the UI's API URL names the server's own port; the
served ``training-pipeline`` form offers the presets and a work_dir; runs created over the
REST API (what the UI's Run button does) fail fast on a bad override and complete with the
demo preset, writing only under their work_dir and logging the corpus's data version; Ctrl-C
stops every server. About 1.5-3 minutes on two busy cores."""

from __future__ import annotations

import hashlib
import json
import signal

import httpx
import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")
pytest.importorskip("torch")

from conftest import REPO  # noqa: E402

from local_stack import (  # noqa: E402
    DEPLOYMENTS,
    create_flow_run,
    flow_run_logs,
    free_port,
    isolated_env,
    port_in_use,
    ui_process,
    wait_for_deployments,
    wait_for_flow_run,
    wait_for_output,
)

PARAMS = str(REPO / "params.yaml")

STAGES = {"validate_data", "init_model", "sft", "train", "evaluate", "register"}


@pytest.mark.slow
def test_progress_sql_ui_serves_the_deployments_on_any_port_and_a_demo_run_logs_its_data_version(tmp_path):
    port, mlflow_port = free_port(), free_port()
    assert 4200 not in (port, mlflow_port)
    elsewhere = tmp_path / "elsewhere"  # not the repository: the command finds it itself
    elsewhere.mkdir()
    work = tmp_path / "work"
    env = isolated_env(tmp_path)
    log = tmp_path / "ui.log"
    with ui_process(["--port", str(port), "--mlflow-port", str(mlflow_port), "--log-dir", str(tmp_path / "logs")],
                    env, elsewhere, log) as ui:
        api = f"http://127.0.0.1:{port}/api"
        ids = wait_for_deployments(api, DEPLOYMENTS, ui, log, timeout_s=240)
        printed = wait_for_output("Ctrl-C stops them.", ui, log, timeout_s=60)
        assert f"http://127.0.0.1:{port}/deployments" in printed and f"http://127.0.0.1:{mlflow_port}" in printed
        # The browser's UI asks the API at the server's own port, not 4200.
        assert httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=30).json()["api_url"] == api

        # The Custom run form: the presets as a choice, a work_dir, the demo as its default.
        deployment = httpx.get(f"{api}/deployments/{ids['training-pipeline']}", timeout=30).json()
        form = deployment["parameter_openapi_schema"]["properties"]
        assert {"preset", "work_dir", "overrides", "params", "run_sft", "init_tiny_model", "async_rollouts",
                "reports", "mlruns_in_work_dir"} <= set(form)
        assert {"none", "cpu-demo", "cpu-long", "cpu-smollm2"} <= set(form["preset"]["enum"])
        assert "Dotted settings keys" in form["overrides"]["description"]
        assert deployment["parameters"] == {"preset": "none", "work_dir": "runs/default"}  # the real model
        assert deployment["entrypoint"] == "flows/pipeline.py:training_pipeline"
        # run-study's form: the scale among the scales only, the arms and seeds as fields
        compare = httpx.get(f"{api}/deployments/{ids['run-study']}", timeout=30).json()
        fields = compare["parameter_openapi_schema"]["properties"]
        assert fields["preset"]["enum"] == ["none", "cpu-demo", "cpu-long", "cpu-smollm2", "tiny"]
        assert compare["parameters"]["preset"] == "cpu-smollm2"
        assert "oneshot" in fields["arms"]["items"]["enum"] and fields["seeds"]["type"] == "integer"

        # A bad override fails the run at once, with the message the CLI prints.
        bad = create_flow_run(api, ids["training-pipeline"], {"params": PARAMS, "preset": "cpu-demo",
                                                              "work_dir": str(work), "overrides": {"rl.group_size": 1}})
        failed = wait_for_flow_run(api, bad, timeout_s=180)
        assert failed["state"]["type"] == "FAILED"
        assert "rl.group_size" in failed["state"]["message"]
        assert not work.exists()

        # The demo preset runs to the end in the served process, its outputs under work_dir.
        good = create_flow_run(api, ids["training-pipeline"], {"preset": "cpu-demo", "work_dir": str(work)})
        run = wait_for_flow_run(api, good, timeout_s=400)
        assert run["state"]["type"] == "COMPLETED", "\n".join(flow_run_logs(api, good)[-30:])
        assert run["deployment_id"] == ids["training-pipeline"]
        artifacts = httpx.post(f"{api}/artifacts/filter", timeout=30,
                               json={"artifacts": {"flow_run_id": {"any_": [good]}}}).json()
        assert {"data-validation", "evaluation", "registry"} <= {a["key"] for a in artifacts}
        assert sorted(p.name for p in work.iterdir()) == ["data", "outputs", "reports"]  # mlruns only if asked
        manifest = work / "data" / "corpus" / "manifest.json"
        assert (work / "outputs" / "rl" / "final" / "config.json").is_file()
        registry = json.loads((work / "reports" / "registry.json").read_text())
        assert registry["model"] == "progress-sql-policy-demo" and registry["version"] == 1 and registry["promoted"]

        # The MLflow UI the command started serves the store: the pipeline run and its data version.
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"http://127.0.0.1:{mlflow_port}")
        experiment = client.get_experiment_by_name("progress-sql").experiment_id
        (parent,) = client.search_runs([experiment], filter_string=f"tags.`prefect.flow_run_id` = '{good}'")
        assert parent.info.status == "FINISHED" and parent.data.tags["progress_sql.preset"] == "cpu-demo"
        corpus_hash = hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
        assert parent.data.params["data_version"] == corpus_hash
        assert parent.data.params["rl.steps"] == "1" and parent.data.params["data.out_dir"] == str(manifest.parent)
        children = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        assert {c.data.tags["progress_sql.stage"] for c in children} == STAGES
        assert {c.data.params["data_version"] for c in children} == {corpus_hash}
        assert int(client.get_model_version_by_alias("progress-sql-policy-demo", "champion").version) == 1

        # Ctrl-C stops the command and every server it started.
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=90) == 0, log.read_text()[-3000:]
        assert "stopped." in log.read_text()
        assert not port_in_use(port) and not port_in_use(mlflow_port)


def test_progress_sql_ui_refuses_a_busy_port_and_finds_the_store_from_any_folder(tmp_path, monkeypatch):
    import socket

    from typer.testing import CliRunner

    from progress_sql.cli import app
    from progress_sql.servers import mlflow_store_uri, project_root

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert project_root() == REPO  # the checkout the package is installed from
    assert mlflow_store_uri(REPO) == f"sqlite:///{REPO / 'mlruns' / 'mlflow.db'}"  # absolute
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere/mlflow.db")
    assert mlflow_store_uri(REPO) == f"sqlite:///{REPO / 'elsewhere' / 'mlflow.db'}"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["ui", "--port", str(port), "--no-mlflow", "--log-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"port {port} on 127.0.0.1 is in use" in result.output and "--port" in result.output
