"""``progress-sql data``: build the bundled corpus or import datasets on disk, and validate a
corpus (the DVC stages ``build_data`` and ``validate_data`` run ``build`` and ``validate``;
``build`` imports when ``data.source`` is ``import``)."""

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
    """Generate the bundled corpus: databases, splits, robustness variants, neighbours (or, with
    data.source import, import the datasets data.import_* name: see `data import`)."""
    from progress_sql.corpus.records import CorpusError

    settings = load_or_exit(params, parse_overrides(overrides))
    target = Path(out or settings.data.out_dir)
    try:
        manifest = stages.build_data(settings, target, progress=progress)
    except CorpusError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    if manifest.get("source") == "import":
        _echo_import(manifest, target)
        return
    typer.echo(f"built {target} in {manifest['build_seconds']:.1f} s (seed {manifest['seed']})")
    for split, info in manifest["splits"].items():
        levels = ", ".join(f"{k} {v}" for k, v in info["hardness"].items())
        typer.echo(f"  {split:5s} {info['examples']:5d} examples on {len(info['databases'])} databases "
                   f"({levels}); empty gold {info['empty_gold']}, with evidence {info['with_evidence']}")
    variants = ", ".join(f"{k} {v['examples']} ({v['coverage']:.0%})" for k, v in manifest["variants"].items())
    typer.echo(f"  variants: {variants}")
    typer.echo(f"  neighbours: {sum(len(v) for v in manifest['neighbours'].values())} databases")


@app.command("import")
def import_datasets(
    spider: str = typer.Option(None, "--spider", help="Spider folder (data.import_spider)"),
    bird: str = typer.Option(None, "--bird", help="BIRD folder holding train/ and dev/ (data.import_bird)"),
    synsql: str = typer.Option(None, "--synsql", help="SynSQL-2.5M folder (data.import_synsql)"),
    spider_syn: str = typer.Option(None, "--spider-syn", help="Spider-Syn dev.json or its folder: the syn split"),
    spider_realistic: str = typer.Option(None, "--spider-realistic",
                                         help="spider-realistic.json or its folder: the realistic split"),
    spider_dk: str = typer.Option(None, "--spider-dk", help="Spider-DK.json or its folder: the dk split"),
    test_suite: str = typer.Option(None, "--test-suite",
                                   help="Test-suite databases <db_id>/*.sqlite (default: SPIDER/test_suite_database)"),
    params: str = typer.Option("params.yaml", "--params", help="Settings file (defaults when absent)"),
    out: str = typer.Option(None, "--out", help="Output folder (default: data.out_dir)"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar"),
) -> None:
    """Import Spider / BIRD / SynSQL-2.5M (and Spider-Syn / -Realistic / -DK) from their
    published layouts into the corpus the trainer and evaluation read; the sources are only
    read. The options set data.source=import and data.import_*; the train split draws
    data.mix_total examples from the union of the train sets (data.import_sampling)."""
    from progress_sql.corpus.records import CorpusError

    given = {"spider": spider, "bird": bird, "synsql": synsql, "spider_syn": spider_syn,
             "spider_realistic": spider_realistic, "spider_dk": spider_dk, "test_suite": test_suite}
    extra = {f"data.import_{key}": value for key, value in given.items() if value is not None}
    settings = load_or_exit(params, {**parse_overrides(overrides), **extra, "data.source": "import"})
    target = Path(out or settings.data.out_dir)
    try:
        manifest = stages.build_data(settings, target, progress=progress)
    except CorpusError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    _echo_import(manifest, target)


def _echo_import(manifest: dict, target: Path) -> None:
    import json

    from progress_sql.corpus.records import CorpusLayout
    from progress_sql.data.importing import summary_lines

    for line in summary_lines(manifest, target):
        typer.echo(line)
    failing = json.loads(CorpusLayout(target).import_report.read_text(encoding="utf-8"))["failing"]
    for entry in failing[:10]:
        typer.echo(f"  failing gold {entry['id']} ({entry['split']}, {entry['action']}): "
                   f"{entry['error']}: {entry['message']}")
    if len(failing) > 10:
        typer.echo(f"  ... and {len(failing) - 10} more in {CorpusLayout(target).import_report}")


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
