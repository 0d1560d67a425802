"""The layering of the package (pyproject.toml, ``[tool.importlinter]``): each layer imports
only those below it, the task module imports no ML framework or tracking, and no two sibling
modules import each other. ``lint-imports`` checks the contracts; these tests run it and keep
the contract complete (a new top-level module must be given a layer)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "progress_sql"


def _contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]


def _layer_modules() -> set[str]:
    layers = next(c for c in _contracts() if c["type"] == "layers")["layers"]
    return {name.strip() for layer in layers for name in layer.split("|")}


def test_every_top_level_module_has_a_layer():
    top = {f"progress_sql.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    top |= {f"progress_sql.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert top - _layer_modules() == set(), "add these to a layer of [tool.importlinter] in pyproject.toml"
    assert _layer_modules() - top == set(), "the contract names modules that no longer exist"


@pytest.mark.slow
def test_import_contracts_are_kept():
    """``lint-imports`` over src/: every contract kept (its report says which import broke one)."""
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                               "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout or "broken" not in run.stdout.split("Contracts:")[-1]


def test_the_layers_contract_catches_an_upward_import(tmp_path):
    """The contract can fail: a copy of the package where the sandbox imports the trainer."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "progress_sql", ignore=shutil.ignore_patterns("__pycache__"))
    sandbox = copy / "progress_sql" / "sql" / "sandbox.py"
    sandbox.write_text(sandbox.read_text(encoding="utf-8") + "\nfrom progress_sql.train import trainer  # noqa\n",
                       encoding="utf-8")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    run = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'src'); from importlinter.cli import lint_imports; "
                               "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode != 0
    assert "progress_sql.sql.sandbox -> progress_sql.train.trainer" in run.stdout
