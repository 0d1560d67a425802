"""Budget-matched studies (progress_sql.studies): one two-arm, one-seed study at the
smallest scale, run for real through ``progress-sql study`` (a subprocess) and through the
``run-study`` flow against a real Prefect server on a free port, each into a real MLflow
store (SQLite), must give the same table and the same metrics; a third arm that fails mid-way is
reported by name beside the finished ones, and a rerun runs only it. What a user compares is
checked where the user sees it: the report and the Prefect ``study`` artifact embed their
figures; each arm × seed MLflow run, named apart, holds the EX of every split and mode first, its
key settings as params and its report files; the runs name the command or flow run that made
them. Bad study files and a method preset given as the scale stop before anything is
written. About 3-4 minutes on two busy cores (a corpus, a tiny policy, one SFT, four RL runs and
evaluations)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

pytest.importorskip("prefect")
pytest.importorskip("mlflow")
pytest.importorskip("torch")

from conftest import REPO  # noqa: E402

sys.path.insert(0, str(REPO))  # flows/ sits beside src/

from local_stack import api_post, prefect_server  # noqa: E402

from progress_sql.studies import StudyError, make_plan  # noqa: E402

# The smallest study: the cpu-demo scale, 2 questions × G 2, one step, one seed, two dev questions.
BUDGET = {"trajectories_per_step": 4, "group_size": 2, "steps": 1, "seeds": 1, "splits": ["dev"],
          "eval_max_examples": 2}


def _write(folder: Path, name: str, arms: list[dict], budget: dict | None = None) -> Path:
    """A checkout of our own: params.yaml beside configs/studies/NAME.yaml (presets: the package's)."""
    (folder / "configs" / "studies").mkdir(parents=True, exist_ok=True)
    if not (folder / "params.yaml").exists():
        shutil.copy(REPO / "params.yaml", folder / "params.yaml")
    path = folder / "configs" / "studies" / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"arms": arms, "budget": budget or BUDGET}), encoding="utf-8")
    return folder / "params.yaml"


