"""Plot RL training curves of one or more runs: reward/mean (and its format and exec parts)
per step, from each run folder's ``metrics.jsonl`` (``progress-sql train rl --out RUN``).

    python scripts/rl_curves.py OUT.png RUN [RUN ...]

Each run is labelled by its folder name; a dashed line is its reward's least-squares trend.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def read_metrics(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def main(out: str, runs: list[str]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in map(Path, runs):
        rows = read_metrics(run)
        steps = np.array([r["step"] for r in rows])
        reward = np.array([r["reward/mean"] for r in rows])
        line = axes[0].plot(steps, reward, marker="o", label=run.name)[0]
        if len(steps) > 1:
            slope, intercept = np.polyfit(steps, reward, 1)
            axes[0].plot(steps, slope * steps + intercept, "--", color=line.get_color(), alpha=0.6)
        for key, style in (("reward/format", "-"), ("reward/exec", ":")):
            if key in rows[0]:
                axes[1].plot(steps, [r[key] for r in rows], style, color=line.get_color(),
                             label=f"{run.name} {key.split('/')[1]}")
    axes[0].set(title="mean training reward", xlabel="step")
    axes[1].set(title="reward parts: format (solid), exec (dotted)", xlabel="step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
