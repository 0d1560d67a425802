"""The code deps of every DVC stage, computed from the sources so they cannot drift.

A stage's code is what its command runs: the ``progress-sql`` command of its ``cmd`` (the CLI
function that typer calls), the ``progress_sql.stages`` function that function calls, and every
module of the package reachable from them through imports, those inside function bodies too
(the package imports lazily). The CLI modules and stages.py serve every command, so they are
followed one function at a time; any other module counts whole. Blocks under
``if TYPE_CHECKING:`` never run and are skipped. The package's data files count where a module
that runs reads them (``MODULE_DATA``) or where the command names them (``--preset``,
``study NAME``).

The script owns the deps under ``src/`` of each stage of dvc.yaml and studies/dvc.yaml;
their other deps (the corpus, a policy, a report) are kept as written, comments included:

    python scripts/stage_deps.py           # rewrite the code deps in place
    python scripts/stage_deps.py --check   # exit 1 naming each stage whose code deps differ
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "src" / "progress_sql"
PIPELINES = ("dvc.yaml", "studies/dvc.yaml")
CODE_PREFIX = "src/"  # a dep under it is code or package data: this script's to write
# Followed one function at a time: each command and each stage is one function of these.
PER_FUNCTION = ("progress_sql.cli", "progress_sql.stages")
# Package data (relative to the package) that a module reads whenever it runs.
MODULE_DATA = {"progress_sql.train.distributed": ("configs/deepspeed",)}  # rl.deepspeed_config's ZeRO files
PRESET_FILE = "configs/presets/{}.yaml"
# Package data a command reads by the name its first argument gives: a study file, and
# the presets its arms name.
ARGUMENT_DATA = {"progress_sql.cli.study:study": ("configs/studies/{}.yaml", "configs/presets")}
CODE_COMMENT = "# code: what the command imports and reads (scripts/stage_deps.py writes the lines below)"


class StageDepsError(Exception):
    """Something the analysis cannot resolve: the message names where."""


# ----------------------------------------------------------------------------- the package
@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its name, file __init__.py)."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def per_function(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in PER_FUNCTION)


def with_parents(module: str) -> list[str]:
    """``a.b.c`` → ``a``, ``a.b``, ``a.b.c``: importing a module runs its packages first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules()]


def node_of(module: str) -> str:
    """What importing ``module`` runs: the whole module, or only the top level of a per-function one."""
    return f"{module}:" if per_function(module) else module


# ----------------------------------------------------------------------------- one module
@dataclass
class Parsed:
    """A module's edges: those of its top-level code and those of each top-level def or class."""

    top: set[str] = field(default_factory=set)
    defs: dict[str, set[str]] = field(default_factory=dict)

    def whole(self) -> set[str]:
        return self.top.union(*self.defs.values())


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


