"""MLflow runs of the pipeline on a real SQLite tracking store: URI resolution, the parent run
per pipeline run with nested stage runs, flattened params and the data version, metrics on
stage and parent runs, artifacts, and two pipeline runs that compare side by side."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

mlflow = pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from progress_sql import tracking  # noqa: E402
from progress_sql.cli import app  # noqa: E402
from progress_sql.params import Settings, settings_from_dict  # noqa: E402
from corpora import small_corpus  # noqa: E402
from progress_sql.eval import EvalResult  # noqa: E402

from conftest import REPO  # noqa: E402

CORPUS = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 6,
          "test_size": 6, "neighbours": 1, "rows_scale": 0.3}


# `store` (one SQLite tracking store per module) comes from conftest.py.
pytestmark = pytest.mark.usefixtures("no_active_run")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("tracking") / "corpus"
    small_corpus(out, settings_from_dict({"data": CORPUS}))
    return out


def make_settings(experiment: str, corpus: Path | None = None, **sections) -> Settings:
    raw = {"data": {**CORPUS, "out_dir": str(corpus or "no-corpus-here")}, **sections}
    raw["tracking"] = {"experiment": experiment, **sections.get("tracking", {})}
    return settings_from_dict(raw)


def runs_of(experiment: str) -> list:
    exp = MlflowClient().get_experiment_by_name(experiment)
    return MlflowClient().search_runs([exp.experiment_id]) if exp else []


# ----------------------------------------------------------------------------- URI and params
def test_tracking_uri_env_wins_then_settings_then_local_sqlite(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    custom = settings_from_dict({"tracking": {"tracking_uri": "sqlite:///custom.db"}})
    assert tracking.tracking_uri(custom) == "http://127.0.0.1:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.tracking_uri(custom) == "sqlite:///custom.db"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking.tracking_uri(Settings()) == f"sqlite:///{tmp_path.resolve() / 'mlruns' / 'mlflow.db'}"
    monkeypatch.delenv("DVC_ROOT")
    monkeypatch.chdir(tmp_path)
    assert tracking.tracking_uri(Settings()).endswith(f"{tmp_path.name}/mlruns/mlflow.db")


def test_settings_flatten_to_every_params_yaml_leaf():
    params = tracking.settings_params(Settings())
    raw = tracking.flat_params(yaml.safe_load((REPO / "params.yaml").read_text()))
    # and those params.yaml leaves to the registry: a run records every value it used
    assert set(params) - set(raw) == {"data.import_train", "data.import_eval"} and set(raw) <= set(params)
    assert json.loads(params["data.import_eval"]) == ["spider", "bird"]
    assert params["odt.weights.select"] == "0.2" and params["rl.recipe"] == "progress"
    assert json.loads(params["eval.splits"]) == ["indomain", "dev", "test", "syn", "realistic", "dk"]


def test_data_version_follows_the_manifest(corpus, tmp_path):
    version = tracking.data_version(corpus)
    assert version and len(version) == 16
    assert tracking.data_version(tmp_path) is None
    copy = tmp_path / "manifest.json"
    copy.write_text((corpus / "manifest.json").read_text() + " ")
    assert tracking.data_version(tmp_path) not in (None, version)


# ----------------------------------------------------------------------------- runs
def test_pipeline_run_nests_stage_runs_with_params_metrics_and_artifacts(store, corpus, tmp_path):
    settings = make_settings("nesting", corpus)
    report = tmp_path / "report.md"
    report.write_text("# validation\nall good\n")
    with tracking.pipeline_run(settings, "nightly") as parent:
        assert os.environ[tracking.PARENT_ENV] == parent.info.run_id
        with tracking.stage_run("sft", settings):
            for step, loss in enumerate([3.0, 2.0, 1.5]):
                tracking.log_step_metrics({"sft/loss": loss, "note": "text is skipped"}, step)
            tracking.log_metrics({"sft/final_loss": 1.5})
        with tracking.stage_run("evaluate", settings):
            tracking.log_metrics({"dev/greedy/ex": 0.5, "dev/vote@8/ex": 0.6})
            tracking.log_artifacts(report, "eval")
    assert tracking.PARENT_ENV not in os.environ

    runs = {r.info.run_name: r for r in runs_of("nesting")}
    assert set(runs) == {"nightly", "sft", "evaluate"}
    top = runs["nightly"]
    assert top.data.params["rl.recipe"] == "progress" and top.data.params["data.train_size"] == "12"
    assert top.data.params["data_version"] == tracking.data_version(corpus)
    assert len([k for k in top.data.params if k != "data_version"]) == len(tracking.settings_params(settings))
    for stage in ("sft", "evaluate"):
        assert runs[stage].data.tags["mlflow.parentRunId"] == top.info.run_id
        assert runs[stage].data.tags["progress_sql.stage"] == stage
        assert runs[stage].data.params["data_version"] == tracking.data_version(corpus)
    history = MlflowClient().get_metric_history(runs["sft"].info.run_id, "sft/loss")
    assert [(m.step, m.value) for m in history] == [(0, 3.0), (1, 2.0), (2, 1.5)]
    assert "note" not in runs["sft"].data.metrics
    # summary metrics reach the parent, '@' made MLflow-safe
    assert top.data.metrics == {"sft/final_loss": 1.5, "dev/greedy/ex": 0.5, "dev/vote_8/ex": 0.6}
    assert [a.path for a in MlflowClient().list_artifacts(runs["evaluate"].info.run_id, "eval")] == ["eval/report.md"]


def test_runs_name_what_ran_and_a_parent_of_another_kind_keeps_its_own_metrics(store, monkeypatch):
    """Every run names its source: the command line (paths shortened for MLflow's UI, which shows
    a local source's text after its last '/'; the whole line in progress_sql.command), or what a
    caller names instead (a Prefect flow run: MLflow would say engine.py). A stage's run may have
    a name of its own, its stage tag unchanged. Only a pipeline run collects its stages' summaries:
    a study's runs log their own, in their own order."""
    settings = make_settings("sources")
    monkeypatch.delenv(tracking.mlflow_runs.SOURCE_ENV, raising=False)
    monkeypatch.setattr("sys.argv", ["/venv/bin/progress-sql", "--preset", "cpu-demo", "train", "sft",
                                     "--params", "/work/x/params.yaml", "--set", "data.out_dir=/tmp/c/corpus"])
    with tracking.pipeline_run(settings, "by-hand"):
        with tracking.stage_run("sft", settings, run_name="sft think_sql"):
            tracking.log_metrics({"sft/final_loss": 1.5})
    with tracking.run_source("prefect flow run-study, run brave-fox"):
        with tracking.pipeline_run(settings, "study-x", tags={tracking.KIND_TAG: "study"},
                                   params={"budget.steps": 2, "budget.splits": ["dev"]}):
            with tracking.stage_run("sft", settings):
                tracking.log_metrics({"sft/final_loss": 1.5})
    runs = {r.info.run_name: r for r in runs_of("sources")}
    command = "progress-sql --preset cpu-demo train sft --params /work/x/params.yaml --set data.out_dir=/tmp/c/corpus"
    for name in ("by-hand", "sft think_sql"):
        assert runs[name].data.tags["mlflow.source.name"] == ("progress-sql --preset cpu-demo train sft --params "
                                                              "params.yaml --set data.out_dir=corpus")
        assert runs[name].data.tags["progress_sql.command"] == command
    assert runs["sft think_sql"].data.tags["progress_sql.stage"] == "sft"
    assert runs["by-hand"].data.metrics == {"sft/final_loss": 1.5}
    for name in ("study-x", "sft"):
        assert runs[name].data.tags["mlflow.source.name"] == "prefect flow run-study, run brave-fox"
    assert runs["study-x"].data.metrics == {}  # a study's parent: the SFT's summary stays on its run
    assert runs["study-x"].data.params == {"budget.steps": "2", "budget.splits": '["dev"]'}
    # only what run_source names reaches the processes a run starts (a command they run names itself)
    assert tracking.mlflow_runs.SOURCE_ENV not in os.environ
    experiment = MlflowClient().get_experiment_by_name("sources")
    assert experiment.tags["mlflow.experiment.primaryMetric.name"] == "dev/greedy/ex"  # eval.gate_metric


def test_standalone_stages_share_a_parent_per_configuration_and_per_dvc_experiment(store, monkeypatch):
    base = make_settings("standalone")
    with tracking.stage_run("build_data", base):
        pass
    with tracking.stage_run("init_model", base):
        pass
    variant = make_settings("standalone", rl={"recipe": "oneshot"})
    with tracking.stage_run("train", variant):
        pass
    monkeypatch.setenv("DVC_EXP_NAME", "brave-fox")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "abcdef1234")
    with tracking.stage_run("train", variant):
        pass

    runs = runs_of("standalone")
    parents = {r.info.run_id: r for r in runs if r.data.tags.get("progress_sql.kind") == "pipeline"}
    children = [r for r in runs if r.data.tags.get("progress_sql.kind") == "stage"]
    assert len(parents) == 3 and len(children) == 4
    by_parent: dict[str, list[str]] = {}
    for child in children:
        by_parent.setdefault(child.data.tags["mlflow.parentRunId"], []).append(child.info.run_name)
    names = {parents[p].info.run_name: sorted(v) for p, v in by_parent.items()}
    assert names["dvc-exp-brave-fox"] == ["train"]
    assert sorted(names.values()) == [["build_data", "init_model"], ["train"], ["train"]]
    assert all(p.info.status == "FINISHED" for p in parents.values())
    exp_parent = next(p for p in parents.values() if p.info.run_name == "dvc-exp-brave-fox")
    assert exp_parent.data.params["rl.recipe"] == "oneshot"


