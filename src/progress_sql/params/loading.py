"""From a params tree to validated Settings: ``settings_from_dict`` (a parsed tree plus
``--set`` overrides) and ``load_settings`` (params.yaml, then a preset's overlay, then the
overrides), with every validation error reported by its dotted key."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Sequence

from pydantic import ValidationError

from progress_sql.params.presets import presets_dir, with_preset
from progress_sql.params.settings import Settings, SettingsError, default_settings
from progress_sql.params.yaml_files import read_yaml
from progress_sql.sections import Conflict

Layer = tuple[str, Any]  # (where the values came from: a file, a preset; its params tree)
OVERRIDE = "--set"


_MISSING = object()


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def _has(tree: Any, dotted: str) -> bool:
    return _get(tree, dotted) is not _MISSING


def _origin(key: str, layers: Sequence[Layer], overridden: tuple[str, ...], base: Any) -> str | None:
    """Where ``key``'s value came from: ``--set`` when an override set it (or a key above, or one
    below that made the key's section: not in ``base``, the tree before the overrides), else the
    last layer that has it, else None (a default)."""
    if any(key == k or key.startswith(k + ".") or (k.startswith(key + ".") and not _has(base, k)) for k in overridden):
        return OVERRIDE
    return next((label for label, tree in reversed(layers) if _has(tree, key)), None)


def _conflict_lines(conflict: Conflict, trees: tuple[Any, Any], layers: Sequence[Layer],
                    overridden: tuple[str, ...]) -> list[str]:
    """A rule between settings: its message, then each value involved with where it came from."""
    (given, merged), defaults = trees, default_settings().model_dump(by_alias=True)
    lines = [f"invalid settings: {conflict}"]
    for key in conflict.keys:
        origin = _origin(key, layers, overridden, given)
        value = _get(merged if origin else defaults, key)
        shown = "{...}" if isinstance(value, dict) else json.dumps(value, default=str)
        lines.append(f"  {key}: {shown}, from {origin or 'the defaults'}")
    return lines


def _format_errors(err: ValidationError, layers: Sequence[Layer], overridden: tuple[str, ...] = (),
                   trees: tuple[Any, Any] = (None, None)) -> str:
    """One line per error under the header of where its value came from (``_origin``; a key no
    layer sets is blamed on the first, the settings file); a rule between settings
    (``sections.Conflict``) names where each of its values came from. ``trees``: the tree before
    and after the overrides."""
    blamed: dict[str, list[str]] = {f"invalid settings in {label}:": [] for label, _ in layers[:1]}
    conflicts: list[str] = []
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, Conflict):
            conflicts += _conflict_lines(cause, trees, layers, overridden)
            continue
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            line = f"  {key}: unknown key"
        else:
            got = e.get("input")
            shown = repr(got) if not isinstance(got, dict) else "{...}"
            line = f"  {key}: {e['msg']} (got {shown})"
        origin = _origin(key, layers, overridden, trees[0]) or layers[0][0]
        header = "invalid --set override:" if origin == OVERRIDE else f"invalid settings in {origin}:"
        blamed.setdefault(header, []).append(line)
    return "\n".join([*(line for header, lines in blamed.items() if lines for line in (header, *lines)), *conflicts])


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SettingsError(f"override {dotted}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def dotted_items(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"rl": {"lr": 1e-4}}`` → ``{"rl.lr": 1e-4}``: nested settings keyed as ``--set`` names
    them, leaves unchanged (``tracking.flat_params`` makes them MLflow's strings)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(dotted_items(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def settings_from_dict(raw: Any, source: str = "<dict>", overrides: dict[str, Any] | None = None, *,
                       layers: Sequence[Layer] | None = None) -> Settings:
    """Validate a parsed params tree (plus ``{"a.b": value}`` overrides) into Settings. ``layers``:
    the trees ``raw`` was merged from, lowest first (``with_preset``), so that an error names the
    one its value came from; default: ``raw`` itself, from ``source``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SettingsError(f"invalid settings in {source}: the top level must be a mapping")
    given, raw = raw, copy.deepcopy(raw)  # the overrides change nested sections: not the caller's
    for key, value in (overrides or {}).items():
        _set_dotted(raw, key, value)
    try:
        return Settings.model_validate(raw)
    except ValidationError as err:
        layers = list(layers) if layers is not None else [(source, given)]
        raise SettingsError(_format_errors(err, layers, tuple(overrides or ()), (given, raw))) from None


def load_settings(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None, *,
                  preset: str | None = None) -> Settings:
    """Load and validate params.yaml, with a preset's overlay merged in first (``preset``: a
    name in ``configs/presets/`` or a YAML file, see ``with_preset``) and the ``{"a.b": value}``
    overrides on top; raise SettingsError with the offending key (and the preset's file)."""
    path = Path(path)
    raw = read_yaml(path, "settings file")
    raw, layers = with_preset(raw, preset, str(path), presets_dir(path))
    return settings_from_dict(raw, str(path), overrides, layers=layers)
