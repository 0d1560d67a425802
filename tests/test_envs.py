"""Rollout environments driven by scripted policies on a real SQLite database, real ODT, real sandbox."""

from __future__ import annotations

import json
import sqlite3
import sys
from dataclasses import dataclass

import pytest

from progress_sql import envs, rewards
from progress_sql.params import settings_from_dict
from progress_sql.corpus.records import CorpusError, Example
from progress_sql.corpus.schema import read_tables_json, render_ddl
from progress_sql.envs import ScriptedPolicy, SchemaTexts, ddl_from_sqlite, rollout
from progress_sql.envs.exec_feedback import format_result
from progress_sql.envs.prompts import FINAL_ANSWER, INVALID_ACTION
from progress_sql.odt import FALLBACK_FEEDBACK, PARSE_ERROR, VALUE_MISMATCH, diagnose, feedback_text
from progress_sql.sql import BatchVerdicts, GoldCache, execute
from progress_sql.sql.worker import execute_isolated

GOLD = "SELECT name FROM student WHERE age > 20"
OLDER = Example(id="q1", db_id="school", question="Which students are older than 20?", gold_sql=GOLD, hardness="easy")
DEPTS = Example(
    id="q2", db_id="school", question="How many students are in each department?",
    gold_sql="SELECT T2.name, COUNT(*) FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id GROUP BY T2.name",
    hardness="medium",
)
COURSES = Example(id="q3", db_id="school", question="List the course titles.", gold_sql="SELECT title FROM course",
                  hardness="easy",
                  evidence="Titles are stored in course.title.")


def sql_out(sql: str, tag: str = "sql") -> str:
    return f"<think>Reasoning.</think>\n<{tag}>{sql}</{tag}>"


def answer(sql: str) -> str:
    return sql_out(sql, "solution")


def settings(**env):
    return settings_from_dict({"env": env})


def run_one(env, policy, example, db):
    """Drive one environment by hand: reset, then step until done."""
    env.reset(example, db)
    while not env.done:
        env.step(policy.generate([env.request()])[0])
    return env.episode


class Recording:
    """Wraps a policy and keeps every batch of prompts it was given."""

    def __init__(self, policy):
        self.policy, self.batches = policy, []

    def generate(self, batch):
        self.batches.append([[dict(m) for m in request.messages] for request in batch])
        return self.policy.generate(batch)


def summary(ep):
    """An episode without timings, for comparing runs."""
    turns = [(t.text, t.sql, t.correct, t.result and (t.result.rows, t.result.columns, t.result.error)) for t in ep.turns]
    return (ep.env, ep.example.id, ep.messages, turns, ep.tags, ep.k_star, ep.K, ep.correct, ep.done_reason)


# ----------------------------------------------------------------------------- odt_feedback
def test_odt_stops_at_first_correct_turn(school_db):
    policy = ScriptedPolicy([[sql_out("SELECT name FROM student"), sql_out(GOLD), sql_out("SELECT 1"), sql_out("SELECT 2")]])
    ep = run_one(envs.get("odt_feedback")(), policy, OLDER, school_db)
    assert (ep.k_star, ep.K, ep.done_reason, ep.correct) == (2, 2, "correct", True)
    assert policy.consumed == [2]  # turn 3 was never generated
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert ep.tags == [("WHERE_MISSING",), ()]
    assert [t.correct for t in ep.turns] == [False, True]
    assert ep.turns[0].result.ok and len(ep.turns[1].result.rows) == len(execute(school_db, GOLD).rows)


def test_odt_feedback_only_after_wrong_non_final_turns(school_db):
    wrong = [sql_out("SELECT name FROM student"), sql_out("SELECT age FROM student WHERE age > 20"),
             sql_out("SELECT name FROM course")]
    policy = ScriptedPolicy([wrong + [sql_out(GOLD)]])
    ep = run_one(envs.get("odt_feedback")(settings(max_turns=3)), policy, OLDER, school_db)
    assert (ep.k_star, ep.K, ep.done_reason, ep.correct, ep.max_turns) == (None, 3, "max_turns", False, 3)
    feedback = [m for m in ep.messages[2:] if m["role"] == "user"]
    assert len(feedback) == 2 and ep.messages[-1] == {"role": "assistant", "content": wrong[2]}
    assert policy.consumed == [3]
    assert all(tags for tags in ep.tags)  # the final turn is diagnosed (recorded) though not answered
    assert ep.tags[2] == diagnose("SELECT name FROM course", GOLD).tags


