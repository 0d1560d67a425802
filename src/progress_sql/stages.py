"""The pipeline's stages, each in one place: the package call, its nested MLflow run
(``tracking.stage_run``, named as in dvc.yaml), the report files and what goes to MLflow.

Two thin callers run them: the CLI commands (``progress-sql data|train|eval|registry``, which
the DVC stages run) and the Prefect tasks of flows/pipeline.py. Callers parse their arguments,
call a stage and print or log its summary; how a failure ends (an exit code, a failed task) is
theirs. A stage that raises leaves its MLflow run marked FAILED.

A stage that writes a run folder (``sft``, ``train``, ``evaluate``) holds its writer lock
(``files.writer_lock``) from before torch and MLflow are imported and its MLflow run opens, to
its end: a second one on the same folder stops within a second and leaves nothing behind.

Heavy modules (torch, MLflow, Great Expectations) are imported inside the functions: the CLI
imports this module for every command.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from progress_sql.files import writer_lock

if TYPE_CHECKING:
    from progress_sql.params import Settings
    from progress_sql.data.validation import ValidationReport
    from progress_sql.eval.runner import EvalResult
    from progress_sql.eval.summary import PipelineSummary
    from progress_sql.tracking import PromotionDecision
    from progress_sql.train.sft import SFTResult
    from progress_sql.train.trainer import RLResult


def build_data(settings: Settings, out: str | Path | None = None, *, progress: bool = True) -> dict[str, Any]:
    """``build_data``: the corpus into ``out`` (default ``data.out_dir``); its manifest. By
    ``data.source``: the bundled corpus (generated from ``data.seed``) or the datasets on disk
    that ``data.import_*`` name (``data.importing``). Deterministic and fingerprinted by its
    manifest, so it is not an MLflow run."""
    if settings.data.source == "import":
        from progress_sql.data.importing import import_corpus

        return import_corpus(settings, Path(out or settings.data.out_dir), progress=progress)
    from progress_sql.data.build import build_corpus

    return build_corpus(settings, Path(out or settings.data.out_dir), progress=progress)


def validate_data(settings: Settings, corpus_dir: str | Path, report_dir: str | Path) -> ValidationReport:
    """``validate_data``: the Great Expectations suite over the corpus; validation.json/.md go
    to ``report_dir`` and, inside the stage's MLflow run, to its artifacts. The verdict is
    the caller's to act on (``report.success``)."""
    from progress_sql.data.validation import validate_corpus

    if not settings.tracking.enabled:  # MLflow is an optional extra: not even imported then
        return validate_corpus(Path(corpus_dir), settings, Path(report_dir))
    from progress_sql import tracking

    with tracking.stage_run("validate_data", settings, corpus_dir=str(corpus_dir)):
        report = validate_corpus(Path(corpus_dir), settings, Path(report_dir))
        tracking.log_artifacts(report_dir)
    return report


def init_model(settings: Settings, corpus_dir: str | Path, out: str | Path | None = None, *,
               progress: bool = True) -> Path:
    """``init_model``: the tiny policy (a BPE tokenizer trained on the corpus, a model from
    ``model.*``, copy-pretrained by ``model.copy_warmup``) in ``out`` (default
    ``model.base_dir``), or with ``model.pretrained`` that model saved there; its folder."""
    from progress_sql import tracking
    from progress_sql.train.tiny import build_tiny_model

    if settings.model.pretrained:
        from progress_sql.inference.models import export_pretrained

        path = Path(out or settings.model.base_dir)
        with tracking.stage_run("init_model", settings, corpus_dir=str(corpus_dir)):
            info = export_pretrained(settings.model.pretrained, path)
            tracking.log_metrics({"parameters": info["parameters"]}, to_parent=False)
            tracking.log_artifacts(path / "pretrained_model.json")
        return path
    with tracking.stage_run("init_model", settings, corpus_dir=str(corpus_dir)):
        path = build_tiny_model(corpus_dir, settings, out, progress=progress)
        warmup = json.loads((path / "tiny_model.json").read_text(encoding="utf-8"))["copy_warmup"]
        tracking.log_metrics({f"copy_warmup/{k}": v for k, v in warmup.items()}, to_parent=False)
        tracking.log_artifacts(path / "tiny_model.json")
    return path


