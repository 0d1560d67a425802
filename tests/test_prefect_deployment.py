"""The deployments as a user meets them: a real ``prefect server start`` on 127.0.0.1 with a
temporary PREFECT_HOME, ``python flows/serve.py`` serving the deployments, runs of
``training-pipeline`` created over the REST API (what the UI's Run button does) with a tiny
configuration, polled to their final state. Takes about 1.5-3 minutes on two busy cores."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")
pytest.importorskip("torch")

from test_flows import PARAMS  # noqa: E402  (it puts the repository on sys.path)

from local_stack import (  # noqa: E402
    create_flow_run,
    flow_run_logs,
    prefect_server,
    served_deployments,
    tiny_overrides,
    wait_for_flow_run,
)
from flows.serve import DEPLOYMENTS  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_served_training_pipeline_deployment_runs_to_completion_from_the_api(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the served runs use the settings' store
    work = tmp_path / "work"
    with prefect_server(tmp_path / "prefect") as stack, served_deployments(stack, DEPLOYMENTS) as ids:
        # The parameter form the UI draws comes from the flow's signature and docstring.
        deployment = httpx.get(f"{stack.api}/deployments/{ids['training-pipeline']}", timeout=30).json()
        form = deployment["parameter_openapi_schema"]["properties"]
        assert {"params", "overrides", "run_sft", "init_tiny_model", "reports"} <= set(form)
        assert "Dotted settings keys" in form["overrides"]["description"]
        assert deployment["entrypoint"] == "flows/pipeline.py:training_pipeline"

        # A bad override fails the run at once, with the message the CLI prints.
        bad = create_flow_run(stack, ids["training-pipeline"],
                              {"params": PARAMS, "overrides": {**tiny_overrides(work), "rl.group_size": 1}})
        failed = wait_for_flow_run(stack, bad, timeout_s=120)
        assert failed["state"]["type"] == "FAILED"
        assert "rl.group_size" in failed["state"]["message"]
        assert not (work / "corpus").exists()

        # The tiny pipeline runs to the end in the served process.
        good = create_flow_run(stack, ids["training-pipeline"],
                               {"params": PARAMS, "overrides": tiny_overrides(work), "reports": str(work / "reports")})
        run = wait_for_flow_run(stack, good, timeout_s=300)
        assert run["state"]["type"] == "COMPLETED", "\n".join(flow_run_logs(stack, good)[-30:])
        assert run["deployment_id"] == ids["training-pipeline"]
        artifacts = httpx.post(f"{stack.api}/artifacts/filter", timeout=30,
                               json={"artifacts": {"flow_run_id": {"any_": [good]}}}).json()
        assert {"data-validation", "evaluation", "registry"} <= {a["key"] for a in artifacts}

    registry = json.loads((work / "reports" / "registry.json").read_text())
    assert registry["version"] == 1 and registry["promoted"] is True
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tiny_overrides(work)["tracking.tracking_uri"])
    assert int(client.get_model_version_by_alias("progress-sql-policy", "champion").version) == 1
    parent = client.search_runs([client.get_experiment_by_name("progress-sql").experiment_id],
                                filter_string=f"tags.`prefect.flow_run_id` = '{good}'")
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
