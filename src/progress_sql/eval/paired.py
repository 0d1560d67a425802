"""Paired comparison of two evaluations of the same questions (pure: no torch, no MLflow).

Two runs scored on the same examples differ by the questions one gets right and the other
does not. On a few hundred questions a change of a few points is often noise, so the
comparison reports, per split and decoding mode:

- ``n``: examples present in both runs (matched by example id);
- ``ex_a`` / ``ex_b``: EX of each run on those examples, each with its 95 % Wilson score
  interval (``ci_a`` / ``ci_b``: what the split's size alone leaves uncertain);
- ``gained`` / ``lost``: examples right only in B / only in A (ids listed);
- ``p_value``: the exact two-sided McNemar test of ``gained`` against ``lost`` (a binomial
  test with p = ½ over the discordant examples); 1.0 when there are none.

Inputs are the ``predictions/<split>.jsonl`` files that ``progress-sql eval`` writes under
its output folder: one JSON object per example with ``id`` and, per mode, ``{"ex": bool}``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from progress_sql.corpus.records import CorpusError, read_json_lines

MODES = ("greedy", "vote", "multi_turn")


class CompareError(ValueError):
    """An evaluation folder or predictions file is missing or malformed; the message names it."""


@dataclass(frozen=True)
class PairedComparison:
    split: str
    mode: str
    n: int
    ex_a: float
    ex_b: float
    gained: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    only_a: int = 0  # examples of the split that only one run evaluated (left out of n)
    only_b: int = 0

    @property
    def p_value(self) -> float:
        return mcnemar_exact(len(self.gained), len(self.lost))

    @property
    def ci_a(self) -> tuple[float, float]:
        return wilson_interval(round(self.ex_a * self.n), self.n)

    @property
    def ci_b(self) -> tuple[float, float]:
        return wilson_interval(round(self.ex_b * self.n), self.n)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "p_value": self.p_value, "ci_a": list(self.ci_a), "ci_b": list(self.ci_b)}


def wilson_interval(right: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95 % Wilson score interval of a share ``right``/``n`` (sound at 0 and near it, where
    the normal approximation gives a negative bound); (0, 1) when n is 0."""
    if not 0 <= right <= n:
        raise ValueError("need 0 <= right <= n")
    if n == 0:
        return 0.0, 1.0
    p, z2 = right / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at 0 or n the bound is exactly 0 or 1 (rounding would leave it a hair inside)
    return (0.0 if right == 0 else centre - half), (1.0 if right == n else centre + half)


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: P(a split at least this uneven) under Binomial(b + c, ½)."""
    if gained < 0 or lost < 0:
        raise ValueError("counts must be non-negative")
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def read_predictions(path: Path) -> dict[str, dict[str, Any]]:
    """One predictions file, keyed by example id."""
    rows: dict[str, dict[str, Any]] = {}
    try:
        for where, row in read_json_lines(path):
            if not isinstance(row.get("id"), str):
                raise CompareError(f"{where}: expected an object with a string 'id'")
            if row["id"] in rows:
                raise CompareError(f"{where}: example id {row['id']!r} appears twice")
            rows[row["id"]] = row
    except CorpusError as err:
        raise CompareError(str(err)) from None
    return rows


def _ex(row: dict[str, Any], mode: str, where: str) -> bool | None:
    """The row's EX under ``mode``; None when the run did not use that mode."""
    answer = row.get(mode)
    if answer is None:
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("ex"), bool):
        raise CompareError(f"{where}: '{mode}' has no boolean 'ex'")
    return answer["ex"]


def compare_split(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], split: str,
                  mode: str) -> PairedComparison | None:
    """The paired comparison of one split under one mode; None when either run lacks the mode."""
    common = sorted(set(a) & set(b))
    pairs = []
    for example_id in common:
        ex_a = _ex(a[example_id], mode, f"run A, {split}, example {example_id!r}")
        ex_b = _ex(b[example_id], mode, f"run B, {split}, example {example_id!r}")
        if ex_a is None or ex_b is None:
            return None
        pairs.append((example_id, ex_a, ex_b))
    if not pairs:
        return None
    n = len(pairs)
    return PairedComparison(
        split=split, mode=mode, n=n,
        ex_a=sum(x for _, x, _ in pairs) / n, ex_b=sum(y for _, _, y in pairs) / n,
        gained=[i for i, x, y in pairs if y and not x], lost=[i for i, x, y in pairs if x and not y],
        only_a=len(set(a) - set(b)), only_b=len(set(b) - set(a)),
    )


def compare_runs(run_a: str | Path, run_b: str | Path, splits: Sequence[str] = (),
                 modes: Sequence[str] = MODES) -> list[PairedComparison]:
    """Paired comparisons of two ``progress-sql eval`` output folders, for every split both
    hold (or ``splits``) and every mode of ``modes`` both used."""
    dirs = [Path(run_a) / "predictions", Path(run_b) / "predictions"]
    for d in dirs:
        if not d.is_dir():
            raise CompareError(f"{d}: no predictions folder (is {d.parent} a `progress-sql eval` output folder?)")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise CompareError(f"unknown mode(s) {sorted(unknown)}; known: {', '.join(MODES)}")
    names = list(splits) or sorted({p.stem for p in dirs[0].glob("*.jsonl")} & {p.stem for p in dirs[1].glob("*.jsonl")})
    if not names:
        raise CompareError(f"{dirs[0].parent} and {dirs[1].parent} share no evaluated split")
    out = []
    for split in names:
        a, b = (read_predictions(d / f"{split}.jsonl") for d in dirs)
        if not set(a) & set(b):
            raise CompareError(f"split {split}: the two runs share no example id")
        out.extend(c for c in (compare_split(a, b, split, m) for m in modes) if c is not None)
    if not out:
        raise CompareError("no decoding mode was used by both runs")
    return out


def markdown_table(comparisons: Sequence[PairedComparison]) -> str:
    """One row per (split, mode): n, both EX with their 95 % intervals, gained, lost, McNemar p."""
    lines = ["| split | mode | n | EX A [95 %] | EX B [95 %] | gained | lost | p (McNemar) |",
             "|---|---|---|---|---|---|---|---|"]

    def ex(share: float, ci: tuple[float, float]) -> str:
        return f"{100 * share:.2f} % [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"

    for c in comparisons:
        lines.append(f"| {c.split} | {c.mode} | {c.n} | {ex(c.ex_a, c.ci_a)} | {ex(c.ex_b, c.ci_b)} | "
                     f"{len(c.gained)} | {len(c.lost)} | {c.p_value:.3g} |")
    return "\n".join(lines)
