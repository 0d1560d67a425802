"""``progress-sql summary``: the last pipeline run's numbers in one short table (EX per split,
the RL reward curve, where the artefacts and the MLflow run are); ``make pipeline`` prints it
after ``dvc repro``."""

from __future__ import annotations

import typer

from progress_sql import stages
from progress_sql.cli.common import SET_HELP, load_or_exit, parse_overrides


def summary(
    ctx: typer.Context,
    params: str = typer.Option("params.yaml", "--params", help="Settings file (defaults when absent)"),
    registry_report: str = typer.Option("reports/registry.json", "--registry-report",
                                        help="The register stage's output"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="Look up the registered version's MLflow run"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Print the pipeline's results: EX per split, the RL curve, artefacts and MLflow run."""
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    typer.echo(stages.summary(settings, registry_report=registry_report, mlflow=mlflow).render())
