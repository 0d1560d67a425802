"""The ``progress-sql`` command: one entry point for every stage. Commands stay thin: each
parses its arguments and calls the package."""

from __future__ import annotations

import typer

from progress_sql.cli.odt import app as odt_app

app = typer.Typer(
    name="progress-sql",
    help="Multi-turn RL post-training for Text-to-SQL (Progress-SQL and baselines).",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(odt_app, name="odt")


def _register_optional() -> None:
    # Sub-apps whose dependencies are extras are added only when importable.
    try:
        from progress_sql.cli.data import app as data_app
    except ImportError:
        return
    app.add_typer(data_app, name="data")


_register_optional()


def main() -> None:
    app()
