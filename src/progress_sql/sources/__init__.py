"""The dataset sources a corpus is imported from (``progress-sql data import``): one module per
source holding its reader, its declaration (``DatasetSource``: its setting ``data.import_<name>``,
the roles it plays, its semantics) and ``SOURCES`` below, the one list of them.

The settings (``data.import_<name>``, the choices of ``data.import_train`` / ``import_eval``,
``data.mix``), the options of ``data import`` and the import itself (``data.importing``) are
composed from ``SOURCES``. Adding a source: a module beside the others defining its reader and
``SOURCE``, then one entry in ``SOURCES``.

Every reader returns a ``LoadResult``: the split's ``Loaded`` records (each an ``Example`` with
hardness by the Spider rules from the gold SQL, and the source's database file to run it on) and
the records it skipped, with reasons.
"""

from __future__ import annotations

from progress_sql.sources import bird, spider, spider_variants, synsql
from progress_sql.sources.base import DatasetSource, TrainSet
from progress_sql.sources.reading import Loaded, LoadResult, Skipped, iter_json_array

SOURCES: tuple[DatasetSource, ...] = (spider.SOURCE, bird.SOURCE, synsql.SOURCE, *spider_variants.SOURCES)
_BY_NAME = {source.name: source for source in SOURCES}
# The robustness variants a corpus may hold (variants/<name>.jsonl), one per source that gives one:
# an import reads them, the bundled build writes its own of each (data.variants; empty where it has no rule).
VARIANTS: tuple[str, ...] = tuple(source.variant for source in SOURCES if source.variant)


def names() -> tuple[str, ...]:
    """The names of every registered source, in registry order."""
    return tuple(_BY_NAME)


def get(name: str) -> DatasetSource:
    """The source called ``name``; KeyError naming the known sources otherwise."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown dataset source {name!r}; known: {', '.join(_BY_NAME)}") from None


def with_train() -> tuple[DatasetSource, ...]:
    """The sources that have a train set (``data.import_train`` chooses among them)."""
    return tuple(s for s in SOURCES if s.train is not None)


def with_evaluation() -> tuple[DatasetSource, ...]:
    """The sources that have dev/test sets (``data.import_eval`` chooses among them)."""
    return tuple(s for s in SOURCES if s.evaluation is not None)


def datasets() -> tuple[DatasetSource, ...]:
    """The sources that give train or dev/test sets; the rest give a robustness split."""
    return tuple(s for s in SOURCES if s.train is not None or s.evaluation is not None)


def dataset_settings() -> str:
    """The settings that give an import its datasets, for messages: ``data.import_spider, ... or ...``."""
    keys = [f"data.{s.setting}" for s in datasets()]
    return f"{', '.join(keys[:-1])} or {keys[-1]}"


__all__ = ["SOURCES", "VARIANTS", "DatasetSource", "LoadResult", "Loaded", "Skipped", "TrainSet", "dataset_settings",
           "datasets", "get", "iter_json_array", "names", "with_evaluation", "with_train"]
