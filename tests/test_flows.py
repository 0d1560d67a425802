"""The Prefect flows (flows/pipeline.py) run in-process against a temporary Prefect server
(``prefect_test_harness``) with the demo configuration: the whole training pipeline end to end
into a temporary MLflow store, over a stale corpus it rebuilds, the data version every run
logs, the published artifacts, the failure paths, presets and work_dir, the deployments
flows/serve.py builds. The real served deployment is tested in test_prefect_deployment.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prefect")
pytest.importorskip("mlflow")
pytest.importorskip("torch")

from conftest import REPO  # noqa: E402

sys.path.insert(0, str(REPO))  # the flows/ folder sits beside src/, outside the package

from local_stack import tiny_overrides  # noqa: E402
from flows.pipeline import (  # noqa: E402
    ARMS,
    PRESETS,
    SCALES,
    StageFailed,
    evaluate_model,
    promote_model,
    resolve_settings,
    training_pipeline,
    validate_data,
)
from progress_sql.params import load_settings, settings_from_dict  # noqa: E402

PARAMS = str(REPO / "params.yaml")
STAGES = {"validate_data", "init_model", "sft", "train", "evaluate", "register"}  # the stages that log to MLflow
STARTS = 2  # evaluate runs twice more: the starting model (zero-shot) and the SFT policy
MODEL = "progress-sql-policy-demo"  # the cpu-demo preset's registered model


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A temporary Prefect server for the module; MLflow's URI comes from the settings only."""
    from prefect.testing.utilities import prefect_test_harness

    patch = pytest.MonkeyPatch()
    patch.setenv("PREFECT_HOME", str(tmp_path_factory.mktemp("prefect-home")))
    patch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    patch.setenv("DO_NOT_TRACK", "true")
    patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI, which outranks the settings:
    # setenv first so that undo() removes what MLflow leaves behind.
    patch.setenv("MLFLOW_TRACKING_URI", "")
    try:
        with prefect_test_harness(server_startup_timeout=120):
            yield
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def pipeline(prefect_api, tmp_path_factory):
    """One demo training-pipeline run over a stale corpus (another seed's, built before the run
    into the same folder), which the run rebuilds: (root folder, overrides, final state, the
    stale corpus's data version)."""
    from progress_sql import tracking
    from corpora import small_corpus

    root = tmp_path_factory.mktemp("pipeline")
    overrides = tiny_overrides(root)
    small_corpus(root / "corpus", settings_from_dict({}, overrides={**overrides, "data.seed": 1}))
    stale = tracking.data_version(root / "corpus")
    state = training_pipeline(params=PARAMS, overrides=overrides, reports=str(root / "reports"), return_state=True)
    return root, overrides, state, stale


def _client(overrides: dict[str, Any]):
    from mlflow.tracking import MlflowClient

    return MlflowClient(overrides["tracking.tracking_uri"])


def _artifact(key: str, flow_run_id) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                      flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert len(found) == 1, f"expected one '{key}' artifact of flow run {flow_run_id}, found {len(found)}"
    return found[0]


# ----------------------------------------------------------------------------- the whole pipeline
@pytest.mark.slow
def test_training_pipeline_runs_every_stage_and_crowns_the_first_version(pipeline):
    root, overrides, state, _ = pipeline
    assert state.is_completed(), state.message
    decision = state.result()
    assert decision["model"] == MODEL and decision["version"] == 1
    assert decision["promoted"] and decision["champion_version"] == 1, decision
    assert decision["gate_metric"] == "dev/greedy/ex" and 0.0 <= decision["gate_value"] <= 1.0
    # Every stage left what its CLI command leaves.
    assert (root / "corpus" / "manifest.json").is_file()
    assert json.loads((root / "reports" / "data" / "validation.json").read_text())["success"] is True
    assert (root / "tiny" / "config.json").is_file() and (root / "sft" / "config.json").is_file()
    assert (root / "rl" / "final" / "config.json").is_file()
    assert json.loads((root / "reports" / "train" / "rl.json").read_text())["rl/steps"] == 1
    assert "dev" in json.loads((root / "eval" / "metrics.json").read_text())
    registry = json.loads((root / "reports" / "registry.json").read_text())
    assert registry["version"] == 1 and registry["promoted"] is True
    assert int(_client(overrides).get_model_version_by_alias(MODEL, "champion").version) == 1


