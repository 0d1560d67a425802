"""YAML read as params.yaml is read: safe, with YAML 1.2 booleans, no key twice in a mapping, and
a file that is missing, unreadable or not YAML reported as a SettingsError naming it (params
files, presets and study files alike)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from progress_sql.params.settings import SettingsError


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


class DuplicateKey(yaml.YAMLError):
    """A mapping names a key twice. PyYAML would keep the last silently, dropping the first's
    settings (a second ``rl:`` section appended to params.yaml replaced the whole first one)."""


def _refuse_duplicates(node: yaml.Node, path: tuple[str, ...] = (), done: set[int] | None = None) -> None:
    """DuplicateKey naming the dotted key and both lines, anywhere under ``node``. A node that
    aliases share is checked once (``done``): a recursive alias or a billion laughs stays cheap."""
    done = set() if done is None else done
    if id(node) in done:
        return
    done.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicates(item, (*path, str(i)), done)
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[tuple[str, str], yaml.Node] = {}
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name is not None:
            first = seen.setdefault((key.tag, name), key)
            if first is not key:
                dotted = ".".join((*path, name))
                raise DuplicateKey(f"duplicate key {dotted!r} at line {key.start_mark.line + 1} "
                                   f"(first at line {first.start_mark.line + 1}): YAML would keep only the "
                                   "last one; remove or merge one of them")
        _refuse_duplicates(value, (*path, str(name)), done)


def yaml_load(text: str) -> Any:
    """Parse YAML as params.yaml is read: safe, YAML 1.2 booleans (``off``/``no`` stay strings),
    a key given twice in one mapping a ``DuplicateKey`` error (a ``yaml.YAMLError``)."""
    loader = _Yaml12Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicates(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


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
    except DuplicateKey as err:
        raise SettingsError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise SettingsError(f"{path} is not valid YAML: {err}") from None
