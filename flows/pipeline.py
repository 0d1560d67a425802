"""Prefect flows of the pipeline: data build → validation → tiny policy → SFT → RL →
evaluation → registration, the stages of dvc.yaml.

The flows are thin. Every task runs the function of ``progress_sql.stages`` that its CLI
command runs (named in its docstring): the same MLflow stage run, the same report files. What
is Prefect's own stays here: the markdown artifacts, the retries, the run logger. Tasks take
the Settings the CLI would build from ``params`` (a params.yaml path), ``preset`` (a file of
configs/presets/, as ``--preset`` takes it: ``cpu-demo``) and ``overrides`` (dotted keys, as
``--set`` takes them: ``{"rl.steps": 5}``), validated by the same settings model, so a bad
override fails the run at once with the message the CLI prints. ``work_dir`` moves the run's
outputs (data/, outputs/, reports/; mlruns/ on request) out of the repository. One Prefect run
is one MLflow pipeline run, tagged with the flow run's id, name and URL and the preset; the
stages nest under it.

Retries: only the MLflow registry calls retry (a tracking server can blink). Building data,
training and evaluating are deterministic and expensive: a failure there is final.

Flows, served as deployments by ``flows/serve.py``:

- ``training-pipeline``: the whole chain (``run_sft=False`` starts RL from ``rl.init_from``);
- ``evaluate-model``: ``progress-sql eval`` of a policy folder or ``models:/name@alias``;
- ``promote-model``: ``progress-sql registry promote`` (the champion alias to a version);
- ``run-study``: ``progress-sql study`` (a study of configs/studies/: each
  shared stage and each arm × seed a task run, one report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from progress_sql import stages, studies
from progress_sql.studies.spec import studies_dir
from progress_sql.params import NO_PRESET, Settings, load_settings, preset_names, presets_dir

REPO = Path(__file__).resolve().parents[1]
# A plain dict default (never mutated) makes the Prefect UI draw a JSON editor for overrides;
# an Optional one makes it a "dict | None" switch set to None.
NO_OVERRIDES: dict[str, Any] = {}
# The presets are the files of configs/presets/ when the flows are loaded (the Prefect form
# draws a drop-down of them); "none" is params.yaml as it is.
PRESETS: tuple[str, ...] = (NO_PRESET, *preset_names(presets_dir(REPO / "params.yaml")))
Preset = Literal[PRESETS]  # type: ignore[valid-type]
# The run-study form: its scale is a drop-down of the presets that name no method (none,
# cpu-demo, cpu-long; the method presets are the arms'), its arms a multi-select of the arms of
# the shipped studies (configs/studies/; empty: all the study's arms). A form cannot
# narrow one field's choices by another's: studies.make_plan, the flow's first step, refuses
# an arm the chosen study lacks before any task runs.
SCALES: tuple[str, ...] = studies.scale_names(presets_dir(REPO / "params.yaml"))
Scale = Literal[SCALES]  # type: ignore[valid-type]
ARMS: tuple[str, ...] = studies.arm_names(studies_dir(REPO / "params.yaml"))
ArmName = Literal[ARMS]  # type: ignore[valid-type]
ALL_ARMS: list[str] = []
NO_BUDGET: dict[str, Any] = {}
# The settings paths a pipeline run writes; with a work_dir each relative one is placed under
# it. An init_from that names one of them (the pipeline's own model) follows it there.
WORK_DIR_PATHS = ("data.out_dir", "model.base_dir", "sft.out_dir", "rl.scores.out_dir", "rl.out_dir", "eval.out_dir",
                  "eval.zero_shot_out_dir", "eval.sft_out_dir", "tracking.model_cache_dir", "study.out_dir", "study.shared_dir", "study.report_dir")
FOLLOWS = {"sft.init_from": "model.base_dir", "rl.init_from": "sft.out_dir"}
# The retries of the registry tasks (see the module docstring).
REGISTRY_RETRIES = 2
REGISTRY_RETRY_DELAY_S = 5


class StageFailed(RuntimeError):
    """A stage ran to the end but its verdict stops the pipeline (a corpus that fails validation)."""


def work_root(work_dir: str) -> Path | None:
    """``work_dir`` as an absolute folder (a relative one is under the repository root, where
    served runs execute); None for ""."""
    if not work_dir:
        return None
    path = Path(work_dir).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def work_dir_overrides(settings: Settings, work_dir: str, mlruns_in_work_dir: bool = False) -> dict[str, Any]:
    """Dotted overrides placing the relative output paths of ``settings`` under ``work_dir``
    (``data/corpus`` → ``WORK/data/corpus``) and, with ``mlruns_in_work_dir``, the MLflow store
    at ``WORK/mlruns/mlflow.db``; {} without a work_dir. Absolute paths stay where they are."""
    root = work_root(work_dir)
    if root is None:
        return {}
    tree = settings.model_dump(mode="json")

    def get(dotted: str) -> Any:
        node: Any = tree
        for part in dotted.split("."):
            node = node[part]
        return node

    out: dict[str, Any] = {key: str(root / get(key)) for key in WORK_DIR_PATHS if not Path(get(key)).is_absolute()}
    for key, target in FOLLOWS.items():
        if target in out and get(key) == get(target):
            out[key] = out[target]
    if mlruns_in_work_dir:
        out["tracking.tracking_uri"] = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    return out


def resolve_settings(params: str, overrides: dict[str, Any] | None, preset: str = NO_PRESET, work_dir: str = "",
                     mlruns_in_work_dir: bool = False) -> Settings:
    """params.yaml, the preset's overlay, the dotted overrides, then the output paths under
    ``work_dir``: validated; a SettingsError names the bad key (and the preset's file)."""
    overrides = dict(overrides or {})
    settings = load_settings(params, overrides, preset=preset)
    moved = work_dir_overrides(settings, work_dir, mlruns_in_work_dir)
    return load_settings(params, {**overrides, **moved}, preset=preset) if moved else settings


def _reports_dir(reports: str, work_dir: str) -> Path:
    root = work_root(work_dir)
    return root / reports if root is not None and not Path(reports).is_absolute() else Path(reports)


def _log_settings(settings: Settings, params: str, preset: str, work_dir: str) -> None:
    from progress_sql import tracking

    root = work_root(work_dir)
    get_run_logger().info("settings: %s%s; corpus %s%s; MLflow store %s", params,
                          "" if preset == NO_PRESET else f" with preset {preset}", settings.data.out_dir,
                          f"; outputs under {root}" if root else "",
                          tracking.tracking_uri(settings) if settings.tracking.enabled else "none (tracking.enabled false)")


def run_tags(preset: str = NO_PRESET) -> dict[str, str]:
    """MLflow tags linking the pipeline run to the current Prefect flow run (and its preset)."""
    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "prefect.flow_run_name": str(flow_run.name or ""),
            "prefect.flow_name": str(flow_run.flow_name or ""), "progress_sql.preset": preset}
    # url_for knows the open-source UI's route (runtime.flow_run.ui_url gives Prefect Cloud's).
    url = url_for("flow-run", obj_id=flow_run.id) if flow_run.id else None
    if url:
        tags["prefect.flow_run_url"] = url
    return tags