class _Edges(ast.NodeVisitor):
    """The nodes one body reaches: modules it imports, functions of per-function modules it
    names (``stages.sft``, ``from progress_sql.stages import sft``, a def of its own module)."""

    def __init__(self, module: str, aliases: dict[str, str], own_defs: set[str]):
        self.module, self.aliases, self.own_defs = module, aliases, own_defs
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if _type_checking(node):  # imports for annotations only: never run
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.update(node_of(m) for m in with_parents(alias.name))
            if alias.asname is None and "." in alias.name and per_function(alias.name):
                self.found.add(f"{alias.name}:*")  # used as a.b.f(), which is not followed: all of it

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = absolute(self.module, node)
        self.found.update(node_of(m) for m in with_parents(base))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in modules():
                self.found.add(node_of(sub))
            elif alias.name == "*" and per_function(base):
                self.found.add(f"{base}:*")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        target = self.aliases.get(node.value.id) if isinstance(node.value, ast.Name) else None
        if target is not None and per_function(target) and f"{target}.{node.attr}" not in modules():
            self.found.add(f"{target}:{node.attr}")
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        target = self.aliases.get(node.id)
        if target is not None and ":" in target:  # a def imported from a per-function module
            self.found.add(target)
        elif target is not None and per_function(target):  # the module itself passed on: all of it
            self.found.add(f"{target}:*")
        elif node.id in self.own_defs:
            self.found.add(f"{self.module}:{node.id}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in modules():  # `python -m progress_sql.x` and the like
            self.found.update(node_of(m) for m in with_parents(node.value))

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("import_module", "__import__"):
            self.found.update(node_of(m) for m in dynamic_import(self.module, node))
        if isinstance(node.func, ast.Call) and getattr(node.func.func, "attr", "") == "command":
            self.visit(node.func)  # `app.command(NAME)(f)`: typer calls f only when NAME is the command run
            return
        self.generic_visit(node)


def absolute(module: str, node: ast.ImportFrom) -> str:
    """The module an ``from X import ...`` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module if modules()[module].name == "__init__.py" else module.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def dynamic_import(module: str, call: ast.Call) -> list[str]:
    """``import_module(f"{__name__}.{name}")`` in a package: any of its submodules; anything else
    is refused, naming the place, so that no import goes unseen."""
    arg = call.args[0] if call.args else None
    if (isinstance(arg, ast.JoinedStr) and len(arg.values) >= 2 and isinstance(arg.values[0], ast.FormattedValue)
            and getattr(arg.values[0].value, "id", "") == "__name__"
            and isinstance(arg.values[1], ast.Constant) and str(arg.values[1].value).startswith(".")):
        return [m for m in modules() if m.startswith(module + ".")]
    raise StageDepsError(f"{modules()[module].relative_to(ROOT)}:{call.lineno}: a dynamic import this script cannot "
                         "follow; import the module by name, or teach scripts/stage_deps.py where it leads")


@functools.cache
def parse(module: str) -> Parsed:
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"), str(modules()[module]))
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                            for a in node.names})
        elif isinstance(node, ast.ImportFrom):
            base = absolute(module, node)
            aliases.update({a.asname or a.name: f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else f"{base}:{a.name}"
                            for a in node.names if f"{base}.{a.name}" in modules() or per_function(base)})

    def edges(*nodes: ast.AST) -> set[str]:
        visitor = _Edges(module, aliases, set(defs))
        for node in nodes:
            visitor.visit(node)
        return visitor.found

    parsed = Parsed()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # decorators and defaults run at import; the body when called
            defaults = [d for d in node.args.kw_defaults if d is not None]
            parsed.top |= edges(*node.decorator_list, *node.args.defaults, *defaults)
            parsed.defs[node.name] = edges(*node.body)
        elif isinstance(node, ast.ClassDef):  # its body runs at import; its methods' bodies are counted too
            parsed.defs[node.name] = edges(node)
            parsed.top |= parsed.defs[node.name]
        else:
            parsed.top |= edges(node)
    return parsed


def successors(node: str) -> set[str]:
    """The nodes that running ``node`` reaches in one step (``module``, ``module:`` for the top
    level of a per-function module, ``module:name`` for one of its defs, ``module:*`` for all)."""
    module, colon, name = node.partition(":")
    parsed = parse(module)
    if not colon:
        return parsed.whole()
    if name == "*":
        return parsed.whole() | {f"{module}:"}
    if not name:
        return parsed.top
    if name not in parsed.defs:  # a constant of the module's top level: imported with it
        return {f"{module}:"}
    return parsed.defs[name] | {f"{module}:"}


def closure(entries: set[str]) -> set[str]:
    """Every module the entries reach, by name."""
    seen, todo = set(), list(entries)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(successors(node) - seen)
    return {n.partition(":")[0] for n in seen}


# ----------------------------------------------------------------------------- a stage
@dataclass(frozen=True)
class Command:
    """What a stage's ``cmd`` runs: the CLI function typer calls, its positional arguments and
    the presets it names."""

    function: str  # "module:qualname"
    arguments: tuple[str, ...]
    presets: tuple[str, ...]


def parse_command(cmd: str) -> Command:
    """``progress-sql [--preset X] GROUP... COMMAND ARGS`` → the CLI function and its arguments,
    walked through the real click command tree (options, groups and all)."""
    import typer.main

    from progress_sql.cli import app

    words = shlex.split(cmd)
    if not words or words[0] != "progress-sql":
        raise StageDepsError(f"not a progress-sql command: {cmd!r}")
    command, rest, arguments, presets = typer.main.get_command(app), words[1:], [], []
    while rest:
        word = rest.pop(0)
        if word.startswith("-"):
            name, _, value = word.partition("=")
            param = next((p for p in command.params if name in (*p.opts, *getattr(p, "secondary_opts", ()))), None)
            if param is None:
                raise StageDepsError(f"{cmd!r}: {name} is not an option of {command.name}")
            if not getattr(param, "is_flag", False) and not value:
                value = rest.pop(0)
            if param.name == "preset":
                presets.append(value)
        elif hasattr(command, "commands") and not arguments:
            if word not in command.commands:
                raise StageDepsError(f"{cmd!r}: {word} is not a command of {command.name}")
            command = command.commands[word]
        else:
            arguments.append(word)
    callback = command.callback
    return Command(f"{callback.__module__}:{callback.__qualname__}", tuple(arguments), tuple(presets))


def package_files(relative: str) -> set[Path]:
    """The files of a package path (a file, or every file of a folder but bytecode)."""
    path = PACKAGE_DIR / relative
    if path.is_dir():
        return {p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    return {path}


def stage_files(cmd: str) -> set[Path]:
    """Every file of the package that the stage's command runs or reads."""
    command = parse_command(cmd)
    files = {modules()[m] for m in closure({"progress_sql.cli:", command.function})}
    reached = {m for m, path in modules().items() if path in files}
    data = [rel for module, rels in MODULE_DATA.items() if module in reached for rel in rels]
    data += [PRESET_FILE.format(name) for name in command.presets if "/" not in name and not name.endswith(".yaml")]
    data += [rel.format(*command.arguments) for rel in ARGUMENT_DATA.get(command.function, ())]
    for rel in data:
        files |= package_files(rel)
    return files


def as_deps(files: set[Path]) -> list[str]:
    """The files as deps relative to the repository: a folder stands for its files only when
    the stage uses every one of them."""
    deps = set(files)
    folders = {folder for p in files for folder in p.parents if folder.is_relative_to(PACKAGE_DIR)}
    for folder in sorted(folders, key=lambda p: -len(p.parts)):  # the deepest first
        if package_files(str(folder.relative_to(PACKAGE_DIR))) <= files:
            deps = {d for d in deps if not d.is_relative_to(folder)} | {folder}
    return sorted(str(d.relative_to(ROOT)) for d in deps)


# ----------------------------------------------------------------------------- dvc.yaml
def stage_bodies(pipeline: str) -> dict[str, dict]:
    """Each stage's definition (a foreach stage's ``do``); every stage runs in the repository
    root, where the deps this script writes are relative to."""
    import yaml

    stages = yaml.safe_load((ROOT / pipeline).read_text(encoding="utf-8"))["stages"]
    bodies = {name: body.get("do") or body for name, body in stages.items()}
    for name, body in bodies.items():
        if (ROOT / pipeline).parent.joinpath(body.get("wdir", ".")).resolve() != ROOT:
            raise StageDepsError(f"{pipeline}: {name} does not run in the repository root (its wdir)")
    return bodies


def stage_commands(pipeline: str) -> dict[str, str]:
    return {name: " ".join(str(body["cmd"]).split()) for name, body in stage_bodies(pipeline).items()}


def written_code_deps(pipeline: str) -> dict[str, list[str]]:
    return {name: [d for d in body.get("deps", []) if str(d).startswith(CODE_PREFIX)]
            for name, body in stage_bodies(pipeline).items()}


def differences(pipeline: str) -> list[str]:
    """One line per code dep that the stage lacks or does not run."""
    lines = []
    written = written_code_deps(pipeline)
    for name, cmd in stage_commands(pipeline).items():
        wanted = as_deps(stage_files(cmd))
        lines += [f"{pipeline}: {name}: missing {d}" for d in wanted if d not in written[name]]
        lines += [f"{pipeline}: {name}: not run by the stage: {d}" for d in written[name] if d not in wanted]
    return lines


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def rewrite(text: str, code_deps: dict[str, list[str]]) -> str:
    """``text`` (a dvc.yaml) with each stage's code deps replaced by ``code_deps[stage]``; the
    other deps and every comment stay where they were."""
    lines, out, stage, done = text.splitlines(), [], None, set()
    i = 0
    while i < len(lines):
        line = lines[i]
        head = re.match(r"^  ([\w-]+):\s*(#.*)?$", line)
        if head:
            stage = head.group(1)
        deps = re.match(r"^(\s*)deps:\s*$", line)
        out.append(line)
        i += 1
        if not deps or stage not in code_deps:
            continue
        block = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(deps.group(1))):
            block.append(lines[i])
            i += 1
        item = " " * (len(deps.group(1)) + 2)
        kept = [b for b in block if not b.strip().startswith(("- " + CODE_PREFIX, "# code: "))]
        out += [b for b in kept if b.strip()] + [item + CODE_COMMENT] + [f"{item}- {d}" for d in code_deps[stage]]
        out += [b for b in kept if not b.strip()]  # a blank line that ended the block
        done.add(stage)
    if set(code_deps) - done:
        raise StageDepsError(f"no deps: list to write into for {', '.join(sorted(set(code_deps) - done))}")
    return "\n".join(out) + "\n"


def regenerate(pipeline: str) -> bool:
    """Rewrite ``pipeline``'s code deps; whether the file changed."""
    from progress_sql.files import write_text

    path = ROOT / pipeline
    computed = {name: as_deps(stage_files(cmd)) for name, cmd in stage_commands(pipeline).items()}
    old = path.read_text(encoding="utf-8")
    new = rewrite(old, computed)
    if new != old:
        write_text(path, new)  # whole or not at all
    return new != old


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 naming each difference")
    args = parser.parse_args(argv)
    try:
        if args.check:
            lines = [line for pipeline in PIPELINES for line in differences(pipeline)]
            print("\n".join(lines) if lines else "every stage's code deps are what it runs")
            if lines:
                print("run `python scripts/stage_deps.py` to rewrite them")
            return 1 if lines else 0
        for pipeline in PIPELINES:
            print(f"{pipeline}: {'rewritten' if regenerate(pipeline) else 'unchanged'}")
    except StageDepsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
