"""`progress-sql train init|sft|rl` and `progress-sql eval` end to end on a tiny corpus and a
tiny policy: each stage writes its outputs and reports, runs inside a nested MLflow run of a
real SQLite store, and fails with a clear message and the right exit code."""

from __future__ import annotations

import csv
import json

import pytest

mlflow = pytest.importorskip("mlflow")
torch = pytest.importorskip("torch")

from mlflow.tracking import MlflowClient  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from progress_sql import tracking  # noqa: E402
from progress_sql.cli import app  # noqa: E402
from progress_sql.params import settings_from_dict  # noqa: E402
from corpora import small_corpus  # noqa: E402

TINY = {
    "data": {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 4,
             "test_size": 4, "neighbours": 1, "rows_scale": 0.3},
    "model": {"vocab_size": 512, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
              "intermediate_size": 64, "max_position_embeddings": 2048, "copy_warmup": {"steps": 3}},
    "sft": {"epochs": 0.5, "batch_size": 4, "max_examples": 8, "max_seq_len": 2048, "copy_rows": 16},
    "rl": {"env": "single_turn", "steps": 2, "group_size": 2, "questions_per_step": 1, "micro_batch_size": 2,
           "checkpoint_every": 1, "keep_checkpoints": 1, "save_rollouts": False},
    "generation": {"max_new_tokens": 8, "batch_size": 4},
    "eval": {"splits": ["dev"], "vote_k": 0, "pass_k": 2, "max_examples": 3, "batch_size": 4},
    "tracking": {"experiment": "cli-stages"},
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A project folder: params.yaml with tiny settings, a built corpus, an MLflow store."""
    root = tmp_path_factory.mktemp("project")
    raw = json.loads(json.dumps(TINY))
    raw["data"]["out_dir"] = str(root / "corpus")
    raw["model"]["base_dir"] = str(root / "base")
    raw["sft"].update(init_from=str(root / "base"), out_dir=str(root / "sft"))
    raw["rl"].update(init_from=str(root / "sft"), out_dir=str(root / "rl"))
    raw["tracking"]["model_cache_dir"] = str(root / "cache")
    settings = settings_from_dict(raw)
    (root / "params.yaml").write_text(json.dumps(settings.model_dump(mode="json")))  # JSON is YAML
    small_corpus(root / "corpus", settings)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        mp.delenv(tracking.PARENT_ENV, raising=False)
        mp.delenv("DVC_EXP_NAME", raising=False)
        mp.setenv("HF_HUB_OFFLINE", "1")  # a missing local model must not become a hub download
        mp.chdir(root)
        torch.set_num_threads(2)
        yield root


@pytest.fixture(autouse=True)
def no_active_run():
    yield
    while mlflow.active_run() is not None:
        mlflow.end_run()


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def stage_runs(name: str) -> list:
    exp = MlflowClient().get_experiment_by_name("cli-stages")
    if exp is None:  # no stage has opened a run yet
        return []
    return [r for r in MlflowClient().search_runs([exp.experiment_id]) if r.data.tags.get("progress_sql.stage") == name]


@pytest.mark.slow  # the tiny policy is built, warm-started and RL-trained (~30 s)
def test_train_init_sft_rl_then_eval(workdir):
    result = cli("train", "init")
    assert result.exit_code == 0, result.output
    assert (workdir / "base" / "config.json").is_file() and "built" in result.output
    assert "copy warmup: 3 steps" in result.output  # the figures of tiny_model.json, said on the console
    (init_run,) = stage_runs("init_model")
    assert 0 <= init_run.data.metrics["copy_warmup/copy_accuracy"] <= 1

    result = cli("train", "sft", "--no-progress")
    assert result.exit_code == 0, result.output
    summary = json.loads((workdir / "reports" / "train" / "sft.json").read_text())
    rows = list(csv.DictReader((workdir / "reports" / "train" / "sft_loss.csv").open()))
    assert summary["sft/steps"] == len(rows) >= 1 and summary["sft/final_loss"] > 0
    assert summary["sft/final_copy_loss"] > 0 and ", copy loss " in result.output  # sft.copy_rows (cpu-long's 16)
    (sft_run,) = stage_runs("sft")
    history = MlflowClient().get_metric_history(sft_run.info.run_id, "sft/loss")
    assert [m.step for m in history] == list(range(1, len(rows) + 1))
    assert sft_run.data.metrics["sft/final_loss"] == pytest.approx(summary["sft/final_loss"], abs=1e-5)

    result = cli("train", "rl", "--no-progress")
    assert result.exit_code == 0, result.output
    assert "stopped by steps" in result.output and (workdir / "rl" / "final" / "config.json").is_file()
    curve = list(csv.DictReader((workdir / "reports" / "train" / "rl_curve.csv").open()))
    assert [int(r["step"]) for r in curve] == [1, 2] and "reward/mean" in curve[0]
    rl = json.loads((workdir / "reports" / "train" / "rl.json").read_text())
    assert rl["rl/steps"] == 2 and "rl/reward_mean" in rl
    n_train = len((workdir / "corpus" / "train.jsonl").read_text().splitlines())
    assert rl["rl/questions"] == n_train and f"on {n_train} train questions (rl.questions: all)" in result.output
    (rl_run,) = stage_runs("train")
    assert [m.step for m in MlflowClient().get_metric_history(rl_run.info.run_id, "rl/reward/mean")] == [1, 2]

    # all three stages nest under one parent run for this configuration
    parents = {r.data.tags["mlflow.parentRunId"] for name in ("init_model", "sft", "train") for r in stage_runs(name)}
    assert len(parents) == 1
    parent = MlflowClient().get_run(parents.pop())
    assert parent.data.params["data_version"] == tracking.data_version(workdir / "corpus")
    assert parent.data.metrics["rl/steps"] == 2 and "sft/final_loss" in parent.data.metrics

    result = cli("train", "rl", "--no-progress", "--resume", "--set", "rl.steps=3")
    assert result.exit_code == 0, result.output
    assert [int(r["step"]) for r in csv.DictReader((workdir / "reports" / "train" / "rl_curve.csv").open())] == [1, 2, 3]

    result = cli("eval", "--model", "rl/final", "--out", "reports/eval", "--no-progress")
    assert result.exit_code == 0, result.output
    metrics = json.loads((workdir / "reports" / "eval" / "metrics.json").read_text())
    assert metrics["dev"]["n"] == 3 and 0.0 <= metrics["dev"]["greedy"]["ex"] <= 1.0
    assert (workdir / "reports" / "eval" / "plots" / "hardness.csv").is_file()
    (eval_run,) = stage_runs("evaluate")
    assert eval_run.data.metrics["dev/greedy/ex"] == metrics["dev"]["greedy"]["ex"]
    assert "dev/pass_at_2/ex" in eval_run.data.metrics
    logged = {a.path for a in MlflowClient().list_artifacts(eval_run.info.run_id, "eval")}
    assert {"eval/metrics.json", "eval/report.md", "eval/hardness.csv", "eval/hardness.png"} <= logged
    assert "note: logged to the active MLflow run" in result.output

    # the pipeline's closing table, from the files the stages wrote (no register stage ran here)
    result = cli("summary")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("split"))
    assert header.split() == ["split", "n", "Greedy", "EX", "Pass@2", "EX"]
    (dev_row,) = [line for line in lines if line.startswith("Dev ")]
    assert dev_row.split()[:3] == ["Dev", "3", f"{100 * metrics['dev']['greedy']['ex']:.1f}"]
    history = [json.loads(line) for line in (workdir / "rl" / "metrics.jsonl").read_text().splitlines()]
    (reward,) = [line for line in lines if line.strip().startswith("reward/mean")]
    assert f"step 1 {history[0]['reward/mean']:.3f} → step 3 {history[-1]['reward/mean']:.3f}" in reward
    assert "RL: 3 steps" in result.output and "policy" in result.output and "rl/final" in result.output
    assert "MLflow store" in result.output and "mlflow.db" in result.output


def test_eval_resolves_a_registry_uri(workdir, tmp_path):
    from progress_sql.train.tiny import build_tiny_model

    settings = settings_from_dict(json.loads((workdir / "params.yaml").read_text()))
    folder = build_tiny_model(workdir / "corpus", settings, tmp_path / "policy")
    version = tracking.register_model(folder, "cli-eval", settings=settings)
    tracking.promote("cli-eval", version, settings)
    result = cli("eval", "--model", "models:/cli-eval@champion", "--out", str(tmp_path / "eval"), "--no-progress",
                 "--set", "eval.pass_k=0")
    assert result.exit_code == 0, result.output
    assert "evaluated models:/cli-eval@champion" in result.output and "gate dev/greedy/ex:" in result.output
    (run,) = [r for r in stage_runs("evaluate") if r.data.params.get("eval.model") == "models:/cli-eval@champion"]
    assert run.data.metrics["dev/n"] == 3


def test_eval_with_the_oracle_scores_one(workdir, tmp_path):
    result = cli("eval", "--model", "oracle", "--split", "dev", "--split", "indomain", "--split", "syn",
                 "--out", str(tmp_path / "o"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "gate dev/greedy/ex: 1.0000" in result.output
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["dev"]["greedy"]["ex"] == 1.0 and metrics["syn"]["greedy"]["ex"] == 1.0
    assert metrics["indomain"]["greedy"]["ex"] == 1.0 and metrics["indomain"]["n"] == 3
    assert "## Table 1: main splits" in (tmp_path / "o" / "report.md").read_text()
    assert "In-domain" in (tmp_path / "o" / "report.md").read_text()


def test_stage_failures_exit_1_with_a_message(workdir, tmp_path):
    before = len(stage_runs("sft"))
    result = cli("train", "sft", "--set", f"sft.init_from={tmp_path / 'nothing'}", "--no-progress")
    assert result.exit_code == 1 and "sft.init_from" in result.output
    assert len(stage_runs("sft")) == before, "a missing model stops the stage before its run opens"
    (tmp_path / "not-a-model").mkdir()
    result = cli("train", "sft", "--set", f"sft.init_from={tmp_path / 'not-a-model'}", "--no-progress")
    assert result.exit_code == 1 and "error: stage sft failed" in result.output
    result = cli("train", "init", "--corpus", str(tmp_path / "no-corpus"))
    assert result.exit_code == 1 and "error: stage init_model failed" in result.output
    result = cli("eval", "--model", "oracle", "--split", "nonsense", "--no-progress")
    assert result.exit_code == 1 and "unknown split" in result.output
    result = cli("eval", "--model", "models:/never-registered@champion", "--no-progress")
    assert result.exit_code == 1 and "cannot resolve" in result.output
    result = cli("train", "rl", "--resume-from", str(tmp_path / "no-checkpoint"), "--no-progress")
    assert result.exit_code == 1 and "error: stage train failed" in result.output
    failed = [r for r in stage_runs("sft") if r.info.status == "FAILED"]
    assert failed, "the failed stage's MLflow run is marked FAILED"


def test_bad_settings_exit_2(workdir):
    for args in (["train", "sft", "--set", "sft.lr=-1"], ["train", "rl", "--set", "rl.recipe=nope"],
                 ["eval", "--model", "oracle", "--set", "eval.vote_k=x"], ["train", "init", "--params", "missing.yaml"]):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output
