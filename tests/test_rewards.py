"""Reward recipes: hand-computed values on small trajectories, formats, components, judge, registry.

Expected values are written as arithmetic over the settings' weights, never as bare numbers.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from progress_sql import rewards
from progress_sql.params import RewardSettings, default_settings, settings_from_dict
from progress_sql.odt import structural_score
from progress_sql.rewards import Trajectory, Turn, make_turn, parse_output
from progress_sql.rewards.components import (
    exec_match,
    executable,
    format_ok,
    ngram_similarity,
    schema_items,
    schema_linking,
)
from progress_sql.formats import strip_fences
from progress_sql.rewards.judge import (
    JudgeError,
    LocalJudge,
    OpenAIJudge,
    build_prompt,
    make_judge,
    parse_score,
)
from progress_sql.rewards.progress import first_correct_turn, progress_terms
from progress_sql.rewards.sql_trail import tool_calls
from progress_sql.sql import execute, hardness
from progress_sql.sql.parse import SQLParseError, parse_one
from progress_sql.sql.result import ExecResult

from conftest import REPO

S = default_settings()
W = S.rewards
P = W.progress
GOLD = "SELECT name FROM student WHERE age > 20"
OK = ExecResult(rows=(("s1",),), columns=("name",))
ERR = ExecResult(error="syntax", message="near 'SELEC': syntax error")


def think(sql: str) -> str:
    return f"<think>reasoning</think>\n<sql>{sql}</sql>"


def answer(sql: str) -> str:
    return f"<reasoning>steps</reasoning><answer>{sql}</answer>"


def call(sql: str) -> str:
    return f"<think>probe</think><sql>{sql}</sql>"


def solution(sql: str) -> str:
    return f"<think>done</think><solution>{sql}</solution>"


def turn(text: str, fmt: str = "think_sql", *, runs: bool = True, correct: bool = False) -> Turn:
    """A turn whose SQL is what the format parser extracts; ``runs``: it executed fine."""
    sql = parse_output(text, fmt).sql
    result = None if sql is None else (OK if runs else ERR)
    return Turn(text=text, sql=sql, result=result, correct=correct)


def traj(*turns: Turn, gold: str = GOLD, max_turns: int = 4, difficulty: str = "", **kw) -> Trajectory:
    return Trajectory(turns=turns, gold_sql=gold, db_id="school", difficulty=difficulty, max_turns=max_turns, **kw)


def assert_output(out, recipe_name: str) -> None:
    recipe = rewards.get(recipe_name)
    assert tuple(out.components) == recipe.components
    assert out.total == pytest.approx(sum(out.components.values()))


# ============================================================================ formats
class TestFormats:
    def test_think_sql_well_formed_and_fenced(self):
        p = parse_output("  <think>plan</think>\n<sql>```sql\nSELECT 1\n```</sql>\n", "think_sql")
        assert (p.well_formed, p.sql, p.kind, p.reason) == (True, "SELECT 1", "sql", "")

    def test_reasoning_answer(self):
        p = parse_output(answer("SELECT a FROM t"), "reasoning_answer")
        assert (p.well_formed, p.sql, p.kind) == (True, "SELECT a FROM t", "answer")
        assert not parse_output(think("SELECT 1"), "reasoning_answer").well_formed

    def test_trail_tool_call_and_solution(self):
        tool, final = parse_output(call("SELECT 1"), "trail"), parse_output(solution("SELECT 2"), "trail")
        assert (tool.well_formed, tool.sql, tool.kind) == (True, "SELECT 1", "sql")
        assert (final.well_formed, final.sql, final.kind) == (True, "SELECT 2", "solution")

    def test_trail_rejects_observation_and_two_actions(self):
        p = parse_output(call("SELECT 1") + "<observation>rows</observation>", "trail")
        assert not p.well_formed and "observation" in p.reason and p.sql == "SELECT 1"
        both = parse_output("<think>x</think><sql>SELECT 1</sql><solution>SELECT 2</solution>", "trail")
        assert not both.well_formed and both.kind == "solution" and both.sql == "SELECT 2"

    @pytest.mark.parametrize(
        ("text", "reason_part", "sql"),
        [
            ("<sql>SELECT 1</sql>", "expected tags", "SELECT 1"),  # no think block
            ("<think>x</think>prose<sql>SELECT 1</sql>", "outside", "SELECT 1"),
            ("<think>x</think><sql>SELECT 1</sql> trailing", "outside", "SELECT 1"),
            ("<think>x</think><sql>   </sql>", "empty", None),
            ("<think>a <sql>SELECT 0</sql></think><sql>SELECT 1</sql>", "more than once", "SELECT 1"),
            ("<think><think>x</think></think><sql>SELECT 1</sql>", "more than once", "SELECT 1"),
            ("<sql>SELECT 1</sql><think>x</think>", "expected tags", "SELECT 1"),  # wrong order
            ("<think>x</think><sql>SELECT name FROM t", "expected tags", "SELECT name FROM t"),  # truncated
            ("<think>x", "expected tags", None),
            ("plain SELECT 1", "found none", None),
            ("", "found none", None),
        ],
    )
    def test_malformed_think_sql(self, text, reason_part, sql):
        p = parse_output(text, "think_sql")
        assert not p.well_formed and reason_part in p.reason
        assert p.sql == sql

    def test_last_complete_block_wins(self):
        p = parse_output("<sql>SELECT 1</sql><sql>SELECT 2</sql><sql>SELECT 3", "think_sql")
        assert p.sql == "SELECT 2"

    def test_fences(self):
        assert strip_fences("```SQL\nSELECT 1\n```") == "SELECT 1"
        assert strip_fences("```sqlite SELECT 1```") == "SELECT 1"
        assert strip_fences("```\nSELECT 1") == "SELECT 1"
        assert strip_fences(" SELECT 1 ") == "SELECT 1"
        assert strip_fences("```sqlx```") == "sqlx"  # 'sqlx' is not a language tag

    def test_hostile_sizes_and_types(self):
        huge = "<think>" * 200_000 + "(" * 500_000 + "<sql>" + "a" * 1_000_000
        p = parse_output(huge, "think_sql")
        assert not p.well_formed and p.sql == "a" * 1_000_000
        assert not parse_output("<" * 1_000_000, "trail").well_formed
        assert parse_output(None, "think_sql").reason == "output is NoneType, not text"  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown output format"):
            parse_output("x", "xml")  # type: ignore[arg-type]


# ============================================================================ components
class TestComponents:
    def test_format_ok(self):
        assert format_ok(think("SELECT 1"), "think_sql") and not format_ok("SELECT 1", "think_sql")

    def test_ngram_similarity_by_hand(self):
        # GOLD tokens: select name from student where age > 20 -> 7 bigrams;
        # the prediction's 3 bigrams (select name, name from, from student) are all among them.
        assert ngram_similarity("SELECT name FROM student", GOLD, 2) == pytest.approx(3 / 7)
        assert ngram_similarity(GOLD, GOLD) == 1.0
        assert ngram_similarity(None, GOLD) == 0.0
        # unigrams: {select, name, from, student} of 8 gold tokens
        assert ngram_similarity("SELECT name FROM student", GOLD, 1) == pytest.approx(4 / 8)

    def test_schema_items_aliases_and_qualification(self):
        sql = ("SELECT T1.name, count(*) AS cnt FROM student AS T1 JOIN department AS T2 "
               "ON T1.dept_id = T2.dept_id GROUP BY T2.name ORDER BY cnt")
        assert schema_items(sql) == {
            "student", "department", "student.name", "student.dept_id", "department.dept_id", "department.name"}
        # one table: unqualified columns take its name; case is folded
        assert schema_items("SELECT Name FROM Student WHERE AGE > 3") == {"student", "student.name", "student.age"}
        # two tables, unqualified column: ambiguous, kept bare
        assert "age" in schema_items("SELECT a.x FROM a, b WHERE age > 3")

    def test_schema_items_nested_scopes_and_ctes(self):
        nested = "SELECT name FROM student WHERE dept_id IN (SELECT dept_id FROM department WHERE budget > 5)"
        assert schema_items(nested) == {
            "student", "student.name", "student.dept_id", "department", "department.dept_id", "department.budget"}
        cte = "WITH x AS (SELECT dept_id AS d FROM student) SELECT x.d FROM x"
        assert schema_items(cte) == {"student", "student.dept_id", "d"}  # x is not a schema table
        assert schema_items("SELECT count(*) FROM singer") == {"singer"}
        assert schema_items("SELECT nonsense FROM (") == set()
        assert schema_items(None) == set() and schema_items("") == set()

    def test_schema_linking(self):
        pred = "SELECT name FROM student"  # {student, student.name}
        # gold {student, student.name, student.age}: 2 shared of 3
        assert schema_linking(pred, GOLD) == pytest.approx(2 / 3)
        assert schema_linking("SELECT s.name FROM student AS s WHERE s.age > 99", GOLD) == 1.0
        assert schema_linking("SELEC name FRM student", GOLD) == 0.0
        assert schema_linking(None, GOLD) == 0.0

    def test_executable_and_match(self):
        assert executable(Turn("t", "SELECT 1", OK)) and not executable(Turn("t", "SELEC", ERR))
        assert not executable(Turn("t", None, None)) and not executable(Turn("t", "SELECT 1", None))
        assert exec_match(Turn("t", "SELECT 1", OK, True)) and not exec_match(Turn("t", "SELECT 1", OK))


# ============================================================================ progress
class TestProgress:
    recipe = rewards.get("progress")

    def test_first_turn_correct(self):
        out = self.recipe(traj(turn(think(GOLD), correct=True)), W)
        # single turn: Δ = 0 → ω_align−; correct at k* = 1: ω_acc·γ^0; executable → executable: ω_keep
        assert out.components == {"align": P.align_neg, "late": P.acc, "exec": P.keep, "format": P.format, "improve": 0.0}
        assert out.total == pytest.approx(P.align_neg + P.acc + P.keep + P.format)
        assert (out.info["k_star"], out.info["K"], out.info["delta"]) == (1, 1, 0.0)
        assert_output(out, "progress")

    @pytest.mark.parametrize("k", [2, 3, 4])
    def test_correct_at_turn_k_after_recovery(self, k):
        # turn 1 has no SQL (F = 0, not executable); turns 2..k-1 wrong; turn k is the gold (F = 1)
        turns = [turn("I cannot answer")] + [turn(think("SELECT 1"))] * (k - 2) + [turn(think(GOLD), correct=True)]
        out = self.recipe(traj(*turns), W)
        assert out.info["F_first"] == 0.0 and out.info["F_last"] == pytest.approx(1.0)
        assert out.components == pytest.approx(
            {"align": P.align_pos * 1.0, "late": P.acc * P.gamma ** (k - 1), "exec": P.recover, "format": P.format,
             "improve": 0.0})
        assert out.info["k_star"] == k == out.info["K"]

    def test_never_correct_stagnant(self):
        same = think("SELECT name FROM student")
        out = self.recipe(traj(*[turn(same)] * 4), W)
        assert out.info["delta"] == 0.0 and out.info["k_star"] is None
        assert out.components == {"align": P.align_neg, "late": 0.0, "exec": P.keep, "format": P.format, "improve": 0.0}

    def test_positive_progress_without_success(self):
        pred = "SELECT name FROM student"
        out = self.recipe(traj(turn("no sql here"), turn(think(pred))), W)
        f_last = 0.5 * (structural_score(pred, GOLD) + 3 / 7)  # 3 of 7 gold bigrams, see above
        assert out.info["F_last"] == pytest.approx(f_last)
        assert out.components["align"] == pytest.approx(P.align_pos * f_last)
        assert out.components["exec"] == P.recover and out.components["late"] == 0.0

    def test_deterioration_and_bad_final_format(self):
        # executable first turn, final turn unparsable and not executable, and no tags at all
        first = turn(think("SELECT name FROM student WHERE age > 3"))
        last = Turn(text="SELEC name FRM student", sql=None, result=None, correct=False)
        out = self.recipe(traj(first, last), W)
        assert out.info["F_last"] == 0.0 and out.info["delta"] < 0
        assert out.components == {"align": P.align_neg, "late": 0.0, "exec": P.deteriorate, "format": 0.0,
                                  "improve": 0.0}

    def test_unparsable_sql_uses_lexical_fallback(self):
        bad = "SELEC name FROM student WHERE age > 20"  # sqlglot cannot parse it
        out = self.recipe(traj(turn("nothing"), turn(think(bad), runs=False)), W)
        # F_struct = 0; bigrams of the prediction: selec name, name from, from student, student where,
        # where age, age >, > 20 -> 6 of them are gold bigrams, union 8
        assert out.info["F_struct_last"] == 0.0
        assert out.info["F_last"] == pytest.approx(0.5 * (0 + 6 / 8))
        assert out.components["exec"] == 0.0  # not executable → not executable

    def test_correct_beyond_budget_earns_no_latency_reward(self):
        turns = [turn(think("SELECT 1"))] * 4 + [turn(think(GOLD), correct=True)]
        assert self.recipe(traj(*turns, max_turns=4), W).components["late"] == 0.0

    def test_weights_come_from_settings(self):
        custom = settings_from_dict({"rewards": {"progress": {"gamma": 0.9, "acc": 3.0, "format": 0.0}}})
        turns = [turn("x"), turn(think("SELECT 1")), turn(think(GOLD), correct=True)]
        out = self.recipe(traj(*turns), custom)  # the whole Settings is accepted too
        assert out.components["late"] == pytest.approx(3.0 * 0.9 ** 2) and out.components["format"] == 0.0
        assert self.recipe(traj(*turns)).total == self.recipe(traj(*turns), W).total  # None → defaults

    def test_progress_terms_and_first_correct_turn(self):
        terms = progress_terms(0.5, 2, 4, False, True, True, P)
        assert terms == {"align": P.align_pos * 0.5, "late": P.acc * P.gamma, "exec": P.recover, "format": P.format,
                         "improve": 0.0}
        assert progress_terms(-0.2, None, 4, False, False, False, P) == {
            "align": P.align_neg, "late": 0.0, "exec": 0.0, "format": 0.0, "improve": 0.0}
        t = traj(turn("a"), turn("b", correct=True), turn("c", correct=True))
        assert first_correct_turn(t) == 2

    # ------------------------------------------------------------------ issue 53: revising options
    def test_improvement_bonus_pays_wrong_to_right_and_charges_right_to_wrong(self):
        """rewards.progress.improve = α adds α·(c_K − c_1); the other terms stay as they were."""
        alpha = 0.3
        bonus = RewardSettings(progress={"improve": alpha})
        wrong, right = turn(think("SELECT 1")), turn(think(GOLD), correct=True)
        for turns, change in (((wrong, right), 1), ((right, wrong), -1), ((right,), 0), ((wrong, wrong), 0)):
            paper, out = self.recipe(traj(*turns), W), self.recipe(traj(*turns), bonus)
            assert out.components == {**paper.components, "improve": alpha * change}, turns
            assert out.total == pytest.approx(paper.total + alpha * change)
            assert paper.components["improve"] == 0.0  # the default: the paper's reward
        assert self.recipe.bounds(bonus) == pytest.approx(
            (self.recipe.min_reward(W) - alpha, self.recipe.max_reward(W) + alpha))

    def test_a_repeated_final_sql_earns_no_align_or_exec_credit_when_asked(self):
        """rewards.progress.repeat_credit: false: a final SQL equal to an earlier turn's, up to
        whitespace, a final ';' and the case of keywords and names, earns neither R_exec's keep /
        recover nor a positive R_align; a deterioration keeps its malus. Default: the paper's."""
        strict = RewardSettings(progress={"repeat_credit": False})
        first = "SELECT name FROM student WHERE age > 21"
        again = turn(think("select  NAME\nfrom Student where AGE>21 ;"))
        kept = traj(turn(think(first)), again)
        assert self.recipe(kept, W).components["exec"] == P.keep and self.recipe(kept, W).info["repeat"]
        assert self.recipe(kept, strict).components == {"align": P.align_neg, "late": 0.0, "exec": 0.0,
                                                       "format": P.format, "improve": 0.0}
        # turn 3 repeats turn 2, which recovered from no SQL and got closer to the gold
        closer = traj(turn("no sql"), turn(think(first)), again)
        paper, out = self.recipe(closer, W), self.recipe(closer, strict)
        assert paper.components["align"] > 0 and paper.components["exec"] == P.recover
        assert (out.components["align"], out.components["exec"]) == (P.align_neg, 0.0)
        broken = turn(think("SELEC name FROM student"), runs=False)
        worse = traj(turn(think(first)), broken, broken)
        assert self.recipe(worse, strict).components["exec"] == P.deteriorate
        # not repeats: a literal of another case, no SQL twice, another query
        by_name = think("SELECT name FROM student WHERE name = 's1'")
        for texts in ((by_name, think("SELECT name FROM student WHERE name = 'S1'")), ("no sql", "no sql"),
                      (by_name, think(GOLD))):
            t = traj(*map(turn, texts))
            assert self.recipe(t, strict) == self.recipe(t, W) and not self.recipe(t, W).info["repeat"], texts

    @pytest.mark.parametrize("key, value, why", [("improve", "-1", "greater than or equal to 0"),
                                                 ("improve", "lots", "a valid number"),
                                                 ("repeat_credit", "maybe", "a valid boolean")])
    def test_bad_revising_options_exit_2_naming_the_key(self, key, value, why, tmp_path):
        exe = Path(sys.executable).with_name("progress-sql")
        done = subprocess.run([str(exe), "train", "rl", "--params", str(REPO / "params.yaml"),
                               "--set", f"rewards.progress.{key}={value}"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert f"rewards.progress.{key}: Input should be {why}" in done.stderr and "Traceback" not in done.stderr


# ============================================================================ oneshot
class TestOneShot:
    recipe = rewards.get("oneshot")
    weights = W.oneshot

    def test_terms_add(self):
        assert self.recipe(traj(turn(think(GOLD), correct=True), max_turns=1), W).total == pytest.approx(
            self.weights.correct + self.weights.executable + self.weights.format)

    @pytest.mark.parametrize(
        ("text", "runs", "correct", "expected"),
        [
            (think("SELECT 1"), True, False, ("executable", "format")),
            (think("SELEC 1"), False, False, ("format",)),
            ("SELECT 1", False, False, ()),  # no tags: nothing extracted
            ("<sql>" + GOLD + "</sql>", True, True, ("correct", "executable")),  # no think block
        ],
    )
    def test_partial(self, text, runs, correct, expected):
        out = self.recipe(traj(turn(text, runs=runs, correct=correct), max_turns=1), W)
        assert out.total == pytest.approx(sum(getattr(self.weights, k) for k in expected))
        assert_output(out, "oneshot")

    def test_scores_the_final_turn(self):
        out = self.recipe(traj(turn(think(GOLD), correct=True), turn("garbage")), W)
        assert out.total == 0.0


# ============================================================================ reasoning-sql
class RecordingJudge:
    def __init__(self, value):
        self.value, self.calls = value, []

    def score(self, question, schema, pred_sql, gold_sql):
        self.calls.append((question, schema, pred_sql, gold_sql))
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class TestReasoningSQL:
    recipe = rewards.get("reasoning_sql")
    R = W.reasoning_sql

    def weight_sum(self):
        return sum(getattr(self.R, k) for k in ("exec", "judge", "syntax", "schema_linking", "ngram", "format"))

    def test_correct_with_judge_is_the_maximum_and_judge_not_asked(self):
        judge = RecordingJudge(RuntimeError("must not be called"))
        out = self.recipe(traj(turn(answer(GOLD), "reasoning_answer", correct=True)), W, judge=judge)
        assert out.total == pytest.approx(self.weight_sum()) and judge.calls == []
        assert out.components["judge"] == self.R.judge and out.info["judge"].startswith("not asked")

    def test_wrong_answer_is_judged(self):
        pred = "SELECT name FROM student"
        judge = RecordingJudge(0.25)
        t = traj(turn(answer(pred), "reasoning_answer"), question="Who is older than 20?", schema="CREATE TABLE student")
        out = self.recipe(t, W, judge=judge)
        assert judge.calls == [("Who is older than 20?", "CREATE TABLE student", pred, GOLD)]
        assert out.components == pytest.approx({
            "exec": 0.0,
            "judge": self.R.judge * 0.25,
            "syntax": self.R.syntax,
            "schema_linking": self.R.schema_linking * 2 / 3,  # see TestComponents.test_schema_linking
            "ngram": self.R.ngram * 3 / 7,
            "format": self.R.format,
        })

    def test_judge_off_redistributes(self):
        out = self.recipe(traj(turn(answer(GOLD), "reasoning_answer", correct=True)), W)
        factor = self.weight_sum() / (self.weight_sum() - self.R.judge)
        assert out.components["judge"] == 0.0
        assert out.components["exec"] == pytest.approx(self.R.exec * factor)
        assert out.total == pytest.approx(self.weight_sum())  # the maximum is unchanged
        assert "judge off" in out.info["notes"][0] and str(self.R.judge) in out.info["notes"][0]

    @pytest.mark.parametrize("bad", [RuntimeError("down"), 1.5, float("nan"), "0.3"])
    def test_failing_judge_scores_zero_with_a_note(self, bad):
        out = self.recipe(traj(turn(answer("SELECT 1"), "reasoning_answer")), W, judge=RecordingJudge(bad))
        assert out.components["judge"] == 0.0 and "judge failed" in out.info["notes"][0]

    def test_no_sql_is_not_judged(self):
        judge = RecordingJudge(0.9)
        out = self.recipe(traj(turn("I don't know", "reasoning_answer")), W, judge=judge)
        assert judge.calls == [] and out.total == 0.0

    def test_local_judge_through_make_judge(self):
        settings = RewardSettings.model_validate({"reasoning_sql": {"judge_backend": "local"}})
        judge = make_judge(settings, local=lambda q, s, p, g: 0.5)
        assert isinstance(judge, LocalJudge)
        out = self.recipe(traj(turn(answer("SELECT 1"), "reasoning_answer")), settings, judge=judge)
        assert out.components["judge"] == pytest.approx(self.R.judge * 0.5)
        with pytest.raises(ValueError, match="no callable"):
            make_judge(settings)
        with pytest.raises(JudgeError):
            LocalJudge(lambda *a: -0.1).score("q", "s", "p", "g")
        assert make_judge(S) is None  # params default: off


# ============================================================================ judge over HTTP
class _Canned(BaseHTTPRequestHandler):
    reply: dict | bytes = {}
    status = 200
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server API)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        payload = self.reply if isinstance(self.reply, bytes) else json.dumps(self.reply).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture()
def chat_server():
    _Canned.received = []
    server = HTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_openai_judge_round_trip(chat_server):
    _Canned.status = 200
    _Canned.reply = {"choices": [{"message": {"role": "assistant", "content": "Close.\nScore: 0.7"}}]}
    endpoint = f"http://127.0.0.1:{chat_server.server_port}/v1"
    judge = OpenAIJudge(endpoint, "judge-model", timeout_s=5.0, api_key="k")
    assert judge.score("q?", "CREATE TABLE t", "SELECT 1", "SELECT 2") == pytest.approx(0.7)
    path, auth, body = _Canned.received[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k"
    assert body["model"] == "judge-model" and body["temperature"] == 0.0
    assert body["messages"][0]["content"] == build_prompt("q?", "CREATE TABLE t", "SELECT 1", "SELECT 2")

    settings = RewardSettings.model_validate(
        {"reasoning_sql": {"judge_backend": "openai", "judge_endpoint": endpoint, "judge_model": "m"}})
    built = make_judge(settings)
    assert isinstance(built, OpenAIJudge) and built.timeout_s == settings.reasoning_sql.judge_timeout_s
    out = rewards.get("reasoning_sql")(traj(turn(answer("SELECT 1"), "reasoning_answer")), settings, judge=built)
    assert out.components["judge"] == pytest.approx(settings.reasoning_sql.judge * 0.7)


@pytest.mark.parametrize(("status", "reply"), [(500, {"error": "boom"}), (200, {"choices": []}), (200, b"not json")])
def test_openai_judge_errors(chat_server, status, reply):
    _Canned.status, _Canned.reply = status, reply
    judge = OpenAIJudge(f"http://127.0.0.1:{chat_server.server_port}", "m", timeout_s=5.0)
    with pytest.raises(JudgeError):
        judge.score("q", "s", "SELECT 1", "SELECT 2")


def test_openai_judge_validates_configuration():
    with pytest.raises(ValueError, match="http"):
        OpenAIJudge("file:///etc/passwd", "m", 1.0)
    with pytest.raises(ValueError, match="model"):
        OpenAIJudge("http://127.0.0.1:1", "", 1.0)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("Score: 0.4", 0.4), ("reasoning... score = 1", 1.0), ("**Score:** 0.25", 0.25), ("0.9", 0.9),
     ("Score: 0.2\nfinal Score: 0.6", 0.6)],
)
def test_parse_score(reply, expected):
    assert parse_score(reply) == pytest.approx(expected)


