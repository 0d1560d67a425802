"""``progress-sql eval``: greedy / Vote@k / pass@k (and optionally multi-turn) evaluation of a
policy on corpus splits and robustness variants (the DVC stage ``evaluate`` runs it). Writes
metrics.json, report.md, plots/ and predictions/ under ``--out``; inside its MLflow run the
flat metrics go to the stage run and its pipeline run."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from progress_sql import stages
from progress_sql.cli.common import (
    CorpusDir,
    Overrides,
    POLICY_ERRORS,
    ParamsFile,
    die_with_dvc,
    load_or_exit,
    model_or_exit,
    parse_overrides,
    stage_or_exit,
)
from progress_sql.params import EVAL_SPLITS


def evaluate(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="Model folder, hub id, models:/NAME@ALIAS, models:/NAME/N, "
                                                   "'oracle' (gold SQL) or 'smollm2'"),
    splits: list[str] = typer.Option([], "--split", help=f"Split or variant: {', '.join(EVAL_SPLITS)} "
                                                         "(repeatable; default: eval.splits)"),
    out: str = typer.Option(None, "--out", help="Output folder (default: eval.out_dir)"),
    label: str = typer.Option("", "--as", help="What the model is to the pipeline, e.g. zero-shot or sft (the "
                                               "stages evaluate_zero_shot, evaluate_sft): its MLflow run is "
                                               "'evaluate LABEL' and its metrics reach the pipeline run as "
                                               "LABEL/<metric>; default: the pipeline's policy"),
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    overrides: Overrides = [],
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars"),
) -> None:
    """Evaluate a model: EX, TS, Vote@k, per-hardness tables and plots."""
    die_with_dvc()
    if label and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", label):  # before anything runs: an MLflow metric prefix
        raise typer.BadParameter(f"{label!r}: letters, digits, '_', '.' and '-' only (e.g. zero-shot, sft)",
                                 param_hint="--as")
    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    model = model_or_exit(model)
    out_dir = Path(out or settings.eval.out_dir)
    with stage_or_exit("evaluate", POLICY_ERRORS, writes=out_dir):
        result = stages.evaluate(settings, model, Path(corpus or settings.data.out_dir), splits, out_dir,
                                 progress=progress, label=label)
    gate = settings.eval.gate_metric
    typer.echo(f"evaluated {model} → {out_dir}")
    for split, modes in result.metrics.items():
        parts = [f"{mode} EX {m['ex']:.3f}" for mode, m in modes.items()
                 if isinstance(m, dict) and isinstance(m.get("ex"), (int, float))]
        typer.echo(f"  {split:9s} " + ", ".join(parts))
    value = result.gate(gate)
    typer.echo(f"  gate {gate}: {'not computed' if value is None else f'{value:.4f}'}")
    for note in result.notes:
        typer.echo(f"  note: {note}")
