"""``progress-sql data``: build the bundled corpus and validate a corpus (the DVC stages
``build_data`` and ``validate_data`` run exactly these commands)."""

from __future__ import annotations

from pathlib import Path

import typer

from progress_sql import stages
from progress_sql.cli.common import SET_HELP, load_or_exit, parse_overrides

app = typer.Typer(help="Corpus construction and validation.", no_args_is_help=True)


@app.command("build")
def build(
    params: str = typer.Option("params.yaml", "--params", help="Settings file (defaults when absent)"),
    out: str = typer.Option(None, "--out", help="Output folder (default: data.out_dir)"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar"),
) -> None:
    """Generate the bundled corpus: databases, splits, robustness variants, neighbours."""
    from progress_sql.corpus.records import CorpusError

    settings = load_or_exit(params, parse_overrides(overrides))
    target = Path(out or settings.data.out_dir)
    try:
        manifest = stages.build_data(settings, target, progress=progress)
    except CorpusError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"built {target} in {manifest['build_seconds']:.1f} s (seed {manifest['seed']})")
    for split, info in manifest["splits"].items():
        levels = ", ".join(f"{k} {v}" for k, v in info["hardness"].items())
        typer.echo(f"  {split:5s} {info['examples']:5d} examples on {len(info['databases'])} databases "
                   f"({levels}); empty gold {info['empty_gold']}, with evidence {info['with_evidence']}")
    variants = ", ".join(f"{k} {v['examples']} ({v['coverage']:.0%})" for k, v in manifest["variants"].items())
    typer.echo(f"  variants: {variants}")
    typer.echo(f"  neighbours: {sum(len(v) for v in manifest['neighbours'].values())} databases")


@app.command("validate")
def validate(
    params: str = typer.Option("params.yaml", "--params", help="Settings file (defaults when absent)"),
    corpus: str = typer.Option(None, "--corpus", help="Corpus folder (default: data.out_dir)"),
    report_dir: str = typer.Option("reports/data", "--report-dir", help="Where validation.json/.md go"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Run the Great Expectations suite over a corpus; exit 1 naming each failed expectation."""
    from progress_sql.corpus.records import CorpusError

    settings = load_or_exit(params, parse_overrides(overrides))
    errors: tuple[type[BaseException], ...] = (CorpusError,)
    if settings.tracking.enabled:  # MLflow (an optional extra) is imported only when used
        from progress_sql.tracking import TrackingError

        errors += (TrackingError,)
    try:
        report = stages.validate_data(settings, corpus or settings.data.out_dir, report_dir)
    except errors as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(report.summary())
    if not report.success:
        for failure in report.failures:
            typer.echo(f"failed expectation: {failure}", err=True)
        raise typer.Exit(1)


@app.command("export-verl")
def export_verl(
    params: str = typer.Option("params.yaml", "--params", help="Settings file (defaults when absent)"),
    corpus: str = typer.Option(None, "--corpus", help="Corpus folder (default: data.out_dir)"),
    out: str = typer.Option("data/verl", "--out", help="Folder for <split>.parquet"),
    splits: list[str] = typer.Option(["train", "dev"], "--split", help="Split to export (repeatable)"),
    recipe: str = typer.Option("progress", "--recipe", help="Reward recipe whose output format the prompts ask for"),
    limit: int = typer.Option(None, "--limit", help="At most this many examples per split"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Write the corpus as verl's RL parquet files (prompt, reward_model, extra_info with the
    database path and the ODT interaction's kwargs): see docs/integrations/verl.md."""
    from progress_sql.corpus.records import CorpusError
    from progress_sql.integrations.verl import export_parquet

    settings = load_or_exit(params, parse_overrides(overrides))
    try:
        written = export_parquet(corpus or settings.data.out_dir, out, splits, recipe, settings, limit=limit)
    except (CorpusError, KeyError, FileNotFoundError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    for split, path in written.items():
        typer.echo(f"wrote {path}")
