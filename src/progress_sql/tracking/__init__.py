"""MLflow tracking and the model registry of the pipeline.

>>> from progress_sql import tracking
>>> with tracking.pipeline_run(settings, "nightly"):              # doctest: +SKIP
...     with tracking.stage_run("train", settings):
...         tracking.log_step_metrics({"reward/mean": 0.4}, step=3)
>>> v = tracking.register_model("outputs/rl/final", settings=settings)   # doctest: +SKIP
>>> tracking.promote_if_better(name, v, "dev/greedy/ex", 0.41, settings)  # doctest: +SKIP

- ``mlflow_runs``: tracking URI, parent and nested runs (their names, kinds and sources), params,
  metrics, artifacts, an evaluation's metrics, EX first, and files (``log_eval``, ``ex_first``,
  ``log_eval_files``);
- ``episodes``: RL episodes and an evaluation's best and worst answers as traces, a span per turn;
- ``model_registry``: log + register a policy, the champion gate, manual promotion, listing,
  resolving ``models:/name@alias`` to a local policy folder;
- ``pyfunc``: the pyfunc every version is logged as (it answers with ``inference.ask``);
- ``model_card``: the card logged with each version;
- ``stage_reports``: the small JSON/CSV files the DVC stages declare as metrics and plots.

The task modules never import this package; it imports mlflow (a few seconds).
"""

from progress_sql.tracking.mlflow_runs import (  # first: sets MLflow's quiet environment
    KIND_TAG,
    PARENT_ENV,
    TrackingError,
    active_run_id,
    child_pipeline_run,
    configure,
    data_version,
    ex_first,
    flat_params,
    log_artifacts,
    log_eval,
    log_eval_files,
    log_metrics,
    log_params,
    log_pipeline_metrics,
    log_run_artifacts,
    log_run_metrics,
    log_step_metrics,
    mlflow_key,
    pipeline_run,
    run_source,
    set_run_tags,
    settings_params,
    source_name,
    stage_run,
    tracking_uri,
)
from progress_sql.tracking.episodes import log_episodes, log_eval_examples
from progress_sql.tracking.model_registry import (
    PromotionDecision,
    VersionRow,
    is_registry_uri,
    local_model_dir,
    promote,
    promote_if_better,
    register_model,
    show,
    write_registry_report,
)

__all__ = [
    "KIND_TAG",
    "PARENT_ENV",
    "PromotionDecision",
    "TrackingError",
    "VersionRow",
    "active_run_id",
    "child_pipeline_run",
    "configure",
    "data_version",
    "ex_first",
    "flat_params",
    "is_registry_uri",
    "local_model_dir",
    "log_artifacts",
    "log_episodes",
    "log_eval",
    "log_eval_examples",
    "log_eval_files",
    "log_metrics",
    "log_params",
    "log_pipeline_metrics",
    "log_run_artifacts",
    "log_run_metrics",
    "log_step_metrics",
    "mlflow_key",
    "pipeline_run",
    "promote",
    "promote_if_better",
    "register_model",
    "run_source",
    "set_run_tags",
    "settings_params",
    "show",
    "source_name",
    "stage_run",
    "tracking_uri",
    "write_registry_report",
]
