"""Reward properties with the weights of params.yaml (hypothesis).

1. Progress-SQL's reward analysis (§4.2): the upper bound of the reward, with format and
   execution status at their best and Δ free in [−1, 1], falls strictly as the first correct
   turn k* grows 1..T, and a never-correct trajectory's bound lies strictly below k* = T's.
   Derived three ways that must agree: the closed form, a maximisation over Δ of the recipe's
   own arithmetic (``progress_terms``), and the recipe evaluated on best-case trajectories.
   With the improvement bonus (``improve`` = α) it holds while α is under the gap between the
   bounds of k* = 1 and k* = 2; the default reward is the paper's Eq. (1)-(4).
2. Every recipe's output lies in [min_reward, max_reward] and is deterministic.
3. Fuzz: random text, truncated and mutated real queries never raise in any recipe.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from progress_sql import rewards
from progress_sql.params import load_settings
from progress_sql.rewards import LocalJudge, Trajectory, Turn, parse_output
from progress_sql.odt import structural_score
from progress_sql.rewards.components import executable, ngram_similarity
from progress_sql.rewards.progress import progress_terms
from progress_sql.sql.result import ExecResult

from conftest import REPO, conformance_dir

SETTINGS = load_settings(REPO / "params.yaml")
P = SETTINGS.rewards.progress
T = SETTINGS.env.max_turns
OK = ExecResult(rows=((1,),), columns=("x",))
ERR = ExecResult(error="runtime", message="no such column")

_FALLBACK_QUERIES = [
    "SELECT name FROM student WHERE age > 20",
    "SELECT T1.name, count(*) FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id GROUP BY T1.name",
    "SELECT title FROM course WHERE credits = (SELECT max(credits) FROM course) ORDER BY title LIMIT 3",
    "SELECT name FROM student EXCEPT SELECT name FROM student WHERE age < 19",
]


def _real_queries() -> list[str]:
    """Spider dev predictions and gold queries (written by others), else a small fallback set."""
    path = conformance_dir()
    if path is None:
        return _FALLBACK_QUERIES
    preds = [line for line in (path / "dev_predict.txt").read_text().splitlines() if line.strip()]
    golds = [line.split("\t")[0] for line in (path / "dev_gold.txt").read_text().splitlines() if line.strip()]
    return preds + golds


QUERIES = _real_queries()
WRAPPERS = {
    "think_sql": "<think>r</think><sql>{}</sql>",
    "reasoning_answer": "<reasoning>r</reasoning><answer>{}</answer>",
    "trail_sql": "<think>r</think><sql>{}</sql>",
    "trail_solution": "<think>r</think><solution>{}</solution>",
    "raw": "{}",
}


def think(sql: str) -> str:
    return WRAPPERS["think_sql"].format(sql)


# ============================================================================ 1. reward analysis
def bound_closed_form(k_star: int | None, w=P) -> float:
    """max R over trajectories whose first correct turn is k* (None: never), rollouts stopping
    at the first correct turn (K = k*, Algorithm 1). k* = 1 is a one-turn trajectory: y_K = y_1,
    so Δ = 0 and executability cannot change (keep). A later k* is a fix: c_K − c_1 = 1."""
    if k_star == 1:
        return w.format + w.keep + w.acc + w.align_neg
    late = w.acc * w.gamma ** (k_star - 1) if k_star is not None else 0.0
    fix = w.improve if k_star is not None else 0.0
    return w.format + max(w.keep, w.recover) + late + max(w.align_pos * 1.0, w.align_neg) + fix


DELTAS = [i / 100 for i in range(-100, 101)]


def bound_by_search(k_star: int | None, w=P) -> float:
    """The same bound as a search over Δ, executability and repetition through the recipe's arithmetic."""
    best = -math.inf
    change = 1 if k_star not in (None, 1) else 0
    for e1 in (False, True):
        for e_k in (False, True):
            if k_star == 1 and e1 != e_k:
                continue  # one turn: y_K is y_1
            for delta in [0.0] if k_star == 1 else DELTAS:
                for repeat in (False, True):
                    terms = progress_terms(delta, k_star, T, e1, e_k, True, w, change=change, repeat=repeat)
                    best = max(best, sum(terms.values()))
    return best


