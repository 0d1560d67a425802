"""The linter passes: ruff with the rules of pyproject.toml ([tool.ruff]) over every Python
folder of the repository (unused and undefined names, redefinitions, line length)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("src", "tests", "bench", "flows", "scripts")


def test_ruff_passes() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *FOLDERS], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
