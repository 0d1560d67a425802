"""``progress-sql preset``: the presets of configs/presets/ (overlays of params.yaml), listed and
shown, and written as ``dvc exp run`` parameters: ``dvc exp run $(progress-sql preset show NAME
--as-set)`` runs the pipeline with the preset's values in params.yaml, as DVC tracks them."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import typer

from progress_sql.cli.common import load_or_exit
from progress_sql.params import SettingsError, load_preset, preset_names, presets_dir, yaml_load

app = typer.Typer(help="The presets of configs/presets/: list, show, as dvc exp run parameters.",
                  no_args_is_help=True)

PARAMS_HELP = "Settings file the preset overlays (its folder's configs/presets/ is searched first)"


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"rl": {"steps": 1}}`` → ``{"rl.steps": 1}`` (lists are values, not sections)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def hydra_value(value: Any) -> str:
    """``value`` in the override grammar ``dvc exp run -S`` parses (Hydra's): strings quoted, so
    ``off`` or ``1.0`` stay strings; lists in brackets without spaces (a bare ``a,b`` is a sweep)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    raise TypeError(f"no override syntax for {type(value).__name__} {value!r}")


def set_params(overlay: dict[str, Any], listed: set[str] | None = None) -> list[str]:
    """The overlay as ``dvc exp run`` arguments: ``-S``, ``key=value`` for each of its settings;
    ``++key=value`` (Hydra's add-or-override) for a key not in ``listed``, params.yaml's keys (a
    registered part's settings are optional there, and DVC refuses to set a key it lacks)."""
    args: list[str] = []
    for key, value in leaves(overlay).items():
        add = "++" if listed is not None and key not in listed else ""
        args += ["-S", f"{add}{key}={hydra_value(value)}"]
    return args


def _checked_overlay(ctx: typer.Context, name: str, params: str) -> dict[str, Any]:
    """The overlay of preset ``name``, validated over ``params`` as every command loads it;
    exit 2 with the message."""
    load_or_exit(ctx, params, preset=name)
    try:
        return load_preset(name, presets_dir(params))[0]
    except SettingsError as err:  # not reached: load_or_exit read the same file
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


def describe(path: Path, name: str, width: int = 90) -> str:
    """What a preset is: its file's opening comment (``# NAME: ...``) to the first ``.`` or ``:``,
    cut to about ``width`` characters."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines).removeprefix(f"{name}:").strip()
    text = re.split(r"(?<!App)(?<!e\.g)[.:](?:\s|$)", text, maxsplit=1)[0]
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0].rstrip(",;") + " …"


@app.command("list")
def list_presets(params: str = typer.Option("params.yaml", "--params", help=PARAMS_HELP)) -> None:
    """The presets, each with the first line of its file's comment."""
    folder = presets_dir(params)
    for name in preset_names(folder):
        typer.echo(f"{name:28s} {describe(folder / f'{name}.yaml', name)}")


@app.command("show")
def show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="A preset of configs/presets/ (or a YAML file)"),
    as_set: bool = typer.Option(False, "--as-set", help="Print `-S key=value` arguments of `dvc exp run`: "
                                                        "dvc exp run $(progress-sql preset show NAME --as-set)"),
    params: str = typer.Option("params.yaml", "--params", help=PARAMS_HELP),
) -> None:
    """The settings a preset changes (validated over the settings file), one `key: value` a line."""
    overlay = _checked_overlay(ctx, name, params)
    if not as_set:
        for key, value in leaves(overlay).items():
            typer.echo(f"{key}: {hydra_value(value)}")
        return
    params_file = Path(params)
    listed = set(leaves(yaml_load(params_file.read_text(encoding="utf-8")) or {})) if params_file.is_file() else None
    args = set_params(overlay, listed)
    spaced = [a for a in args if any(c.isspace() for c in a)]
    if spaced:  # the shell would split them in $(...)
        typer.echo(f"error: {', '.join(spaced)}: a value with a space; pass it to dvc exp run -S by hand", err=True)
        raise typer.Exit(2)
    typer.echo("\n".join(f"{flag} {arg}" for flag, arg in zip(args[::2], args[1::2])))
