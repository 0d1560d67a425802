"""Budget-matched comparisons of methods and ablations (issue 32): a comparison file of
``configs/comparisons/`` names arms (a preset plus overrides each) and one budget; ``make_plan``
turns it into arm × seed jobs at a scale, ``run_comparison`` runs them (the shared stages once)
and writes one report. ``progress-sql compare-run`` and the ``compare-methods`` Prefect flow are
its two callers; the DVC stage ``compare`` runs the CLI.

- ``spec``: the file, the layering of settings (params.yaml, scale, the method's keys, overrides,
  budget, seed, paths), every check that can be made before anything runs;
- ``run``: the shared stages, one job, the whole comparison, resuming what is missing; its MLflow
  runs (a ``compare-<name>`` parent, a ``<arm> seed <k>`` child per job);
- ``report``: the table, paired tests, figures, ODT profile and cost (markdown, HTML, JSON).
"""

from progress_sql.comparisons.run import (
    Outcome,
    build_shared,
    collect,
    comparison_run,
    finish,
    is_done,
    pending,
    run_comparison,
    run_job,
    run_job_isolated,
    run_name,
    shared_keys,
)
from progress_sql.comparisons.spec import (
    METHOD_KEYS,
    Comparison,
    ComparisonError,
    Job,
    JobResult,
    Plan,
    arm_names,
    comparison_names,
    load_comparison,
    make_plan,
    scale_names,
)

__all__ = [
    "METHOD_KEYS", "Comparison", "ComparisonError", "Job", "JobResult", "Outcome", "Plan", "arm_names",
    "build_shared", "collect", "comparison_names", "comparison_run", "finish", "is_done", "load_comparison",
    "make_plan", "pending", "run_comparison", "run_job", "run_job_isolated", "run_name", "scale_names", "shared_keys",
]
