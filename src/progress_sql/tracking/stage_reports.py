"""The small files the training stages leave under ``reports/train`` for ``dvc metrics`` and
``dvc plots`` (a stage's model folder is a DVC output, and DVC refuses metrics inside another
output), and the summary metrics logged to MLflow under the same keys:

    sft.json        sft/final_loss, sft/first_loss, sft/steps, sft/tokens, sft/tokens_per_s, sft/seconds,
                    sft/final_copy_loss (with sft.copy_rows)
    sft_loss.csv    step, loss                      (the SFT loss curve)
    rl.json         rl/steps, rl/reward_mean, rl/ex, rl/... (means over the last steps), rl/seconds
    rl_curve.csv    step and every per-step metric of metrics.jsonl (the RL reward curve)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from progress_sql.files import write_csv, write_json

# The RL summary averages the last steps: one step's reward is a noisy estimate.
RL_SUMMARY_STEPS = 5
# Per-step RL metrics summarised in rl.json (MLflow-safe names: '/' → '_').
RL_SUMMARY_KEYS = ("reward/mean", "ex", "turns/mean", "loss", "kl", "response_tokens/mean", "truncated")


def _is_number(value: Any) -> bool:
    # a bool is an int to Python, but a flag is no point on a curve
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(summary: dict[str, float]) -> dict[str, float]:
    # metrics JSON is strict (no NaN): a metric that could not be computed is left out
    return {k: round(v, 6) for k, v in summary.items() if math.isfinite(v)}


def sft_reports(result: Any, report_dir: Path) -> dict[str, float]:
    """Write ``sft.json`` and ``sft_loss.csv`` for an ``SFTResult``; the summary metrics."""
    summary = {
        "sft/first_loss": result.losses[0] if result.losses else float("nan"),
        "sft/final_loss": result.final_loss,
        "sft/steps": float(result.steps),
        "sft/tokens": float(result.tokens),
        "sft/tokens_per_s": result.tokens / result.seconds if result.seconds else 0.0,
        "sft/seconds": float(result.seconds),
        "sft/dropped_too_long": float(result.dropped_too_long),
    }
    if result.copy_losses:
        summary["sft/final_copy_loss"] = result.final_copy_loss
    for key in ("questions", "wrong", "dialogues", "replayed", "steps", "seconds"):  # sft.own_mistakes' pass
        if key in result.own_mistakes:
            summary[f"sft/own_mistakes/{key}"] = float(result.own_mistakes[key])
    write_json(report_dir / "sft.json", _finite(summary))
    write_csv(report_dir / "sft_loss.csv", ({"step": i, "loss": round(v, 6)} for i, v in enumerate(result.losses, 1)),
              ("step", "loss"))
    return summary


def curve_columns(history: Sequence[dict[str, Any]]) -> list[str]:
    """``step`` then every numeric per-step key, in order of first appearance."""
    columns = ["step"]
    for row in history:
        columns += [k for k, v in row.items() if k not in columns and _is_number(v)]
    return columns


def rl_summary(history: Sequence[dict[str, Any]], steps: int) -> dict[str, float]:
    """``rl/steps``, ``rl/seconds`` and the mean of each RL_SUMMARY_KEYS over the last
    RL_SUMMARY_STEPS steps (``reward/mean`` → ``rl/reward_mean``)."""
    tail = list(history)[-RL_SUMMARY_STEPS:]
    summary = {"rl/steps": float(steps), "rl/seconds": float(sum(r.get("step_s", 0.0) for r in history))}
    for key in RL_SUMMARY_KEYS:
        values = [float(r[key]) for r in tail if _is_number(r.get(key))]
        if values:
            summary["rl/" + key.replace("/", "_")] = sum(values) / len(values)
    return summary


def rl_reports(result: Any, report_dir: Path) -> dict[str, float]:
    """Write ``rl.json`` and ``rl_curve.csv`` for an ``RLResult``; the summary metrics."""
    summary = {**rl_summary(result.metrics, result.steps), "rl/questions": float(result.questions)}
    write_json(report_dir / "rl.json", _finite(summary))
    columns = curve_columns(result.metrics)
    write_csv(report_dir / "rl_curve.csv", result.metrics, columns)
    return summary
