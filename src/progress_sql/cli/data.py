"""``progress-sql data``: build the bundled corpus or import datasets on disk, and validate a
corpus (the DVC stages ``build_data`` and ``validate_data`` run ``build`` and ``validate``;
``build`` imports when ``data.source`` is ``import``)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import typer

from progress_sql import sources, stages
from progress_sql.cli.common import (
    CorpusDir,
    Overrides,
    ParamsFile,
    ProgressBar,
    load_or_exit,
    parse_overrides,
)
from progress_sql.params import Settings

app = typer.Typer(help="Corpus construction and validation.", no_args_is_help=True)
IMPORTED = "data/imported"  # where `data import` writes, beside the bundled corpus (data.out_dir)


@app.command("build")
def build(
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    out: str = typer.Option(None, "--out", help="Output folder (default: data.out_dir)"),
    overrides: Overrides = [],
    progress: ProgressBar = True,
) -> None:
    """Generate the bundled corpus: databases, splits, robustness variants, neighbours (or, with
    data.source import, import the datasets data.import_* name: see `data import`)."""
    manifest, target = _build_data(load_or_exit(ctx, params, parse_overrides(overrides)), out, progress)
    if manifest.get("source") == "import":
        _echo_import(manifest, target)
        return
    typer.echo(f"built {target} in {manifest['build_seconds']:.1f} s (seed {manifest['seed']})")
    catalogue, naming = manifest["catalogue"], manifest["naming"]
    typer.echo(f"  catalogue: {catalogue['domains']} domains in {catalogue['families']} families; "
               f"{len(manifest['databases'])} databases, {naming['messy_databases']} with messy values")
    for split, info in manifest["splits"].items():
        levels = ", ".join(f"{k} {v}" for k, v in info["hardness"].items())
        named = info["names_tables"]
        typer.echo(f"  {split:5s} {info['examples']:5d} examples on {len(info['databases'])} databases in "
                   f"{len(info['families'])} families ({levels}); empty gold {info['empty_gold']}, with evidence "
                   f"{info['with_evidence']}; names its gold tables {named['tables']:.0%} (all {named['all']:.0%}, "
                   f"one {named['any']:.0%})")
    typer.echo("  naming: " + ", ".join(f"{k} {v}" for k, v in naming["cases"].items()) + " databases")
    variants = ", ".join(f"{k} {v['examples']} ({v['coverage']:.0%})" for k, v in manifest["variants"].items())
    typer.echo(f"  variants: {variants}")
    typer.echo(f"  neighbours: {sum(len(v) for v in manifest['neighbours'].values())} databases")


def source_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with one option per registered source (``--spider``, ``--spider-syn``, ...:
    ``sources.SOURCES``), passed to it in ``**given`` by source name, ahead of its own options.
    Typer reads a command's options from its signature, so options that follow the registry are
    parameters added to it here, not written out (a new source then needs no change here)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    per_source = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                    default=typer.Option(None, f"--{s.option}", help=f"{s.about} (data.{s.setting})"))
                  for s in sources.SOURCES]
    leading = [p for p in own if p.kind is not p.KEYWORD_ONLY]  # the typer.Context, before the options
    rest = [p for p in own if p.kind is p.KEYWORD_ONLY]
    command.__signature__ = inspect.Signature([*leading, *per_source, *rest])  # type: ignore[attr-defined]
    return command


@app.command("import")
@source_options
def import_datasets(
    ctx: typer.Context,
    *,
    test_suite: str = typer.Option(None, "--test-suite",
                                   help="Test-suite databases <db_id>/*.sqlite (default: SPIDER/test_suite_database)"),
    params: ParamsFile = "params.yaml",
    out: str = typer.Option(IMPORTED, "--out",
                            help="Output folder, its own so the bundled corpus (data.out_dir) stays; the other "
                                 "commands read it with --corpus"),
    overrides: Overrides = [],
    progress: ProgressBar = True,
    **given: str | None,
) -> None:
    """Import the registered dataset sources (Spider / BIRD / SynSQL-2.5M, Spider-Syn / -Realistic /
    -DK) from their published layouts into a corpus the trainer and evaluation read (--corpus);
    the sources are only read. The options set data.source=import and data.import_*; the train
    split draws data.mix_total examples from the union of the train sets (data.import_sampling).
    A folder with its dev set alone (Spider's dev.json, BIRD's dev/) gives an evaluation-only
    corpus: dev (and test), no train."""
    extra = {f"data.{sources.get(name).setting}": path for name, path in given.items() if path is not None}
    if test_suite is not None:
        extra["data.import_test_suite"] = test_suite
    settings = load_or_exit(ctx, params, {**parse_overrides(overrides), **extra, "data.source": "import"})
    _echo_import(*_build_data(settings, out, progress))


def _build_data(settings: Settings, out: str | None, progress: bool) -> tuple[dict, Path]:
    """The ``build_data`` stage into ``out`` (default ``data.out_dir``): its manifest and the
    folder; a CorpusError ends the command with its message and exit code 1."""
    from progress_sql.corpus.records import CorpusError

    target = Path(out or settings.data.out_dir)
    try:
        return stages.build_data(settings, target, progress=progress), target
    except CorpusError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None


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
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    report_dir: str = typer.Option("reports/data", "--report-dir", help="Where validation.json/.md go"),
    overrides: Overrides = [],
    progress: bool = typer.Option(True, "--progress/--no-progress",
                                  help="Accepted as by every stage's command (validation draws no bar)"),
) -> None:
    """Run the Great Expectations suite over a corpus; exit 1 naming each failed expectation."""
    del progress  # the suite runs with Great Expectations' own bars off: nothing to show or hide
    from progress_sql.corpus.records import CorpusError

    settings = load_or_exit(ctx, params, parse_overrides(overrides))
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
    ctx: typer.Context,
    params: ParamsFile = "params.yaml",
    corpus: CorpusDir = None,
    out: str = typer.Option("data/verl", "--out", help="Folder for <split>.parquet"),
    splits: list[str] = typer.Option(["train", "dev"], "--split", help="Split to export (repeatable)"),
    recipe: str = typer.Option(None, "--recipe",
                               help="Reward recipe whose output format the prompts ask for (default: the protocol's)"),
    protocol: str = typer.Option("odt", "--protocol", help="Multi-turn protocol whose interaction the rows name"),
    limit: int = typer.Option(0, "--limit", min=0, help="At most this many examples per split (0: all)"),
    overrides: Overrides = [],
) -> None:
    """Write the corpus as verl's RL parquet files (prompt, reward_model, extra_info with the
    database path and the protocol's interaction kwargs): see docs/integrations/verl.md."""
    from progress_sql.corpus.records import CorpusError
    from progress_sql.files import written_aside
    from progress_sql.integrations.verl import export_parquet

    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    try:  # the splits' files replaced together; other files in --out are kept
        with written_aside(out, owned=[f"{split}.parquet" for split in splits]) as aside:
            written = export_parquet(corpus or settings.data.out_dir, aside, splits, recipe, settings,
                                     protocol=protocol, limit=limit)
    except (CorpusError, KeyError, FileNotFoundError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    for path in written.values():
        typer.echo(f"wrote {Path(out) / path.name}")
