"""Presets: named overlays of params.yaml (``configs/presets/<name>.yaml``), where they are
looked up, and how one is merged into a params tree.

A preset is a YAML file with the same nested keys as params.yaml, holding only what differs
(configs/presets/cpu-demo.yaml: the one-minute demo sizes). Adding one is adding a file. A
preset may build on another (``extends: tiny``): the other's overlay is merged first.
Order: params.yaml, then the preset (the ones it extends first), then --set overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from progress_sql.params.settings import SettingsError
from progress_sql.params.yaml_files import read_yaml

PRESETS_SUBDIR = Path("configs") / "presets"
NO_PRESET = "none"  # the name that means "params.yaml as it is" (a choice of the Prefect form)
EXTENDS = "extends"  # a preset's key naming the preset it builds on (cpu-demo: extends tiny)
# The presets and DeepSpeed configs ship inside the package (the checkout's configs/ links
# there), so an installed package finds them from any folder. parents[1]: this module sits in
# progress_sql/config/, the configs in progress_sql/configs/.
PACKAGE_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def presets_dir(params: str | Path | None = None) -> Path:
    """Where presets are looked up: ``configs/presets/`` beside the params file (or the working
    directory), else the package's own."""
    near = (Path(params).resolve().parent if params else Path.cwd()) / PRESETS_SUBDIR
    return near if near.is_dir() else PACKAGE_CONFIGS / "presets"


def preset_names(folder: str | Path | None = None) -> tuple[str, ...]:
    """The presets in ``folder`` (default ``presets_dir()``): the stems of its *.yaml files, sorted."""
    folder = Path(folder) if folder is not None else presets_dir()
    return tuple(sorted(p.stem for p in folder.glob("*.yaml") if p.stem != NO_PRESET)) if folder.is_dir() else ()


def preset_file(name: str, folder: str | Path | None = None) -> Path:
    """The file of preset ``name`` (a name in ``folder``, or a path to a .yaml/.yml file);
    SettingsError listing the available names when there is none."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise SettingsError(f"preset file not found: {path}")
        return path
    folder = Path(folder) if folder is not None else presets_dir()
    path = folder / f"{name}.yaml"
    if not path.is_file():
        available = ", ".join(preset_names(folder)) or "none"
        raise SettingsError(f"unknown preset {name!r}; available: {available} (the .yaml files of {folder})")
    return path


def load_preset(name: str, folder: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """The overlay of preset ``name`` with those it extends merged in first, and its file."""
    chain = preset_chain(name, folder)
    overlay: dict[str, Any] = {}
    for part, _ in chain:
        overlay = merge_overlay(overlay, part)
    return overlay, chain[-1][1]


def _read_preset(name: str, folder: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """The overlay written in preset ``name``'s file (a mapping of settings sections) and the
    file; a file that is not YAML or not a mapping of sections is a SettingsError naming it."""
    path = preset_file(name, folder)
    overlay = read_yaml(path, "preset file")
    if overlay is None:  # an empty overlay: params.yaml as it is
        return {}, path
    if not isinstance(overlay, dict):
        raise SettingsError(f"preset {path}: the top level must be a mapping of settings sections")
    return overlay, path


def preset_chain(name: str, folder: str | Path | None = None) -> list[tuple[dict[str, Any], Path]]:
    """Preset ``name`` and the presets it extends (``extends: OTHER``, a name in the same
    folder), base first, each overlay without its ``extends`` key; a loop is a SettingsError."""
    chain: list[tuple[dict[str, Any], Path]] = []
    while name:
        overlay, path = _read_preset(name, folder)
        if any(path.resolve() == seen.resolve() for _, seen in chain):
            raise SettingsError(f"preset {path}: `extends` goes round in a loop")
        parent = overlay.get(EXTENDS)
        if parent is not None and not isinstance(parent, str):
            raise SettingsError(f"preset {path}: `{EXTENDS}` must name a preset")
        chain.append(({k: v for k, v in overlay.items() if k != EXTENDS}, path))
        name, folder = parent or "", path.parent
    return chain[::-1]


def merge_overlay(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay`` merged in: mappings merge key by key, anything else (a list, a
    number) replaces the base value. Neither argument is changed."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overlay(out[key], value)
        else:
            out[key] = value
    return out


def with_preset(raw: Any, preset: str | None, source: str,
                folder: str | Path | None = None) -> tuple[Any, list[tuple[str, Any]]]:
    """(params tree with the preset's overlay merged in, its layers lowest first: ``(source, raw)``
    and ``("preset NAME (FILE)", overlay)``, which errors name as where a value came from);
    ``preset`` None, "" or ``NO_PRESET`` leaves the tree as it is."""
    if not preset or preset == NO_PRESET:
        return raw, [(source, raw)]
    chain = preset_chain(preset, folder)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return raw, [(source, raw)]  # settings_from_dict reports the malformed params tree
    layers = [(source, raw)]
    for i, (overlay, path) in enumerate(chain, start=1):
        raw = merge_overlay(raw, overlay)
        layers.append((f"preset {preset if i == len(chain) else path.stem} ({path})", overlay))
    return raw, layers