@pytest.mark.parametrize("reply", ["", "no idea", "Score: 7", "Score: -0.5"])
def test_parse_score_rejects(reply):
    with pytest.raises(JudgeError):
        parse_score(reply)


# ============================================================================ sql-trail
class TestSQLTrail:
    recipe = rewards.get("sql_trail")
    T = W.sql_trail

    def full(self):
        return sum(getattr(self.T, k) for k in ("exec", "turns", "schema_linking", "bigram", "syntax", "format"))

    def trail(self, n_calls: int, final_sql: str = GOLD, correct: bool = True, difficulty: str = "easy",
              runs: bool = True, **kw):
        calls = [turn(call("SELECT name FROM student"), "trail")] * n_calls
        final = turn(solution(final_sql), "trail", runs=runs, correct=correct)
        return traj(*calls, final, difficulty=difficulty, max_turns=10, **kw)

    @pytest.mark.parametrize("calls", [0, 1, 2])
    def test_easy_within_budget(self, calls):
        out = self.recipe(self.trail(calls), W)
        assert out.total == pytest.approx(self.full()) and out.info["t"] == calls
        assert_output(out, "sql_trail")

    def test_easy_over_budget_loses_turn_reward(self):
        out = self.recipe(self.trail(self.T.turn_limits.easy + 1), W)
        assert out.components["turns"] == 0.0 and out.total == pytest.approx(self.full() - self.T.turns)

    def test_easy_wrong_within_budget_keeps_turn_reward(self):
        # the paper conditions the turn reward on correctness only for hard/extra
        out = self.recipe(self.trail(1, final_sql="SELECT name FROM student", correct=False), W)
        assert out.components["exec"] == 0.0 and out.components["turns"] == self.T.turns
        assert out.components["schema_linking"] == pytest.approx(self.T.schema_linking * 2 / 3)
        assert out.components["bigram"] == pytest.approx(self.T.bigram * 3 / 7)

    @pytest.mark.parametrize("level", ["hard", "extra"])
    def test_hard_needs_correctness(self, level):
        limit = getattr(self.T.turn_limits, level)
        assert self.recipe(self.trail(limit, difficulty=level), W).components["turns"] == self.T.turns
        assert self.recipe(self.trail(limit + 1, difficulty=level), W).components["turns"] == 0.0
        wrong = self.recipe(self.trail(1, correct=False, difficulty=level), W)
        assert wrong.components["turns"] == 0.0

    def test_medium_and_bird_labels(self):
        medium = self.T.turn_limits.medium
        assert self.recipe(self.trail(medium, difficulty="medium"), W).components["turns"] == self.T.turns
        assert self.recipe(self.trail(medium + 1, difficulty="medium"), W).components["turns"] == 0.0
        out = self.recipe(self.trail(self.T.turn_limits.easy, difficulty="Simple"), W)
        assert out.info["difficulty"] == "easy" and out.info["difficulty_source"] == "given"

    def test_difficulty_computed_from_gold(self):
        gold = "SELECT T1.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id GROUP BY T1.name"
        out = self.recipe(self.trail(1, final_sql=gold, gold=gold, difficulty=""), W)
        assert out.info["difficulty"] == hardness(gold) and out.info["difficulty_source"] == "computed"

    def test_unparsable_gold_counts_as_extra(self):
        out = self.recipe(self.trail(1, final_sql="SELECT 1", gold="SELEC name FRM student", difficulty="", correct=False), W)
        assert out.info["difficulty"] == "extra" and "does not parse" in out.info["notes"][0]

    def test_no_final_solution(self):
        t = traj(*[turn(call(GOLD), "trail", correct=True)] * 3, difficulty="easy", max_turns=10)
        out = self.recipe(t, W)
        assert out.total == 0.0 and out.info["t"] == 3 and "no final <solution>" in out.info["notes"][0]

    def test_one_malformed_turn_loses_format_only(self):
        bad_call = turn("<sql>SELECT name FROM student</sql>", "trail")  # no <think>
        t = traj(bad_call, turn(solution(GOLD), "trail", correct=True), difficulty="easy", max_turns=10)
        out = self.recipe(t, W)
        assert out.components["format"] == 0.0 and out.total == pytest.approx(self.full() - self.T.format)

    def test_tool_calls_counts_turns_before_the_answer(self):
        assert tool_calls(self.trail(3)) == 3 == self.recipe(self.trail(3), W).info["t"]
        assert tool_calls(traj(turn(call(GOLD), "trail"), turn(call(GOLD), "trail"))) == 2  # no answer

    def test_non_executing_solution(self):
        out = self.recipe(self.trail(0, final_sql="SELEC x FRM", correct=False, runs=False), W)
        assert out.components["syntax"] == 0.0 and out.components["schema_linking"] == 0.0