def _run_name(prefix: str) -> str:
    return f"{prefix}-{flow_run.name}" if flow_run.name else prefix


def run_source() -> str:
    """What the MLflow runs of this flow run name as their source (MLflow would name Prefect's
    engine.py, the script that runs every flow)."""
    return f"prefect flow {flow_run.flow_name}, run {flow_run.name}" if flow_run.name else "prefect flow"


# ----------------------------------------------------------------------------- tasks
# NO_CACHE everywhere: each stage writes files, a new run runs it again (DVC is the tool that
# skips unchanged stages). Tasks take the validated Settings object.
@task(name="build-data", cache_policy=NO_CACHE)
def build_data(settings: Settings) -> str:
    """``progress-sql data build``: the bundled corpus into ``data.out_dir``; its folder."""
    manifest = stages.build_data(settings, progress=False)
    get_run_logger().info("built %s in %.1f s: %s", settings.data.out_dir, manifest["build_seconds"],
                          ", ".join(f"{split} {info['examples']}" for split, info in manifest["splits"].items()))
    return settings.data.out_dir


@task(name="validate-data", cache_policy=NO_CACHE)
def validate_data(settings: Settings, corpus_dir: str, report_dir: str) -> str:
    """``progress-sql data validate``: the Great Expectations suite; its report is published
    as the ``data-validation`` markdown artifact; a failed expectation raises StageFailed
    naming each one."""
    report = stages.validate_data(settings, corpus_dir, report_dir)
    create_markdown_artifact(key="data-validation", description=report.summary().splitlines()[0],
                             markdown=(Path(report_dir) / "validation.md").read_text(encoding="utf-8"))
    if not report.success:
        raise StageFailed("corpus validation failed:\n" + "\n".join(report.failures))
    return report.summary()