def sft(settings: Settings, corpus_dir: str | Path, *, out: str | Path | None = None, report_dir: str | Path,
        progress: bool = True, run_name: str | None = None) -> tuple[SFTResult, dict[str, float]]:
    """``sft``: the warm start from ``sft.init_from`` into ``out`` (default ``sft.out_dir``);
    sft.json and sft_loss.csv go to ``report_dir``, the loss curve and the summary to MLflow, in
    a run named ``run_name`` (default ``sft <the output format it teaches>``). The result and its
    summary metrics."""
    from progress_sql import rewards
    from progress_sql.params import check_model_paths
    from progress_sql.corpus.integrity import require_intact

    check_model_paths(settings, "sft.init_from")  # a preset's missing model: at once, naming it
    require_intact(corpus_dir)  # before the stage run opens: a damaged corpus leaves nothing behind
    run_name = run_name or f"sft {rewards.get(settings.rl.recipe).fmt}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(writer_lock(out or settings.sft.out_dir))  # before torch and MLflow load (seconds)
        from progress_sql import tracking
        from progress_sql.tracking.stage_reports import sft_reports
        from progress_sql.train.sft import METRICS_FILE, run_sft

        stack.enter_context(tracking.stage_run("sft", settings, corpus_dir=str(corpus_dir), run_name=run_name))
        result = run_sft(settings, corpus_dir, out_dir=out, progress=progress)
        summary = sft_reports(result, Path(report_dir))
        for step, loss in enumerate(result.losses, start=1):
            tracking.log_step_metrics({"sft/loss": loss}, step)
        tracking.log_metrics(summary)
        tracking.log_artifacts(Path(result.out_dir) / METRICS_FILE)
    return result, summary


