"""Every command of the `progress-sql` CLI answers --help; the console script is installed."""

from __future__ import annotations

import json
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


def test_progress_bars_become_status_lines_in_a_log():
    """In a pipe (``dvc repro`` in CI, a log file) a bar prints its status as a whole line at
    most once per interval and its last state when it closes; other text passes through."""
    import io

    from tqdm import tqdm

    from progress_sql.cli.common import StatusLines

    log, now = io.StringIO(), [0.0]
    stream = StatusLines(log, every_s=20.0, clock=lambda: now[0])
    stream.write("starting\n")
    bar = tqdm(total=100, desc="sft", file=stream, mininterval=0, ascii=True)
    for _ in range(100):
        now[0] += 1.0  # a step a second: 100 redraws
        bar.update(1)
    bar.close()
    quiet = tqdm(total=3, desc="build corpus", file=stream, mininterval=0, leave=False, ascii=True)
    quiet.update(3)  # within the interval of its first line: only its closing state follows
    quiet.close()
    stream.write("done\n")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0] == "starting" and lines[-1] == "done"
    sft = [line for line in lines if line.startswith("sft:")]
    assert 5 <= len(sft) <= 7 and sft[0].startswith("sft:   0%") and "100/100" in sft[-1]
    build = [line for line in lines if line.startswith("build corpus:")]
    assert build[0].startswith("build corpus:   0%") and "3/3" in build[-1] and len(build) == 2
    assert not stream.isatty()


def test_sparkline_spans_the_range_and_buckets_long_rows():
    from progress_sql.eval.summary import SPARKS, sparkline

    assert sparkline([0.0, 0.5, 1.0]) == SPARKS[0] + SPARKS[len(SPARKS) // 2] + SPARKS[-1]
    assert sparkline([]) == "" and sparkline([float("nan")]) == ""
    assert sparkline([2.0, 2.0]) == SPARKS[len(SPARKS) // 2] * 2
    long = sparkline(list(range(100)), width=10)
    assert len(long) == 10 and long[0] == SPARKS[0] and long[-1] == SPARKS[-1]


def test_every_stage_command_takes_no_progress():
    # issue 39: `data validate --no-progress` was refused; a script passes it to every stage
    from progress_sql.cli import app

    runner = CliRunner()
    for command in (["data", "build"], ["data", "import"], ["data", "validate"], ["train", "init"], ["train", "sft"],
                    ["train", "rl"], ["eval"]):
        result = runner.invoke(app, [*command, "--help"], terminal_width=200)
        assert result.exit_code == 0 and "--no-progress" in result.output, command


def test_a_model_folder_that_does_not_exist_is_named_not_read_as_a_hub_id(tmp_path):
    # issue 39: `eval --model outputs/rl/fnal` answered "Repo id must be in the form ..."
    from progress_sql.cli import app

    for command in (["eval", "--model", "outputs/rl/fnal", "--out", str(tmp_path / "eval")],
                    ["ask", "How many?", "--model", "./outputs/rl/fnal", "--db", str(tmp_path / "x.sqlite")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert f"error: --model {command[command.index('--model') + 1]}: no such folder" in result.output
        assert "Repo id" not in result.output
    assert not (tmp_path / "eval").exists()


def test_an_empty_model_is_refused_as_empty(tmp_path):
    # issue 49: `eval --model ''` said ". is not a model directory"
    from progress_sql.cli import app

    for command in (["eval", "--model", "", "--out", str(tmp_path / "eval")],
                    ["ask", "How many?", "--model", " ", "--db", str(tmp_path / "x.sqlite")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "error: --model is empty" in result.output
    assert not (tmp_path / "eval").exists()


def test_a_label_mlflow_cannot_name_a_metric_with_is_refused_before_anything_runs(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--model", "oracle", "--as", "zero shot:1", "--out", str(tmp_path / "e")])
    assert result.exit_code == 2 and "--as" in result.output and "zero-shot" in result.output, result.output
    assert not (tmp_path / "e").exists()


def test_the_summary_pairs_rl_against_sft_with_intervals(tmp_path):
    """`progress-sql summary`: the starting points' greedy EX beside RL's, each with its Wilson
    interval, and RL against SFT question by question (exact McNemar)."""
    from progress_sql import stages
    from progress_sql.params import settings_from_dict

    def evaluation(folder: str, right: set[int]) -> str:
        out = tmp_path / folder
        (out / "predictions").mkdir(parents=True)
        rows = [{"id": f"q{i}", "greedy": {"ex": i in right}} for i in range(20)]
        (out / "predictions" / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out / "metrics.json").write_text(json.dumps({"dev": {"greedy": {"ex": len(right) / 20, "n": 20}}}))
        return str(out)

    settings = settings_from_dict({"eval": {"out_dir": evaluation("rl", set(range(12))),
                                            "sft_out_dir": evaluation("sft", {0, 1, 2, 3, 15}),
                                            "zero_shot_out_dir": evaluation("zero", set())},
                                   "rl": {"out_dir": str(tmp_path / "no-rl-run")}, "tracking": {"enabled": False}})
    table = stages.summary(settings, registry_report=tmp_path / "none.json").render()
    header = next(line for line in table.splitlines() if line.startswith("split") and "zero-shot" in line)
    assert header.split() == ["split", "n", "zero-shot", "after", "SFT", "after", "RL", "RL", "vs", "SFT",
                              "(gained/lost,", "p)"]
    # 0/20 [0, 16.1], 5/20 [11.2, 46.9], 12/20 [38.7, 78.1]; RL gained 8 (q4..q11), lost 1 (q15)
    row = next(line for line in table.splitlines() if line.startswith("Dev") and "[" in line)
    assert row.split() == ["Dev", "20", "0.0", "%", "[0.0,", "16.1]", "25.0", "%", "[11.2,", "46.9]",
                           "60.0", "%", "[38.7,", "78.1]", "+8", "-1,", "p", "=", "0.039"], row
    # no SFT evaluation (a run before the stage existed): the table says nothing it cannot pair
    bare = settings.model_copy(update={"eval": settings.eval.model_copy(update={"sft_out_dir": str(tmp_path / "x")})})
    text = stages.summary(bare, registry_report=tmp_path / "none.json").render()
    assert "after SFT" not in text and "RL vs SFT" in text and "zero-shot" in text