# ============================================================================ skyrl
class TestSkyRL:
    recipe = rewards.get("skyrl")
    K = W.skyrl

    @pytest.mark.parametrize(
        ("last", "key"),
        [
            (turn(solution(GOLD), "trail", correct=True), "correct"),
            (turn(solution("SELECT 1"), "trail"), "wrong"),
            (turn(call(GOLD), "trail", correct=True), "bad_format"),  # a tool call is not an answer
            (turn("<solution>" + GOLD + "</solution>", "trail", correct=True), "bad_format"),  # no think
            (turn(solution(GOLD) + "<observation>x</observation>", "trail", correct=True), "bad_format"),
        ],
    )
    def test_outcomes(self, last, key):
        out = self.recipe(traj(turn(call("SELECT 1"), "trail"), last, max_turns=10), W)
        assert out.total == getattr(self.K, key) and out.info["outcome"] == key
        assert_output(out, "skyrl")


# ============================================================================ registry
def test_registry():
    # the seed methods' recipes, first in this order (a new recipe goes after them)
    assert rewards.names()[:5] == ("progress", "oneshot", "reasoning_sql", "sql_trail", "skyrl")
    fmts = {name: rewards.get(name).fmt for name in rewards.names()[:5]}
    assert fmts == {"progress": "think_sql", "oneshot": "think_sql", "reasoning_sql": "reasoning_answer",
                    "sql_trail": "trail", "skyrl": "trail"}
    with pytest.raises(KeyError, match="known: progress, oneshot"):
        rewards.get("grpo")
    assert rewards.get("oneshot").bounds(W) == (0.0, W.oneshot.correct + W.oneshot.executable + W.oneshot.format)
    assert rewards.get("skyrl").max_reward() == W.skyrl.correct
    assert rewards.get("skyrl").min_reward(S) == W.skyrl.bad_format
    assert rewards.get("progress").max_reward(W) == pytest.approx(
        max(P.align_pos, P.align_neg) + P.acc + max(P.keep, P.recover) + P.format)
    with pytest.raises(TypeError):
        rewards.get("progress")(traj(turn("x")), {"rewards": {}})  # type: ignore[arg-type]


