"""The pipeline's numbers in one short table (``progress-sql summary``, which ``make pipeline``
prints after ``dvc repro``): EX per split and decoding mode from the evaluation's metrics.json,
the RL curve from the run's metrics.jsonl (first and last steps and a sparkline), and where the
artefacts and the MLflow run are. Pure formatting over the files the stages wrote: the caller
(``stages.summary``) finds them and asks the tracking layer for the MLflow details.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from progress_sql.eval.reports import decoding_modes, mode_label, split_title

SPARKS = "▁▂▃▄▅▆▇█"
CURVE_KEYS = ("reward/mean", "ex")  # the RL curve: mean reward and rollout EX per step


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """``values`` as a row of block characters (min to max of the row), at most ``width`` wide
    (longer rows are averaged in buckets); "" when there is nothing finite to draw."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return ""
    if len(vals) > width:
        size = len(vals) / width
        vals = [sum(chunk) / len(chunk) for i in range(width)
                if (chunk := vals[int(i * size): max(int((i + 1) * size), int(i * size) + 1)])]
    low, high = min(vals), max(vals)
    if high - low < 1e-12:
        return SPARKS[len(SPARKS) // 2] * len(vals)
    return "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / (high - low) * len(SPARKS)))] for v in vals)


def read_rl_history(path: Path) -> list[dict[str, Any]]:
    """The per-step rows of an RL run's metrics.jsonl ([] when the file is absent)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class PipelineSummary:
    """What the summary shows; ``places``: label → path or URI (artefacts, MLflow)."""

    metrics: dict[str, Any] | None  # the evaluation's nested metrics.json (None: not evaluated yet)
    rl_history: list[dict[str, Any]] = field(default_factory=list)
    places: dict[str, str] = field(default_factory=dict)
    registry: dict[str, Any] | None = None  # reports/registry.json

    def split_rows(self) -> tuple[list[str], list[list[str]]]:
        """The EX table: a header (split, n, one column per decoding mode) and a row per split."""
        metrics = self.metrics or {}
        modes: list[str] = []
        for m in metrics.values():
            modes += [mode for mode in decoding_modes(m, with_pass=True) if mode not in modes]
        header = ["split", "n", *(f"{mode_label(mode)} EX" for mode in modes)]
        rows = []
        for split, m in metrics.items():
            n = next((m[mode].get("n") for mode in modes if isinstance(m.get(mode), dict)), None)
            cells = [_percent(m[mode].get("ex")) if isinstance(m.get(mode), dict) else "-" for mode in modes]
            rows.append([split_title(split), "-" if n is None else str(n), *cells])
        return header, rows

    def curve_lines(self) -> list[str]:
        """One line per curve key: first → last step, min / max, sparkline."""
        history = self.rl_history
        if not history:
            return ["RL: no metrics.jsonl (train not run)"]
        lines = [f"RL: {len(history)} steps"]
        for key in CURVE_KEYS:
            values = [float(r[key]) for r in history if isinstance(r.get(key), (int, float))]
            if not values:
                continue
            lines.append(f"  {key:12s} step 1 {values[0]:.3f} → step {len(values)} {values[-1]:.3f} "
                         f"(min {min(values):.3f}, max {max(values):.3f})  {sparkline(values)}")
        return lines

    def render(self) -> str:
        lines = ["== Progress-SQL pipeline: results =="]
        if self.metrics is None:
            lines.append("evaluation: no metrics.json (evaluate not run)")
        else:
            header, rows = self.split_rows()
            widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
            fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                          for i, (c, w) in enumerate(zip(cells, widths)))
            lines += [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]
        lines += self.curve_lines()
        if self.registry:
            reg = self.registry
            if reg.get("registered"):
                lines.append(f"registry: {reg.get('model')} v{reg.get('version')}, "
                             f"{'promoted to champion' if reg.get('promoted') else 'not promoted'} ({reg.get('reason')})")
            else:
                lines.append(f"registry: nothing registered ({reg.get('reason', 'no reason given')})")
        width = max((len(k) for k in self.places), default=0)
        lines += [f"{label.ljust(width)}  {where}" for label, where in self.places.items()]
        return "\n".join(lines)


def _percent(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{100 * value:.1f} %"


__all__ = ["CURVE_KEYS", "PipelineSummary", "read_rl_history", "sparkline"]