def score_questions(settings: Settings, corpus_dir: str | Path, *, out: str | Path | None = None,
                    report_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """``score_questions``: the train questions scored by ``rl.init_from`` (``rl.scores.k``
    samples each, EX; ``train.question_scores``) into ``out`` (default ``rl.scores.out_dir``), for
    ``rl.questions: band``; its summary, also in ``report_dir``/scores.json and, with the scores
    file, in the stage's MLflow run. With another ``rl.questions`` nothing is loaded or scored
    and the scores are empty (no MLflow run): the DVC stage costs the default pipeline nothing."""
    from progress_sql.files import write_json

    target = Path(out or settings.rl.scores.out_dir)
    if settings.rl.questions != "band":
        from progress_sql.train.question_scores import write_unscored

        summary = write_unscored(settings, target)
        write_json(Path(report_dir) / "scores.json", {"scores/scored": 0})
        return summary
    from progress_sql.params import check_model_paths
    from progress_sql.corpus.integrity import require_intact

    check_model_paths(settings, "rl.init_from")  # a preset's missing model: at once, naming it
    require_intact(corpus_dir)  # before the stage run opens: a damaged corpus leaves nothing behind
    with contextlib.ExitStack() as stack:
        stack.enter_context(writer_lock(target))  # before torch and MLflow load (seconds)
        from progress_sql import tracking
        from progress_sql.train.question_scores import score_train_questions

        stack.enter_context(tracking.stage_run("score_questions", settings, corpus_dir=str(corpus_dir)))
        summary = score_train_questions(settings, corpus_dir, target, progress=progress)
        metrics = {f"scores/{key}": float(summary[key]) for key in ("scored", "k", "at_0", "between", "at_1", "seconds")}
        write_json(Path(report_dir) / "scores.json", metrics)
        tracking.log_metrics(metrics)
        tracking.log_artifacts(target)
    return summary


def train_rl(settings: Settings, corpus_dir: str | Path, *, out: str | Path | None = None,
             resume: bool | str | Path = False, report_dir: str | Path, progress: bool = True,
             on_step: Callable[[int, dict[str, Any]], None] | None = None) -> tuple[RLResult, dict[str, float]]:
    """``train``: RL from ``rl.init_from`` into ``out`` (default ``rl.out_dir``; the policy goes
    to OUT/final), resumed from the newest checkpoint (``resume=True``), from it only when it
    was trained the same way (``resume="auto"``, the DVC stage) or from a checkpoint folder.
    Each step's metrics go to MLflow as ``rl/<key>``, then to ``on_step`` when given; rl.json
    and rl_curve.csv go to ``report_dir``. The result and its summary metrics."""
    from progress_sql.params import check_model_paths
    from progress_sql.corpus.integrity import require_intact

    def log_step(step: int, metrics: dict[str, Any]) -> None:
        tracking.log_step_metrics({f"rl/{k}": v for k, v in metrics.items() if k != "step"}, step)
        if on_step is not None:
            on_step(step, metrics)

    check_model_paths(settings, "rl.init_from")  # a preset's missing model: at once, naming it
    require_intact(corpus_dir)  # before the stage run opens: a damaged corpus leaves nothing behind
    with contextlib.ExitStack() as stack:
        # only rank 0 writes the run folder (one lock per run, however many processes train); RANK
        # read as train.distributed.rank reads it, before torch and MLflow load (seconds)
        if int(os.environ.get("RANK", "0")) == 0:
            stack.enter_context(writer_lock(out or settings.rl.out_dir))
        from progress_sql import tracking
        from progress_sql.tracking.stage_reports import rl_reports
        from progress_sql.train.trainer import run_rl

        stack.enter_context(tracking.stage_run("train", settings, corpus_dir=str(corpus_dir)))
        result = run_rl(settings, corpus_dir, out_dir=out, resume=resume, progress=progress, on_step=log_step,
                        on_episodes=lambda step, views: tracking.log_episodes(views))
        summary = rl_reports(result, Path(report_dir))
        tracking.log_metrics(summary)
        tracking.log_artifacts(Path(result.out_dir) / "metrics.jsonl")
    return result, summary


def evaluate(settings: Settings, model: str, corpus_dir: str | Path, splits: Sequence[str] | None,
             out_dir: str | Path, *, progress: bool = True, label: str = "") -> EvalResult:
    """``evaluate``: ``model`` (a folder, a hub id, ``models:/NAME@ALIAS``, ``oracle``, ...) on
    ``splits`` (empty: ``eval.splits``); the files go to ``out_dir`` and, but for the
    predictions, to the stage run's artifacts (``eval/``); the flat metrics to the stage run
    and its pipeline run, there as ``label/<metric>`` when ``label`` names a starting point
    (zero-shot, sft) rather than the pipeline's policy."""
    from progress_sql.corpus.integrity import require_intact

    require_intact(corpus_dir)  # before the stage run opens: a damaged corpus leaves nothing behind
    with contextlib.ExitStack() as stack:
        stack.enter_context(writer_lock(out_dir))  # before torch and MLflow load (seconds)
        from progress_sql import tracking
        from progress_sql.eval.runner import run_eval

        stack.enter_context(tracking.stage_run("evaluate", settings, corpus_dir=str(corpus_dir),
                                               run_name=f"evaluate {label}" if label else None))
        local = str(tracking.local_model_dir(model, settings)) if tracking.is_registry_uri(model) else model
        tracking.log_params({"eval.model": model})
        result = run_eval(settings, local, corpus_dir, splits or None, out_dir, progress=progress)
        if tracking.log_eval(result, parent_prefix=label):  # evaluation logs nothing itself: it sits below tracking
            tracking.log_eval_examples(result, settings.eval.log_examples)
            result.notes.append("logged to the active MLflow run")
    return result


def register(settings: Settings, model_dir: str | Path, metrics: Mapping[str, float], *,
             name: str | None = None) -> int:
    """``register`` (first half): log the policy folder with ``metrics`` (the evaluation's,
    flat) in the stage's run and register it as a version of ``name`` (default
    ``tracking.model_name``); the version number."""
    from progress_sql import tracking

    with tracking.stage_run("register", settings):
        return tracking.register_model(model_dir, name or settings.tracking.model_name, settings=settings,
                                       metrics=metrics)


def gate(settings: Settings, name: str, version: int, metrics: Mapping[str, float],
         report: str | Path | None = None) -> PromotionDecision:
    """``register`` (second half): the champion alias moves to ``version`` only when its
    ``eval.gate_metric`` in ``metrics`` (or on its run) beats the champion's; the decision
    is written to ``report`` (reports/registry.json) when given."""
    from progress_sql import tracking

    gate_metric = settings.eval.gate_metric
    decision = tracking.promote_if_better(name, version, gate_metric, metrics.get(gate_metric), settings)
    if report:
        tracking.write_registry_report(report, name, version, decision)
    return decision


def summary(settings: Settings, *, registry_report: str | Path = "reports/registry.json",
            mlflow: bool = True) -> PipelineSummary:
    """``progress-sql summary`` (after ``dvc repro``): the numbers of the last pipeline run from
    the files its stages wrote (``eval.out_dir``/metrics.json, ``rl.out_dir``/metrics.jsonl,
    ``registry_report``) and where its artefacts and MLflow run are. With ``mlflow`` and
    tracking on, the registered version's run id is read from the registry (imports MLflow);
    a registry that cannot be read leaves it out, naming why."""
    from progress_sql.eval.paired import CompareError, compare_runs
    from progress_sql.eval.summary import PipelineSummary, read_rl_history

    def read(path: Path) -> Any:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    eval_dir, rl_dir = Path(settings.eval.out_dir), Path(settings.rl.out_dir)
    sft_dir = Path(settings.eval.sft_out_dir)
    metrics, registry = read(eval_dir / "metrics.json"), read(Path(registry_report))
    starts = {label: m for label, folder in (("zero-shot", settings.eval.zero_shot_out_dir), ("after SFT", sft_dir))
              if (m := read(Path(folder) / "metrics.json")) is not None}
    paired, paired_note = [], ""
    if metrics is not None and "after SFT" in starts:
        try:
            paired = compare_runs(sft_dir, eval_dir, modes=("greedy",))
        except CompareError as err:
            paired_note = f"no paired test ({err})"
    places = {"corpus": settings.data.out_dir, "policy": str(rl_dir / "final"),
              "evaluation": f"{eval_dir / 'report.md'} (predictions: {eval_dir / 'predictions'})",
              "starting points": f"{settings.eval.zero_shot_out_dir}, {sft_dir} (`progress-sql compare A B`)",
              "training curves": "reports/train/ (dvc plots show)"}
    if settings.tracking.enabled and mlflow:
        from progress_sql import tracking

        places["MLflow store"] = f"{tracking.tracking_uri(settings)} (experiment {settings.tracking.experiment}; " \
                                 "`progress-sql ui` opens it)"
        if registry and registry.get("registered"):
            try:
                rows = {row.version: row for row in tracking.show(registry["model"], settings)}
                run = rows[registry["version"]].run_id if registry["version"] in rows else "not found"
            except tracking.TrackingError as err:
                run = f"not read ({err})"
            places["MLflow run"] = f"{run} (models:/{registry['model']}/{registry['version']})"
    return PipelineSummary(metrics=metrics, rl_history=read_rl_history(rl_dir / "metrics.jsonl"), places=places,
                           registry=registry, starts=starts, paired=paired, paired_note=paired_note)


def ask(settings: Settings, model: str, db_path: str | Path, question: str, *, evidence: str = "") -> Any:
    """``progress-sql ask``: one question about a SQLite file, answered greedily by ``model``
    (a folder, a hub id, a bundled model's name or a ``models:/name@alias`` URI) in the output
    format of ``rl.recipe``, its SQL run read-only (``inference.ask.AskAnswer``). Errors:
    CorpusError (unreadable database), PolicyLoadError (model), TrackingError (registry URI)."""
    from progress_sql import rewards
    from progress_sql.inference.policy import ChatModel
    from progress_sql.inference.ask import answer_on_database
    from progress_sql.tracking.model_registry import local_model_dir

    with ChatModel.load(local_model_dir(model, settings), settings.generation, dtype=settings.model.dtype,
                        seed=settings.seed) as chat:
        return answer_on_database(chat, db_path, question, rewards.get(settings.rl.recipe).fmt, settings.env,
                                  settings.sandbox, evidence=evidence, seed=settings.seed)