def test_trajectory_validation():
    with pytest.raises(ValueError, match="at least one turn"):
        Trajectory(turns=(), gold_sql=GOLD)
    with pytest.raises(ValueError, match="max_turns"):
        Trajectory(turns=(Turn("x"),), gold_sql=GOLD, max_turns=0)
    assert Trajectory(turns=[Turn("x")], gold_sql=GOLD).turns == (Turn("x"),)  # a list is frozen to a tuple


# ============================================================================ real turns
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_real_odt_trajectory(school_db):
    gold = "SELECT name FROM student WHERE age > 20 ORDER BY name"
    gold_result = execute(school_db, gold)
    assert gold_result.ok and gold_result.rows
    before = _digest(school_db)
    outputs = [
        think("SELECT name FROM student WHERE age > 30 ORDER BY name"),  # runs, wrong rows
        think("SELEC name FROM student"),  # syntax error
        "<think>x</think><sql>DROP TABLE student</sql>",  # refused by the sandbox
        think("SELECT s.name FROM student AS s WHERE s.age > 20 ORDER BY s.name"),  # equivalent
    ]
    turns = [make_turn(text, "think_sql", school_db, gold, S.sandbox) for text in outputs]
    assert [t.correct for t in turns] == [False, False, False, True]
    assert [executable(t) for t in turns] == [True, False, False, True]
    assert turns[2].result.error == "forbidden"
    assert _digest(school_db) == before  # evaluating SQL never writes the database

    t = Trajectory(turns=tuple(turns), gold_sql=gold, db_id="school", max_turns=S.env.max_turns)
    out = rewards.get("progress")(t, S)
    assert out.info["k_star"] == 4
    assert out.components["late"] == pytest.approx(P.acc * P.gamma ** 3)
    assert out.components["exec"] == P.keep and out.components["format"] == P.format
    # the final SQL is the gold up to aliases: F_struct 1 by the ODT's contract
    assert out.info["F_struct_last"] == pytest.approx(1.0)

    reversed_order = make_turn(think("SELECT name FROM student WHERE age > 20 ORDER BY name DESC"),
                               "think_sql", school_db, gold, S.sandbox)
    assert not reversed_order.correct  # the gold's output is ordered: order matters
    assert make_turn(think("SELECT name FROM student WHERE age > 20 ORDER BY name DESC"),
                     "think_sql", school_db, "SELECT name FROM student WHERE age > 20", S.sandbox).correct