def test_a_failing_stage_is_marked_failed(store):
    settings = make_settings("failing")
    with pytest.raises(ValueError, match="boom"):
        with tracking.pipeline_run(settings, "p"):
            with tracking.stage_run("train", settings):
                raise ValueError("boom")
    status = {r.info.run_name: r.info.status for r in runs_of("failing")}
    assert status == {"p": "FAILED", "train": "FAILED"}


def test_logging_without_a_run_or_with_tracking_off_does_nothing(store, tmp_path):
    tracking.log_step_metrics({"x": 1.0}, 0)
    tracking.log_metrics({"x": 1.0})
    tracking.log_params({"a": 1})
    tracking.log_artifacts(tmp_path)
    assert tracking.log_eval(EvalResult("m", {}, {"dev/greedy/ex": 1.0}, {"metrics": tmp_path / "m.json"})) is False
    off = make_settings("off", tracking={"enabled": False})
    with tracking.pipeline_run(off, "p") as run, tracking.stage_run("sft", off) as stage:
        assert run is None and stage is None and mlflow.active_run() is None
    assert runs_of("off") == []


def test_metric_keys_are_made_mlflow_safe():
    assert tracking.mlflow_key("dev/vote@8/by_difficulty/very hard?") == "dev/vote_8/by_difficulty/very hard_"


