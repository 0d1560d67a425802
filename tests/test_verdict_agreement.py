"""Rewards, the adapters and evaluation decide "correct" alike: all of them call one function,
``sql.verdict.BatchVerdicts.judge``, and this test guards that they reach it the same way.

On every pair, six decisions must be equal. Reward side: ``rewards.make_turn`` called as the
environments call it (a batch of one, no pool), and a real ``single_turn`` environment (reset,
then one step with a ``think_sql`` output). Adapter side: ``integrations.scoring.score_batch``
(the whole batch through a pool). Evaluation side: ``BatchVerdicts.judge`` as the runner calls
it (a pool, its own gold cache), ``sql.verdict`` (one prediction) and the Spider evaluator's
``sql.execution_match``, written apart from it. The raw executions (what "executable" and the feedback read) must be equal too.

Pairs: the Spider conformance pairs of tests/spider_conformance.py (its databases, the 322
labelled dev pairs, each gold against itself, and its mutations), and mutations of golds on a
small database built here, whose repeated values make DISTINCT matter and whose ties make
ORDER BY matter. The DISTINCT case of the issue is checked explicitly, with the old raw
comparison of the rewards shown to disagree.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from progress_sql import envs
from progress_sql.corpus.records import Example
from progress_sql.envs.settings import default_task_settings
from progress_sql.formats import parse_output
from progress_sql.integrations.scoring import score_batch
from progress_sql.rewards import make_turn
from progress_sql.sql import BatchVerdicts, Candidate, execute, execution_match, order_matters, results_match, verdict

from spider_conformance import mutations  # noqa: E402

SETTINGS = default_task_settings()  # what the environments default to


def think(sql: str) -> str:
    return f"<think>Reasoning.</think>\n<sql>{sql}</sql>"


def _raw(result) -> tuple | None:
    return None if result is None else (result.error, result.rows)


def assert_agreement(items: list[tuple[Path, str, str, str]], judge: BatchVerdicts) -> Counter:
    """Assert that the six decisions agree on every ``(db_path, db_id, gold, pred)``; return
    how often each verdict occurred."""
    texts = [think(pred) for _, _, _, pred in items]
    sqls = [parse_output(t, "think_sql").sql for t in texts]
    verdicts = judge.judge([Candidate(str(db), sql, gold) for (db, _, gold, _), sql in zip(items, sqls)])
    scored = score_batch(texts, [db for db, _, _, _ in items], [gold for _, _, gold, _ in items], "oneshot", SETTINGS,
                         pool=judge.pool)
    stats: Counter = Counter()
    disagreements = []
    for i, ((db, db_id, gold, pred), text, sql, ev, adapter) in enumerate(zip(items, texts, sqls, verdicts, scored)):
        turn = make_turn(text, "think_sql", db, gold, SETTINGS.sandbox)
        env = envs.get("single_turn")(SETTINGS)
        env.reset(Example(id=f"p{i}", db_id=db_id, question="?", gold_sql=gold, hardness="easy"), db)
        step = env.step(text)
        assert step.done and env.episode.turns[0].sql == sql
        decisions = {
            "make_turn": turn.correct,
            "env": env.episode.correct,
            "score_batch": adapter.correct,
            "judge": ev.correct,
            "verdict": verdict(db, sql, gold).correct,
            "execution_match": execution_match(db, sql, gold),
        }
        if len(set(decisions.values())) != 1:
            disagreements.append((gold, pred, decisions))
        assert _raw(turn.result) == _raw(ev.result) == _raw(env.episode.turns[0].result), (gold, pred)
        assert not adapter.floored, adapter.reason  # scored by the recipe, not given the floor
        stats[ev.correct] += 1
    assert not disagreements, disagreements[:5]
    return stats


# ----------------------------------------------------------------------------- Spider pairs
@pytest.mark.conformance
def test_agreement_on_the_322_dev_pairs_and_the_golds_themselves(spider, judge):
    pairs, dbs = spider
    dev = assert_agreement([(dbs[db], db, gold, pred) for gold, db, pred in pairs], judge)
    assert dev[True] > 30 and dev[False] > 30  # both verdicts occur: the check can fail either way
    own = assert_agreement([(dbs[db], db, gold, gold) for gold, db, _ in pairs], judge)
    assert own == Counter({True: len(pairs)})


@pytest.mark.conformance
def test_agreement_on_mutated_spider_pairs(spider, judge):
    pairs, dbs = spider
    items = [(dbs[db], db, gold, pred) for gold, db, _ in pairs for pred in mutations(gold).values()]
    stats = assert_agreement(items, judge)
    assert stats[True] > 100 and stats[False] > 100


# ----------------------------------------------------------------------------- a small database
@pytest.fixture(scope="module")
def pets_db(tmp_path_factory) -> Path:
    """Repeated names and kinds (DISTINCT changes results) and tied ages (ORDER BY age leaves
    ties whose order the query does not fix)."""
    path = tmp_path_factory.mktemp("verdict") / "pets.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE pet (pet_id INTEGER PRIMARY KEY, name TEXT, kind TEXT, age INTEGER, weight REAL);
        CREATE TABLE owner (owner_id INTEGER PRIMARY KEY, name TEXT, pet_id INTEGER REFERENCES pet(pet_id));
        INSERT INTO pet VALUES (1, 'Rex', 'dog', 3, 12.5), (2, 'Tom', 'cat', 3, 4.0), (3, 'Rex', 'dog', 5, 20.0),
                               (4, 'Kit', 'cat', 1, 3.5), (5, 'Bo', 'bird', 1, 0.3), (6, 'Tom', 'cat', 7, 5.5);
        INSERT INTO owner VALUES (1, 'Ann', 1), (2, 'Ben', 3), (3, 'Ann', 2), (4, 'Cy', 5);
        """
    )
    con.close()
    return path


