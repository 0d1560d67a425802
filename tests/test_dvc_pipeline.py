"""dvc.yaml: the whole pipeline (build_data → validate_data → init_model → sft → score_questions →
train → evaluate → register) runs with `dvc repro` in a fresh copy of the repository on tiny params,
logs to the default local SQLite MLflow store, registers a champion, then reports nothing to
reproduce; `dvc exp run -S rl.recipe=oneshot` reruns only the stages that read rl.*."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest
import yaml

from conftest import REPO, tiny_params

pytest.importorskip("torch")
mlflow = pytest.importorskip("mlflow")

STAGES = ("build_data", "validate_data", "init_model", "sft", "score_questions", "train", "evaluate", "register")
# the starting points, evaluated once each beside the chain: the summary's zero-shot and SFT columns
STARTS = {"evaluate_zero_shot": "init_model", "evaluate_sft": "sft"}
# the stages that log an MLflow run (build_data is deterministic, score_questions scores nothing
# with rl.questions all), by run name: the starting points' evaluations are `evaluate <label>`
LOGGED = (*(s for s in STAGES if s not in ("build_data", "score_questions")), "evaluate zero-shot", "evaluate sft")
CHAIN = [*zip(STAGES, STAGES[1:]), *((after, start) for start, after in STARTS.items())]
TINY = {
    "data": {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 4,
             "test_size": 4, "indomain_size": 3, "neighbours": 1, "rows_scale": 0.3},
    "model": {"vocab_size": 512, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
              "intermediate_size": 64, "copy_warmup": {"steps": 3}},
    "sft": {"epochs": 0.5, "batch_size": 4, "max_examples": 8, "max_seq_len": 2048},
    "rl": {"env": "single_turn", "steps": 1, "group_size": 2, "questions_per_step": 1, "micro_batch_size": 2,
           "checkpoint_every": 1, "keep_checkpoints": 1},
    "generation": {"backend": "transformers", "max_new_tokens": 8, "batch_size": 4},  # no vLLM engine to start per stage
    "eval": {"splits": ["indomain", "dev"], "vote_k": 0, "pass_k": 0, "max_examples": 3, "batch_size": 4},
}


def _merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict):
            _merge(base.setdefault(key, {}), value)
        else:
            base[key] = value
    return base


def _which(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not on PATH")
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A fresh repository: the package sources the stages depend on, dvc.yaml, tiny params."""
    _which("dvc")
    _which("progress-sql")
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(REPO / "src" / "progress_sql", root / "src" / "progress_sql",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    params = _merge(tiny_params(), json.loads(json.dumps(TINY)))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / ".gitignore").write_text("/mlruns/\n/outputs/registry/\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "DVC_EXP_NAME", "PROGRESS_SQL_PARENT_RUN_ID")}
    env.update(HF_HUB_OFFLINE="1", MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        out = subprocess.run(list(args), cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    run("git", "init", "-q")
    run("dvc", "init", "-q")
    run("dvc", "config", "core.analytics", "false")
    run("dvc", "config", "core.check_update", "false")
    return root, run


@pytest.mark.slow
def test_graph_is_the_whole_pipeline(repo):
    root, run = repo
    dot = run("dvc", "dag", "--dot").stdout
    edges = set(re.findall(r'"(\w+)" -> "(\w+)"', dot))
    assert set(CHAIN) <= edges, dot
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert set(stages) == set(STAGES) | set(STARTS)
    for name in ("init_model", "sft", "score_questions", "train", "evaluate", "register", *STARTS):
        assert stages[name]["cmd"].startswith("progress-sql ") and stages[name]["params"]


@pytest.mark.slow  # the whole tiny pipeline, then an experiment (~1-3 min on 2 cores)
def test_repro_runs_everything_then_nothing_and_an_experiment_reruns_from_train(repo):
    root, run = repo
    out = run("dvc", "repro")
    for stage in (*STAGES, *STARTS):
        assert f"Running stage '{stage}'" in out.stdout
    decision = json.loads((root / "reports" / "registry.json").read_text())
    assert decision["registered"] and decision["version"] == 1 and decision["promoted"]
    metrics = json.loads((root / "reports" / "eval" / "metrics.json").read_text())
    assert metrics["dev"]["n"] == 3 and metrics["indomain"]["n"] == 3
    assert json.loads((root / "reports" / "train" / "rl.json").read_text())["rl/steps"] == 1
    # every long stage says it is alive: its bar as whole status lines in a log, no redraws
    for bar in ("build corpus", "sft", "rl", "eval indomain", "eval dev"):
        assert re.search(rf"^{bar}: +\d+%", out.stderr, re.M), (bar, out.stderr[-3000:])
    # the closing table `make pipeline` prints after `dvc repro`
    table = run("progress-sql", "summary").stdout
    assert re.search(r"^In-domain +3 ", table, re.M) and re.search(r"^Dev +3 ", table, re.M), table
    assert "RL: 1 steps" in table and "registry: progress-sql-policy v1, promoted to champion" in table
    # ... with the starting points beside RL, each with its interval, and RL paired against SFT
    assert re.search(r"^split +n +zero-shot +after SFT +after RL +RL vs SFT", table, re.M), table
    assert re.search(r"^Dev +3 +\d+\.\d % \[[\d.]+, [\d.]+\] .*, p = [\d.e-]+$", table, re.M), table
    assert re.search(r"MLflow run +[0-9a-f]{32} \(models:/progress-sql-policy/1\)", table), table

    started = time.perf_counter()
    again = run("dvc", "repro")
    assert "Data and pipelines are up to date" in again.stdout
    assert time.perf_counter() - started < 60
    shown = json.loads(run("dvc", "metrics", "show", "--json").stdout)
    files = next(iter(shown.values()))["data"]
    assert {"reports/eval/metrics.json", "reports/train/rl.json", "reports/train/sft.json",
            "reports/eval-zero-shot/metrics.json", "reports/eval-sft/metrics.json"} <= set(files)

    # the default tracking store: <repo>/mlruns/mlflow.db, one parent with a nested run per stage
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("progress-sql")
    runs = client.search_runs([exp.experiment_id])
    stage_runs = [r for r in runs if r.data.tags.get("progress_sql.kind") == "stage"]
    assert sorted(r.data.tags["progress_sql.stage"] for r in stage_runs) == sorted(s.split()[0] for s in LOGGED)
    # each named by its stage, the SFT also by the output format it teaches
    assert sorted(r.info.run_name for r in stage_runs) == sorted(s if s != "sft" else "sft think_sql" for s in LOGGED)
    assert len({r.data.tags["mlflow.parentRunId"] for r in stage_runs}) == 1
    assert int(client.get_model_version_by_alias("progress-sql-policy", "champion").version) == 1

    # an experiment: only the stages that read rl.* run again, under their own parent run (SFT
    # among them: it teaches rl.recipe's output format; score_questions samples in it)
    run("git", "add", "-A")
    run("git", "commit", "-q", "-m", "baseline")
    exp_out = run("dvc", "exp", "run", "-S", "rl.recipe=oneshot", "-n", "oneshot")
    ran = set(re.findall(r"Running stage '(\w+)'", exp_out.stdout))
    assert ran == {"sft", "score_questions", "train", "evaluate", "register", *STARTS}, exp_out.stdout
    assert json.loads((root / "reports" / "registry.json").read_text())["version"] == 2
    parents = {r.info.run_name for r in client.search_runs([exp.experiment_id])
               if r.data.tags.get("progress_sql.kind") == "pipeline"}
    assert "dvc-exp-oneshot" in parents
    diff = run("dvc", "metrics", "diff", "--json").stdout
    assert "reports/train/rl.json" in diff

    # dvc repro keeps the train stage's checkpoints (persist: true) and --auto-resume goes on from
    # them: forced to run again with the same settings, the stage resumes at its last step
    forced = run("dvc", "repro", "-f", "-s", "train")
    assert "rl: resumed from outputs/rl/checkpoints/step-1 (same settings and inputs)" in forced.stdout, \
        forced.stdout[-3000:] + forced.stderr[-3000:]


def test_params_rewritten_by_dvc_load_the_same(tmp_path):
    """`dvc exp run -S` rewrites params.yaml with a YAML 1.2 writer that unquotes "off"; the
    settings loader must read it back unchanged (YAML 1.1 would read False)."""
    from dvc.utils.serialize import modify_yaml

    from progress_sql.params import load_settings

    params = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)
    with modify_yaml(params) as tree:
        tree["rl"]["recipe"] = "oneshot"
    assert "judge_backend: off" in params.read_text()
    loaded = load_settings(params)
    assert loaded.rl.recipe == "oneshot"
    assert loaded.model_copy(update={"rl": load_settings(REPO / "params.yaml").rl}) == load_settings(REPO / "params.yaml")