def _pipeline_runs(overrides: dict[str, Any], flow_run_id) -> tuple[Any, list[Any]]:
    """(the MLflow pipeline run of a flow run, its stage runs)."""
    client = _client(overrides)
    runs = client.search_runs([client.get_experiment_by_name("progress-sql").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("prefect.flow_run_id") == str(flow_run_id)]
    return parent, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]


@pytest.mark.slow
def test_every_run_of_a_pipeline_logs_the_data_version_of_the_corpus_it_trained_on(pipeline):
    """The corpus is rebuilt during the run: the pipeline run and each stage name the rebuilt
    one, never the stale corpus found at the start (nor nothing, as when the corpus is built in
    the same run: test_prefect_deployment.py starts from an empty work_dir)."""
    from progress_sql import tracking

    root, overrides, state, stale = pipeline
    trained_on = tracking.data_version(root / "corpus")
    assert trained_on and trained_on != stale
    parent, children = _pipeline_runs(overrides, state.state_details.flow_run_id)
    assert parent.data.params["data_version"] == trained_on
    assert {c.data.params["data_version"] for c in children} == {trained_on}
    assert len(children) == len(STAGES) + STARTS
    assert MODEL in (root / "reports" / "registry.json").read_text()


@pytest.mark.slow
def test_the_mlflow_pipeline_run_is_the_prefect_flow_run_and_stages_nest_under_it(pipeline):
    _, overrides, state, _ = pipeline
    client = _client(overrides)
    experiment = client.get_experiment_by_name("progress-sql")
    runs = client.search_runs([experiment.experiment_id])
    flow_run_id = str(state.state_details.flow_run_id)
    parents = [r for r in runs if r.data.tags.get("prefect.flow_run_id") == flow_run_id]
    assert len(parents) == 1, [r.data.tags for r in runs]
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_name"] == "training-pipeline"
    assert parent.data.tags["prefect.flow_run_url"].endswith(f"/runs/flow-run/{flow_run_id}")  # the UI's route
    assert parent.data.params["rl.steps"] == "1"  # the overridden settings are the run's params
    assert "dev/greedy/ex" in parent.data.metrics
    # the starting points' EX beside the policy's, each from its own evaluate run
    assert {"zero-shot/dev/greedy/ex", "sft/dev/greedy/ex"} <= set(parent.data.metrics)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert {r.data.tags["progress_sql.stage"] for r in children} == STAGES
    assert sorted(r.info.run_name for r in children if r.data.tags["progress_sql.stage"] == "evaluate") == [
        "evaluate", "evaluate sft", "evaluate zero-shot"]
    assert all(r.info.status == "FINISHED" for r in children)
    # The registered version comes from the register stage of this pipeline run.
    version = client.get_model_version(MODEL, "1")
    assert version.run_id in {r.info.run_id for r in children}


@pytest.mark.slow
def test_the_evaluation_and_validation_reports_are_published_as_markdown_artifacts(pipeline):
    root, _, state, _ = pipeline
    flow_run_id = state.state_details.flow_run_id
    evaluation = _artifact("evaluation", flow_run_id)
    assert evaluation.type == "markdown"
    assert evaluation.data == (root / "eval" / "report.md").read_text(encoding="utf-8")
    assert "| Dev | Greedy | 4 |" in evaluation.data  # the table's row: split, decoding, examples
    assert "dev/greedy/ex" in evaluation.description
    validation = _artifact("data-validation", flow_run_id)
    assert validation.data == (root / "reports" / "data" / "validation.md").read_text(encoding="utf-8")
    assert "PASSED" in validation.data
    registry = _artifact("registry", flow_run_id)
    assert f"| {MODEL} | 1 |" in registry.data and "promoted" in registry.data
    # the closing table: zero-shot, SFT and RL on the same questions, RL paired against SFT
    summary = _artifact("summary", flow_run_id).data
    assert "zero-shot" in summary and "after SFT" in summary and "RL vs SFT" in summary, summary
    assert (root / "eval-zero-shot" / "predictions" / "dev.jsonl").is_file()
    assert (root / "eval-sft" / "predictions" / "dev.jsonl").is_file()


