"""Helpers shared by the CLI commands."""

from __future__ import annotations

from pathlib import Path

import typer

from progress_sql.config import Settings, SettingsError, default_settings, load_settings


def load_or_exit(params: str, overrides: dict | None = None) -> Settings:
    """Settings from ``params`` (built-in defaults when the default file is absent); a bad
    file ends the command with its message and exit code 2."""
    path = Path(params)
    if params == "params.yaml" and not path.exists() and not overrides:
        return default_settings()
    try:
        return load_settings(path, overrides)
    except SettingsError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