def best_case_trajectory(k_star: int | None) -> Trajectory:
    """F(y_1) = 0 (no SQL), F(y_K) = 1 (the gold itself), well-formed final output."""
    gold = "SELECT name FROM singer WHERE age > 20"
    if k_star == 1:
        turns = [Turn(think(gold), gold, OK, True)]
    else:
        n = k_star if k_star is not None else T
        wrong = [Turn(think("SELECT 1"), "SELECT 1", OK, False)] * (n - 2)
        turns = [Turn("no sql yet", None, None, False), *wrong, Turn(think(gold), gold, OK, k_star is not None)]
    return Trajectory(turns=tuple(turns), gold_sql=gold, max_turns=T)


LEVELS = [*range(1, T + 1), None]


@pytest.mark.parametrize("k_star", LEVELS)
def test_bound_closed_form_matches_search_and_recipe(k_star):
    assert bound_by_search(k_star) == pytest.approx(bound_closed_form(k_star))
    out = rewards.get("progress")(best_case_trajectory(k_star), SETTINGS)
    assert out.info["k_star"] == k_star and out.info["F_last"] == pytest.approx(1.0)
    assert out.total <= bound_closed_form(k_star) + 1e-9
    if k_star == 1 or P.recover >= P.keep:  # the constructed trajectory is then the best case
        assert out.total == pytest.approx(bound_closed_form(k_star))


def test_bound_falls_strictly_with_k_star_and_never_correct_is_lowest():
    bounds = [bound_by_search(k) for k in range(1, T + 1)]
    assert all(a > b for a, b in zip(bounds, bounds[1:])), bounds
    assert bound_by_search(None) < bounds[-1]
    recipe = rewards.get("progress")
    observed = [recipe(best_case_trajectory(k), SETTINGS).total for k in LEVELS]
    assert all(a > b for a, b in zip(observed, observed[1:])), observed


def test_an_improvement_bonus_under_the_gap_keeps_the_analysis_and_one_past_it_breaks_it():
    """rewards.progress.improve = α lifts every bound but k* = 1's by α: the ordering holds
    exactly while α < bound(1) − bound(2) of the paper's reward (0.1 with the default weights)."""
    gap = bound_by_search(1) - bound_by_search(2)
    assert P.improve == 0.0 and gap > 0
    for alpha, holds in ((gap / 2, True), (gap, False), (4 * gap, False)):
        w = P.model_copy(update={"improve": alpha})
        levels = [bound_by_search(k, w) for k in range(1, T + 1)]
        assert levels == pytest.approx([bound_closed_form(k, w) for k in range(1, T + 1)])
        falls = all(a > b for a, b in zip(levels, levels[1:])) and bound_by_search(None, w) < levels[-1]
        assert falls == holds, alpha


# ============================================================================ strategies
@st.composite
def mutated_query(draw) -> str:
    query = draw(st.sampled_from(QUERIES))
    i = draw(st.integers(0, len(query)))
    op = draw(st.sampled_from(["keep", "truncate", "delete", "insert", "swap", "duplicate"]))
    if op == "truncate":
        return query[:i]
    if op == "delete":
        j = draw(st.integers(i, len(query)))
        return query[:i] + query[j:]
    if op == "insert":
        junk = draw(st.sampled_from(["(", ")", "'", '"', ",", " JOIN ", " WHERE ", "SELECT", ";", "--", "\x00", "é"]))
        return query[:i] + junk + query[i:]
    if op == "swap":
        words = query.split()
        if len(words) > 1:
            a, b = draw(st.integers(0, len(words) - 1)), draw(st.integers(0, len(words) - 1))
            words[a], words[b] = words[b], words[a]
        return " ".join(words)
    if op == "duplicate":
        return query[:i] + query + query[i:]
    return query


sql_texts = st.one_of(mutated_query(), st.text(max_size=200), st.sampled_from(["", " ", ";", "SELECT", "*"]))


@st.composite
def model_output(draw) -> tuple[str, str | None]:
    """(raw text, extracted SQL) for a random output, well-formed or not."""
    sql = draw(sql_texts)
    wrapper = draw(st.sampled_from(list(WRAPPERS)))
    text = WRAPPERS[wrapper].format(sql)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]  # a truncated generation
    fmt = draw(st.sampled_from(["think_sql", "reasoning_answer", "trail"]))
    return text, parse_output(text, fmt).sql


@st.composite
def random_turn(draw) -> Turn:
    text, sql = draw(model_output())
    result = None if sql is None else draw(st.sampled_from([OK, ERR, None]))
    return Turn(text=text, sql=sql, result=result, correct=draw(st.booleans()))