def test_odt_prompt_of_next_turn_holds_every_earlier_sql_and_feedback(school_db):
    outputs = [sql_out("SELECT name FROM student"), sql_out("SELECT name, age FROM student WHERE age > 20"),
               sql_out("SELECT name FROM student WHERE age > 20 LIMIT 3"), sql_out(GOLD)]
    policy = Recording(ScriptedPolicy([outputs]))
    ep = rollout(envs.get("odt_feedback"), policy, [OLDER], lambda _: school_db)[0]
    assert ep.k_star == 4 and len(policy.batches) == 4
    prompts = [batch[0] for batch in policy.batches]
    assert [m["role"] for m in prompts[0]] == ["system", "user"]
    for t in range(1, 4):
        sql = rewards.parse_output(outputs[t - 1], "think_sql").sql
        expected_feedback = diagnose(sql, GOLD).feedback
        assert expected_feedback.startswith("Feedback: your previous SQL has structural issues:")
        assert prompts[t] == prompts[t - 1] + [
            {"role": "assistant", "content": outputs[t - 1]},
            {"role": "user", "content": expected_feedback},
        ]
    # In order: every earlier SQL appears in the final prompt, each before the next.
    text = "\n".join(m["content"] for m in prompts[3])
    positions = [text.index(rewards.parse_output(o, "think_sql").sql) for o in outputs[:3]]
    assert positions == sorted(positions)


def test_odt_value_mismatch_when_only_a_literal_differs(school_db):
    pred = "SELECT name FROM student WHERE age > 21"
    assert execute(school_db, pred).rows != execute(school_db, GOLD).rows
    ep = run_one(envs.get("odt_feedback")(), ScriptedPolicy([[sql_out(pred), sql_out(GOLD)]]), OLDER, school_db)
    assert ep.tags[0] == (VALUE_MISMATCH,)
    assert ep.messages[3]["content"] == feedback_text((VALUE_MISMATCH,))
    assert "The structure matches; check the values and conditions." in ep.messages[3]["content"]


@pytest.mark.parametrize("output", ["I am not sure what to do.", sql_out("SELEC name FROM WHERE"), "<think>x</think><sql></sql>"])
def test_odt_fallback_feedback_on_garbage(school_db, output):
    ep = run_one(envs.get("odt_feedback")(), ScriptedPolicy([[output, sql_out(GOLD)]]), OLDER, school_db)
    assert ep.tags[0] == (PARSE_ERROR,)
    assert ep.messages[3]["content"] == FALLBACK_FEEDBACK.format(db_engine="SQLite")
    assert (ep.k_star, ep.K) == (2, 2)


# ----------------------------------------------------------------------------- single_turn
def test_single_turn_one_generation_in_the_recipe_format(school_db):
    env = envs.get("single_turn")(fmt="reasoning_answer")
    messages = env.reset(OLDER, school_db)
    assert "<reasoning>reasoning</reasoning> then <answer>SQL</answer>" in messages[0]["content"]
    result = env.step(f"<reasoning>r</reasoning>\n<answer>{GOLD}</answer>")
    assert result.done and result.messages_to_append == []
    ep = env.episode
    assert (ep.K, ep.k_star, ep.correct, ep.done_reason) == (1, 1, True, "single")
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("again")
    with pytest.raises(ValueError, match="format must be one of"):
        envs.get("single_turn")(fmt="trail")


# ----------------------------------------------------------------------------- exec_feedback
def test_exec_observation_table_with_turns_left(school_db):
    policy = ScriptedPolicy([[sql_out("SELECT stu_id, name FROM student WHERE stu_id <= 3 ORDER BY stu_id"), answer(GOLD)]])
    ep = run_one(envs.get("exec_feedback")(), policy, OLDER, school_db)
    assert ep.messages[3] == {"role": "user", "content": (
        "<observation>\nstu_id | name\n1 | s1\n2 | s2\n3 | s3\n"
        "You have 10 turns left to complete the task.\n</observation>"  # T − t with t = 0 (Algorithm 1)
    )}
    assert (ep.done_reason, ep.correct, ep.K, ep.max_turns) == ("solution", True, 2, 11)