@task(name="init-model", cache_policy=NO_CACHE)
def init_model(settings: Settings, corpus_dir: str) -> str:
    """``progress-sql train init``: the copy-pretrained tiny policy in ``model.base_dir``."""
    return str(stages.init_model(settings, corpus_dir, progress=False))


@task(name="sft", cache_policy=NO_CACHE)
def sft(settings: Settings, corpus_dir: str, report_dir: str) -> str:
    """``progress-sql train sft``: the warm start from ``sft.init_from`` into ``sft.out_dir``."""
    result, _ = stages.sft(settings, corpus_dir, report_dir=report_dir, progress=False)
    get_run_logger().info("sft: %d steps in %.0f s, final loss %.3f", result.steps, result.seconds, result.final_loss)
    return result.out_dir


@task(name="score-questions", cache_policy=NO_CACHE)
def score_questions(settings: Settings, corpus_dir: str, report_dir: str) -> dict[str, Any]:
    """``progress-sql train score``: the train questions scored by ``rl.init_from`` (rl.questions band)."""
    summary = stages.score_questions(settings, corpus_dir, report_dir=report_dir, progress=False)
    get_run_logger().info("score: %d questions, %d never right, %d sometimes, %d always", summary["scored"],
                          summary["at_0"], summary["between"], summary["at_1"])
    return summary


@task(name="train-rl", cache_policy=NO_CACHE)
def train_rl(settings: Settings, corpus_dir: str, report_dir: str) -> str:
    """``progress-sql train rl``: RL from ``rl.init_from``; the final policy's folder."""
    logger = get_run_logger()

    def on_step(step: int, metrics: dict[str, Any]) -> None:
        logger.info("rl step %d: reward/mean %s", step, metrics.get("reward/mean"))

    result, _ = stages.train_rl(settings, corpus_dir, report_dir=report_dir, progress=False, on_step=on_step)
    return str(result.final_dir)


@task(name="evaluate", cache_policy=NO_CACHE, task_run_name="evaluate {label}")
def evaluate(settings: Settings, model: str, corpus_dir: str, splits: list[str] | None = None, *,
             out_dir: str = "", label: str = "") -> dict[str, float]:
    """``progress-sql eval [--as LABEL]`` into ``out_dir`` (default eval.out_dir): the flat
    metrics; the report's tables are published as the ``evaluation[-LABEL]`` markdown artifact."""
    result = stages.evaluate(settings, model, corpus_dir, splits, out_dir or settings.eval.out_dir, progress=False,
                             label=label)
    gate = settings.eval.gate_metric
    value = result.gate(gate)
    create_markdown_artifact(key=f"evaluation-{label}" if label else "evaluation",
                             markdown=result.files["report"].read_text(encoding="utf-8"),
                             description=f"{model}: {gate} = {'not computed' if value is None else f'{value:.4f}'}")
    return result.flat


@task(name="summary", cache_policy=NO_CACHE)
def summary(settings: Settings, registry_report: str) -> str:
    """``progress-sql summary``: the closing table (zero-shot, SFT and RL EX per split, RL
    against SFT question by question), published as the ``summary`` markdown artifact."""
    text = stages.summary(settings, registry_report=registry_report).render()
    create_markdown_artifact(key="summary", markdown=f"```\n{text}\n```", description="the pipeline's results")
    return text


@task(name="register-model", cache_policy=NO_CACHE, retries=REGISTRY_RETRIES, retry_delay_seconds=REGISTRY_RETRY_DELAY_S)
def register_model(settings: Settings, model_dir: str, metrics: dict[str, float]) -> int:
    """``progress-sql registry register`` (first half): log the policy and register a version."""
    return stages.register(settings, model_dir, metrics)


@task(name="promote-if-better", cache_policy=NO_CACHE, retries=REGISTRY_RETRIES,
      retry_delay_seconds=REGISTRY_RETRY_DELAY_S)
