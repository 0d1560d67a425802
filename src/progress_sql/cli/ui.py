"""``progress-sql ui``: the Prefect server, the deployments of flows/serve.py and the MLflow
UI on the project's store, started together on 127.0.0.1 with the right variables for any
port; Ctrl-C stops them. The process management is ``progress_sql.servers``."""

from __future__ import annotations

from pathlib import Path

import typer

from progress_sql.servers import MLFLOW_PORT, PREFECT_PORT


def ui(
    port: int = typer.Option(PREFECT_PORT, "--port", min=1, max=65535, help="Port of the Prefect server and its UI"),
    mlflow_port: int = typer.Option(MLFLOW_PORT, "--mlflow-port", min=1, max=65535, help="Port of the MLflow UI"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow",
                                help="Also start the MLflow UI on the project's store (MLFLOW_TRACKING_URI, "
                                     "else mlruns/mlflow.db of the repository)"),
    limit: int = typer.Option(1, "--limit", min=1, help="Flow runs the served deployments execute at the same time"),
    log_dir: Path = typer.Option(None, "--log-dir", help="Folder of the servers' logs (default: a new temporary one)"),
) -> None:
    """Start the Prefect UI with the deployments served, and the MLflow UI; print their URLs (from any folder)."""
    # The deployments are served from the repository this package is installed from (or the
    # one the working directory is in); PREFECT_HOME keeps Prefect's database elsewhere than ~/.prefect.
    from progress_sql.servers import project_root, run_ui

    try:
        root = project_root()
    except FileNotFoundError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    code = run_ui(port=port, mlflow_port=mlflow_port if mlflow else None, root=root, log_dir=log_dir, limit=limit,
                  echo=lambda line: typer.echo(line))
    raise typer.Exit(code)
