"""``progress-sql odt diff``: in process (typer's CliRunner) and as the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from progress_sql.cli import app
from progress_sql.odt import PARSE_ERROR, diagnose

PRED = "SELECT name FROM student WHERE age > 20"
GOLD = "SELECT T1.name, count(*) FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id GROUP BY T1.name"

runner = CliRunner()


def test_diff_prints_score_tags_feedback():
    result = runner.invoke(app, ["odt", "diff", PRED, GOLD])
    assert result.exit_code == 0, result.output
    expected = diagnose(PRED, GOLD)
    assert f"score:    {expected.score:.4f}" in result.output
    assert "tags:     " + ", ".join(expected.tags) in result.output
    assert "JOIN_MISSING" in result.output and "GROUP_BY_MISSING" in result.output
    assert "feedback: Feedback: your previous SQL has structural issues:" in result.output


def test_diff_identical_queries():
    result = runner.invoke(app, ["odt", "diff", GOLD, GOLD.lower()])
    assert result.exit_code == 0
    assert "score:    1.0000" in result.output and "tags:     (none)" in result.output


def test_diff_json_has_exactly_score_tags_feedback():
    result = runner.invoke(app, ["odt", "diff", PRED, GOLD, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert set(payload) == {"score", "tags", "feedback"}
    expected = diagnose(PRED, GOLD)
    assert payload == {"score": expected.score, "tags": list(expected.tags), "feedback": expected.feedback}


def test_diff_unparsable_prediction():
    result = runner.invoke(app, ["odt", "diff", "SELEC name FRM", GOLD, "--json"])
    assert result.exit_code == 0
    payload = json.loads(result.output)
    assert payload["score"] == 0.0 and payload["tags"] == [PARSE_ERROR]


def test_diff_reads_thresholds_from_params(tmp_path: Path):
    params = tmp_path / "params.yaml"
    params.write_text("odt:\n  thresholds:\n    select: 0.0\n    select_count: 0.0\n", encoding="utf-8")
    default = json.loads(runner.invoke(app, ["odt", "diff", PRED, GOLD, "--json"]).output)
    lenient = json.loads(runner.invoke(app, ["odt", "diff", PRED, GOLD, "--json", "--params", str(params)]).output)
    assert "SELECT_ERROR" in default["tags"] and "SELECT_ERROR" not in lenient["tags"]
    assert "SELECT_COUNT_MISMATCH" not in lenient["tags"]
    assert lenient["score"] == default["score"]  # thresholds only decide tags


def test_diff_bad_params_file_exits_2(tmp_path: Path):
    params = tmp_path / "bad.yaml"
    params.write_text("odt:\n  alpha: 7\n", encoding="utf-8")
    result = runner.invoke(app, ["odt", "diff", PRED, GOLD, "--params", str(params)])
    assert result.exit_code == 2
    assert "odt.alpha" in result.output


def test_console_script_subprocess(tmp_path: Path):
    exe = shutil.which("progress-sql") or str(Path(sys.executable).parent / "progress-sql")
    if not Path(exe).exists():
        pytest.fail("the progress-sql console script is not installed (pip install -e .)")
    # Run from an empty folder: no params.yaml there, so the built-in defaults apply.
    proc = subprocess.run([exe, "odt", "diff", PRED, GOLD, "--json"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert set(payload) == {"score", "tags", "feedback"}
    assert payload["tags"] == list(diagnose(PRED, GOLD).tags)
