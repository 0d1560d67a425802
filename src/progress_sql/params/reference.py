"""The configuration reference (docs/CONFIG.md), generated from the settings model and the
comments of params.yaml (the project's: that of the working directory or a folder above it),
so the documentation cannot drift from what is validated:
``python -m progress_sql.params.reference > docs/CONFIG.md`` (a test compares the two).
``python -m progress_sql.params.reference --missing`` prints, as YAML to paste into
params.yaml, the settings that params.yaml does not list yet, with their defaults (``--parts``:
the optional settings of registered parts too).

The settings of a registered part (a recipe's weights, a backend's section, a dataset source's
folder and share: ``params.part_settings()``) are optional in params.yaml and listed here only
where params.yaml lists them; a setting that names parts (``params.registered_settings()``) is
documented by its registry, not by a copy of the registry's names, and where the registry derives
its default (every source: ``params.derived_settings()``) params.yaml may leave it out. A new
part therefore changes neither params.yaml nor docs/CONFIG.md."""

from __future__ import annotations

import ast
import re
import sys
import typing
from pathlib import Path
from typing import Any, Iterator

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from progress_sql.params.loading import dotted_items
from progress_sql.params.settings import Settings, derived_settings, part_settings, registered_settings
from progress_sql.params.yaml_files import yaml_load

_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def params_comments(text: str) -> dict[str, str]:
    """Dotted key → the inline comment on its line in params.yaml."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        rest = match["rest"]
        # a comment starts at " #" outside quotes (values here hold no '#')
        if " #" in rest or rest.lstrip().startswith("#"):
            comment = rest[rest.index("#") + 1 :].strip()
            comments[".".join(k for _, k in stack)] = comment
    return comments


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Literal:  # its __name__ alone drops the values
        return "one of " + " \\| ".join(str(v) for v in typing.get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "")


def _leaf_keys(tree: Any, prefix: str = "") -> set[str]:
    """The dotted keys of a params tree's values (sections are not keys)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip(".")} if prefix else set()
    return {key for name, value in tree.items() for key in _leaf_keys(value, f"{prefix}{name}.")}


def unlisted_parts(params_text: str) -> set[str]:
    """The registered parts' settings (``part_settings``) that ``params_text`` does not list at all."""
    listed = _leaf_keys(yaml_load(params_text) or {})
    return {part for part in part_settings() if not any(k == part or k.startswith(part + ".") for k in listed)}


def unlisted_optional(params_text: str) -> set[str]:
    """What ``params_text`` may leave out and does: the unlisted parts' settings and the settings
    whose default the registry derives (``derived_settings``; documented all the same)."""
    listed = _leaf_keys(yaml_load(params_text) or {})
    return unlisted_parts(params_text) | (derived_settings() - listed)


def _rows(model: type[BaseModel], skipped: set[str], prefix: str = "") -> Iterator[tuple[str, str, str, str, Any]]:
    defaults = model()
    registered = registered_settings()
    for name, info in model.model_fields.items():
        key = f"{prefix}{info.alias or name}"  # the key params.yaml writes (rl.async: the field async_)
        if key in skipped:
            continue
        default = getattr(defaults, name)
        if isinstance(default, BaseModel):
            yield from _rows(type(default), skipped, key + ".")
            continue
        if key in registered:
            kind, shown = registered[key].what, registered[key].default or f"`{default!r}`"
        else:
            kind, shown = _type_name(info.annotation), f"`{default!r}`"
        yield key, kind, shown, _constraints(info), default


def _differs(value: Any, shown_default: str) -> bool:
    """Whether params.yaml's ``value`` is not the default written ``shown_default`` (its repr)."""
    try:
        return value != ast.literal_eval(shown_default)
    except (ValueError, SyntaxError):
        return f"{value!r}" != shown_default


def reference_markdown(params_text: str) -> str:
    """The whole reference page as Markdown."""
    comments = params_comments(params_text)
    listed = dict(dotted_items(yaml_load(params_text) or {}))
    registered = registered_settings()
    lines = [
        "# Configuration reference",
        "",
        "Every tunable number of the pipeline, as validated by `progress_sql.params.Settings`",
        "when params.yaml is loaded (generated: `python -m progress_sql.params.reference > docs/CONFIG.md`).",
        "Override any key on the command line with `--set key=value`, in DVC with",
        "`dvc exp run -S key=value`, or in a Prefect run with the `overrides` parameter.",
        "The settings of a registered part (a reward recipe's weights `rewards.<recipe>`, a generation",
        "backend's `generation.<backend>`, a dataset source's `data.import_<source>` and `data.mix.<source>`)",
        "are listed where params.yaml lists them; a part's module holds the defaults of any other.",
        "The default is the code's (the tiny policy's: `--preset tiny`); where params.yaml (the real",
        "model's default run) sets another value, the cell shows both.",
        "",
    ]
    section = None
    for key, type_name, default, limits, value in _rows(Settings, unlisted_parts(params_text)):
        top = key.split(".")[0] if "." in key else "(top level)"
        if top != section:
            section = top
            lines += ["", f"## {section}", "", "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        note = (comments.get(key) or getattr(registered.get(key), "meaning", "")).replace("|", "\\|")
        if key in listed and _differs(listed[key], repr(value)):
            default = f"{default}, params.yaml `{listed[key]!r}`"
        lines.append(f"| `{key}` | {type_name} | {default} | {limits} | {note} |")
    return "\n".join(lines) + "\n"


def missing_params(params_text: str, parts: bool = False) -> str:
    """The settings with no key in ``params_text`` (a params.yaml), as YAML of their defaults
    nested under their sections ('' when none is missing). A registered part's settings that
    params.yaml does not list at all are optional (``part_settings``) and not missing, unless
    ``parts`` (to list a new part's settings in params.yaml); so are the settings whose default
    the registry derives (``derived_settings``)."""
    listed = yaml_load(params_text) or {}
    optional = set() if parts else unlisted_optional(params_text)
    missing: dict[str, Any] = {}

    def walk(defaults: dict[str, Any], present: Any, out: dict[str, Any], prefix: str) -> None:
        for key, value in defaults.items():
            if prefix + key in optional:
                continue
            here = present.get(key) if isinstance(present, dict) else None
            if isinstance(value, dict):
                sub: dict[str, Any] = {}
                walk(value, here, sub, f"{prefix}{key}.")
                if sub:
                    out[key] = sub
            elif not (isinstance(present, dict) and key in present):
                out[key] = value

    walk(Settings().model_dump(mode="json"), listed, missing, "")
    return yaml.safe_dump(missing, sort_keys=False) if missing else ""


def find_params(start_dir: str | Path | None = None) -> Path:
    """The project's params.yaml: in ``start_dir`` (default the working directory) or the
    nearest folder above it that has one, as a checkout or a project of an installed package
    keeps it (the package ships none); FileNotFoundError when there is none."""
    here = Path(start_dir or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "params.yaml").is_file():
            return folder / "params.yaml"
    raise FileNotFoundError(f"no params.yaml in {here} or a folder above it: run this from the project folder")


def main(argv: list[str]) -> int:
    """``python -m progress_sql.params.reference [--missing [--parts]]`` on the project's params.yaml."""
    try:
        text = find_params().read_text(encoding="utf-8")
    except FileNotFoundError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    sys.stdout.write(missing_params(text, "--parts" in argv) if "--missing" in argv else reference_markdown(text))
    return 0


if __name__ == "__main__":  # pragma: no cover - the generator entry point
    sys.exit(main(sys.argv[1:]))