def test_real_trail_and_single_turn(school_db):
    gold = "SELECT count(*) FROM enrolment WHERE grade > 2"
    probe = make_turn(call("SELECT grade FROM enrolment LIMIT 3"), "trail", school_db, gold, S.sandbox)
    final = make_turn(solution("SELECT COUNT(*) FROM enrolment AS e WHERE e.grade > 2"), "trail", school_db, gold, S.sandbox)
    assert probe.result.ok and not probe.correct and final.correct
    t = Trajectory(turns=(probe, final), gold_sql=gold, difficulty="", max_turns=S.env.trail_max_turns)
    assert rewards.get("skyrl")(t, S).total == W.skyrl.correct
    trail = rewards.get("sql_trail")(t, S)
    assert trail.components["exec"] == W.sql_trail.exec and trail.info["t"] == 1
    assert trail.components["syntax"] == W.sql_trail.syntax and trail.components["format"] == W.sql_trail.format

    none = make_turn("no tags", "reasoning_answer", school_db, gold, S.sandbox)
    assert none == Turn(text="no tags", sql=None, result=None, correct=False)
    missing_db = make_turn(answer(gold), "reasoning_answer", school_db.parent / "nope.sqlite", gold, S.sandbox)
    assert missing_db.result.error == "no_database" and not missing_db.correct


