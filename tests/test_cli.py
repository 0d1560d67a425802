"""Every command of the `progress-sql` CLI answers --help; the console script is installed."""

from __future__ import annotations

import shutil
import subprocess

import typer.main
from typer.testing import CliRunner

from progress_sql.cli import app


def _command_paths(cmd, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    # typer vendors its own click classes: walk groups by their `commands` mapping.
    paths = [prefix]
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        paths += _command_paths(sub, prefix + (name,))
    return paths


def test_every_command_has_help():
    root = typer.main.get_command(app)
    paths = _command_paths(root)
    assert ("odt", "diff") in paths
    runner = CliRunner()
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output, path


def test_console_script_installed():
    exe = shutil.which("progress-sql")
    assert exe, "the progress-sql console script is not on PATH"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "odt" in out.stdout


def test_bad_params_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("odt:\n  alpha: 3\n")
    result = CliRunner().invoke(app, ["odt", "diff", "SELECT 1", "SELECT 1", "--params", str(bad)])
    assert result.exit_code == 2
    assert "odt.alpha" in result.output
