"""What a dataset source declares (``DatasetSource``), and its train set as the train draw sees it
(``TrainSet``). ``progress_sql.params`` composes the ``data.import_*`` settings from the
declarations; ``data.importing`` reads the sources through them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from progress_sql.sources.reading import Loaded, LoadResult
from progress_sql.sql.verdict import Semantics


@dataclass(frozen=True)
class TrainSet:
    """A train set as ``size`` positions the draw picks from; ``take(positions)`` reads the
    records at those positions (keyed by position: one left out was skipped) and the load they
    came from, whose skips the import reports. ``whole``: the load of a set read at once."""

    size: int
    take: Callable[[Sequence[int]], tuple[dict[int, Loaded], LoadResult | None]]
    whole: LoadResult | None = None

    @classmethod
    def read_at_once(cls, load: LoadResult) -> TrainSet:
        """A train set read whole: its positions are those of the records kept."""
        records = load.records
        return cls(len(records), lambda positions: ({p: records[p] for p in positions}, None), whole=load)

    @classmethod
    def read_by_position(cls, size: int, read: Callable[[Sequence[int]], LoadResult]) -> TrainSet:
        """A train set too large to read whole (SynSQL-2.5M): ``read`` converts only the records at
        the given positions of the source, so positions are the records' own ``index``."""

        def take(positions: Sequence[int]) -> tuple[dict[int, Loaded], LoadResult]:
            load = read(positions)
            return {record.index: record for record in load.records}, load

        return cls(size, take)


@dataclass(frozen=True)
class DatasetSource:
    """A published dataset that ``progress-sql data import`` reads, set by ``data.import_<name>``
    (the option ``--<name>`` with ``_`` as ``-``). It gives any of: a train set (drawn from when
    ``data.import_train`` names it, with the default share ``share`` of ``data.mix``), dev/test
    sets (``data.import_eval``), or one robustness split (``variant``: its name, in ``sources.VARIANTS``)."""

    name: str
    about: str  # what data.import_<name> names: the option's help
    semantics: Semantics  # how its golds are judged (sql.verdict): every example it gives has it
    train: Callable[[Path], TrainSet] | None = None
    evaluation: Callable[[Path], dict[str, LoadResult]] | None = None  # {"dev": ..., "test": ...}
    variant: str = ""
    # the variant's reader: its file or folder, and the folders of every source given (databases
    # may live in another source's folder: Spider-Syn uses Spider's)
    read_variant: Callable[[Path, Mapping[str, Path]], LoadResult] | None = None
    share: float = 0.0  # data.mix.<name>: its default share of a train draw by fixed shares
    test_suite: str = ""  # the folder of its root holding test-suite databases <db_id>/*.sqlite
    # whether a folder holds the train set: one with the dev set alone (an evaluation-only copy)
    # gives the import no train examples; None: the train set is all the source is (SynSQL)
    holds_train: Callable[[Path], bool] | None = None

    def train_in(self, root: Path) -> bool:
        """Whether ``root`` gives a train set (``train`` is read from it)."""
        return self.train is not None and (self.holds_train is None or self.holds_train(root))

    @property
    def setting(self) -> str:
        """The setting that gives its folder (or file), under ``data``."""
        return f"import_{self.name}"

    @property
    def option(self) -> str:
        """Its option of ``progress-sql data import``; how the import report names it."""
        return self.name.replace("_", "-")