def test_stage_run_needs_settings_outside_a_pipeline(store):
    with pytest.raises(tracking.TrackingError, match="needs settings"):
        with tracking.stage_run("sft"):
            pass


# ----------------------------------------------------------------------------- side by side
def test_two_pipeline_runs_expose_the_same_metric_keys(store, corpus, tmp_path):
    """Two recipes evaluated through the CLI inside two pipeline runs: the parent runs carry
    the same metric keys (so the experiment table compares them column by column)."""
    runner = CliRunner()
    keys = []
    for recipe in ("progress", "reasoning_sql"):
        settings = make_settings("side-by-side", corpus, rl={"recipe": recipe}, eval={"vote_k": 2, "pass_k": 0})
        params = tmp_path / f"{recipe}.yaml"
        params.write_text(yaml.safe_dump(settings.model_dump(mode="json")))
        with tracking.pipeline_run(settings, f"run-{recipe}") as parent:
            result = runner.invoke(app, ["eval", "--model", "oracle", "--split", "dev", "--split", "syn",
                                         "--out", str(tmp_path / recipe), "--params", str(params), "--no-progress"])
            assert result.exit_code == 0, result.output
            assert "gate dev/greedy/ex: 1.0000" in result.output
        metrics = MlflowClient().get_run(parent.info.run_id).data.metrics
        assert metrics["dev/greedy/ex"] == 1.0 and metrics["syn/vote_at_2/ex"] == 1.0
        keys.append(set(metrics))
    assert keys[0] == keys[1] and len(keys[0]) > 20
    stages = [r for r in runs_of("side-by-side") if r.info.run_name == "evaluate"]
    assert len(stages) == 2 and all(r.data.params["eval.model"] == "oracle" for r in stages)


