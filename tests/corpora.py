"""The tests' one corpus factory: a generated corpus (``data.build.build_corpus``, well under a
second at these sizes) written where a fixture asks, from its settings or the small default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from progress_sql.config import Settings, settings_from_dict
from progress_sql.data.build import build_corpus

# Three small train databases, one dev and one test database: enough for every split to exist.
SMALL_DATA = {"n_databases": 3, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 12, "dev_size": 4,
              "test_size": 4, "neighbours": 0, "rows_scale": 0.3}


def small_corpus(out: Path, settings: Settings | None = None, **data: Any) -> Path:
    """A corpus built into ``out`` from ``settings`` (its ``data`` section), or from
    ``SMALL_DATA`` with ``data`` overriding it; returns ``out``."""
    if settings is None:
        settings = settings_from_dict({"data": {**SMALL_DATA, **data}})
    elif data:
        raise TypeError("give settings or data overrides, not both")
    build_corpus(settings, out, progress=False)
    return out