def test_exec_observation_truncated_at_max_rows_and_chars(school_db):
    env_settings = settings().env
    many = execute(school_db, "SELECT * FROM enrolment")
    assert len(many.rows) > 50
    text = format_result(many, env_settings)
    lines = text.split("\n")
    assert lines[0] == "stu_id | course_id | grade" and len(lines) == 1 + 50 + 1
    assert lines[-1] == f"(truncated: showing 50 of {len(many.rows)} rows)"

    wide = execute(school_db, "SELECT printf('%0600d', stu_id) AS wide FROM student")  # 30 rows of 600 chars
    text = format_result(wide, env_settings)
    table, note = text.rsplit("\n", 1)
    assert len(table) <= 9000 < len(table) + 601  # as many whole rows as fit
    shown = table.count("\n")
    assert note == f"(truncated: showing {shown} of 30 rows)" and shown == (9000 - 4) // 601
    assert all(len(row) == 600 for row in table.split("\n")[1:])

    small = settings(observation_max_rows=2, observation_max_chars=100).env
    assert format_result(execute(school_db, "SELECT name FROM department ORDER BY dept_id"), small) == (
        "name\nPhysics\nHistory\n(truncated: showing 2 of 3 rows)"
    )
    assert format_result(execute(school_db, "SELECT name FROM student WHERE age > 99"), small) == "name\n(no rows)"


def test_exec_error_observation_and_invalid_action(school_db):
    """SQL-Trail's Algorithm 1, lines 21-22: an invalid execution is answered with the
    invalid-action message; so is an output with no tool call at all."""
    policy = ScriptedPolicy([[sql_out("SELECT nope FROM student"), "<think>Let me think.</think>", answer(GOLD)]])
    ep = run_one(envs.get("exec_feedback")(), policy, OLDER, school_db)
    assert ep.messages[3]["content"] == (
        f"<observation>\n{INVALID_ACTION}\nYou have 10 turns left to complete the task.\n</observation>"
    )
    assert not ep.turns[0].result.ok and ep.turns[0].result.error == "runtime"  # the error is kept on the turn
    assert ep.messages[5]["content"] == (
        f"<observation>\n{INVALID_ACTION}\nYou have 9 turns left to complete the task.\n</observation>"
    )
    assert INVALID_ACTION == "Your previous action is invalid. Think and try again."
    assert (ep.K, ep.done_reason, ep.correct, ep.k_star) == (3, "solution", True, 3)
    assert ep.turns[1].sql is None and ep.turns[1].result is None  # the invalid action counts as a turn


def test_exec_forced_final_answer_when_budget_runs_out(school_db):
    calls = [sql_out("SELECT COUNT(*) FROM student"), sql_out(GOLD)]
    policy = ScriptedPolicy([calls + [answer(GOLD), answer("SELECT 1")]])
    ep = run_one(envs.get("exec_feedback")(settings(trail_max_turns=2)), policy, OLDER, school_db)
    last_observation = ep.messages[5]["content"]
    assert "You have 1 turns left to complete the task.\n</observation>" in last_observation  # T − (T − 1)
    assert last_observation.endswith(FINAL_ANSWER)
    assert (ep.K, ep.done_reason, ep.correct, ep.k_star, policy.consumed) == (3, "solution", True, 2, [3])

    # A forced answer that is not a <solution> ends the episode all the same, and is wrong even
    # though its tool call returned the gold's rows.
    policy = ScriptedPolicy([calls + [sql_out(GOLD), answer(GOLD)]])
    ep = run_one(envs.get("exec_feedback")(settings(trail_max_turns=2)), policy, OLDER, school_db)
    assert (ep.K, ep.done_reason, ep.correct, policy.consumed) == (3, "no_solution", False, [3])
    assert ep.turns[-1].correct  # the execution matched, but it is not an answer


# ----------------------------------------------------------------------------- batched driver
@pytest.mark.parametrize("name", ["odt_feedback", "exec_feedback"])
def test_batched_rollout_equals_running_each_alone(school_db, name):
    fmt_out = sql_out if name == "odt_feedback" else answer
    scripts = [
        [fmt_out(GOLD)],  # correct at once
        [sql_out("SELECT name FROM department"), sql_out("SELECT COUNT(*) FROM student"),
         fmt_out(DEPTS.gold_sql)],  # three turns
        [sql_out("SELECT 1")] * 4 + [answer("SELECT 1")] * 7,  # never right
    ]
    examples = [OLDER, DEPTS, COURSES]
    factory = lambda: envs.get(name)(settings(max_turns=4, trail_max_turns=4))  # noqa: E731
    recording = Recording(ScriptedPolicy(scripts))
    together = rollout(factory, recording, examples, lambda _: school_db)
    alone = [rollout(factory, ScriptedPolicy([s]), [ex], lambda _: school_db)[0] for s, ex in zip(scripts, examples)]
    assert [summary(e) for e in together] == [summary(e) for e in alone]
    assert [e.K for e in together] == [1, 3, 4 if name == "odt_feedback" else 5]
    # One generate call per turn, with the episodes still running.
    assert [len(b) for b in recording.batches] == [3, 2, 2, 1] + ([1] if name == "exec_feedback" else [])