@st.composite
def random_trajectory(draw, max_len: int = T) -> Trajectory:
    turns = draw(st.lists(random_turn(), min_size=1, max_size=max_len))
    gold = draw(st.one_of(st.sampled_from(QUERIES), mutated_query()))
    difficulty = draw(st.sampled_from(["", "easy", "medium", "hard", "extra", "simple", "Challenging", "??"]))
    return Trajectory(turns=tuple(turns), gold_sql=gold, db_id="db", difficulty=difficulty,
                      question="q", schema="s", max_turns=T)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ============================================================================ 2. bounded, deterministic
def _judge(question: str, schema: str, pred: str, gold: str) -> float:
    return (len(pred) % 11) / 10  # deterministic, in [0, 1]


@FUZZ
@given(random_trajectory())
def test_every_recipe_is_bounded_and_deterministic(trajectory):
    for name in rewards.names():
        recipe = rewards.get(name)
        low, high = recipe.bounds(SETTINGS)
        judges = [None, LocalJudge(_judge)] if name == "reasoning_sql" else [None]
        for judge in judges:
            first = recipe(trajectory, SETTINGS, judge=judge)
            assert first == recipe(trajectory, SETTINGS, judge=judge)
            assert low - 1e-9 <= first.total <= high + 1e-9, (name, first)
            assert tuple(first.components) == recipe.components
            assert all(math.isfinite(v) for v in first.components.values())


def paper_reward(t: Trajectory) -> float:
    """Eq. (1)-(4) of progress-sql.md §4.2 written out, apart from the recipe's own arithmetic."""
    def f(sql):
        return 0.5 * ((structural_score(sql, t.gold_sql) if sql else 0.0) + ngram_similarity(sql, t.gold_sql, 2))

    delta = f(t.last.sql) - f(t.first.sql) if len(t.turns) > 1 else 0.0
    k_star = next((k for k, turn in enumerate(t.turns, 1) if turn.correct), None)
    e1, e_k = executable(t.first), executable(t.last)
    return ((P.align_pos * delta if delta > 0 else P.align_neg)
            + (P.acc * P.gamma ** (k_star - 1) if k_star is not None and k_star <= t.max_turns else 0.0)
            + {(True, True): P.keep, (False, True): P.recover, (True, False): P.deteriorate}.get((e1, e_k), 0.0)
            + (P.format if parse_output(t.last.text, "think_sql").well_formed else 0.0))


@FUZZ
@given(random_trajectory())
def test_the_default_progress_reward_is_the_papers(trajectory):
    """Issue 53's options (improve, repeat_credit) are off by default: the reward is Eq. (4)."""
    out = rewards.get("progress")(trajectory, SETTINGS)
    assert (P.improve, P.repeat_credit) == (0.0, True) and out.components["improve"] == 0.0
    assert out.total == pytest.approx(paper_reward(trajectory), abs=1e-12)


@FUZZ
@given(random_trajectory(), st.floats(0.0, 3.0), st.booleans())
def test_progress_with_its_options_stays_in_its_bounds(trajectory, alpha, repeat_credit):
    w = P.model_copy(update={"improve": alpha, "repeat_credit": repeat_credit})
    low, high = rewards.get("progress").bounds(w)
    out = rewards.get("progress")(trajectory, w)
    assert low - 1e-9 <= out.total <= high + 1e-9
    paper = rewards.get("progress")(trajectory, P)
    assert out.total <= paper.total + alpha * (int(trajectory.last.correct) - int(trajectory.first.correct)) + 1e-9


@FUZZ
@given(random_trajectory())
def test_progress_never_exceeds_the_bound_of_its_k_star(trajectory):
    out = rewards.get("progress")(trajectory, SETTINGS)
    k_star = out.info["k_star"]
    if k_star is not None and k_star < len(trajectory.turns):
        return  # continued after success: not an Algorithm 1 rollout (K = k*)
    if k_star is not None and k_star > T:
        k_star = None  # a late success earns no latency reward
    assert out.total <= bound_closed_form(k_star) + 1e-9


# ============================================================================ 3. fuzz
@FUZZ
@given(st.one_of(st.text(max_size=2000), mutated_query()), st.one_of(st.sampled_from(QUERIES), mutated_query()))
def test_fuzzed_sql_never_raises(sql, gold):
    turns = tuple(Turn(text=WRAPPERS[w].format(sql), sql=sql or None, result=ERR, correct=False) for w in WRAPPERS)
    trajectory = Trajectory(turns=turns, gold_sql=gold, max_turns=len(turns))
    for name in rewards.names():
        rewards.get(name)(trajectory, SETTINGS)