def test_a_gold_past_max_rows_gets_the_floor_from_every_recipe(school_db):
    """Issue 49: a gold of more rows than sandbox.max_rows made every answer wrong, the gold
    itself too. Every turn of such a question says why it cannot be judged, and every recipe
    gives it the floor, whatever the answer: its rollouts all score alike."""
    gold = "SELECT name FROM department"  # 3 rows
    sandbox = S.sandbox.model_copy(update={"max_rows": 2})
    texts = {"think_sql": think(gold), "reasoning_answer": answer(gold), "trail": solution(gold)}
    for name in rewards.names():
        recipe = rewards.get(name)
        turns = [make_turn(text, recipe.fmt, school_db, gold, sandbox) for text in (texts[recipe.fmt], "no tags")]
        assert turns[0].unjudged == turns[1].unjudged != ""
        assert turns[0].unjudged.startswith("gold_too_large: the gold query returns more than 2 rows (sandbox.max_rows)")
        outs = [recipe(Trajectory(turns=(turn,), gold_sql=gold, max_turns=4), S) for turn in turns]
        assert [out.total for out in outs] == [recipe.min_reward(S)] * 2, name
        assert outs[0].info == {"unjudged": turns[0].unjudged} and not any(outs[0].components.values())
    judged = make_turn(think(gold), "think_sql", school_db, gold, S.sandbox.model_copy(update={"max_rows": 3}))
    assert judged.correct and judged.unjudged == ""