def promote_if_better(settings: Settings, version: int, metrics: dict[str, float], report: str) -> dict[str, Any]:
    """``progress-sql registry register`` (second half): the champion gate on
    ``eval.gate_metric``; writes ``report`` (reports/registry.json) and publishes the
    ``registry`` markdown artifact; the decision."""
    name, gate = settings.tracking.model_name, settings.eval.gate_metric
    decision = stages.gate(settings, name, version, metrics, report)
    alias = settings.tracking.champion_alias
    create_markdown_artifact(key="registry", description=f"{name} v{version}: {decision.reason}", markdown=(
        f"| model | version | {gate} | {alias} | decision |\n|---|---|---|---|---|\n"
        f"| {name} | {version} | {decision.candidate_value} | v{decision.champion_version} | "
        f"{'promoted' if decision.promoted else 'kept'}: {decision.reason} |\n"))
    get_run_logger().info("registered %s v%d: %s", name, version, decision.reason)
    return {"model": name, "version": version, "promoted": decision.promoted, "reason": decision.reason,
            "champion_version": decision.champion_version, "gate_metric": gate, "gate_value": decision.candidate_value}


@task(name="promote", cache_policy=NO_CACHE, retries=REGISTRY_RETRIES, retry_delay_seconds=REGISTRY_RETRY_DELAY_S)
def promote(settings: Settings, version: int) -> dict[str, Any]:
    """``progress-sql registry promote``: the champion alias to ``version``, no gate."""
    from progress_sql import tracking

    name = settings.tracking.model_name
    previous = tracking.promote(name, version, settings)
    get_run_logger().info("%s: %s → v%d (previous: %s)", name, settings.tracking.champion_alias, version, previous)
    return {"model": name, "version": version, "previous_champion": previous}


# ----------------------------------------------------------------------------- flows
@flow(name="training-pipeline")
def training_pipeline(
    preset: Preset = NO_PRESET,
    work_dir: str = "",
    overrides: dict[str, Any] = NO_OVERRIDES,
    params: str = "params.yaml",
    run_sft: bool = True,
    init_tiny_model: bool = True,
    async_rollouts: bool = False,
    reports: str = "reports",
    mlruns_in_work_dir: bool = False,
) -> dict[str, Any]:
    """The whole pipeline: build and validate the corpus, the starting model (model.pretrained, or
    the tiny policy) and its evaluation, SFT warm start and its evaluation, (rl.questions band) the
    train questions scored, RL, evaluation, registration (the champion alias moves only when
    ``eval.gate_metric`` beats the champion's), the closing table (the ``summary`` artifact).
    Returns the registry decision.

    Args:
        preset: Sizes and protocol from configs/presets/: none, params.yaml as it is (SmolLM2-135M-Instruct through SFT, RL and evaluation on 2 CPU cores, the same as cpu-smollm2); cpu-demo, the tiny policy through the whole pipeline in about a minute; tiny, the tiny policy at the full corpus; cpu-long, the tiny policy's hour-long run; the papers' protocols (progress-sql and its ablations, reasoning-sql, sql-trail, skyrl-sql, oneshot; they need the model in models/ and a GPU).
        work_dir: Folder of this run's outputs (data/, outputs/, reports/ under it), relative to the repository root or absolute; empty: the repository's own folders, as dvc repro writes them.
        overrides: Dotted settings keys to override, as JSON, on top of the preset, e.g. {"rl.recipe": "oneshot", "rl.steps": 10}.
        params: The settings file, relative to the repository root.
        run_sft: Warm-start with SFT; off: RL starts from rl.init_from as it is.
        init_tiny_model: Save model.pretrained (SmolLM2 by default) into model.base_dir, or build the tiny policy there, and evaluate it (the zero-shot column); off when sft.init_from / rl.init_from name a model of your own.
        async_rollouts: Asynchronous rollouts (rl.async.enabled): a producer process samples the next step while the trainer updates, its weights at most rl.async.max_staleness steps old.
        reports: Folder of the stage reports (data/, train/, registry.json), as in dvc.yaml; under work_dir when relative.
        mlruns_in_work_dir: Keep the MLflow store in work_dir/mlruns too; off: the project's store, where the MLflow UI looks.
    """
    from progress_sql import tracking

    if async_rollouts:
        overrides = {**(overrides or {}), "rl.async.enabled": True}
    settings = resolve_settings(params, overrides, preset, work_dir, mlruns_in_work_dir)
    _log_settings(settings, params, preset, work_dir)
    report_root = _reports_dir(reports, work_dir)
    with tracking.run_source(run_source()), tracking.pipeline_run(settings, _run_name("pipeline"), tags=run_tags(preset)):
        corpus = build_data(settings)
        validate_data(settings, corpus, str(report_root / "data"))
        if init_tiny_model:
            init_model(settings, corpus)
            evaluate(settings, settings.model.base_dir, corpus, out_dir=settings.eval.zero_shot_out_dir,
                     label="zero-shot")
        if run_sft:
            sft(settings, corpus, str(report_root / "train"))
            evaluate(settings, settings.sft.out_dir, corpus, out_dir=settings.eval.sft_out_dir, label="sft")
        if settings.rl.questions == "band":  # RL draws by the scores of its starting policy
            score_questions(settings, corpus, str(report_root / "train"))
        policy = train_rl(settings, corpus, str(report_root / "train"))
        metrics = evaluate(settings, policy, corpus)
        if not settings.tracking.enabled:  # as `progress-sql registry register`: no registry to use
            summary(settings, str(report_root / "registry.json"))
            return {"model": settings.tracking.model_name, "registered": False, "reason": "tracking.enabled is false"}
        version = register_model(settings, policy, metrics)
        decision = promote_if_better(settings, version, metrics, str(report_root / "registry.json"))
        summary(settings, str(report_root / "registry.json"))
        return decision


