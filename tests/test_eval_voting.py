"""Vote@k over execution-result classes (results only: no gold information), under Spider and
BIRD semantics, and pass@k (pure: hand-made execution results)."""

from __future__ import annotations

import itertools
from math import comb

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from progress_sql.eval.voting import equivalence_classes, is_valid, pass_at_k, vote
from progress_sql.sql import ExecResult


def ok(*rows: tuple, columns: tuple[str, ...] = ()) -> ExecResult:
    return ExecResult(rows=tuple(rows), columns=columns)


ERROR = ExecResult(error="runtime", message="no such column: x")
A = ok((1, "a"), (2, "b"))
A_SWAPPED = ok(("a", 1), ("b", 2))  # same answer, columns in the other order
A_REORDERED = ok((2, "b"), (1, "a"))  # same rows, other row order
B = ok((1, "a"))
EMPTY = ok()


def test_majority_class_wins_and_its_first_member_answers():
    outcome = vote([B, A_SWAPPED, A, ERROR, A_REORDERED])
    assert outcome.winner == 1  # A_SWAPPED, A, A_REORDERED are one class; A_SWAPPED came first
    assert outcome.votes == 3 and outcome.valid == 4
    assert outcome.classes == ((0,), (1, 2, 4))


def test_ties_go_to_the_class_seen_first():
    assert vote([B, A, A, B]).winner == 0
    assert vote([A, B, B, A]).winner == 0
    assert vote([ERROR, A, B]).winner == 1


def test_invalid_candidates_never_win_unless_all_are_invalid():
    assert vote([ERROR, None, ERROR, B]).winner == 3
    cut = ExecResult(rows=((1,),), truncated=True)
    assert not is_valid(cut) and not is_valid(None) and not is_valid(ERROR)
    assert vote([cut, cut, B]).winner == 2  # truncated results cannot be compared
    assert vote([cut, cut, B], "bird").winner == 2
    outcome = vote([None, ERROR, cut])
    assert (outcome.winner, outcome.votes, outcome.valid, outcome.all_invalid) == (0, 0, 0, True)


def test_grouping_reads_results_only_never_the_gold_order():
    # Row order never separates candidates, whatever the gold (voting cannot see it).
    for semantics in ("spider", "bird"):
        assert len(equivalence_classes([A, A_REORDERED], semantics)) == 1
        assert vote([A_REORDERED, A, A], semantics).winner == 0
    with pytest.raises(TypeError, match="results only"):
        vote([A, A_REORDERED], True)  # the old gold-order argument is refused, not taken as a semantics


def test_bird_groups_sets_of_rows_without_column_permutation():
    twice, once = ok((1, "a"), (1, "a")), ok((1, "a"))
    assert len(equivalence_classes([twice, once], "bird")) == 1  # sets: duplicates do not count
    assert len(equivalence_classes([A, A_SWAPPED], "bird")) == 2  # rows as tuples: no column permutation
    assert len(equivalence_classes([A, A_SWAPPED], "spider")) == 1
    outcome = vote([twice, A_SWAPPED, once, A], "bird")
    assert (outcome.winner, outcome.votes, outcome.classes) == (0, 2, ((0, 2), (1,), (3,)))
    assert vote([EMPTY, ok(columns=("x",)), A], "bird").votes == 2  # empty results are one answer


def test_bag_semantics_and_empty_results():
    twice = ok((1, "a"), (1, "a"))
    once = ok((1, "a"))
    assert len(equivalence_classes([twice, once])) == 2  # duplicates count
    # an empty result is a valid answer; empty results are equal whatever their columns
    outcome = vote([EMPTY, A, ok(columns=("x", "y")), ERROR])
    assert (outcome.winner, outcome.votes) == (0, 2)


def test_no_candidates_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        vote([])


ROWSETS = [(), ((1,),), ((2,),), ((1,), (2,)), ((2,), (1,)), ((1, "x"),), (("x", 1),), ((1,), (1,))]
candidates = st.lists(
    st.one_of(st.none(), st.just(ERROR), st.sampled_from(ROWSETS).map(lambda rows: ok(*rows))), min_size=1, max_size=8
)


@hsettings(max_examples=200, deadline=None)
@given(candidates, st.sampled_from(["spider", "bird"]))
def test_vote_properties(results, semantics):
    outcome = vote(results, semantics)
    sizes = [len(c) for c in outcome.classes]
    assert sorted(i for c in outcome.classes for i in c) == [i for i, r in enumerate(results) if is_valid(r)]
    if outcome.valid:
        assert is_valid(results[outcome.winner])
        assert outcome.votes == max(sizes)
        first_max = next(c for c in outcome.classes if len(c) == max(sizes))
        assert outcome.winner == first_max[0]
    else:
        assert outcome.winner == 0
    assert vote(results, semantics) == outcome  # deterministic
    # a function of the results alone: the same multiset in another order gives classes of the same sizes
    assert sorted(map(len, vote(results[::-1], semantics).classes)) == sorted(sizes)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 2), (8, 3, 8), (8, 0, 4), (8, 8, 1), (5, 2, 3), (10, 4, 1)])
def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample(n, c, k):
    correct = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)
    assert len(subsets) == comb(n, k)


def test_pass_at_k_edges_and_errors():
    assert pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(10, 4, 1) == pytest.approx(0.4)  # pass@1 is the mean accuracy
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 2)
