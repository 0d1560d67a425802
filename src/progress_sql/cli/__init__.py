"""The ``progress-sql`` command: one entry point for every stage. Commands stay thin: each
parses its arguments and calls the package."""

from __future__ import annotations

import importlib.util

import typer

from progress_sql.cli.common import PRESET_HELP, Commands, Invocation
from progress_sql.cli.compare import compare
from progress_sql.cli.odt import app as odt_app
from progress_sql.cli.preset import app as preset_app

app = typer.Typer(
    name="progress-sql",
    help="Multi-turn RL post-training for Text-to-SQL (Progress-SQL and baselines).",
    no_args_is_help=True,
    add_completion=False,
    cls=Commands,
)
app.add_typer(odt_app, name="odt")
app.add_typer(preset_app, name="preset")
app.command("compare")(compare)


@app.callback()
def _global_options(
    ctx: typer.Context,
    preset: str = typer.Option(None, "--preset", metavar="NAME", help=PRESET_HELP),
) -> None:
    """Multi-turn RL post-training for Text-to-SQL (Progress-SQL and baselines)."""
    ctx.obj = Invocation(preset or None)


def _register_optional() -> None:
    # Sub-apps whose dependencies are extras are added only when importable.
    try:
        from progress_sql.cli.data import app as data_app
    except ImportError:
        pass
    else:
        app.add_typer(data_app, name="data")
    try:  # the ML and MLOps commands import torch / mlflow only when they run
        from progress_sql.cli.ask import ask
        from progress_sql.cli.study import study
        from progress_sql.cli.eval import evaluate
        from progress_sql.cli.registry import app as registry_app
        from progress_sql.cli.summary import summary
        from progress_sql.cli.train import app as train_app
    except ImportError:
        return
    app.add_typer(train_app, name="train")
    app.command("eval")(evaluate)
    app.add_typer(registry_app, name="registry")
    app.command("ask")(ask)
    app.command("summary")(summary)
    app.command("study")(study)
    if all(importlib.util.find_spec(name) for name in ("prefect", "httpx")):  # the Prefect and MLflow UIs
        from progress_sql.cli.ui import ui

        app.command("ui")(ui)


_register_optional()


def main() -> None:
    """The ``progress-sql`` console script. When stderr is not a terminal (a log, ``dvc repro``
    in CI) the progress bars print a status line now and then instead of redrawing one line; a
    SIGTERM ends a command with its cleanup run (``exit_on_sigterm``)."""
    from progress_sql.cli.common import exit_on_sigterm, status_lines_when_piped

    status_lines_when_piped()
    exit_on_sigterm()
    app()