GOLDS = [
    "SELECT name FROM pet",
    "SELECT DISTINCT kind FROM pet",
    "SELECT name, age FROM pet WHERE kind = 'cat'",
    "SELECT name FROM pet ORDER BY age",
    "SELECT name, weight FROM pet WHERE age > 1 ORDER BY weight DESC",
    "SELECT kind, count(*) FROM pet GROUP BY kind",
    "SELECT name FROM pet WHERE age != 3",
    "SELECT kind FROM pet WHERE age ! = 3",  # a spaced operator, as in some Spider golds
    "SELECT count(DISTINCT name) FROM pet",
    "SELECT T1.name FROM owner AS T1 JOIN pet AS T2 ON T1.pet_id = T2.pet_id WHERE T2.kind = 'dog'",
    "SELECT DISTINCT T1.name FROM owner AS T1 JOIN pet AS T2 ON T1.pet_id = T2.pet_id ORDER BY T1.name",
]


def _changed_literal(select: exp.Select) -> str | None:
    literal = next(select.find_all(exp.Literal), None)
    if literal is None:
        return None
    changed = select.copy()
    target = next(changed.find_all(exp.Literal))
    value = str(int(target.this) + 1) if target.is_int else target.this + "x"
    target.replace(exp.Literal(this=value, is_string=target.is_string))
    return changed.sql(dialect="sqlite")


def more_mutations(gold: str) -> dict[str, str]:
    """Mutations the conformance set lacks: split operators, a changed literal, no WHERE."""
    out = {
        "spaced_operator": gold.replace("!=", "! =").replace(">=", "> =").replace("<=", "< ="),
        "joined_operator": gold.replace("! =", "!="),
    }
    try:
        select = sqlglot.parse_one(gold.replace("! =", "!="), read="sqlite")
    except sqlglot.errors.SqlglotError:
        return out
    if isinstance(select, exp.Select):
        literal = _changed_literal(select)
        if literal is not None:
            out["literal_changed"] = literal
        if select.args.get("where"):
            dropped = select.copy()
            dropped.set("where", None)
            out["where_dropped"] = dropped.sql(dialect="sqlite")
    return out


def test_agreement_on_mutated_pairs_of_a_small_database(pets_db, judge):
    items = []
    for gold in GOLDS:
        preds = {"self": gold, **mutations(gold.replace("! =", "!=")), **more_mutations(gold)}
        items += [(pets_db, "pets", gold, pred) for pred in preds.values()]
    stats = assert_agreement(items, judge)
    assert stats[True] > 20 and stats[False] > 20


def test_distinct_is_ignored_on_both_sides(pets_db, judge):
    """The issue's example: with repeated names, DISTINCT changes the rows, yet EX calls it
    right; so must the reward. The old reward compared raw executions and said wrong."""
    gold, pred = "SELECT name FROM pet", "SELECT DISTINCT name FROM pet"
    raw_pred, raw_gold = execute(pets_db, pred), execute(pets_db, gold)
    assert len(raw_pred.rows) < len(raw_gold.rows)
    assert not results_match(raw_pred, raw_gold, order_matters(gold))  # the old make_turn's decision

    turn = make_turn(think(pred), "think_sql", pets_db, gold, SETTINGS.sandbox)
    assert turn.correct and turn.result.rows == raw_pred.rows  # the turn keeps what the model's SQL gave
    env = envs.get("single_turn")(SETTINGS)
    env.reset(Example(id="d", db_id="pets", question="Pet names?", gold_sql=gold, hardness="easy"), pets_db)
    assert env.step(think(pred)).done and env.episode.correct
    verdict = judge.judge([Candidate(str(pets_db), pred, gold)])[0]
    assert verdict.correct and verdict.result.rows == raw_pred.rows
    assert execution_match(pets_db, pred, gold)
    # the other way round too: a DISTINCT gold accepts the duplicates
    assert make_turn(think(gold), "think_sql", pets_db, pred, SETTINGS.sandbox).correct


