"""Helpers shared by the CLI commands: settings with a preset and overrides, and clean exits."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import typer
import yaml

from progress_sql.config import (
    Settings,
    SettingsError,
    load_settings,
    presets_dir,
    settings_from_dict,
    with_preset,
    yaml_load,
)

SET_HELP = "Override a setting, e.g. --set data.train_size=200 (repeatable; the value is read as YAML)"
PRESET_HELP = ("A preset of configs/presets/ (or a YAML file) merged over the settings file before the --set "
               "overrides, e.g. cpu-demo (the one-minute demo sizes)")

_preset: str | None = None  # the global --preset of this invocation (set by the app's callback)


def set_preset(name: str | None) -> None:
    """Record the global ``--preset`` for the commands of this invocation."""
    global _preset
    _preset = name or None


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["data.train_size=200", ...]`` → ``{"data.train_size": 200}``; values are YAML."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            out[key.strip()] = yaml_load(raw)
        except yaml.YAMLError as err:
            raise typer.BadParameter(f"{key}: value is not valid YAML ({err})", param_hint="--set") from None
    return out


def load_or_exit(params: str, overrides: dict | None = None, preset: str | None = None) -> Settings:
    """Settings from ``params`` (built-in defaults when the default params.yaml is absent), the
    preset (default: the global ``--preset``) merged in, then the overrides; a bad file, preset
    or override ends the command with its message and exit code 2."""
    path = Path(params)
    preset = preset if preset is not None else _preset
    try:
        if params == "params.yaml" and not path.exists():
            raw, source = with_preset({}, preset, "built-in defaults", presets_dir())
            return settings_from_dict(raw, source, overrides)
        return load_settings(path, overrides, preset=preset)
    except SettingsError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


@contextmanager
def stage_or_exit(name: str, errors: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """End the command with its message and exit code 1 when the stage run inside (a function
    of ``progress_sql.stages``) fails in a way it reports: a CorpusError, an MLflow
    TrackingError, a ValueError or FileNotFoundError from the stage's checks, or one of
    ``errors``. The stage's MLflow run is already marked FAILED when the error gets here."""
    from progress_sql.corpus.records import CorpusError
    from progress_sql.tracking import TrackingError

    try:
        yield
    except (CorpusError, TrackingError, ValueError, FileNotFoundError, *errors) as err:
        typer.echo(f"error: stage {name} failed: {err}", err=True)
        raise typer.Exit(1) from None
