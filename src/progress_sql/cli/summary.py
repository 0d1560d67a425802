"""``progress-sql summary``: the last pipeline run's numbers in one short table (EX per split,
the RL reward curve, where the artefacts and the MLflow run are); ``make pipeline`` prints it
after ``dvc repro``."""

from __future__ import annotations

import typer

from progress_sql import stages
from progress_sql.cli.common import Overrides, ParamsFile, load_or_exit, parse_overrides


def summary(
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    registry_report: str = typer.Option("reports/registry.json", "--registry-report",
                                        help="The register stage's output"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Look up the registered version's MLflow run"),
    overrides: Overrides = [],
) -> None:
    """Print the pipeline's results: EX per split, the RL curve, artefacts and MLflow run."""
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    typer.echo(stages.summary(settings, registry_report=registry_report, mlflow=mlflow).render())