# ============================================================================ conformance
def _parses(sql: str) -> bool:
    try:
        parse_one(sql)
    except SQLParseError:
        return False
    return True


@pytest.mark.conformance
def test_every_spider_pair_through_every_recipe(conformance):
    gold_lines = (conformance / "dev_gold.txt").read_text().splitlines()
    pred_lines = (conformance / "dev_predict.txt").read_text().splitlines()
    pairs = [(p, g.split("\t")[0]) for p, g in zip(pred_lines, gold_lines) if g.strip()]
    assert len(pairs) == 322
    unparsable = 0
    for pred, gold in pairs:
        unparsable += not _parses(pred)
        texts = {"think_sql": think(pred), "reasoning_answer": answer(pred), "trail": solution(pred)}
        for name in rewards.names():
            recipe = rewards.get(name)
            t = Trajectory(turns=(turn(texts[recipe.fmt], recipe.fmt),) * 2, gold_sql=gold, max_turns=4)
            out = recipe(t, W)
            low, high = recipe.bounds(W)
            assert low - 1e-9 <= out.total <= high + 1e-9
    print(f"\n{unparsable} of {len(pairs)} predictions took the parse fallback")


@pytest.mark.conformance
@pytest.mark.slow
def test_every_gold_query_scored_against_itself(conformance):
    """Classical and Spider gold queries (3,831 by others) through every recipe, each against
    itself: a parsable query earns Reasoning-SQL's maximum; an unparsable one takes the
    fallback (no schema items) and must still score without an exception."""
    golds = [line.split("\t")[0] for line in (conformance / "dev_gold.txt").read_text().splitlines() if line.strip()]
    golds += [line for line in (conformance / "classical_gold.txt").read_text().splitlines() if line.strip()]
    texts = {"think_sql": think, "reasoning_answer": answer, "trail": solution}
    reasoning_max = rewards.get("reasoning_sql").max_reward(W)
    fallback = 0
    for gold in golds:
        parsable = _parses(gold)
        fallback += not parsable
        for name in rewards.names():
            recipe = rewards.get(name)
            t = Trajectory(turns=(turn(texts[recipe.fmt](gold), recipe.fmt, correct=True),), gold_sql=gold, max_turns=4)
            out = recipe(t, W)
            if name == "reasoning_sql" and parsable:
                assert out.total == pytest.approx(reasoning_max), gold
            low, high = recipe.bounds(W)
            assert low - 1e-9 <= out.total <= high + 1e-9
    print(f"\n{fallback} of {len(golds)} gold queries took the parse fallback")
