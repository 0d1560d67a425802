"""``progress-sql ask``: the trained model put to use. One question about a SQLite database:
the model's output, the SQL in it, and that SQL's result from the read-only sandbox."""

from __future__ import annotations

import typer

from progress_sql.cli.common import Overrides, ParamsFile, load_or_exit, model_or_exit, parse_overrides


def ask(
    ctx: typer.Context,
    question: str = typer.Argument(..., help="The question, in natural language"),
    model: str = typer.Option(..., "--model", help="models:/NAME@champion, models:/NAME/N, a model folder or hub id"),
    db: str = typer.Option(..., "--db", help="The SQLite database the question is about (opened read-only)"),
    evidence: str = typer.Option("", "--evidence", help="External knowledge for the question (BIRD-style)"),
    params: ParamsFile = "params.yaml",
    overrides: Overrides = [],
) -> None:
    """Generate SQL for a question (greedy, the output format of rl.recipe) and run it read-only."""
    from progress_sql.corpus.records import CorpusError
    from progress_sql.envs.exec_feedback import format_result
    from progress_sql import stages
    from progress_sql.inference.models import PolicyLoadError
    from progress_sql.tracking import TrackingError

    settings = load_or_exit(ctx, params, parse_overrides(overrides))
    model = model_or_exit(model)
    try:
        answer = stages.ask(settings, model, db, question, evidence=evidence)
    except (CorpusError, PolicyLoadError, TrackingError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"model output ({answer.finish_reason}):\n{answer.text.strip() or '(empty)'}\n")
    if answer.sql is None:
        typer.echo("SQL: none found in the output")
        return
    typer.echo(f"SQL: {answer.sql}" + ("" if answer.well_formed else "  (output not well-formed)"))
    typer.echo("result:\n" + format_result(answer.result, settings.env))
