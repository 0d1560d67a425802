"""Serve the pipeline's deployments, so runs start from the Prefect UI with parameters.

One command starts the Prefect server, these deployments and the MLflow UI together, with
the API variables right for any port (Ctrl-C stops them):

    progress-sql ui [--port 4200] [--mlflow-port 5000]

By hand, against a Prefect server of your own (PREFECT_API_URL must name its API):

    prefect server start --port 4200     # terminal 1; the UI is at http://127.0.0.1:4200
    PREFECT_API_URL=http://127.0.0.1:4200/api python flows/serve.py    # terminal 2

Then in the UI: Deployments → ``training-pipeline`` → Run → Custom run. The form starts on the
default run (``preset`` none: params.yaml, SmolLM2-135M-Instruct, about 50 minutes on 2 cores;
``work_dir`` runs/default: nothing written into the repository's data/, outputs/ or reports/);
pick ``cpu-demo`` for the tiny policy in about a minute. Runs execute in this process's
machine, in the repository root, one at a time (``--limit``). ``run-study`` runs a
study of configs/studies/ (the form: the study, the scale, the arms, the number of
seeds, budget overrides), each arm × seed a task run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as `python flows/serve.py`
    sys.path.insert(0, str(REPO))

from prefect import serve  # noqa: E402
from prefect.deployments.runner import RunnerDeployment  # noqa: E402

from flows.pipeline import evaluate_model, promote_model, run_study, training_pipeline  # noqa: E402
from progress_sql.servers import DEPLOYMENTS  # noqa: E402  (the names `progress-sql ui` waits for)

# What the Custom run form starts with: the default run (params.yaml: SmolLM2, ~50 min on 2 cores)
# in its own folder; the study at the real model's scale, on the two arms the paper's
# question needs (all five would take hours on a CPU).
FORM_DEFAULTS = {"preset": "none", "work_dir": "runs/default"}
STUDY_DEFAULTS = {"study": "methods", "preset": "cpu-smollm2", "arms": ["progress-sql", "oneshot"],
                       "work_dir": "runs/default"}


def deployments() -> list[RunnerDeployment]:
    """The deployments, named as in DEPLOYMENTS (one per flow), defaulting to the real model."""
    tags = ["progress-sql"]
    built = [
        training_pipeline.to_deployment(name="training-pipeline", tags=tags, parameters=FORM_DEFAULTS),
        evaluate_model.to_deployment(name="evaluate-model", tags=tags, parameters=FORM_DEFAULTS),
        promote_model.to_deployment(name="promote-model", tags=tags, parameters=FORM_DEFAULTS),
        run_study.to_deployment(name="run-study", tags=tags, parameters=STUDY_DEFAULTS),
    ]
    assert tuple(d.name for d in built) == DEPLOYMENTS
    return built


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1, help="flow runs executed at the same time (default 1)")
    args = parser.parse_args(argv)
    # Entrypoints are recorded relative to the working directory and runs execute in it.
    os.chdir(REPO)
    serve(*deployments(), limit=args.limit)


if __name__ == "__main__":
    main()
