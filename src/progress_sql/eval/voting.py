"""Vote@k and pass@k over sampled candidates: pure functions of execution results (no torch).

Vote@k (self-consistency, as OmniSQL's ``major_voting``): the k candidates of one question are
grouped into classes of equivalent execution results; the largest class wins and its first
candidate is the answer. Our rules, and how they relate to OmniSQL's:

- Equivalence: the results are the candidates' comparison-view executions
  (``Verdict.compared``), and they are grouped by those results alone: nothing about the gold
  is read, since at test time there is none (OmniSQL's ``major_voting`` likewise keys on the
  results only). Two results are equal when ``sql.verdict.same_answer`` holds *unordered*
  under the example's semantics: under ``"spider"``, the same rows up to a column
  permutation, as bags (duplicates count), DISTINCT ignored; under ``"bird"``, the same sets of
  rows (OmniSQL's ``frozenset(rows)``). Row order never separates two candidates: whether
  order matters is a property of the gold query, which voting must not see; the verdict
  still applies the gold's order to the winner. OmniSQL keys on ``frozenset(rows)`` for
  every dataset; under Spider semantics that would merge results that differ only in
  duplicate rows and separate results that differ only in column order, both of which the
  Spider metric treats the other way, so there the classes are the metric's. Both relations
  are equivalences (a column permutation composes), so comparing each candidate with the
  first member of each class is exact.
- Invalid candidates (no SQL extracted, an execution error of the comparison view, or a result
  cut at ``sandbox.max_rows``, which cannot be compared) never vote. An empty result is a valid
  answer and votes like any other, as in OmniSQL.
- Ties between classes of equal size go to the class whose first member came first; the answer
  is that first member. OmniSQL's ``max`` over an insertion-ordered dict does the same.
- All candidates invalid: OmniSQL returns ``random.choice`` of them (seeded); we return the
  first. The candidates are i.i.d. samples, so the first is distributed exactly like a random
  pick, and the result stays a deterministic function of the samples.

pass@k: some candidate among k is correct. With n > k samples of which c are correct, the
unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al., 2021) is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Sequence

from progress_sql.sql.result import ExecResult
from progress_sql.sql.verdict import Semantics, same_answer


@dataclass(frozen=True)
class VoteOutcome:
    """``winner``: index of the chosen candidate; ``classes``: candidate indices per class of
    equivalent results, in order of first appearance; ``votes``: the winning class's size
    (0 when every candidate was invalid); ``valid``: how many candidates voted."""

    winner: int
    classes: tuple[tuple[int, ...], ...]
    votes: int
    valid: int

    @property
    def all_invalid(self) -> bool:
        return self.valid == 0


def is_valid(result: ExecResult | None) -> bool:
    """A candidate votes when its SQL executed without error and its rows were not cut."""
    return result is not None and result.ok and not result.truncated


def equivalence_classes(results: Sequence[ExecResult | None], semantics: Semantics = "spider") -> list[list[int]]:
    """Indices of the valid ``results`` grouped by ``same_answer`` without order (under
    ``semantics``), classes and members in order of first appearance."""
    classes: list[list[int]] = []
    for i, result in enumerate(results):
        if not is_valid(result):
            continue
        assert result is not None
        for members in classes:
            rep = results[members[0]]
            assert rep is not None
            if same_answer(result, rep, False, semantics):
                members.append(i)
                break
        else:
            classes.append([i])
    return classes


def vote(results: Sequence[ExecResult | None], semantics: Semantics = "spider") -> VoteOutcome:
    """Majority vote over the execution results of one question's candidates.

    ``results[i]`` is candidate i's comparison-view execution (``Verdict.compared``; None when
    it had no SQL); ``semantics`` is the example's (``Example.semantics``). Nothing about the
    gold is read. Raises ValueError for no candidates.
    """
    if not results:
        raise ValueError("vote needs at least one candidate")
    if isinstance(semantics, bool):
        raise TypeError("vote groups by execution results only: it takes the semantics, not the gold's order")
    classes = equivalence_classes(results, semantics)
    if not classes:
        return VoteOutcome(winner=0, classes=(), votes=0, valid=0)
    best = max(classes, key=len)  # max keeps the first of equal sizes: earliest class wins
    return VoteOutcome(
        winner=best[0],
        classes=tuple(tuple(c) for c in classes),
        votes=len(best),
        valid=sum(len(c) for c in classes),
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (needs n >= k >= 1)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number correct must be in [0, n], got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
