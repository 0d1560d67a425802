"""Atomic writers for the text, JSON and CSV files the stages leave behind (metrics, reports,
plot data). The bottom of the import stack: it imports nothing from the package, so every
layer may use it.

A file is written to a temporary sibling and renamed over its target, so a reader (DVC, a
dashboard, a concurrent stage) never sees half a file.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, obj: Any) -> None:
    """Pretty JSON (strict: no NaN) written atomically."""
    write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_csv(path: Path, rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> None:
    """CSV with a header; None becomes an empty cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: ("" if row.get(c) is None else row.get(c)) for c in columns})
    write_text(path, buf.getvalue())