@flow(name="evaluate-model")
def evaluate_model(
    model: str = "",
    splits: list[str] | None = None,
    preset: Preset = NO_PRESET,
    work_dir: str = "",
    overrides: dict[str, Any] = NO_OVERRIDES,
    params: str = "params.yaml",
    mlruns_in_work_dir: bool = False,
) -> dict[str, float]:
    """Evaluate a model on corpus splits (``progress-sql eval``); the flat metrics, the tables
    as the ``evaluation`` artifact.

    Args:
        model: A policy folder (under work_dir when it is there), a hub id or models:/NAME@ALIAS; empty: the champion, models:/<tracking.model_name>@<tracking.champion_alias>.
        splits: Splits or variants among train, dev, test, syn, realistic, dk; empty: eval.splits.
        preset: Sizes and protocol from configs/presets/ (the corpus and the evaluation protocol); none: params.yaml as it is.
        work_dir: Folder of the run whose corpus is evaluated on (its data/, outputs/); the reports go under it too. Empty: the repository's own folders.
        overrides: Dotted settings keys to override, as JSON, e.g. {"eval.vote_k": 0}.
        params: The settings file, relative to the repository root.
        mlruns_in_work_dir: The MLflow store is work_dir/mlruns; off: the project's store.
    """
    from progress_sql import tracking

    settings = resolve_settings(params, overrides, preset, work_dir, mlruns_in_work_dir)
    _log_settings(settings, params, preset, work_dir)
    root = work_root(work_dir)
    if model and root is not None and not Path(model).is_absolute() and (root / model).exists():
        model = str(root / model)
    model = model or f"models:/{settings.tracking.model_name}@{settings.tracking.champion_alias}"
    with tracking.run_source(run_source()), tracking.pipeline_run(settings, _run_name("evaluate"), tags=run_tags(preset)):
        return evaluate(settings, model, settings.data.out_dir, splits)


@flow(name="promote-model")
def promote_model(
    version: int,
    preset: Preset = NO_PRESET,
    work_dir: str = "",
    overrides: dict[str, Any] = NO_OVERRIDES,
    params: str = "params.yaml",
    mlruns_in_work_dir: bool = False,
) -> dict[str, Any]:
    """Move the champion alias of tracking.model_name to a version by hand, no gate
    (``progress-sql registry promote``).

    Args:
        version: The registered version that becomes champion.
        preset: The preset the model was trained with (it names the registered model: cpu-demo registers progress-sql-policy-demo); none: params.yaml as it is.
        work_dir: The run's folder (the registry's download cache goes under it).
        overrides: Dotted settings keys to override, as JSON, e.g. {"tracking.model_name": "my-policy"}.
        params: The settings file, relative to the repository root.
        mlruns_in_work_dir: The MLflow store is work_dir/mlruns; off: the project's store.
    """
    return promote(resolve_settings(params, overrides, preset, work_dir, mlruns_in_work_dir), version)


# ----------------------------------------------------------------------------- studies
@task(name="build-shared", task_run_name="shared-{key}", cache_policy=NO_CACHE)
def build_shared(plan: studies.Plan, key: str) -> str:
    """A corpus, tiny policy or SFT checkpoint that several arms read, built once (or reused)."""
    return studies.build_shared(plan, key, get_run_logger().info)


