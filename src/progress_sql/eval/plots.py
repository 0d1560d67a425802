"""PNG plots of an evaluation (matplotlib, Agg backend: no display needed).

- ``plot_hardness``: EX by Spider hardness, one panel per split, one bar per decoding mode;
- ``plot_robustness``: EX and TS per split and variant, one bar per decoding mode.

Both take the rows of ``reports.hardness_rows`` / ``reports.robustness_rows`` (the same data
the CSV files give ``dvc plots``). ``save_png`` writes a figure atomically (the comparison
report's figures too).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: render to files only

import matplotlib.pyplot as plt  # noqa: E402

from progress_sql.files import write_bytes  # noqa: E402

_BAR_GROUP_WIDTH = 0.8
_DPI = 120


def _bars(ax: Any, categories: Sequence[str], series: dict[str, Sequence[float | None]]) -> None:
    width = _BAR_GROUP_WIDTH / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
        ax.bar(xs, [100 * v if v is not None else 0.0 for v in values], width, label=label)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")


def save_png(fig: Any, path: Path, dpi: int = _DPI) -> Path:
    """``fig`` as a PNG at ``path`` (then closed): rendered in memory and written atomically, so
    a failed write (a full disk) leaves no half image and names ``path``."""
    buf = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    write_bytes(path, buf.getvalue())
    return path


def plot_hardness(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """EX by hardness level: a panel per split, a bar per decoding mode."""
    splits = list(dict.fromkeys(r["split"] for r in rows)) or ["(no data)"]
    fig, axes = plt.subplots(1, len(splits), figsize=(4 * len(splits), 3.2), squeeze=False)
    for ax, split in zip(axes[0], splits):
        mine = [r for r in rows if r["split"] == split]
        levels = list(dict.fromkeys(r["hardness"] for r in mine))
        modes = list(dict.fromkeys(r["decoding"] for r in mine))
        lookup = {(r["decoding"], r["hardness"]): r["ex"] for r in mine}
        _bars(ax, levels, {m: [lookup.get((m, lv)) for lv in levels] for m in modes})
        ax.set_title(f"{split}: EX by hardness")
        if modes:
            ax.legend(fontsize="small")
    return save_png(fig, path)


def plot_robustness(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """EX and TS across splits and variants, a bar per decoding mode."""
    splits = list(dict.fromkeys(r["split"] for r in rows)) or ["(no data)"]
    modes = list(dict.fromkeys(r["decoding"] for r in rows))
    lookup = {(r["decoding"], r["split"]): r for r in rows}
    fig, axes = plt.subplots(1, 2, figsize=(max(6, 1.6 * len(splits)) * 2, 3.2), squeeze=False)
    for ax, metric in zip(axes[0], ("ex", "ts")):
        _bars(ax, splits, {m: [(lookup.get((m, s)) or {}).get(metric) for s in splits] for m in modes})
        ax.set_title(f"{metric.upper()} across splits")
        if modes:
            ax.legend(fontsize="small")
    return save_png(fig, path)
