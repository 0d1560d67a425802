"""The pipeline's numbers in one short table (``progress-sql summary``, which ``make pipeline``
prints after ``dvc repro``): EX per split and decoding mode from the evaluation's metrics.json,
the greedy EX of the starting points (zero-shot, after SFT) beside RL's with intervals and RL's
paired test against SFT, the RL curve from the run's metrics.jsonl (first and last steps and a
sparkline), and where the artefacts and the MLflow run are. Pure formatting over the files the
stages wrote: the caller (``stages.summary``) finds them and asks the tracking layer for the
MLflow details.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from progress_sql.eval.paired import PairedComparison, wilson_interval
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
    # the starting points' metrics.json by label ("zero-shot", "after SFT"), evaluated as RL's
    starts: dict[str, dict[str, Any]] = field(default_factory=dict)
    paired: list[PairedComparison] = field(default_factory=list)  # RL against SFT, greedy, per split
    paired_note: str = ""  # why there is no paired test, when there is none

    def start_rows(self) -> tuple[list[str], list[list[str]]]:
        """The closing table: greedy EX per split with its 95 % interval for each starting point
        and the RL policy, then RL against SFT question by question (gained, lost, McNemar p)."""
        columns = {**self.starts, "after RL": self.metrics or {}}
        paired = {c.split: c for c in self.paired}
        header = ["split", "n", *columns, "RL vs SFT (gained/lost, p)"]
        rows = []
        for split in (self.metrics or {}):
            n = _greedy(self.metrics[split]).get("n")
            cells = [_with_interval(_greedy(metrics.get(split, {}))) for metrics in columns.values()]
            c = paired.get(split)
            test = "-" if c is None else f"+{len(c.gained)} -{len(c.lost)}, p = {c.p_value:.2g}"
            rows.append([split_title(split), "-" if n is None else str(n), *cells, test])
        return header, rows

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
            lines += _table(*self.split_rows())
            if self.starts:
                lines += ["", "greedy EX [95 %]: the starting points and the RL policy on the same questions",
                          *_table(*self.start_rows())]
                if self.paired_note:
                    lines.append(f"RL vs SFT: {self.paired_note}")
                lines.append("")
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


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def _greedy(split_metrics: Any) -> dict[str, Any]:
    greedy = split_metrics.get("greedy") if isinstance(split_metrics, dict) else None
    return greedy if isinstance(greedy, dict) else {}


def _with_interval(greedy: dict[str, Any]) -> str:
    """EX with its 95 % Wilson interval, "12.5 % [9.6, 16.1]"; "-" when not evaluated."""
    ex, n = greedy.get("ex"), greedy.get("n")
    if not isinstance(ex, (int, float)) or not isinstance(n, int) or n <= 0:
        return _percent(ex)
    low, high = wilson_interval(round(ex * n), n)
    return f"{_percent(ex)} [{100 * low:.1f}, {100 * high:.1f}]"


def _percent(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) or not math.isfinite(value) else f"{100 * value:.1f} %"


__all__ = ["CURVE_KEYS", "PipelineSummary", "read_rl_history", "sparkline"]