def _places(root: Path) -> dict[str, str]:
    return {"study.out_dir": str(root / "out"), "study.shared_dir": str(root.parent / "shared"),
            "study.report_dir": str(root / "reports"),
            "tracking.tracking_uri": f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    exe = Path(sys.executable).with_name("progress-sql")
    return subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def _sets(places: dict[str, str]) -> list[str]:
    return [arg for key, value in places.items() for arg in ("--set", f"{key}={value}")]


def _study_runs(uri: str, flow_run_id: str | None = None) -> tuple[object, dict[str, object], object]:
    """(the parent run, its children by name, the MLflow client) of the first study run in the
    store (or the one of a Prefect flow run), after checking what the Compare view of its arms
    shows. The first run of the test builds the shared stages, under its parent."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("progress-sql")
    # the experiment's charts open on the gate metric
    assert experiment.tags["mlflow.experiment.primaryMetric.name"] == "dev/greedy/ex"
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
    parent = next(r for r in runs if r.info.run_name == "study-two"
                  and r.data.tags.get("prefect.flow_run_id", "") == (flow_run_id or ""))
    assert parent.data.tags["progress_sql.kind"] == "study"
    assert parent.data.params["budget.trajectories_per_step"] == "4" and parent.data.params["budget.splits"] == '["dev"]'
    assert not [k for k in parent.data.metrics if k.startswith("sft/")]  # the shared SFT's summary stays on its run
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    by_name = {r.info.run_name: r for r in children}
    assert len(by_name) == len(children)  # the names tell them apart
    assert all(r.data.tags["mlflow.source.name"] == parent.data.tags["mlflow.source.name"] for r in children)
    if flow_run_id is None:  # the shared SFT, named by the format it teaches and the arms it serves
        assert by_name["sft think_sql (oneshot, single-turn, start)"].data.tags["progress_sql.stage"] == "sft"
    for arm, recipe in (("single-turn", "progress"), ("oneshot", "oneshot")):
        run = by_name[f"{arm} seed 1"]
        metrics = list(run.data.metrics)
        assert metrics[0] == "dev/greedy/ex", metrics[:5]  # first logged: what the Compare view plots
        assert {"dev/greedy/ex", "dev/greedy/exec_rate", "rl/reward_mean", "study/rl_seconds"} <= set(metrics)
        assert parent.data.metrics[f"{arm}/dev/greedy/ex"] == run.data.metrics["dev/greedy/ex"]  # the table
        assert {k: run.data.params[k] for k in ("arm", "rl.recipe", "rl.env", "rl.group_size", "seed")} == {
            "arm": arm, "rl.recipe": recipe, "rl.env": "single_turn", "rl.group_size": "2", "seed": "1"}
        assert not [k for k in run.data.params if k.endswith("out_dir")]  # paths differ by arm: not params
        files = {f.path for f in client.list_artifacts(run.info.run_id)}  # at the top: Compare shows them side by side
        assert {"report.md", "metrics.json", "rl.json", "rl_curve.csv", "settings.json"} <= files, files
    return parent, by_name, client


@pytest.mark.slow
def test_cli_and_prefect_flow_give_the_same_table_and_name_a_failed_arm(tmp_path):
    not_a_model = tmp_path / "not-a-model"  # exists (so the plan accepts it), holds no weights
    not_a_model.mkdir()
    # Two single-turn arms (Progress-SQL's reward without its multi-turn rollouts, and the one-shot
    # baseline) share one SFT checkpoint: the cheapest pair that exercises the sharing.
    # A third arm without RL evaluates that SFT checkpoint, the start the others are tested against.
    arms = [{"name": "single-turn", "preset": "progress-sql-single-turn"}, {"name": "oneshot", "preset": "oneshot"},
            {"name": "start", "preset": "oneshot", "rl": False},
            {"name": "broken", "preset": "oneshot", "overrides": {"rl.init_from": str(not_a_model)}}]
    params = _write(tmp_path, "two", arms)
    cli_places = _places(tmp_path / "cli")

    done = _cli("--preset", "cpu-demo", "study", "two", "--params", str(params), *_sets(cli_places), cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out  # one arm failed: exit 1, after the report of the others
    assert "broken/seed-1 failed" in out and "not-a-model" in out, out
    report = tmp_path / "cli" / "reports" / "two" / "cpu-demo"
    cli_table = json.loads((report / "table.json").read_text())
    assert cli_table["arms"]["single-turn"]["seeds"] == [1] and cli_table["arms"]["broken"]["seeds"] == []
    md = (report / "report.md").read_text()
    assert "| oneshot | dev | greedy | 1 | 2 |" in md  # the paired test of oneshot against the first arm
    assert "| start | dev | greedy | 1 | 2 |" in md and "No RL for start" in md
    row = next(line for line in md.splitlines() if line.startswith("| start | dev | greedy | 1 | 2 |"))
    assert row.split(" | ")[5].endswith("]") and row.split(" | ")[6].endswith("]"), row  # EX [95 % interval]
    start = json.loads((tmp_path / "cli" / "out" / "two" / "cpu-demo" / "start" / "seed-1" / "result.json").read_text())
    assert (start["status"], start["rl_steps"], start["generated_tokens"], start["metrics"]["dev/greedy/n"]) == (
        "done", 0, 0.0, 2)
    assert not (tmp_path / "cli" / "out" / "two" / "cpu-demo" / "start" / "seed-1" / "rl").exists()
    assert "Failed or missing runs" in md and "broken/seed-1" in md
    # figures inlined in both, so any viewer of either file shows them
    assert "![RL reward and rollout EX per step](data:image/png;base64," in md and "](curves.png)" not in md
    assert "src='data:image/png;base64," in (report / "report.html").read_text()
    # The two arms share one corpus, one tiny policy and one SFT checkpoint (same output format).
    shared = tmp_path / "shared"
    markers = {p.name: p.stat().st_mtime_ns for p in shared.glob("*.done")}
    assert sorted(name.split("-")[0] for name in markers) == ["corpus", "sft", "tiny"], markers
    # MLflow: one parent run named as docs/studies.md says, a child per arm × seed, the report among
    # the parent's artifacts; every run names the command that made it.
    parent, children, client = _study_runs(cli_places["tracking.tracking_uri"])
    assert parent.data.tags["mlflow.source.name"].startswith("progress-sql --preset cpu-demo study two --params "
                                                             "params.yaml --set")
    assert parent.data.tags["progress_sql.command"].split()[-1] == f"tracking.tracking_uri={cli_places['tracking.tracking_uri']}"
    assert children["broken seed 1"].info.status == "FAILED"
    assert children["start seed 1"].data.params["rl.steps"] == "0"  # evaluated as RL would start it
    assert children["oneshot seed 1"].data.metrics["dev/greedy/ex"] == cli_table["arms"]["oneshot"]["ex"]["dev/greedy"][0]
    assert {"study/report.md", "study/report.html"} <= {
        f.path for f in client.list_artifacts(parent.info.run_id, "study")}

    # A rerun runs the missing arm only.
    again = _cli("--preset", "cpu-demo", "study", "two", "--params", str(params), *_sets(cli_places), cwd=tmp_path)
    assert again.returncode == 1 and "4 arm × seed runs, 3 done before, 1 to run" in again.stdout, again.stdout

    # The Prefect flow, against a real server, on the same study in another folder (sharing
    # the shared outputs): the same table, the same metrics, the failure named in its state.
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.pipeline import run_study

    flow_places = _places(tmp_path / "flow")
    with prefect_server(tmp_path / "prefect") as stack, temporary_settings({PREFECT_API_URL: stack.api}):
        state = run_study(study="two", preset="cpu-demo", params=str(params), overrides=flow_places,
                                return_state=True)
        # The form's fields pick arms and seeds: two finished arms, in another order, reused.
        picked = run_study(study="two", preset="cpu-demo", arms=["oneshot", "single-turn"], seeds=1,
                                 params=str(params), overrides=flow_places, return_state=True)
        APILogWorker.drain_all(timeout=30)  # the run's logs reach the server before it stops
        artifacts = api_post(stack.api, "/artifacts/filter", {"artifacts": {"key": {"any_": ["study"]}}})
        flow_run = httpx.get(f"{stack.api}/flow_runs/{state.state_details.flow_run_id}", timeout=30).json()
    assert state.is_failed() and "broken/seed-1" in state.message, state.message
    assert picked.is_completed(), picked.message
    assert picked.result()["table"].splitlines()[2].startswith("| oneshot | 1 |")  # the first arm given, first
    # The artifact the Prefect UI shows is the report, its figures inlined (a file name would 404 there).
    assert len(artifacts) == 2 and all("](data:image/png;base64," in a["data"] for a in artifacts)
    flow_report = tmp_path / "flow" / "reports" / "two" / "cpu-demo"
    assert json.loads((flow_report / "table.json").read_text())["arms"] == {
        arm: cli_table["arms"][arm] for arm in ("oneshot", "single-turn")}
    parent, _, _ = _study_runs(flow_places["tracking.tracking_uri"], str(state.state_details.flow_run_id))
    assert parent.data.tags["mlflow.source.name"] == f"prefect flow run-study, run {flow_run['name']}"
    for arm in ("single-turn", "oneshot"):
        ran = [json.loads((tmp_path / where / "out" / "two" / "cpu-demo" / arm / "seed-1" / "result.json").read_text())
               for where in ("cli", "flow")]
        assert ran[0]["metrics"] == ran[1]["metrics"] and ran[0]["metrics"]["dev/greedy/n"] == 2
        assert ran[0]["generated_tokens"] == ran[1]["generated_tokens"] > 0
    assert {p.name: p.stat().st_mtime_ns for p in shared.glob("*.done")} == markers  # reused, not rebuilt


def test_bad_studies_stop_before_anything_runs(tmp_path):
    from typer.testing import CliRunner

    from progress_sql.cli import app

    ok = [{"name": "a", "preset": "progress-sql"}, {"name": "b", "preset": "oneshot"}]
    cases = {
        "unknown": ([{"name": "a", "preset": "progress-sql"}, {"name": "b", "preset": "no-such-preset"}], BUDGET,
                    "arm 'b': unknown preset 'no-such-preset'"),
        "twice": ([{"name": "a", "preset": "progress-sql"}, {"name": "a", "preset": "oneshot"}], BUDGET,
                  "two arms are named 'a'"),
        # reasoning-sql's G is 6 (its paper's): 16 trajectories a step cannot be split into groups of 6
        "indivisible": ([*ok, {"name": "c", "preset": "reasoning-sql"}], {**BUDGET, "group_size": "method",
                                                                          "trajectories_per_step": 16},
                        "arm 'c': its G = 6 does not divide budget.trajectories_per_step = 16"),
        "bad-key": (ok, {**BUDGET, "stepz": 3}, "budget.stepz"),
        "bad-setting": ([ok[0], {"name": "b", "preset": "oneshot", "overrides": {"rl.group_size": 1}}], BUDGET,
                        "rl.group_size"),
    }
    places = _places(tmp_path / "run")
    for name, (arms, budget, message) in cases.items():
        params = _write(tmp_path, name, arms, budget)
        result = CliRunner().invoke(app, ["--preset", "cpu-demo", "study", name, "--params", str(params),
                                          *_sets(places)])
        assert result.exit_code == 2, (name, result.output)
        assert message in result.output, (name, result.output)
    result = CliRunner().invoke(app, ["study", "no-such-study", "--params", str(params)])
    assert result.exit_code == 2 and "unknown study 'no-such-study'; available:" in result.output
    # A method preset is no scale (the arms name the methods); arms are picked by name, two at least.
    for scale, arms, message in (
            ("oneshot", [], "preset 'oneshot' is a method (it sets rl.recipe), not a scale: the arms name the methods; "
                            "scales: none, cpu-demo, cpu-long"),
            ("cpu-demo", ["oneshot", "sky"], "no arm named 'sky' in this study; its arms: progress-sql, oneshot,"),
            ("cpu-demo", ["oneshot"], "pick at least two arms")):
        picked = [arg for arm in arms for arg in ("--arm", arm)]
        result = CliRunner().invoke(app, ["--preset", scale, "study", "methods", *picked, *_sets(places)])
        assert result.exit_code == 2 and message in result.output, (scale, arms, result.output)
    # Without a scale the method presets apply whole: their 7B model is missing, named at once.
    with pytest.raises(StudyError, match="rl.init_from: models/Qwen2.5-Coder-7B-Instruct does not exist"):
        make_plan("methods", REPO / "params.yaml", "none")
    assert not (tmp_path / "run").exists() and not (tmp_path / "shared").exists()  # nothing written


def test_picked_arms_run_in_the_order_given_and_their_runs_name_what_tells_them_apart():
    from progress_sql.tracking import ex_first
    from progress_sql.studies.spec import arm_params

    plan = make_plan("ablations", REPO / "params.yaml", "cpu-demo", arms=["no-decay", "progress-sql"],
                     budget_overrides={"seeds": 1})
    assert plan.arms == ["no-decay", "progress-sql"] and [j.label for j in plan.jobs] == ["no-decay/seed-1",
                                                                                          "progress-sql/seed-1"]
    params = {j.arm: arm_params(plan, j) for j in plan.jobs}
    # the key settings, and the one method key the two arms differ in (no-decay's γ = 1)
    assert params["no-decay"] == {"arm": "no-decay", "rl.recipe": "progress", "rl.env": "odt_feedback",
                                  "rl.algorithm": "grpo", "rl.group_size": 8, "rl.questions_per_step": 2,
                                  "rl.steps": 2, "seed": 1, "rewards.progress.gamma": 1.0}
    assert params["progress-sql"]["rewards.progress.gamma"] == 0.5
    # what MLflow's Compare view plots first: EX of every split and mode, in the budget's split order
    flat = {"dev/n": 6, "dev/greedy/by_hardness/easy/ex": 0.5, "dev/greedy/ex": 0.1, "indomain/greedy/ex": 0.2,
            "dev/vote/ex": 0.3, "indomain/greedy/exec_rate": 1.0}
    assert list(ex_first(flat, ["indomain", "dev"]))[:3] == ["indomain/greedy/ex", "dev/greedy/ex", "dev/vote/ex"]


def test_the_scale_wins_for_paths_and_sizes_and_the_method_keeps_its_protocol():
    demo = make_plan("methods", REPO / "params.yaml", "cpu-demo")  # its cpu-demo budget: G = 4 for all
    assert len(demo.jobs) == 12  # 6 arms × 2 seeds (sft among them: no RL)
    assert {(j.settings.rl.group_size, j.settings.rl.questions_per_step) for j in demo.jobs} == {(4, 4)}
    # each paper's G, the budget matched in trajectories (a multiple of lcm(8, 6, 5) = 120)
    plan = make_plan("methods", REPO / "params.yaml", "cpu-demo",
                     budget_overrides={"group_size": "method", "trajectories_per_step": 120})
    assert any("matched in generated trajectories" in note for note in plan.notes)
    jobs = {job.label: job.settings for job in plan.jobs}
    trail, sky, prog = jobs["sql-trail/seed-1"], jobs["skyrl-sql/seed-2"], jobs["progress-sql/seed-1"]
    # the methods' own protocol: recipe, environment, G, turns, sampling, test-time protocol
    assert (prog.rl.recipe, prog.rl.env, prog.rl.group_size, prog.env.max_turns) == ("progress", "odt_feedback", 8, 4)
    assert (sky.rl.recipe, sky.rl.group_size, sky.env.trail_max_turns, sky.generation.temperature) == ("skyrl", 5, 5, 0.6)
    assert trail.eval.multi_turn and trail.rl.clip_eps_high == 0.28
    assert {s.rl.group_size * s.rl.questions_per_step for s in jobs.values()} == {120}
    # the scale's: the tiny policy and the bundled corpus, not the presets' 7B model and datasets
    assert all(s.data.source == "bundled" and s.model.hidden_size == 64 and s.rl.lr == 1e-4 for s in jobs.values())
    assert jobs["reasoning-sql/seed-1"].rewards.reasoning_sql.judge_backend == "off"
    assert sky.seed == sky.rl.seed == 2
    # one corpus for all; one SFT per output format and settings it reads (progress-sql and oneshot share theirs)
    assert len({j.corpus for j in plan.jobs}) == 1
    sft = {j.arm: j.sft for j in plan.jobs}
    assert sft["progress-sql"] == sft["oneshot"] and len(set(sft.values())) == 4
    assert prog.rl.init_from == str(plan.shared_dir / sft["progress-sql"])


def test_the_async_study_differs_in_rl_async_alone_and_shares_the_sft():
    plan = make_plan("async", REPO / "params.yaml", "cpu-demo")
    assert [j.label for j in plan.jobs] == ["sync/seed-1", "sync/seed-2", "async/seed-1", "async/seed-2"]
    jobs = {j.label: j for j in plan.jobs}
    sync, run = jobs["sync/seed-1"].settings, jobs["async/seed-1"].settings
    assert (sync.rl.async_.enabled, run.rl.async_.enabled, run.rl.async_.max_staleness) == (False, True, 1)
    assert run.model_copy(update={"rl": run.rl.model_copy(update={"async_": sync.rl.async_,
                                                                   "out_dir": sync.rl.out_dir})}).rl == sync.rl
    assert jobs["sync/seed-1"].sft == jobs["async/seed-1"].sft  # one SFT: the arms differ after it


def test_each_seed_run_carries_its_own_seed_in_a_real_store(tmp_path):
    # issue 52: every `<arm> seed 1` run carried the param seed = 2 (the arm's last seed)
    from mlflow.tracking import MlflowClient

    from progress_sql import tracking
    from progress_sql.studies.run import run_name
    from progress_sql.studies.spec import arm_params

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    plan = make_plan("methods", REPO / "params.yaml", "cpu-demo", arms=["oneshot", "progress-sql"],
                     budget_overrides={"seeds": 2})
    first = plan.jobs[0].settings.model_copy(deep=True)
    first.tracking.tracking_uri = uri
    with tracking.pipeline_run(first, "compare-seeds") as parent:
        for job in plan.jobs:
            s = job.settings.model_copy(deep=True)
            s.tracking.tracking_uri = uri
            with tracking.child_pipeline_run(s, run_name(job), parent.info.run_id, params=arm_params(plan, job)):
                pass
    runs = {r.info.run_name: r for r in MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name(first.tracking.experiment).experiment_id])}
    for job in plan.jobs:
        params = runs[run_name(job)].data.params
        assert (params["arm"], params["seed"]) == (job.arm, str(job.seed)), run_name(job)


def test_every_shipped_study_is_a_dvc_stage_at_both_scales():
    """A study is one file of configs/studies/: studies/dvc.yaml's two stages run each of them (its
    ``foreach`` lists the folder's files, no more, no fewer), and the form's arms are theirs."""
    from flows.pipeline import ARMS
    from progress_sql.studies import arm_names, study_names
    from progress_sql.studies.spec import studies_dir

    folder = studies_dir(REPO / "params.yaml")
    stages = yaml.safe_load((REPO / "studies" / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert {name: sorted(stage["foreach"]) for name, stage in stages.items()} == {
        "demo": sorted(study_names(folder)), "paper": sorted(study_names(folder))}
    assert ARMS == arm_names(folder)


def test_arms_drawing_from_a_band_share_each_seeds_scores_and_the_sft_arm_trains_nothing(tmp_path):
    """rl.questions band (the cpu-smollm2 scale's): the study scores the train questions as a shared
    stage, once a seed, for the arms of one output format, and each arm's run accepts those scores
    (built here for real at the smallest sizes); the sft arm needs none."""
    from progress_sql.corpus.records import CorpusLayout
    from progress_sql.studies import build_shared, shared_keys
    from progress_sql.studies.spec import arm_params
    from progress_sql.train.question_scores import band_ids

    places = _places(tmp_path / "run")
    overrides = {**places, "rl.questions": "band", "rl.scores.pool": 3, "rl.scores.k": 2, "tracking.enabled": False}
    plan = make_plan("methods", REPO / "params.yaml", "cpu-demo", arms=["sft", "progress-sql", "oneshot"],
                     overrides=overrides, budget_overrides={"seeds": 2})
    jobs = {j.label: j for j in plan.jobs}
    assert jobs["sft/seed-1"].scores is None and not jobs["sft/seed-1"].rl
    assert arm_params(plan, jobs["sft/seed-1"])["rl.steps"] == 0
    assert jobs["progress-sql/seed-1"].scores == jobs["oneshot/seed-1"].scores != jobs["progress-sql/seed-2"].scores
    assert any("once a seed" in note for note in plan.notes) and any("No RL for sft" in note for note in plan.notes)
    keys, seed_1 = shared_keys(plan), jobs["progress-sql/seed-1"].scores
    assert [k.split("-")[0] for k in keys] == ["corpus", "tiny", "sft", "scores", "scores"]
    for key in keys:  # seed 2's scores left out: one is enough to show they are accepted
        if not key.startswith("scores-") or key == seed_1:
            build_shared(plan, key, log=lambda _: None)
    for label in ("progress-sql/seed-1", "oneshot/seed-1"):  # the same scores, made as either run makes them
        s = jobs[label].settings
        assert s.rl.scores.out_dir == str(plan.shared_dir / seed_1)
        assert isinstance(band_ids(s, CorpusLayout(Path(s.data.out_dir))), list)
    scored = [json.loads(line) for line in (plan.shared_dir / seed_1 / "scores.jsonl").read_text().splitlines()]
    assert len(scored) == 3 and {row["k"] for row in scored} == {2}