@pytest.mark.slow
def test_evaluate_model_loads_the_champion_through_the_registry(pipeline):
    from progress_sql import tracking

    root, overrides, _, _ = pipeline
    state = evaluate_model(params=PARAMS, overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    metrics = state.result()
    assert 0.0 <= metrics["dev/greedy/ex"] <= 1.0
    # The champion was downloaded into the model cache as version 1 and evaluated from there.
    assert (Path(overrides["tracking.model_cache_dir"]) / MODEL / "v1").is_dir()
    parent, (stage,) = _pipeline_runs(overrides, state.state_details.flow_run_id)
    assert parent.data.params["data_version"] == stage.data.params["data_version"] == tracking.data_version(root / "corpus")
    # MLflow's Compare opens its plot on the first metric the runs share in the order they were
    # logged (the store keeps it): EX, not dev/n (its Metrics table sorts by name, whatever the order)
    assert next(iter(parent.data.metrics)) == next(iter(stage.data.metrics)) == "dev/greedy/ex"


@pytest.mark.slow
def test_promote_model_moves_the_champion_alias_by_hand(pipeline):
    from progress_sql import tracking

    root, overrides, _, _ = pipeline
    settings = settings_from_dict({}, overrides=overrides)
    second = tracking.register_model(root / "sft", settings=settings)  # another real policy
    assert second == 2
    state = promote_model(version=second, params=PARAMS, overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == {"model": MODEL, "version": 2, "previous_champion": 1}
    assert int(_client(overrides).get_model_version_by_alias(MODEL, "champion").version) == 2


# ----------------------------------------------------------------------------- failures
@pytest.mark.parametrize("override, message", [
    ({"rl.group_size": 1}, "rl.group_size: Input should be greater than or equal to 2"),
    ({"rl.grup_size": 4}, "rl.grup_size: unknown key"),
])
def test_a_bad_override_fails_the_run_at_once_with_the_settings_message(prefect_api, tmp_path, override, message):
    overrides = {**tiny_overrides(tmp_path), **override}
    state = training_pipeline(params=PARAMS, overrides=overrides, reports=str(tmp_path / "reports"), return_state=True)
    assert state.is_failed()
    assert message in state.message
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "mlruns").exists()  # nothing ran


def test_a_corpus_that_fails_validation_stops_with_every_failed_expectation(prefect_api, tmp_path):
    from corpora import small_corpus

    settings = settings_from_dict({}, overrides=tiny_overrides(tmp_path))
    small_corpus(tmp_path / "corpus", settings)
    dev_db = json.loads((tmp_path / "corpus" / "dev.jsonl").read_text().splitlines()[0])["db_id"]
    shutil.rmtree(tmp_path / "corpus" / "databases" / dev_db)
    with pytest.raises(StageFailed, match="corpus validation failed") as failed:
        validate_data(settings, str(tmp_path / "corpus"), str(tmp_path / "reports"))
    assert "database file exists" in str(failed.value)
    assert json.loads((tmp_path / "reports" / "validation.json").read_text())["success"] is False


def test_an_arm_of_another_study_is_refused_before_any_task(prefect_api, tmp_path):
    """The form offers the arms of every shipped study (a Prefect form cannot narrow one
    field's choices by another's): an arm the chosen study lacks stops the flow at its start,
    before any task runs or anything is written, naming the study's own arms."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.pipeline import run_study

    work = tmp_path / "work"
    state = run_study(study="methods", preset="cpu-demo", arms=["progress-sql", "sync"], work_dir=str(work),
                            mlruns_in_work_dir=True, return_state=True)
    assert state.is_failed()
    assert ("no arm named 'sync' in this study; its arms: progress-sql, oneshot, reasoning-sql, sql-trail, "
            "skyrl-sql") in state.message
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert tasks == [] and not work.exists()
    from prefect.utilities.callables import parameter_schema

    described = parameter_schema(run_study).model_dump()["properties"]["arms"]["description"]
    assert "stops the run before anything runs" in described and "the chosen study's" in described
    from progress_sql.studies.spec import load_study, studies_dir, study_names

    for name in study_names(studies_dir(PARAMS)):  # the description lists each one's arms, as shipped
        assert f"{name}: {', '.join(arm.name for arm in load_study(name, PARAMS)[1].arms)}" in described


def test_an_unknown_preset_is_refused_before_the_run_starts(prefect_api, tmp_path):
    state = training_pipeline(preset="cpu-huge", work_dir=str(tmp_path / "work"), return_state=True)
    assert state.is_failed()
    assert "cpu-demo" in state.message  # the choices are named
    assert not (tmp_path / "work").exists()


# ----------------------------------------------------------------------------- presets and work_dir
def test_work_dir_takes_the_outputs_and_the_preset_the_sizes(tmp_path):
    work = tmp_path / "work"
    settings = resolve_settings(PARAMS, {"eval.out_dir": "/elsewhere/eval", "rl.init_from": "Qwen/Qwen2.5-0.5B"},
                                "cpu-demo", str(work))
    assert settings.data.train_size == 24 and settings.rl.steps == 1 and settings.tracking.model_name == MODEL
    assert settings.data.out_dir == str(work / "data" / "corpus")
    assert settings.model.base_dir == settings.sft.init_from == str(work / "outputs" / "tiny-base")
    assert settings.sft.out_dir == str(work / "outputs" / "sft") and settings.rl.out_dir == str(work / "outputs" / "rl")
    assert settings.tracking.model_cache_dir == str(work / "outputs" / "registry")
    assert settings.eval.out_dir == "/elsewhere/eval"  # absolute: where it was
    assert settings.rl.init_from == "Qwen/Qwen2.5-0.5B"  # not the pipeline's own model: not moved
    assert settings.tracking.tracking_uri == ""  # the project's store unless asked
    asked = resolve_settings(PARAMS, {}, "cpu-long", str(work), mlruns_in_work_dir=True)
    assert asked.tracking.tracking_uri == f"sqlite:///{work / 'mlruns' / 'mlflow.db'}"
    assert asked.rl.init_from == asked.sft.out_dir == str(work / "outputs" / "sft") and asked.rl.steps == 40
    assert resolve_settings(PARAMS, {}).data.out_dir == "data/corpus"  # no work_dir, no preset: params.yaml


def test_serve_builds_the_deployments_from_the_flow_file(monkeypatch):
    from flows.serve import DEPLOYMENTS, FORM_DEFAULTS, STUDY_DEFAULTS, deployments

    monkeypatch.chdir(REPO)  # entrypoints are relative to the working directory, as when serving
    built = {d.name: d for d in deployments()}
    assert tuple(built) == DEPLOYMENTS
    assert built["training-pipeline"].entrypoint == "flows/pipeline.py:training_pipeline"
    assert built["evaluate-model"].entrypoint == "flows/pipeline.py:evaluate_model"
    assert built["promote-model"].entrypoint == "flows/pipeline.py:promote_model"
    assert all(d.tags == ["progress-sql"] for d in built.values())
    # The form starts on the default run (params.yaml: the real model), in its own folder; the
    # study at the real model's scale on two arms; the presets are a drop-down.
    assert built["run-study"].entrypoint == "flows/pipeline.py:run_study"
    assert all(d.parameters == FORM_DEFAULTS == {"preset": "none", "work_dir": "runs/default"}
               for name, d in built.items() if name != "run-study")
    assert built["run-study"].parameters == STUDY_DEFAULTS
    assert STUDY_DEFAULTS["preset"] in SCALES and set(STUDY_DEFAULTS["arms"]) <= set(ARMS)
    assert load_settings(PARAMS).model.pretrained == "smollm2"
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(training_pipeline).model_dump()["properties"]  # what the form draws
    assert schema["preset"]["enum"] == list(PRESETS) and {"none", "cpu-demo", "cpu-long"} <= set(PRESETS)
    assert list(schema)[:3] == ["preset", "work_dir", "overrides"]
    # run-study: its scale a drop-down of the scales only (a method is an arm), arms a
    # multi-select of the shipped studies' arm names, seeds a count
    from flows.pipeline import run_study

    form = parameter_schema(run_study).model_dump()["properties"]
    assert list(form)[:4] == ["study", "preset", "arms", "seeds"]
    assert form["preset"]["enum"] == ["none", "cpu-demo", "cpu-long", "cpu-smollm2", "tiny"]
    assert form["arms"]["type"] == "array" and form["arms"]["default"] == []
    assert {"progress-sql", "oneshot", "skyrl-sql", "no-decay"} <= set(form["arms"]["items"]["enum"])
    assert form["seeds"]["type"] == "integer"