def test_configured_store_does_not_stick(tmp_path, monkeypatch):
    """mlflow.set_tracking_uri writes MLFLOW_TRACKING_URI: a store configured once must not
    shadow the next settings' store, while a user-set variable still wins."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = settings_from_dict({"tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'a' / 'a.db'}"}})
    second = settings_from_dict({"tracking": {"tracking_uri": f"sqlite:///{tmp_path / 'b' / 'b.db'}"}})
    tracking.configure(first)
    assert tracking.tracking_uri(second) == second.tracking.tracking_uri
    user = f"sqlite:///{tmp_path / 'user.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", user)
    assert tracking.tracking_uri(first) == user
    tracking.configure(first)
    assert tracking.tracking_uri(second) == user


# ----------------------------------------------------------------------------- faults
KILLED_SCRIPT = """
import sys, time
from progress_sql import tracking
from progress_sql.params import settings_from_dict
settings = settings_from_dict({"tracking": {"experiment": "killed"}, "data": {"out_dir": "nowhere"}})
with tracking.pipeline_run(settings, "pipeline"):
    with tracking.stage_run("train", settings):
        print(tracking.active_run_id(), flush=True)
        time.sleep(120)
"""


def test_runs_of_a_killed_process_are_marked_killed_by_the_next_run(store):
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        assert child.stdout.readline().strip()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # the store the child wrote to

    def status() -> dict[str, str]:
        experiment = client.get_experiment_by_name("killed")
        return {r.info.run_name: r.info.status for r in client.search_runs([experiment.experiment_id])}

    assert status() == {"pipeline": "RUNNING", "train": "RUNNING"}
    settings = make_settings("killed")
    with tracking.pipeline_run(settings, "alive"):  # a run of a living process is left alone
        tracking.mlflow_runs._configured.clear()  # as in the next process
        tracking.configure(settings)
        assert status() == {"pipeline": "KILLED", "train": "KILLED", "alive": "RUNNING"}


def test_a_copied_store_writes_its_artifacts_beside_itself(tmp_path, monkeypatch, no_active_run):
    import shutil

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    note = tmp_path / "note.txt"
    note.write_text("hello", encoding="utf-8")

    def run_once(root: Path) -> str:
        settings = settings_from_dict({"tracking": {"experiment": "moved",
                                                    "tracking_uri": f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"},
                                       "data": {"out_dir": "nowhere"}})
        with tracking.pipeline_run(settings, "p") as run:
            tracking.log_artifacts(note)
            return run.info.run_id

    first = run_once(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with pytest.warns(UserWarning, match="moved or copied"):
        second = run_once(tmp_path / "b")
    assert (tmp_path / "b" / "mlruns" / "artifacts" / second / "artifacts" / "note.txt").is_file()
    assert not (tmp_path / "a" / "mlruns" / "artifacts" / second).exists()
    client = MlflowClient(f"sqlite:///{tmp_path / 'b' / 'mlruns' / 'mlflow.db'}")
    assert client.get_run(first).info.artifact_uri.startswith((tmp_path / "b").resolve().as_uri())
    assert client.download_artifacts(first, "note.txt", str(tmp_path)).endswith("note.txt")


def test_a_folder_named_with_uri_characters_keeps_its_store_inside_it(tmp_path, monkeypatch, no_active_run):
    # issue 39: in a folder named "odd #1 %20?x" the store went to a file "odd #1  " beside it
    from progress_sql.servers import mlflow_store_uri

    odd = tmp_path / "odd #1 %20?x"
    odd.mkdir()
    note = odd / "note.txt"
    note.write_text("hello", encoding="utf-8")
    monkeypatch.chdir(odd)
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", tracking.PARENT_ENV):
        monkeypatch.delenv(name, raising=False)
    settings = make_settings("odd")
    with tracking.pipeline_run(settings, "p") as run:
        tracking.log_artifacts(note)
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]  # nothing beside the folder
    store = odd / "mlruns" / "mlflow.db"
    assert store.is_file()
    client = MlflowClient(tracking.tracking_uri(settings))
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert (odd / "mlruns" / "artifacts" / run.info.run_id / "artifacts" / "note.txt").is_file()
    assert mlflow_store_uri(odd) == tracking.tracking_uri(settings)  # `progress-sql ui` opens the same store
    (odd / "params.yaml").write_text("tracking:\n  tracking_uri: sqlite:///mlruns/mlflow.db\n", encoding="utf-8")
    assert mlflow_store_uri(odd) == tracking.tracking_uri(settings)  # a relative SQLite path, made absolute


# ----------------------------------------------------------------------------- what the model says
def test_rl_episodes_are_traces_with_a_span_per_turn(store, school_db):
    """An RL step's episodes, as ``run_rl`` hands them to ``on_episodes``, read back from the
    store as the Traces tab shows them: the question in, the verdict out, a span per turn with
    its prompt tail, output, ODT feedback and reward so far, tagged with the step."""
    from progress_sql import envs, rewards
    from progress_sql.corpus.records import Example
    from progress_sql.envs import ScriptedPolicy, rollout
    from progress_sql.train.samples import episode_view

    gold = "SELECT name FROM student WHERE age > 20"
    older = Example(id="q1", db_id="school", question="Which students are older than 20?", gold_sql=gold,
                    hardness="easy")
    out = "<think>Reasoning.</think>\n<sql>{}</sql>".format
    s = make_settings("episodes", env={"max_turns": 2})
    policy = ScriptedPolicy([[out("SELECT name FROM student"), out(gold)], [out("SELECT nope FROM student"), out("SELECT 1")]])
    episodes = rollout(lambda: envs.get("odt_feedback")(s), policy, [older, older], lambda _: school_db)
    recipe = rewards.get("progress")
    views = [episode_view(ep, recipe(ep.trajectory(), s), recipe, s, step=3) for ep in episodes]
    with tracking.stage_run("train", s) as run:
        assert tracking.log_episodes(views) == 2

    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
    assert len(traces) == 2
    by_verdict = {t.info.tags["verdict"]: t for t in traces}
    assert set(by_verdict) == {"correct", "wrong"}
    right = by_verdict["correct"]
    assert right.info.tags[tracking.episodes.KIND] == "rl" and right.info.tags["step"] == "3"
    root = next(sp for sp in right.data.spans if sp.parent_id is None)
    assert root.inputs["question"] == older.question and root.inputs["gold_sql"] == gold
    # rewards are shown to 4 decimals (2.2943, not 2.2942857142857145); the views keep the exact ones
    assert views[0]["reward"] != round(views[0]["reward"], 4)
    assert root.outputs["verdict"] == "correct" and root.outputs["reward"] == round(views[0]["reward"], 4)
    assert root.attributes["reward"] == round(views[0]["reward"], 4)
    assert root.outputs["components"] == {k: round(v, 4) for k, v in views[0]["components"].items()}
    turns = sorted((sp for sp in right.data.spans if sp.parent_id == root.span_id), key=lambda sp: sp.name)
    assert [sp.name for sp in turns] == ["turn 1", "turn 2"]
    assert turns[0].outputs["feedback"] == views[0]["turns"][0]["feedback"] != ""  # the ODT's diagnosis
    assert turns[0].attributes["odt_tags"] == "WHERE_MISSING" and turns[0].attributes["correct"] is False
    assert turns[1].attributes["correct"] is True
    assert [sp.attributes["reward_so_far"] for sp in turns] == [round(t["reward_so_far"], 4) for t in views[0]["turns"]]
    assert "older than 20" in turns[0].inputs["prompt_tail"]


def test_an_evaluation_logs_its_best_and_worst_answers_as_traces(store, corpus, tmp_path):
    """``eval`` logs eval.log_examples best and worst greedy answers of each split as traces of its
    stage run; the ranking puts right before wrong, executed before not."""
    from progress_sql import stages
    from progress_sql.tracking.episodes import best_and_worst

    s = make_settings("eval-examples", corpus, eval={"log_examples": 2, "ts": False})
    stages.evaluate(s, "oracle", corpus, ["dev"], tmp_path / "eval", progress=False)
    [run] = [r for r in runs_of("eval-examples") if r.data.tags.get("progress_sql.stage") == "evaluate"]
    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
    assert sorted(t.info.tags["rank"] for t in traces) == ["best", "best", "worst", "worst"]
    assert {t.info.tags["split"] for t in traces} == {"dev"} and {t.info.tags["verdict"] for t in traces} == {"correct"}
    [turn] = [sp for sp in traces[0].data.spans if sp.parent_id is not None]
    assert turn.outputs["sql"] and turn.inputs["question"]

    def rec(i, ex, executed):
        return {"id": i, "greedy": {"ex": ex, "executed": executed, "well_formed": True, "odt_tags": []}}

    records = [rec("a", False, True), rec("b", True, True), rec("c", False, False), rec("d", True, True)]
    assert [(rank, r["id"]) for rank, r in best_and_worst(records, 1)] == [("best", "b"), ("worst", "c")]
    assert [r["id"] for _, r in best_and_worst(records, 3)] == ["b", "d", "a", "c"]  # none twice
