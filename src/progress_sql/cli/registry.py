"""``progress-sql registry``: register a trained policy behind the champion gate, promote a
version by hand, list versions (the DVC stage ``register`` runs ``registry register``)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Iterator

import typer

from progress_sql import stages
from progress_sql.cli.common import Overrides, ParamsFile, load_or_exit, parse_overrides, stage_or_exit

app = typer.Typer(help="The MLflow model registry: register, promote, show.", no_args_is_help=True)

ModelName = Annotated[str, typer.Option("--name", help="Registered model name (default: tracking.model_name)")]


def _registry_settings(ctx: typer.Context, params: str, overrides: list[str], name: str | None):
    """Settings and the registered model's name for a registry command; exit 2 when tracking
    is off (the registry lives in MLflow)."""
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    if not settings.tracking.enabled:
        typer.echo("error: tracking.enabled is false: the registry needs MLflow", err=True)
        raise typer.Exit(2)
    return settings, name or settings.tracking.model_name


@contextmanager
def _tracking_errors() -> Iterator[None]:
    """A TrackingError inside ends the command with its message and exit code 1."""
    from progress_sql.tracking import TrackingError

    try:
        yield
    except TrackingError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


@app.command("register")
def register(
    ctx: typer.Context,
    model_dir: str = typer.Option(..., "--model-dir", help="The policy folder to register (save_pretrained output)"),
    metrics: str = typer.Option(None, "--metrics", help="Evaluation metrics.json (nested) or a flat JSON; "
                                                        "its eval.gate_metric decides the promotion"),
    out: str = typer.Option(None, "--out", help="Write the decision as JSON here (the DVC stage's output)"),
    name: ModelName = None,
    params: ParamsFile = "params.yaml",
    overrides: Overrides = [],
) -> None:
    """Log and register a model version; move the champion alias only if it beats the champion."""
    from progress_sql.eval.metrics import flat_metrics
    from progress_sql.files import write_json

    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    name = name or settings.tracking.model_name
    if not settings.tracking.enabled:
        if out:  # the pipeline runs on without MLflow; the stage still leaves its output
            write_json(Path(out), {"model": name, "registered": False, "reason": "tracking.enabled is false"})
        typer.echo("tracking.enabled is false: nothing registered")
        return
    flat: dict[str, float] = {}
    if metrics:
        try:
            flat = flat_metrics(json.loads(Path(metrics).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as err:
            typer.echo(f"error: cannot read metrics {metrics}: {err}", err=True)
            raise typer.Exit(1) from None
    with stage_or_exit("register"):
        version = stages.register(settings, model_dir, flat, name=name)
        decision = stages.gate(settings, name, version, flat, out)
    typer.echo(f"registered {name} v{version}: {'promoted to' if decision.promoted else 'not'} "
               f"{settings.tracking.champion_alias} ({decision.reason})")


@app.command("promote")
def promote(
    ctx: typer.Context,
    version: int = typer.Option(..., "--version", min=1, help="The version that becomes champion"),
    name: ModelName = None,
    params: ParamsFile = "params.yaml",
    overrides: Overrides = [],
) -> None:
    """Move the champion alias to a version by hand (no gate)."""
    from progress_sql import tracking

    settings, name = _registry_settings(ctx, params, overrides, name)
    with _tracking_errors():
        previous = tracking.promote(name, version, settings)
    alias = settings.tracking.champion_alias
    before = f"v{previous}" if previous is not None else "none"
    typer.echo(f"{name}: {alias} → v{version} (previous {alias}: {before})")


@app.command("show")
def show(
    ctx: typer.Context,
    name: ModelName = None,
    params: ParamsFile = "params.yaml",
    overrides: Overrides = [],
) -> None:
    """List the versions: aliases, gate metric, decision, run."""
    from progress_sql import tracking

    settings, name = _registry_settings(ctx, params, overrides, name)
    with _tracking_errors():
        rows = tracking.show(name, settings)
    gate = settings.eval.gate_metric
    typer.echo(f"{name} ({tracking.tracking_uri(settings)}): {len(rows)} version(s); gate {gate}")
    typer.echo(f"{'version':>7}  {'aliases':12s} {gate:>14s}  {'decision':9s} {'created (UTC)':16s}  run")
    for row in rows:
        value = row.metrics.get(gate)
        created = datetime.fromtimestamp(row.created / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
        typer.echo(f"{row.version:>7}  {','.join(row.aliases) or '-':12s} "
                   f"{'-' if value is None else f'{value:.4f}':>14s}  {row.decision or '-':9s} {created:16s}  {row.run_id}")
        others = {k: v for k, v in sorted(row.metrics.items()) if k != gate and k.count("/") == 2
                  and k.split("/")[-1] in ("ex", "ts")}
        if others:
            typer.echo("         " + ", ".join(f"{k} {v:.3f}" for k, v in others.items()))
