"""``progress-sql odt``: compare a predicted SQL with a gold SQL through the ODT."""

from __future__ import annotations

import json

import typer

from progress_sql.cli.common import ParamsFile, load_or_exit

app = typer.Typer(help="Oracle-guided Diagnostic Tree: structural diagnosis of SQL.", no_args_is_help=True)


@app.command("diff")
def diff(
    ctx: typer.Context,
    pred: str = typer.Argument(..., help="Predicted SQL"),
    gold: str = typer.Argument(..., help="Gold (reference) SQL"),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object with score, tags, feedback"),
    params: ParamsFile = "params.yaml",
) -> None:
    """Print the structural score, the diagnostic tags and the feedback the policy would see."""
    from progress_sql.odt import diagnose

    settings = load_or_exit(ctx, params)
    d = diagnose(pred, gold, settings.odt)
    if as_json:
        typer.echo(json.dumps({"score": d.score, "tags": list(d.tags), "feedback": d.feedback}))
        return
    typer.echo(f"score:    {d.score:.4f}")
    typer.echo(f"tags:     {', '.join(d.tags) if d.tags else '(none)'}")
    typer.echo(f"feedback: {d.feedback or '(none)'}")
