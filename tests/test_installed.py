"""A non-editable install (``pip install .``) works from any folder: the package finds its
presets in its own files and the project (params.yaml, flows/serve.py) from the folder it runs
in, never through its own path, which after such an install lies in site-packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The package installed without its dependencies (they are the venv's) into a folder of
    its own, as ``pip install --target`` lays it out: site-packages-like, with bin/progress-sql."""
    tmp = tmp_path_factory.mktemp("installed")
    source = tmp / "source"  # a copy: building writes build/ and egg-info beside the sources
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).is_file():
            shutil.copy(REPO / name, source / name)
    site = tmp / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(source)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return site


def run_installed(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``args`` run by the interpreter with ``site`` first on the path, so the installed copy is
    imported, not the editable one."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(site)})


def test_the_installed_cli_runs_with_a_preset_from_an_empty_folder(installed, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    probe = run_installed(installed, empty, "-c", "import progress_sql; print(progress_sql.__file__)")
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(installed)

    cli = str(installed / "bin" / "progress-sql")  # the console script pip wrote
    # --preset is merged over the built-in defaults (no params.yaml here) and validated
    ran = run_installed(installed, empty, cli, "--preset", "progress-sql", "odt", "diff", "SELECT 1", "SELECT 1")
    assert ran.returncode == 0, ran.stderr
    assert "score:    1.0000" in ran.stdout
    shown = run_installed(installed, empty, cli, "--preset", "progress-sql", "preset", "show", "progress-sql")
    assert shown.returncode == 0, shown.stderr
    assert "rl.init_from: 'models/Qwen2.5-Coder-7B-Instruct'" in shown.stdout.splitlines()
    # the presets looked up are the installed package's own
    unknown = run_installed(installed, empty, cli, "--preset", "no-such", "odt", "diff", "SELECT 1", "SELECT 1")
    assert unknown.returncode == 2
    assert "unknown preset 'no-such'; available: cpu-demo," in unknown.stderr
    assert f"(the .yaml files of {installed / 'progress_sql' / 'configs' / 'presets'})" in unknown.stderr
    assert not any(empty.iterdir())  # nothing written where it ran


def test_the_installed_package_finds_the_project_from_the_folder_it_runs_in(installed, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    reference = run_installed(installed, empty, "-m", "progress_sql.params.reference")
    assert reference.returncode == 2 and "no params.yaml in" in reference.stderr
    project = tmp_path / "project"
    (project / "docs").mkdir(parents=True)
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    reference = run_installed(installed, project / "docs", "-m", "progress_sql.params.reference")
    assert reference.returncode == 0, reference.stderr
    assert reference.stdout == (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")

    # The project `progress-sql ui` serves: the folder it runs in or one above, else none (the
    # folder installed from, the sources' copy here, has no flows/serve.py).
    (project / "flows").mkdir()
    (project / "flows" / "serve.py").write_text("", encoding="utf-8")
    probe = ("from progress_sql.servers import project_root\n"
             "print(project_root())\n"
             "try:\n    project_root(%r)\nexcept FileNotFoundError as err:\n    print('none:', err)\n") % str(empty)
    found = run_installed(installed, project / "docs", "-c", probe)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == [str(project), "none: no flows/serve.py found: run this from the "
                                                       "progress-sql repository"]


def test_the_installed_sandbox_worker_imports_the_installed_copy(installed, tmp_path):
    # the worker is an interpreter of its own: it must import the caller's copy of the package
    # (it refuses to serve another), here the installed one though an editable one is in the venv
    import sqlite3

    db = tmp_path / "t.sqlite"
    sqlite3.connect(db).executescript("CREATE TABLE t (a INTEGER); INSERT INTO t VALUES (1), (2);")
    code = ("import sys; from progress_sql.sql import execute_isolated; from progress_sql.sql.worker import "
            "shared_worker_pid; r = execute_isolated(sys.argv[1], 'SELECT sum(a) FROM t'); "
            "print(r.rows, r.error, shared_worker_pid() is not None)")
    ran = run_installed(installed, tmp_path, "-c", code, str(db))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.split() == ["((3,),)", "None", "True"], ran.stdout + ran.stderr[-3000:]
