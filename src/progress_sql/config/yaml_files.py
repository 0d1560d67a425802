"""YAML read as params.yaml is read: safe, with YAML 1.2 booleans, and a file that is missing,
unreadable or not YAML reported as a SettingsError naming it (params files and presets alike)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from progress_sql.config.settings import SettingsError


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 booleans: only true/false. DVC rewrites params.yaml
    (``dvc exp run -S``) with a YAML 1.2 writer that drops the quotes around ``"off"``, which
    YAML 1.1 would then read as False."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def yaml_load(text: str) -> Any:
    """Parse YAML as params.yaml is read: safe, YAML 1.2 booleans (``off``/``no`` stay strings)."""
    return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path: Path, what: str) -> Any:
    """The parsed YAML of ``path``; ``what`` names the file in the SettingsError when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"cannot read {what} {path}: {err}") from None
    try:
        return yaml_load(text)
    except yaml.YAMLError as err:
        raise SettingsError(f"{path} is not valid YAML: {err}") from None
