"""What every framework adapter (progress_sql.integrations) shares: importing them imports no
framework, bad input gets the recipe's floor with a reason and never raises, no database is
ever written, the sandbox's timeout bounds a call, and batched scoring (through the SQL process
pool) gives the one-by-one rewards."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from progress_sql import envs, rewards
from progress_sql.envs.prompts import INVALID_ACTION
from progress_sql.envs.settings import TaskSettings
from progress_sql.formats import answer_text
from progress_sql.integrations import scoring, sessions
from progress_sql.integrations.tasks import example_from_row
from progress_sql.integrations import trl as trl_adapter
from progress_sql.integrations import verl as verl_adapter
from progress_sql.sql import SQLPool

from conftest import GOLD, WRONG, answer

RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
# A gold of 10,001 rows: one more than the default sandbox.max_rows (issue 49: even the gold
# itself scored as a wrong answer, silently)
TOO_LARGE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10001) SELECT x FROM c"


# ----------------------------------------------------------------------------- helpers
def folder_state(folder: Path) -> dict[str, str]:
    """Every file of ``folder`` with the sha256 of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


# ----------------------------------------------------------------------------- imports
def test_importing_the_adapters_imports_no_framework():
    code = ("import sys, json; import progress_sql.integrations; "
            "from progress_sql.integrations import trl, verl, skyrl_gym; "
            "mods = ['torch', 'trl', 'transformers', 'verl', 'skyrl_gym', 'mlflow', 'datasets', 'pandas', "
            "'progress_sql.train', 'progress_sql.params', 'progress_sql.inference']; "
            "print(json.dumps({m: m in sys.modules for m in mods}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert not any(loaded.values()), loaded


def test_a_registered_environment_reaches_every_adapter(school_db):
    """An environment with an ``Adapter`` in the registry is a protocol of every framework: the
    SkyRL-gym id and the verl interaction (its class on the installed verl's own base class,
    loaded by file as tests/test_integrations_verl.py does) follow ``envs.protocols()``, and the
    TRL class is what the generator writes out for it (in a fresh process, so the new entry is
    there before the integrations are imported)."""
    verl_base = importlib.util.find_spec("verl")
    if verl_base is None:
        pytest.skip("verl is not installed (make setup installs verl==0.7.1 with --no-deps)")
    verl_base = Path(next(iter(verl_base.submodule_search_locations))) / "interactions" / "base.py"
    code = f"""
import importlib.util, json, inspect, sys
from progress_sql import envs
from progress_sql.envs.odt_feedback import ODTFeedbackEnv

class Retry(ODTFeedbackEnv):  # ODT feedback under another protocol
    name = "retry"
    adapter = envs.Adapter(protocol="retry", stem="Retry", recipe="oneshot", tool="retry_answer", tool_arg="text",
                           tool_doc="Retry.\\n\\nArgs:\\n    text: The answer.\\n\\nReturns:\\n    Feedback.")

envs._ENVS[Retry.name] = Retry
from progress_sql.integrations import sessions, skyrl_gym, trl
spec = importlib.util.spec_from_file_location("verl.interactions.base", {str(verl_base)!r})
sys.modules[spec.name] = base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)
from progress_sql.integrations.verl_interaction import ProtocolInteraction
interaction = ProtocolInteraction({{"name": "progress_sql_retry", "protocol": "retry"}})
written = {{**vars(trl)}}
exec(trl.environment_classes_source(), written)  # its TRL class, as the generator writes it out
env = written["RetryEnvironment"]()
env.reset({str(school_db)!r}, {GOLD!r}, db_id="school", question="q")
print(json.dumps({{
    "protocols": sorted(sessions.PROTOCOLS),
    "skyrl": skyrl_gym.ENV_IDS.get("progress-sql-retry"),
    "verl": [interaction.protocol, interaction.recipe],
    "tool": str(inspect.signature(env.retry_answer)),
    "reply": env.retry_answer(text={answer(GOLD)!r}),
    "recipe": env.session.recipe.name,
}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert {"odt", "retry", "sql_tool"} <= set(got["protocols"])
    assert (got["skyrl"], got["verl"], got["recipe"]) == ("retry", ["retry", "oneshot"], "oneshot")
    assert got["tool"] == "(text: str) -> str" and got["reply"] == trl_adapter.CORRECT


# ----------------------------------------------------------------------------- bad input
@pytest.fixture()
def broken_cases(school_db: Path) -> dict[str, tuple[str, Path, str, str]]:
    """kind -> (completion, database, gold, reason prefix)."""
    return {
        "no tags": ("SELECT name FROM student", school_db, GOLD, "no_sql"),
        "missing database": (answer(GOLD), school_db.parent / "absent.sqlite", GOLD, "no_database"),
        "gold fails": (answer(GOLD), school_db, "SELECT name FROM no_such_table", "gold_failed"),
        "gold writes": (answer(GOLD), school_db, "DELETE FROM student", "gold_failed"),
        "gold too large": (answer(TOO_LARGE), school_db, TOO_LARGE, "gold_too_large"),
    }


@pytest.mark.parametrize("kind", ["no tags", "missing database", "gold fails", "gold writes", "gold too large"])
@pytest.mark.parametrize("recipe", ["progress", "oneshot", "reasoning_sql"])
def test_bad_input_gets_the_floor_and_a_reason_in_every_single_turn_adapter(broken_cases, kind, recipe):
    text, db, gold, reason = broken_cases[kind]
    recipe_ = rewards.get(recipe)
    text = text if recipe == "progress" or kind == "no tags" else answer(GOLD, recipe_.fmt)
    low = recipe_.min_reward()

    scored = scoring.score_completion(text, db, gold, recipe)
    assert (scored.total, scored.reason.split(":")[0]) == (low, reason)
    assert set(scored.components) == set(recipe_.components) and not any(scored.components.values())

    reward = trl_adapter.reward_function(recipe)
    assert reward([[]], [[{"role": "assistant", "content": text}]], db_path=[str(db)], gold_sql=[gold]) == [low]

    out = verl_adapter.compute_score("progress_sql", text, gold, {"db_path": str(db)}, recipe=recipe)
    assert (out["score"], out["reason"].split(":")[0]) == (low, reason)
    assert out["correct"] == 0.0 and all(out[c] == 0.0 for c in recipe_.components)


@pytest.mark.parametrize("kind", ["no tags", "missing database", "gold fails", "gold too large"])
def test_bad_input_gets_the_floor_and_a_reason_in_every_episode(broken_cases, kind):
    text, db, gold, reason = broken_cases[kind]
    low = rewards.get("progress").min_reward()
    session = sessions.EpisodeSession("odt")
    session.start(db, gold)
    while not session.done:  # no-tag turns are turns: the episode runs to T, then scores the floor
        session.step(text)
    scored = session.score()
    assert (scored.total, scored.reason.split(":")[0]) == (low, reason)

    env = trl_adapter.ODTFeedbackEnvironment()
    env.reset(db_path=str(db), gold_sql=gold)
    for _ in range(5):
        env.submit_answer(text)
    assert trl_adapter.episode_reward([[]], [[]], environments=[env]) == [low]


def test_a_gold_past_max_rows_says_what_to_do_in_every_adapter(school_db):
    """The gold itself as the answer: the floor, not a score with ``correct`` 0 and no reason."""
    settings = {"sandbox": {"max_rows": 2}}
    gold = "SELECT name FROM department"  # 3 rows
    out = verl_adapter.compute_score("progress_sql", answer(gold), gold, {"db_path": str(school_db)},
                                     settings=settings)
    assert out["reason"] == ("gold_too_large: the gold query returns more than 2 rows (sandbox.max_rows), so no "
                             "answer can be judged against it; raise sandbox.max_rows or fix the question")
    assert out["score"] == rewards.get("progress").min_reward() and out["correct"] == 0.0
    reasons = []
    reward = trl_adapter.reward_function("progress", settings)
    assert reward([[]], [answer(gold)], db_path=[str(school_db)], gold_sql=[gold],
                  log_extra=lambda key, values: reasons.extend(values)) == [out["score"]]
    assert reasons == [out["reason"]]
    assert scoring.score_completion(answer(gold), school_db, gold, "progress", {"sandbox": {"max_rows": 3}}).correct


@pytest.mark.parametrize("column", ["db_path", "gold_sql", "semantics"])
def test_the_trl_reward_refuses_a_column_that_is_not_a_list(school_db, column):
    """TRL passes each column as a list; a single string was read character by character
    ("score_batch: 1 texts, 56 databases, 27 gold queries")."""
    reward = trl_adapter.reward_function("progress")
    columns = {"db_path": [str(school_db)], "gold_sql": [GOLD], "semantics": ["spider"]}
    assert reward([[]], [answer(GOLD)], **columns) == [scoring.score_completion(answer(GOLD), school_db, GOLD).total]
    columns[column] = columns[column][0]
    with pytest.raises(TypeError, match=f"column '{column}' must be a list with one value per completion"):
        reward([[]], [answer(GOLD)], **columns)
    with pytest.raises(ValueError, match="column 'gold_sql' has 2 values for 1 completions"):
        reward([[]], [answer(GOLD)], db_path=[str(school_db)], gold_sql=[GOLD, GOLD])


def test_policy_sql_sqlglot_cannot_parse_prints_nothing(school_db):
    """sqlglot logs a warning for a statement it parses as a mere command; the task module
    parses a model's SQL without it reaching the user's stderr (a fresh process: the
    interpreter's own last-resort handler, as a user's script has it)."""
    code = f"""
import json
from progress_sql.integrations import verl
print(json.dumps([verl.compute_score("x", t, {GOLD!r}, {{"db_path": {str(school_db)!r}}})["score"]
                  for t in {[answer(sql) for sql in ("VACUUM", "VACUUM main", "REPLACE INTO student VALUES (1)",
                                                     "EXPLAIN SELECT 1")]!r}]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert json.loads(out.stdout) == [verl_adapter.compute_score("x", answer("VACUUM"), GOLD,
                                                                 {"db_path": str(school_db)})["score"]] * 4


def test_odd_values_never_raise(school_db):
    odd = [None, 7, b"<sql>SELECT 1</sql>", {"sql": 1}, "x" * 300_000, "<sql>\x00</sql>", "<sql>" * 5000, ""]
    reward = trl_adapter.reward_function("progress")
    values = reward([[]] * len(odd), odd, db_path=[str(school_db)] * len(odd), gold_sql=[GOLD] * len(odd))
    assert len(values) == len(odd) and all(math.isfinite(v) for v in values)
    assert reward([[]], ["<think>a</think><sql>SELECT 1</sql>"]) == [rewards.get("progress").min_reward()]
    for text in odd:
        assert math.isfinite(verl_adapter.compute_score("x", text, GOLD, {"db_path": str(school_db)})["score"])
    for info in (None, [], "nope", {"db_path": 3}, {"db_path": None, "turn_scores": []}):
        assert verl_adapter.compute_score("x", answer(GOLD), GOLD, info)["reason"].startswith("no_database")
    unknown = verl_adapter.compute_score("x", answer(GOLD), GOLD, {"db_path": str(school_db), "recipe": "nope"})
    assert unknown["reason"].startswith("error") and unknown["score"] == rewards.get("progress").min_reward()
    for gold in (None, 5, ""):
        assert verl_adapter.compute_score("x", answer(GOLD), gold, {"db_path": str(school_db)})["reason"]
    session = sessions.EpisodeSession("sql_tool")
    session.start(school_db, GOLD)
    assert session.step(None).counted is False and session.step(42).text == sessions.NOT_TEXT
    assert session.turns == 0


# ----------------------------------------------------------------------------- read-only
WRITES = ["DELETE FROM student", "DROP TABLE student", "UPDATE student SET age = 0",
          "INSERT INTO student VALUES (99, 'x', 1, 1)", "CREATE TABLE t (a)", "PRAGMA journal_mode = WAL",
          "ATTACH DATABASE 'other.sqlite' AS o", "SELECT 1; DROP TABLE student", "VACUUM",
          "WITH x AS (SELECT 1) DELETE FROM student"]


def test_no_adapter_ever_writes_a_database(school_db):
    before = folder_state(school_db.parent)
    reward = trl_adapter.reward_function("oneshot")
    texts = [answer(sql) for sql in WRITES]
    values = reward([[]] * len(texts), texts, db_path=[str(school_db)] * len(texts), gold_sql=[GOLD] * len(texts))
    assert values == [rewards.get("oneshot").weights().format] * len(texts)  # well-formed, never executed
    for sql in WRITES:
        assert verl_adapter.compute_score("x", answer(sql), GOLD, {"db_path": str(school_db)})["correct"] == 0.0
        assert verl_adapter.compute_score("x", answer(GOLD), sql, {"db_path": str(school_db)})["reason"]
    tool = trl_adapter.SQLToolEnvironment()
    tool.reset(db_path=str(school_db), gold_sql=GOLD)
    for sql in WRITES:
        # refused by the sandbox: SQL-Trail's invalid-action message (its Algorithm 1, lines 21-22)
        assert INVALID_ACTION in tool.run_sql(f"<think>t</think><sql>{sql}</sql>")
    assert folder_state(school_db.parent) == before  # same files, same bytes: no -wal, -journal, other.sqlite


# ----------------------------------------------------------------------------- time
def test_the_sandbox_timeout_bounds_a_call(school_db):
    settings = TaskSettings.model_validate({"sandbox": {"timeout_s": 0.3}})
    start = time.monotonic()
    scored = scoring.score_completion(answer(RUNAWAY), school_db, GOLD, "oneshot", settings)
    assert time.monotonic() - start < 3 * 0.3 + 1.0
    assert not scored.reason and scored.components["executable"] == 0.0  # the model's fault: scored, not floored
    start = time.monotonic()
    scored = scoring.score_completion(answer(GOLD), school_db, RUNAWAY, "oneshot", settings)
    assert time.monotonic() - start < 3 * 0.3 + 1.0
    assert scored.reason.startswith("gold_failed: timeout") and scored.total == 0.0


# ----------------------------------------------------------------------------- batches
BATCH = [GOLD, WRONG, "SELECT DISTINCT name FROM student WHERE age > 21", "SELECT name FROM student WHERE age >= 22",
         "SELECT nme FROM student", "SELECT name, age FROM student WHERE age > 21"]


@pytest.mark.parametrize("recipe", ["progress", "oneshot", "reasoning_sql"])
def test_a_batch_scores_as_one_by_one(school_db, recipe):
    fmt = rewards.get(recipe).fmt
    texts = [answer(sql, fmt) for sql in BATCH] + ["no tags", answer(GOLD, fmt)]
    dbs, golds = [school_db] * len(texts), [GOLD] * len(texts)
    dbs[-1] = school_db.parent / "absent.sqlite"
    one_by_one = [scoring.score_completion(t, d, g, recipe) for t, d, g in zip(texts, dbs, golds)]
    batched = scoring.score_batch(texts, dbs, golds, recipe)
    assert [(s.total, s.components, s.reason) for s in batched] == [(s.total, s.components, s.reason)
                                                                      for s in one_by_one]
    assert one_by_one[0].correct and one_by_one[2].correct and not one_by_one[1].correct


def test_a_batch_through_the_process_pool_scores_as_one_by_one(school_db):
    texts = [answer(sql) for sql in BATCH] * 3
    expected = [scoring.score_completion(t, school_db, GOLD).total for t in texts]
    with SQLPool(2) as pool:
        assert pool.uses_processes
        reward = trl_adapter.reward_function("progress", pool=pool)
        assert reward([[]] * len(texts), texts, db_path=[str(school_db)] * len(texts),
                      gold_sql=[GOLD] * len(texts)) == expected


# ----------------------------------------------------------------------------- episodes
def test_an_episode_scores_as_the_project_rollout(school_db):
    """sql_tool: a tool call, then the final answer; the reward is the recipe's on the
    environment's own trajectory, and a step after the end is no turn."""
    script = [answer("SELECT count(*) FROM student", "trail").replace("<solution>", "<sql>").replace("</solution>", "</sql>"),
              answer(GOLD, "trail")]
    session = sessions.EpisodeSession("sql_tool")
    assert session.start(school_db, GOLD, question="Who is older than 21?")[1]["role"] == "user"
    first = session.step(script[0])
    assert not first.done and first.text.startswith("<observation>") and "30" in first.text
    assert session.step(script[1]).done and session.step(script[1]).counted is False
    reference = envs.get("exec_feedback")()
    reference.reset(example_from_row(GOLD, question="Who is older than 21?"), school_db)
    for text in script:
        reference.step(text)
    expected = rewards.get("sql_trail")(reference.episode.trajectory())
    scored = session.score()
    assert (scored.total, scored.components, scored.turns, scored.correct) == (expected.total, expected.components, 2,
                                                                                True)


def test_an_episode_needs_the_recipes_format():
    with pytest.raises(ValueError, match="speaks"):
        sessions.EpisodeSession("odt", "sql_trail")
    with pytest.raises(ValueError, match="multi-turn"):
        trl_adapter.reward_function("skyrl")


def test_the_adapters_judge_with_the_examples_semantics(school_db):
    """A row's ``semantics`` column reaches the verdict: under BIRD's set semantics a prediction
    that returns the gold's rows twice is right, under Spider's bag semantics it is not."""
    gold = "SELECT name FROM department"
    doubled = answer_text("think_sql", "t", "SELECT name FROM department UNION ALL SELECT name FROM department")
    by = {s: scoring.score_completion(doubled, str(school_db), gold, "oneshot", semantics=s) for s in ("spider", "bird")}
    assert by["bird"].components["correct"] > 0 and by["spider"].components["correct"] == 0
    batch = scoring.score_batch([doubled, doubled], [str(school_db)] * 2, [gold] * 2, "oneshot",
                                semantics=["spider", "bird"])
    assert [b.total for b in batch] == [by["spider"].total, by["bird"].total]
    info = {"db_path": str(school_db), "recipe": "oneshot", "semantics": "bird"}
    assert verl_adapter.compute_score("x", doubled, gold, info)["score"] == by["bird"].total


def test_a_gold_is_checked_as_the_verdict_compares_it(school_db):
    """A Spider gold with a spaced operator (``! =``, as some Spider golds are written) does not
    run as written, but its comparison view does: the adapters judge it as the environments
    do. Under BIRD the gold is run as written, so the example cannot be judged."""
    gold = "SELECT name FROM department WHERE name ! = 'Math'"
    text = answer("SELECT name FROM department WHERE name != 'Math'")
    env = envs.get("single_turn")()
    env.reset(example_from_row(gold, question="Which departments are not Math?"), school_db)
    env.step(text)
    assert env.episode.correct
    for scored in (scoring.score_completion(text, school_db, gold, "oneshot"),
                   *scoring.score_batch([text], [school_db], [gold], "oneshot")):
        assert scored.correct and not scored.floored
    bird = scoring.score_completion(text, school_db, gold, "oneshot", semantics="bird")
    assert bird.reason.startswith("gold_failed: syntax")
