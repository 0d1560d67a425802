"""Serve the pipeline's deployments, so runs start from the Prefect UI with parameters.

From the repository root (flows read params.yaml and write data/, outputs/, reports/ there):

    prefect server start                 # terminal 1; the UI is at http://127.0.0.1:4200
    python flows/serve.py                # terminal 2; PREFECT_API_URL=http://127.0.0.1:4200/api

Then in the UI: Deployments → ``training-pipeline`` → Run → Custom run, edit the parameters
(``overrides`` takes dotted settings keys as JSON, e.g. ``{"rl.steps": 5}``) → Submit. Runs
execute in this process's machine, one at a time (``--limit``).
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

from flows.pipeline import evaluate_model, promote_model, training_pipeline  # noqa: E402

DEPLOYMENTS = ("training-pipeline", "evaluate-model", "promote-model")


def deployments() -> list[RunnerDeployment]:
    """The three deployments, named as in DEPLOYMENTS (one per flow)."""
    tags = ["progress-sql"]
    return [
        training_pipeline.to_deployment(name="training-pipeline", tags=tags),
        evaluate_model.to_deployment(name="evaluate-model", tags=tags),
        promote_model.to_deployment(name="promote-model", tags=tags),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1, help="flow runs executed at the same time (default 1)")
    args = parser.parse_args(argv)
    # Entrypoints are recorded relative to the working directory and runs execute in it.
    os.chdir(REPO)
    serve(*deployments(), limit=args.limit)


if __name__ == "__main__":
    main()
