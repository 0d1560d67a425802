"""Metric aggregation, the Table 8 ODT analysis, and the report / plot writers."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from progress_sql.params import EvalSettings
from progress_sql.eval import plots, reports
from progress_sql.eval.analysis import CATEGORIES, categories_of, mismatch_rates, prediction_tags
from progress_sql.corpus.records import Example
from progress_sql.eval import metrics
from progress_sql.eval.metrics import METRICS, Metric, Outcome, flat_metrics, mean, mode_metrics, pass_metrics, rate
from progress_sql.files import write_csv, write_json
from progress_sql.odt import TAGS
from progress_sql.sql import ExecResult, Verdict


def outcome(ex, ts=None, executed=True, well_formed=True, tokens=10.0, hardness="easy", difficulty="", rows=()):
    example = Example(id="e", db_id="db", question="?", gold_sql="SELECT 1", hardness=hardness, difficulty=difficulty)
    result = ExecResult(rows=rows) if executed else ExecResult(error="runtime", message="no such column")
    return Outcome(example, Verdict(result, ex, result), ts, well_formed, tokens)


# ----------------------------------------------------------------------------- metrics
def test_rate_and_mean_ignore_missing_values():
    assert rate([True, None, False, True]) == pytest.approx(2 / 3)
    assert rate([None, None]) is None and mean([]) is None
    assert mean([1.0, 2.0, 6.0]) == 3.0


def test_mode_metrics_counts_rates_and_hardness_breakdown():
    outcomes = [
        outcome(True, ts=True, hardness="easy", tokens=10),
        outcome(True, ts=False, hardness="easy", tokens=20),
        outcome(False, ts=None, executed=False, well_formed=False, hardness="hard", tokens=30),
        outcome(False, ts=False, hardness="medium", tokens=40),
    ]
    m = mode_metrics(outcomes)
    assert (m["n"], m["ex"], m["ts"], m["ts_n"]) == (4, 0.5, pytest.approx(1 / 3), 3)
    assert (m["exec_rate"], m["format_rate"], m["mean_response_tokens"]) == (0.75, 0.75, 25.0)
    assert list(m["by_hardness"]) == ["easy", "medium", "hard", "extra"]
    assert m["by_hardness"]["easy"] == {"n": 2, "ex": 1.0, "ts": 0.5}
    assert m["by_hardness"]["hard"] == {"n": 1, "ex": 0.0, "ts": None}
    assert m["by_hardness"]["extra"] == {"n": 0, "ex": None, "ts": None}
    assert "by_difficulty" not in m  # no dataset labels: no breakdown


def test_mode_metrics_reports_dataset_difficulty_in_bird_order_and_unknown_hardness():
    outcomes = [outcome(True, difficulty="challenging"), outcome(False, difficulty="simple"),
                outcome(True, difficulty="simple", hardness="weird")]
    m = mode_metrics(outcomes)
    assert list(m["by_difficulty"]) == ["simple", "challenging"]
    assert m["by_difficulty"]["simple"] == {"n": 2, "ex": 0.5, "ts": None}
    assert m["by_hardness"]["weird"]["n"] == 1  # an unexpected label is kept, not dropped
    assert m["ts"] is None and m["ts_n"] == 0


def test_pass_metrics_and_flat_metrics():
    p = pass_metrics([1.0, 0.5, 0.0], ["easy", "easy", "extra"])
    assert p["ex"] == 0.5 and p["by_hardness"]["easy"] == {"n": 2, "ex": 0.75}
    assert p["by_hardness"]["medium"] == {"n": 0, "ex": None}
    with pytest.raises(ValueError):
        pass_metrics([1.0], [])
    flat = flat_metrics({"dev": {"n": 3, "greedy": {"ex": 0.5, "ts": None, "by_hardness": {"easy": {"ex": 1}}},
                            "note": "x", "flag": True}})
    assert flat == {"dev/n": 3.0, "dev/greedy/ex": 0.5, "dev/greedy/by_hardness/easy/ex": 1.0}


def test_an_example_whose_gold_passed_max_rows_is_counted_apart():
    """Issue 49: its answers are neither right nor wrong (even the gold would not match): EX,
    TS and pass@k are over the other examples, the count is ``gold_too_large``, in the report."""
    base = outcome(False, ts=False)
    too_large = Verdict(base.verdict.result, False, base.verdict.result, ExecResult(rows=((1,), (2,)), truncated=True))
    unjudged = Outcome(base.example, too_large, False, True, 10.0)
    assert unjudged.verdict.unjudged.startswith("gold_too_large: the gold query returns more than 2 rows")
    m = mode_metrics([outcome(True, ts=True), outcome(False, ts=False), unjudged])
    assert (m["n"], m["ex"], m["ts"], m["ts_n"], m["gold_too_large"]) == (3, 0.5, 0.5, 2, 1)
    assert m["exec_rate"] == 1.0 and m["by_hardness"]["easy"] == {"n": 3, "ex": 0.5, "ts": 0.5}
    p = pass_metrics([1.0, 0.0, None], ["easy"] * 3)
    assert (p["n"], p["ex"], p["gold_too_large"], p["by_hardness"]["easy"]) == (3, 0.5, 1, {"n": 3, "ex": 0.5})
    text = reports.markdown_report("tiny", {"dev": {"n": 3, "greedy": m, "gold_errors": 0}}, EvalSettings())
    assert "| Gold too large |" in text and "| 1 |" in text


def test_wrong_answers_are_counted_by_why_they_are_wrong(tmp_path: Path):
    # issue 51: predictions kept only "runtime"; the report now counts wrong answers by kind, from real
    # executions on a real database
    import sqlite3

    from progress_sql.sql import verdict

    db = tmp_path / "shop.sqlite"
    with sqlite3.connect(db) as con:
        con.executescript("CREATE TABLE Item (ItemName TEXT, Qty INT); INSERT INTO Item VALUES ('pen', 3), ('ink', 0);")
    gold = "SELECT ItemName FROM Item WHERE Qty > 0"
    answers = {"right": "SELECT ItemName FROM Item WHERE Qty > 0", "wrong_result": "SELECT ItemName FROM Item",
               "unknown_table": "SELECT name FROM items", "unknown_column": "SELECT name FROM Item",
               "syntax": "SELECT FROM WHERE", "other_error": "SELECT nosuchfunction(Qty) FROM Item", "no_sql": None}
    example = Example(id="e", db_id="shop", question="?", gold_sql=gold, hardness="easy")
    outcomes = {}
    for name, sql in answers.items():
        v = verdict(db, sql, gold) if sql is not None else Verdict(None, False, None)
        outcomes[name] = Outcome(example, v, None, sql is not None, 5.0, sql)
    assert {name: metrics.wrong_kind(o) for name, o in outcomes.items()} == {
        "right": None, **{name: name for name in answers if name != "right"}}
    m = mode_metrics(list(outcomes.values()))
    assert m["wrong"] == {"no_sql": 1, "syntax": 1, "unknown_table": 1, "unknown_column": 1, "other_error": 1,
                          "timeout": 0, "wrong_result": 1}
    assert flat_metrics({"dev": {"greedy": m}})["dev/greedy/wrong/unknown_table"] == 1
    text = reports.markdown_report("tiny", {"dev": {"n": 7, "greedy": m, "gold_errors": 0}}, EvalSettings())
    assert "## Wrong answers by kind (counts)" in text
    assert "| Dev | Greedy | 1 | 1 | 1 | 1 | 1 | 0 | 1 | 6 |" in text
    from progress_sql.eval.runner import Answer  # the predictions file keeps the message, not only its kind

    record = Answer(answers["unknown_table"], True, outcomes["unknown_table"].verdict, 5.0).record()
    assert record["error"] == "runtime" and "no such table: items" in record["error_message"]
    assert Answer(gold, True, outcomes["right"].verdict, 5.0).record()["error_message"] is None


def test_a_registered_metric_reaches_metrics_json_mlflow_and_the_report(monkeypatch):
    """The walk of docs/architecture.md: one ``Metric`` entry is the whole change. Here a
    row count, the mean number of rows the chosen SQL returned (errors not counted)."""
    rows = Metric("mean_rows", lambda o: len(o.verdict.result.rows) if o.executed else None,
                  lambda values: mean(v for v in values if v is not None), "Rows", lambda v: f"{v:.1f}")
    monkeypatch.setattr(metrics, "METRICS", (*METRICS, rows))
    m = mode_metrics([outcome(True, rows=((1,), (2,))), outcome(False, rows=((1,),)), outcome(False, executed=False)])
    keys = list(m)
    assert m["mean_rows"] == 1.5 and keys.index("mean_rows") == keys.index("gold_too_large") + 1  # after the others
    assert flat_metrics({"dev": {"greedy": m}})["dev/greedy/mean_rows"] == 1.5
    text = reports.markdown_report("tiny", {"dev": {"n": 3, "greedy": m, "gold_errors": 0}}, EvalSettings())
    header, row = (next(line for line in text.splitlines() if line.startswith(start))
                   for start in ("| Split | Decoding |", "| Dev | Greedy |"))
    assert header.startswith("| Split | Decoding | n | EX | TS | TS n | Executable | Format | Mean tokens |")
    assert header.endswith("| Rows | Notes |") and row.endswith("| 1.5 |  |")  # its column last, before the notes
    assert row.startswith("| Dev | Greedy | 3 | 33.3 | – | 0 | 66.7 | 100.0 | 10.0 |")


# ----------------------------------------------------------------------------- Table 8
def test_categories_cover_the_paper_examples_and_only_known_tags():
    assert categories_of(["SELECT_ERROR", "JOIN_MISSING", "GROUP_BY_ERROR"]) == {"select", "join", "group"}
    assert categories_of(["ORDER_BY_MISSING", "LIMIT_MISMATCH"]) == set()
    assert all(tag in TAGS for members in CATEGORIES.values() for tag in members)


def test_prediction_tags_from_real_odt_comparisons():
    gold = "SELECT T1.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id WHERE T2.budget > 700"
    assert categories_of(prediction_tags(gold, gold)) == set()
    no_where = "SELECT T1.name FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id"
    assert "WHERE_MISSING" in prediction_tags(no_where, gold)
    no_join = "SELECT name FROM student WHERE age > 20"
    assert {"join", "where"} <= categories_of(prediction_tags(no_join, gold))
    wrong_select = "SELECT T1.age FROM student AS T1 JOIN department AS T2 ON T1.dept_id = T2.dept_id WHERE T2.budget > 700"
    assert categories_of(prediction_tags(wrong_select, gold)) == {"select"}
    assert prediction_tags(None, gold) == ("PARSE_ERROR",)
    assert prediction_tags("SELEC name FROM (", gold) == ("PARSE_ERROR",)


def test_mismatch_rates_over_profiled_predictions():
    tags = [(), ("SELECT_ERROR", "WHERE_ERROR"), ("JOIN_MISSING",), ("PARSE_ERROR",), ("GOLD_UNAVAILABLE",)]
    r = mismatch_rates(tags)
    assert (r["n"], r["n_profiled"], r["gold_unavailable"]) == (5, 3, 1)
    assert (r["select"], r["join"], r["where"], r["group"]) == (pytest.approx(1 / 3),) * 3 + (0.0,)
    assert r["avg"] == pytest.approx(0.25)
    assert r["parse_error_rate"] == 0.25
    empty = mismatch_rates([("PARSE_ERROR",)])
    assert empty["avg"] is None and empty["select"] is None and empty["parse_error_rate"] == 1.0


# ----------------------------------------------------------------------------- reports
def _metrics() -> dict:
    def mode(ex, ts, **extra):
        return {"n": 4, "ex": ex, "ts": ts, "ts_n": 4 if ts is not None else 0, "exec_rate": 1.0, "format_rate": 0.75,
                "mean_response_tokens": 12.5,
                "by_hardness": {"easy": {"n": 2, "ex": ex, "ts": ts}, "medium": {"n": 2, "ex": ex, "ts": ts},
                                "hard": {"n": 0, "ex": None, "ts": None}, "extra": {"n": 0, "ex": None, "ts": None}},
                **extra}
    odt = {"n": 4, "n_profiled": 4, "select": 0.25, "join": 0.5, "where": 0.0, "group": 0.25, "avg": 0.25,
           "parse_error_rate": 0.0, "gold_unavailable": 0}
    return {
        "dev": {"n": 4, "greedy": mode(0.5, 0.25), "odt_mismatch": odt,
                "vote_at_8": mode(0.75, 0.5, mean_votes=5.0, all_invalid_rate=0.0),
                "pass_at_8": {"n": 4, "ex": 1.0, "by_hardness": {"easy": {"n": 2, "ex": 1.0}}},
                "gold_errors": 0, "prompt_too_long": 0},
        "dk": {"n": 4, "greedy": mode(0.25, None), "odt_mismatch": odt, "gold_errors": 0, "prompt_too_long": 0},
    }


def test_markdown_report_has_the_paper_table_shapes():
    text = reports.markdown_report("tiny", _metrics(), EvalSettings(), notes=["dk: no neighbours"])
    assert "| Model | Decoding | Dev EX | Dev TS |" in text
    assert "| tiny | Greedy | 50.0 | 25.0 |" in text and "| tiny | Vote@8 | 75.0 | 50.0 |" in text
    assert "| Model | Decoding | DK EX |" in text and "DK TS" not in text  # TS absent there: column dropped
    assert "| tiny | Dev | 25.0 | 50.0 | 0.0 | 25.0 | 25.0 | 4 | 0.0 |" in text  # Table 8 row
    assert "| Decoding | Metric | easy (n=2) | medium (n=2) | hard (n=0) | extra (n=0) | All (n=4) |" in text
    assert "| Greedy | EX | 50.0 | 50.0 | – | – | 50.0 |" in text
    assert "| Dev | Pass@8 | 100.0 |" in text and "- dk: no neighbours" in text
    # the decoding-mode table: one column per registered metric (these first), then the notes
    assert "| Split | Decoding | n | EX | TS | TS n | Executable | Format | Mean tokens |" in text
    assert "| Dev | Greedy | 4 | 50.0 | 25.0 | 4 | 100.0 | 75.0 | 12.5 |" in text
    assert "| DK | Greedy | 4 | 25.0 | – | 0 | 100.0 | 75.0 | 12.5 |" in text
    assert "Table 9:" not in text  # no BIRD difficulty labels in these metrics
    m = _metrics()
    m["dev"]["greedy"]["by_difficulty"] = {"simple": {"n": 3, "ex": 1.0, "ts": None},
                                           "challenging": {"n": 1, "ex": 0.0, "ts": None}}
    text = reports.markdown_report("tiny", m, EvalSettings(vote_k=0, pass_k=0))
    assert "| Decoding | Metric | simple (n=3) | challenging (n=1) | All (n=4) |" in text
    assert "Table 9:" in text and "Vote@" not in text.split("##")[0]


def test_mode_labels_and_plot_rows():
    assert [reports.mode_label(k) for k in ("greedy", "vote_at_8", "pass_at_4", "multi_turn")] == [
        "Greedy", "Vote@8", "Pass@4", "Multi-turn"]
    rows = reports.hardness_rows(_metrics())
    assert {r["group"] for r in rows} >= {"dev Greedy easy", "dev Vote@8 medium", "dk Greedy easy"}
    assert all(r["n"] > 0 for r in rows)  # empty levels are not plotted
    rob = reports.robustness_rows(_metrics())
    assert [(r["split"], r["decoding"], r["ex"]) for r in rob] == [
        ("dev", "Greedy", 0.5), ("dev", "Vote@8", 0.75), ("dk", "Greedy", 0.25)]


def test_writers_produce_json_csv_and_png(tmp_path: Path):
    m = _metrics()
    write_json(tmp_path / "m.json", m)
    assert json.loads((tmp_path / "m.json").read_text()) == m
    with pytest.raises(ValueError):
        write_json(tmp_path / "nan.json", {"x": float("nan")})
    write_csv(tmp_path / "r.csv", reports.robustness_rows(m), reports.ROBUSTNESS_COLUMNS)
    with (tmp_path / "r.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows[2] == {"group": "dk Greedy", "split": "dk", "decoding": "Greedy", "ex": "0.25", "ts": ""}
    for fn, data in ((plots.plot_hardness, reports.hardness_rows(m)), (plots.plot_robustness, reports.robustness_rows(m)),
                     (plots.plot_hardness, [])):
        path = fn(data, tmp_path / f"{fn.__name__}-{len(data)}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporaries


# ----------------------------------------------------------------------------- second turns (issue 53)
def test_second_turn_counts_fixes_and_repeats_of_real_turns(school_db):
    """Of the episodes with a second turn: wrong first turns mended at turn 2, and second turns
    whose SQL is the first's (whitespace, a final ';' and the case of names aside; a literal's
    case counts). A question that cannot be judged counts in the repeats only."""
    from conftest import GOLD, WRONG, answer
    from progress_sql.rewards import make_turn
    from progress_sql.sql.settings import SandboxSettings

    def turns(*sqls, sandbox=None):
        return [make_turn(answer(sql) if sql else "no sql", "think_sql", school_db, GOLD, sandbox) for sql in sqls]

    older = "SELECT name FROM student WHERE age > 22"
    too_large = SandboxSettings(max_rows=2)
    episodes = [
        turns(WRONG, GOLD),  # fixed
        turns(WRONG, "select  NAME from Student;"),  # a repeat
        turns(GOLD),  # right at once: no second turn
        turns(None, None),  # no SQL twice: wrong, not a repeat
        turns(older, "SELECT name FROM student WHERE name = 'S1'"),  # another wrong query
        turns("SELECT name FROM student WHERE name = 's1'", "SELECT name FROM student WHERE name = 'S1'"),
        turns(WRONG, WRONG, sandbox=too_large),  # cannot be judged
    ]
    assert episodes[0][1].correct and episodes[-1][0].unjudged
    assert metrics.second_turn_counts(episodes) == {"wrong_at_1": 5, "fixed": 1, "fix_rate": 0.2, "second_turns": 6,
                                                    "repeats": 2, "repeat_rate": pytest.approx(2 / 6)}
    assert metrics.second_turn_counts([episodes[2]]) == {"wrong_at_1": 0, "fixed": 0, "fix_rate": None,
                                                         "second_turns": 0, "repeats": 0, "repeat_rate": None}


def test_the_report_shows_second_turns_of_the_multi_turn_protocol():
    m = mode_metrics([outcome(False), outcome(True)])
    m.update(mean_turns=2.0, solution_rate=1.0, turn2={"wrong_at_1": 186, "fixed": 2, "fix_rate": 2 / 186,
                                                         "second_turns": 186, "repeats": 137, "repeat_rate": 137 / 186})
    text = reports.markdown_report("tiny", {"dev": {"n": 2, "multi_turn": m, "gold_errors": 0}},
                                   EvalSettings(multi_turn=True))
    assert "## Multi-turn: second turns (counts, rates in %)" in text
    assert "| Dev | 186 | 2 | 1.1 | 186 | 137 | 73.7 |" in text
    no_multi = reports.markdown_report("tiny", _metrics(), EvalSettings())
    assert "second turns" not in no_multi
