"""From a params tree to validated Settings: ``settings_from_dict`` (a parsed tree plus
``--set`` overrides) and ``load_settings`` (params.yaml, then a preset's overlay, then the
overrides), with every validation error reported by its dotted key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from progress_sql.params.presets import presets_dir, with_preset
from progress_sql.params.settings import Settings, SettingsError
from progress_sql.params.yaml_files import read_yaml


def _has(tree: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _format_errors(err: ValidationError, source: str, overridden: tuple[str, ...] = (), raw: Any = None) -> str:
    """One line per error under the header of where its value came from: a ``--set`` override
    when its key is (or lies under) one of ``overridden``, or when a section's error comes from
    an override that put a key there the source did not have; else ``source``."""
    blamed: dict[str, list[str]] = {f"invalid settings in {source}:": [], "invalid --set override:": []}
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            line = f"  {key}: unknown key"
        else:
            got = e.get("input")
            shown = repr(got) if not isinstance(got, dict) else "{...}"
            line = f"  {key}: {e['msg']} (got {shown})"
        by_override = any(key == k or key.startswith(k + ".") or (k.startswith(key + ".") and not _has(raw, k))
                          for k in overridden)
        blamed["invalid --set override:" if by_override else f"invalid settings in {source}:"].append(line)
    return "\n".join(line for header, lines in blamed.items() if lines for line in (header, *lines))


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


def settings_from_dict(raw: Any, source: str = "<dict>", overrides: dict[str, Any] | None = None) -> Settings:
    """Validate a parsed params tree (plus ``{"a.b": value}`` overrides) into Settings."""
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
        raise SettingsError(_format_errors(err, source, tuple(overrides or ()), given)) from None


def load_settings(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None, *,
                  preset: str | None = None) -> Settings:
    """Load and validate params.yaml, with a preset's overlay merged in first (``preset``: a
    name in ``configs/presets/`` or a YAML file, see ``with_preset``) and the ``{"a.b": value}``
    overrides on top; raise SettingsError with the offending key (and the preset's file)."""
    path = Path(path)
    raw = read_yaml(path, "settings file")
    raw, source = with_preset(raw, preset, str(path), presets_dir(path))
    return settings_from_dict(raw, source, overrides)
