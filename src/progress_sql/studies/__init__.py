"""Budget-matched studies of methods and ablations (issue 32): a study file of
``configs/studies/`` names arms (a preset plus overrides each) and one budget; ``make_plan``
turns it into arm × seed jobs at a scale, ``run_study`` runs them (the shared stages once)
and writes one report. ``progress-sql study`` and the ``run-study`` Prefect flow are
its two callers; the DVC stage ``compare`` runs the CLI.

- ``spec``: the file, the layering of settings (params.yaml, scale, the method's keys, overrides,
  budget, seed, paths), every check that can be made before anything runs;
- ``run``: the shared stages, one job, the whole study, resuming what is missing; its MLflow
  runs (a ``study-<name>`` parent, a ``<arm> seed <k>`` child per job);
- ``report``: the table, paired tests, figures, ODT profile and cost (markdown, HTML, JSON).
"""

from progress_sql.studies.run import (
    Outcome,
    build_shared,
    collect,
    finish,
    is_done,
    pending,
    run_job,
    run_job_isolated,
    run_name,
    run_study,
    shared_keys,
    study_run,
)
from progress_sql.studies.spec import (
    METHOD_KEYS,
    Job,
    JobResult,
    Plan,
    Study,
    StudyError,
    arm_names,
    load_study,
    make_plan,
    scale_names,
    study_names,
)

__all__ = [
    "METHOD_KEYS", "Job", "JobResult", "Outcome", "Plan", "Study", "StudyError", "arm_names",
    "build_shared", "collect", "finish", "is_done", "load_study", "make_plan", "pending", "run_job",
    "run_job_isolated", "run_name", "run_study", "scale_names", "shared_keys", "study_names",
    "study_run",
]