def test_a_spaced_operator_is_correct_but_not_executable(pets_db, judge):
    """``! =`` is a syntax error to SQLite: the raw execution fails (executability, feedback)
    while the comparison view, re-joined, is the gold's answer: correct on both sides."""
    gold, pred = "SELECT name FROM pet WHERE age != 3", "SELECT name FROM pet WHERE age ! = 3"
    turn = make_turn(think(pred), "think_sql", pets_db, gold, SETTINGS.sandbox)
    verdict = judge.judge([Candidate(str(pets_db), pred, gold)])[0]
    assert turn.correct and verdict.correct
    assert turn.result.error == verdict.result.error == "syntax"
    assert verdict.compared.ok and not verdict.executed


def test_order_matters_only_for_an_ordered_gold(pets_db, judge):
    ordered, unordered = "SELECT name FROM pet ORDER BY weight", "SELECT name FROM pet"
    reversed_rows = "SELECT name FROM pet ORDER BY weight DESC"
    for gold, expected in ((ordered, False), (unordered, True)):
        assert make_turn(think(reversed_rows), "think_sql", pets_db, gold, SETTINGS.sandbox).correct is expected
        assert judge.judge([Candidate(str(pets_db), reversed_rows, gold)])[0].correct is expected


# ----------------------------------------------------------------------------- BIRD semantics
def bird_reference(db: Path, pred: str, gold: str) -> bool:
    """BIRD's official EX (``calculate_ex`` of its evaluation.py): both queries as written,
    ``set(predicted_res) == set(ground_truth_res)``; a prediction that fails is wrong."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        gold_rows = con.execute(gold).fetchall()
        try:
            pred_rows = con.execute(pred).fetchall()
        except sqlite3.Error:
            return False
        return set(pred_rows) == set(gold_rows)
    finally:
        con.close()


def test_bird_semantics_agrees_with_birds_evaluator_on_both_sides(pets_db, judge):
    """Under ``"bird"`` the reward (make_turn, an environment on a BIRD example), the adapters
    (score_batch) and the evaluation (BatchVerdicts) decide as BIRD's evaluator does, on the small database's golds
    and their mutations (a gold BIRD cannot run, the spaced operator, is left out)."""
    stats: Counter = Counter()
    for gold in (g for g in GOLDS if "! =" not in g):
        preds = {"self": gold, **mutations(gold), **more_mutations(gold), "unordered": gold.split(" ORDER BY")[0],
                 "duplicates": gold.replace("DISTINCT ", ""), "distinct": gold.replace("SELECT ", "SELECT DISTINCT ", 1)}
        for pred in dict.fromkeys(preds.values()):
            expected = bird_reference(pets_db, pred, gold)
            turn = make_turn(think(pred), "think_sql", pets_db, gold, SETTINGS.sandbox, semantics="bird")
            env = envs.get("single_turn")(SETTINGS)
            env.reset(Example(id="b", db_id="pets", question="?", gold_sql=gold, hardness="easy", semantics="bird"),
                      pets_db)
            env.step(think(pred))
            (verdict,) = judge.judge([Candidate(str(pets_db), pred, gold, "bird")])
            (adapter,) = score_batch([think(pred)], [pets_db], [gold], "oneshot", SETTINGS, semantics=["bird"])
            assert turn.correct == env.episode.correct == verdict.correct == adapter.correct == expected, (gold, pred)
            stats[expected] += 1
    assert stats[True] > 30 and stats[False] > 8


def test_bird_and_spider_differ_where_their_evaluators_do(pets_db, judge):
    cases = [  # (gold, pred, spider, bird)
        ("SELECT name FROM pet ORDER BY age", "SELECT name FROM pet ORDER BY age DESC", False, True),  # order
        ("SELECT kind FROM pet GROUP BY kind", "SELECT kind FROM pet", False, True),  # duplicates
        ("SELECT name, age FROM pet", "SELECT age, name FROM pet", True, False),  # column permutation
        ("SELECT count(DISTINCT name) FROM pet", "SELECT count(name) FROM pet", True, False),  # DISTINCT kept
        ("SELECT name FROM pet WHERE age != 3", "SELECT name FROM pet WHERE age ! = 3", True, False),  # as written
    ]
    for gold, pred, spider_ok, bird_ok in cases:
        spider_v, bird_v = judge.judge([Candidate(str(pets_db), pred, gold), Candidate(str(pets_db), pred, gold, "bird")])
        assert (spider_v.correct, bird_v.correct) == (spider_ok, bird_ok), (gold, pred)
        assert make_turn(think(pred), "think_sql", pets_db, gold, SETTINGS.sandbox, semantics="bird").correct is bird_ok
    # TS takes the semantics too: the bird verdict on a neighbour is a set comparison
    pred, gold = "SELECT kind FROM pet", "SELECT kind FROM pet GROUP BY kind"
    assert judge.test_suite([(Candidate(str(pets_db), pred, gold, "bird"), [pets_db])]) == [True]
    assert judge.test_suite([(Candidate(str(pets_db), pred, gold), [pets_db])]) == [False]