@task(name="arm-seed", task_run_name="{job.arm} seed {job.seed}", cache_policy=NO_CACHE)
def run_arm(plan: studies.Plan, job: studies.Job, parent_run_id: str | None) -> dict[str, Any]:
    """``progress-sql study``'s job: RL then evaluation of one arm × seed; a failure fails
    this task run (the others go on, the report names it)."""
    if plan.base.study.max_parallel > 1:
        result = studies.run_job_isolated(plan, job, parent_run_id)
    else:
        result = studies.run_job(plan, job, parent_run_id, get_run_logger().info)
    if result.status != "done":
        raise StageFailed(f"{job.label}: {result.error}")
    return {"arm": result.arm, "seed": result.seed, "metrics": result.metrics}


@flow(name="run-study")
def run_study(
    study: str = "methods",
    preset: Scale = "cpu-demo",
    arms: list[ArmName] = ALL_ARMS,
    seeds: int = 0,
    budget: dict[str, Any] = NO_BUDGET,
    work_dir: str = "",
    overrides: dict[str, Any] = NO_OVERRIDES,
    params: str = "params.yaml",
    mlruns_in_work_dir: bool = False,
) -> dict[str, Any]:
    """A budget-matched study (``progress-sql study``): every arm × seed trained and
    evaluated on one budget, the shared corpus and SFT built once, one report (reports/studies/NAME/,
    the ``study`` artifact, and the MLflow parent run ``study-NAME``). A rerun runs only the
    missing arms. Returns the table.

    Args:
        study: A study of configs/studies/ (methods: the five methods; ablations: Progress-SQL and its Table 3 variants; async: Progress-SQL with synchronous against asynchronous rollouts) or the path of a YAML file.
        preset: The scale every arm runs at: cpu-demo, the CPU demo (the study's cpu-demo budget); cpu-long, the hour-long CPU sizes; cpu-smollm2, SmolLM2-135M-Instruct (pick two arms); none: the papers' protocols as they are (7B model, GPUs). The methods are the arms'.
        arms: The arms to run, by name, the first the one the others are tested against (at least two); empty: all of them. The list offers the arms of every shipped study (methods: progress-sql, oneshot, reasoning-sql, sql-trail, skyrl-sql, sft; ablations: progress-sql, no-align, no-decay, no-exec-status, single-turn; async: sync, async): pick the chosen study's. Another study's arm stops the run before anything runs, with a message naming the study's arms.
        seeds: How many seeds: 1..N; 0: the study's.
        budget: Budget keys to override, as JSON, e.g. {"steps": 5} (trajectories_per_step, group_size, steps, max_minutes, seeds, splits, eval_max_examples).
        work_dir: Folder of the study's outputs and report, relative to the repository root or absolute; empty: the repository's own folders.
        overrides: Dotted settings keys for every arm, as JSON, under the budget, e.g. {"rl.lr": 0.0002}.
        params: The settings file, relative to the repository root.
        mlruns_in_work_dir: Keep the MLflow store in work_dir/mlruns too; off: the project's store.
    """
    import time

    from progress_sql import tracking

    start = time.monotonic()
    overrides = dict(overrides or {})
    moved = work_dir_overrides(load_settings(params, overrides, preset=preset), work_dir, mlruns_in_work_dir)
    plan = studies.make_plan(study, params, preset, overrides={**overrides, **moved}, arms=list(arms),
                                 budget_overrides={**budget, **({"seeds": seeds} if seeds else {})})
    logger = get_run_logger()
    todo, shared = studies.pending(plan)
    logger.info("study %s at scale %s: %d arm × seed runs, %d done before; %s", plan.name, plan.scale,
                len(plan.jobs), len(plan.jobs) - len(todo), " ".join(plan.notes[:2]))
    with tracking.run_source(run_source()), studies.study_run(plan, run_tags(preset)) as parent:
        for key in shared:
            build_shared(plan, key)
        step = plan.base.study.max_parallel  # as many arm × seed task runs at once
        for first in range(0, len(todo), step):
            futures = [run_arm.submit(plan, job, parent) for job in todo[first:first + step]]
            for future in futures:
                future.wait()
        outcome = studies.finish(plan, parent, time.monotonic() - start, logger.info)
    create_markdown_artifact(key="study", description=f"{plan.name} at {plan.scale}",
                             markdown=(outcome.report_dir / "report.md").read_text(encoding="utf-8"))
    if outcome.failures:
        raise StageFailed(f"{len(outcome.failures)} run(s) failed (the report holds the others; run again for "
                          "the missing ones): " + "; ".join(f"{r.label}: {r.error}" for r in outcome.failures))
    return {"report": str(outcome.report_dir), "table": outcome.table}