def test_rollout_judges_a_round_at_once_and_names_each_request_by_its_episode(school_db, monkeypatch):
    @dataclass
    class Generation:  # what a trainer's policy returns: text plus the sampled token ids
        text: str
        token_ids: tuple[int, ...]

    class RecordPolicy:
        def __init__(self):
            self.requests = []

        def generate(self, batch):
            self.requests += batch
            return [Generation(sql_out(GOLD), (1, 2, 3)) for _ in batch]

    executed = []  # the candidates' queries the judge runs (gold queries go through the cache)

    def counting(db_path, sql, **kwargs):
        executed.append(sql)
        return execute_isolated(db_path, sql, **kwargs)

    monkeypatch.setattr(sys.modules["progress_sql.sql.verdict"], "execute_isolated", counting)  # the module, not sql.verdict()
    policy = RecordPolicy()
    assert isinstance(policy, envs.Policy)
    cache = GoldCache()
    episodes = rollout(envs.get("odt_feedback"), policy, [OLDER, DEPTS, OLDER], lambda _: school_db,
                       judge=BatchVerdicts(gold_cache=cache))
    assert cache.misses == 2
    # the three round-1 outputs are one query, run once; DEPTS's later rounds (its T turns) once each
    assert executed == [GOLD] * episodes[1].K and episodes[1].K == 4
    # round 1 asks for every episode, then only DEPTS's (OLDER's gold is wrong for it) goes on
    assert [e.id for e in episodes] == [r.episode_id for r in policy.requests[:3]] == [0, 1, 2]
    assert {r.episode_id for r in policy.requests[3:]} == {1} and not episodes[1].correct
    assert [r.example for r in policy.requests[:3]] == [OLDER, DEPTS, OLDER] and episodes[0].correct
    assert all(r.fmt == "think_sql" and r.messages == e.messages[:2] for r, e in zip(policy.requests, episodes))

    class Short:
        def generate(self, batch):
            return []

    with pytest.raises(ValueError, match="0 outputs for 1 conversations"):
        rollout(envs.get("single_turn"), Short(), [OLDER], lambda _: school_db)
    with pytest.raises(TypeError, match="policy output must be str"):
        envs.output_text(42)


# ----------------------------------------------------------------------------- rewards
def test_trajectories_score_with_the_recipes(school_db):
    odt = run_one(envs.get("odt_feedback")(), ScriptedPolicy([[sql_out("SELECT name FROM student"), sql_out(GOLD)]]),
                  OLDER, school_db)
    out = rewards.get("progress")(odt.trajectory())
    assert (out.info["k_star"], out.info["K"]) == (2, 2)
    assert out.components["late"] == pytest.approx(2.0 * 0.5)
    assert odt.trajectory().max_turns == 4 and odt.trajectory().difficulty == "easy"

    one = run_one(envs.get("single_turn")(), ScriptedPolicy([[sql_out(GOLD)]]), OLDER, school_db)
    out = rewards.get("oneshot")(one.trajectory())
    assert out.components == {"correct": 2.0, "executable": 0.5, "format": 0.5}

    trail = run_one(envs.get("exec_feedback")(), ScriptedPolicy([[sql_out("SELECT name FROM student LIMIT 2"), answer(GOLD)]]),
                    OLDER, school_db)
    out = rewards.get("sql_trail")(trail.trajectory())
    assert (out.info["t"], out.components["exec"], out.components["format"]) == (1, 5.0, 1.0)
    assert rewards.get("skyrl")(trail.trajectory()).info["outcome"] == "correct"


# ----------------------------------------------------------------------------- prompts and schema text
def test_round1_messages_follow_appendix_f(school_db):
    env = envs.get("odt_feedback")(settings(prompt_style="paper"))
    system, user = env.reset(COURSES, school_db)
    assert system["role"] == "system" and system["content"].startswith("Task Overview: You are a data science expert.")
    assert "Database Engine: SQLite" in system["content"]
    assert system["content"].endswith("<think>Your step-by-step reasoning here.</think>\n<sql>SELECT ...</sql>")
    ddl = ddl_from_sqlite(school_db)
    assert user["content"] == (
        f"Database Schema:\n{ddl}\nThis schema describes the database's structure, including tables, columns, "
        "primary keys, foreign keys, and any relevant relationships or constraints.\n\n"
        "External Knowledge:\nTitles are stored in course.title.\n\nQuestion:\nList the course titles."
    )
    assert "External Knowledge" not in envs.user_prompt(OLDER, ddl)
    trail = envs.system_prompt("trail", settings(trail_max_turns=7, prompt_style="paper").env)
    assert "at most 7 times" in trail and "<solution>...</solution>" in trail and "<observation>" in trail
    with pytest.raises(ValueError, match="unknown output format"):
        envs.system_prompt("xml")


def test_compact_prompt_style_one_line_system_and_table_lines(school_db, tmp_path):
    env = envs.get("odt_feedback")()  # the default style: compact
    system, user = env.reset(COURSES, school_db)
    assert system["content"] == ("Write one SQLite query for the question. "
                                 "Output <think>reasoning</think> then <sql>SQL</sql>.")
    schema = user["content"].split("Database Schema:\n")[1].split("\nThis schema")[0]
    # no tables.json: the file's DDL, parsed, one line per table, then the foreign keys
    assert schema.splitlines() == [
        "- department: dept_id, name, budget",
        "- student: stu_id, name, age, dept_id",
        "- course: course_id, title, credits, dept_id",
        "- enrolment: stu_id, course_id, grade",
        "- student.dept_id = department.dept_id",
        "- course.dept_id = department.dept_id",
        "- enrolment.stu_id = student.stu_id",
        "- enrolment.course_id = course.course_id",
    ]
    assert user["content"].endswith("Question:\nList the course titles.")
    trail = envs.system_prompt("trail", settings(trail_max_turns=7).env)
    assert "up to 7 queries" in trail and "<solution>" in trail and "<observation>" in trail
    with pytest.raises(ValueError, match="unknown prompt style"):
        SchemaTexts(prompt_style="verbose")


def test_ddl_from_sqlite_and_tables_json(school_db, tmp_path):
    ddl = ddl_from_sqlite(school_db)
    names = [block.split("(")[0].split()[-1] for block in ddl.split("\n\n")]
    assert names == ["department", "student", "course", "enrolment"]
    with pytest.raises(CorpusError, match="cannot read the schema"):
        ddl_from_sqlite(tmp_path / "missing.sqlite")

    entry = {
        "db_id": "school",
        "table_names_original": ["department"], "table_names": ["department"],
        "column_names_original": [[-1, "*"], [0, "dept_id"], [0, "name"]],
        "column_names": [[-1, "*"], [0, "department id"], [0, "name"]],
        "column_types": ["text", "number", "text"], "primary_keys": [1], "foreign_keys": [],
    }
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps([entry]))
    texts = SchemaTexts(tables, "paper")
    assert texts("school", school_db) == render_ddl(read_tables_json(tables)["school"])
    assert SchemaTexts(tables)("school", school_db) == "- department: dept_id, name"  # default: compact
    assert texts("other", school_db) == ddl  # no entry: read from the file

    con = sqlite3.connect(school_db)  # a rebuilt file is read again
    con.execute("CREATE TABLE club (club_id INTEGER)")
    con.commit()
    con.close()
    assert texts("other", school_db).endswith("CREATE TABLE club (club_id INTEGER);")


# ----------------------------------------------------------------------------- contracts
def test_registry_policy_and_env_contracts(school_db, tmp_path):
    assert envs.names()[:3] == ("single_turn", "odt_feedback", "exec_feedback")  # a new one goes after
    with pytest.raises(KeyError, match="known: single_turn, odt_feedback, exec_feedback"):
        envs.get("nope")
    env = envs.get("odt_feedback")()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("x")
    with pytest.raises(FileNotFoundError, match="not found"):
        env.reset(OLDER, tmp_path / "missing.sqlite")

    with pytest.raises(TypeError, match="one per conversation"):
        ScriptedPolicy(["a", "b"])
    policy = ScriptedPolicy([["only one"]])
    conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert policy.generate([envs.Request(conversation, "think_sql", episode_id=0)]) == ["only one"]
    with pytest.raises(IndexError, match="no output left"):
        policy.generate([envs.Request(conversation, "think_sql", episode_id=0)])
    with pytest.raises(ValueError, match="episode 1 has no script"):
        policy.generate([envs.Request(conversation, "think_sql", episode_id=1)])
    with pytest.raises(ValueError, match="needs its episode_id"):
        policy.generate([envs.Request(conversation, "think_sql")])
