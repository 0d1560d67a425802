"""``run_eval`` end to end on a small built corpus: the oracle, a scripted generator with known
answers, and a real (untrained) tiny transformers model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from progress_sql.params import EvalSettings, settings_from_dict
from corpora import small_corpus
from progress_sql.corpus.records import CorpusError, CorpusLayout, Example, read_jsonl
from progress_sql.eval import ORACLE, run_eval
from progress_sql.envs import Request
from progress_sql.eval.generators import Completion, OracleGenerator, RequestPolicy, oracle_answer
from progress_sql.eval.runner import PROMPT_TOO_LONG
from progress_sql.formats import FORMATS, parse_output
from progress_sql.sql import gold_result
from progress_sql.sql.verdict import comparison_sql

SMALL_DATA = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 30, "dev_size": 12,
              "test_size": 12, "indomain_size": 12, "neighbours": 2, "rows_scale": 0.3}
TINY_MODEL = {"vocab_size": 2048, "hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
              "intermediate_size": 128, "copy_warmup": {"steps": 0}}


# The paper's protocol (Vote@8, pass@8, every example), not the CPU pipeline's budget defaults.
PAPER_EVAL = {"vote_k": 8, "pass_k": 8, "max_examples": 0}


def make_settings(**sections):
    sections["eval"] = {**PAPER_EVAL, **sections.get("eval", {})}
    return settings_from_dict({"data": SMALL_DATA, **sections})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "corpus"
    small_corpus(out, make_settings())
    return out


# ----------------------------------------------------------------------------- the oracle
@pytest.fixture(scope="module")
def oracle_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle") / "eval"
    settings = make_settings(eval={"multi_turn": True})
    return run_eval(settings, ORACLE, corpus, None, out, progress=False), out


def test_oracle_scores_one_everywhere(oracle_run, corpus):
    result, _ = oracle_run
    assert list(result.metrics) == ["indomain", "dev", "test", "syn", "realistic", "dk"]
    for split, m in result.metrics.items():
        n = len(list(read_jsonl(CorpusLayout(corpus).variant(split) if split in ("syn", "realistic", "dk")
                                else CorpusLayout(corpus).split(split))))
        assert m["n"] == n > 0
        for mode in ("greedy", "vote_at_8", "multi_turn"):
            # the train databases have no test-suite neighbours: no TS in-domain
            ts = (None, 0) if split == "indomain" else (1.0, n)
            assert (m[mode]["ex"], m[mode]["ts"], m[mode]["ts_n"]) == (1.0, *ts), (split, mode)
            assert m[mode]["exec_rate"] == m[mode]["format_rate"] == 1.0
        assert m["pass_at_8"]["ex"] == 1.0
        assert m["vote_at_8"]["mean_votes"] == 8.0 and m["vote_at_8"]["all_invalid_rate"] == 0.0
        assert m["multi_turn"]["mean_turns"] == 1.0 and m["multi_turn"]["solution_rate"] == 1.0
        assert m["odt_mismatch"]["avg"] == 0.0 and m["odt_mismatch"]["n_profiled"] == n
        assert m["gold_errors"] == m["prompt_too_long"] == 0
    assert result.gate("dev/greedy/ex") == 1.0
    (note,) = result.notes
    assert note.startswith("indomain: no test-suite neighbours for ")


def test_oracle_run_writes_every_report_file(oracle_run):
    result, out = oracle_run
    assert json.loads((out / "metrics.json").read_text()) == result.metrics
    for name in ("metrics", "report", "hardness_csv", "robustness_csv", "hardness_png", "robustness_png"):
        assert result.files[name].is_file() and result.files[name].is_relative_to(out)
    assert (out / "plots" / "hardness.png").read_bytes()[:4] == b"\x89PNG"
    report = (out / "report.md").read_text()
    for heading in ("Table 1:", "Table 2:", "Table 8:", "Tables 10-12:", "pass@k"):
        assert heading in report
    assert "Table 9:" not in report  # the bundled corpus has no BIRD difficulty labels
    with (out / "plots" / "hardness.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    levels = {(s, lv) for s, m in result.metrics.items() for lv, g in m["greedy"]["by_hardness"].items() if g["n"]}
    assert len(rows) == 3 * len(levels)  # greedy, vote, multi-turn
    assert all(float(r["ex"]) == 1.0 for r in rows)
    for split, m in result.metrics.items():
        lines = (out / "predictions" / f"{split}.jsonl").read_text().splitlines()
        assert len(lines) == m["n"]
        first = json.loads(lines[0])
        assert first["greedy"]["ex"] and first["vote"]["votes"] == 8 and first["multi_turn"]["turns"] == 1


# ----------------------------------------------------------------------------- known answers
WRONG = "SELECT -987654321"


class KnownAnswers:
    """A generator whose outputs are fixed per example, so the runner's numbers are known:
    greedy is always a wrong (executable) query; the samples are [no SQL, wrong, gold, gold]
    for questions of even length (Vote@4 picks the gold) and [wrong, gold, wrong, gold] for
    odd ones (a 2-2 tie: the class seen first, the wrong one, wins)."""

    name = "known-answers"

    def complete(self, requests, *, n, temperature, top_p, seed):
        out = []
        for r in requests:
            gold = f"<think>t</think><sql>{r.example.gold_sql}</sql>"
            wrong = f"<think>t</think><sql>{WRONG}</sql>"
            if temperature == 0:
                row = [wrong]
            elif len(r.example.question) % 2 == 0:
                row = ["<think>no query</think>", wrong, gold, gold]
            else:
                row = [wrong, gold, wrong, gold]
            assert len(row) == n
            out.append([Completion(text, 7, "stop") for text in row])
        return out


def test_runner_arithmetic_with_known_answers(corpus, tmp_path):
    settings = make_settings(eval={"vote_k": 4, "pass_k": 2, "splits": ["dev", "syn"], "max_examples": 10})
    result = run_eval(settings, KnownAnswers(), corpus, None, tmp_path / "eval", progress=False)
    assert result.model == "known-answers"
    for split in ("dev", "syn"):
        examples = list(read_jsonl(CorpusLayout(corpus).split("dev") if split == "dev"
                                   else CorpusLayout(corpus).variant("syn")))[:10]
        even = sum(len(ex.question) % 2 == 0 for ex in examples) / len(examples)
        m = result.metrics[split]
        assert m["n"] == len(examples) == 10
        assert (m["greedy"]["ex"], m["greedy"]["ts"], m["greedy"]["exec_rate"], m["greedy"]["format_rate"]) == (
            0.0, 0.0, 1.0, 1.0)
        assert m["vote_at_4"]["ex"] == pytest.approx(even) and m["vote_at_4"]["ts"] == pytest.approx(even)
        assert m["vote_at_4"]["mean_votes"] == 2.0
        # pass@2 from n = 4 samples with 2 correct: 1 - C(2,2)/C(4,2) = 5/6
        assert m["pass_at_2"]["ex"] == pytest.approx(5 / 6)
        assert m["greedy"]["mean_response_tokens"] == 7.0
        assert m["odt_mismatch"]["n_profiled"] == 10 and m["odt_mismatch"]["select"] > 0
    lines = [json.loads(x) for x in (tmp_path / "eval" / "predictions" / "dev.jsonl").read_text().splitlines()]
    assert lines[0]["greedy"]["sql"] == WRONG and len(lines[0]["samples"]) == 4
    assert {ln["vote"]["winner"] for ln in lines} <= {0, 2}


def test_golds_past_max_rows_are_counted_apart_not_as_wrong_answers(corpus, tmp_path):
    """Issue 49: with sandbox.max_rows under some golds' row counts, the oracle (the gold
    itself) was scored wrong on those. Now they are left out of EX and pass@k, counted in
    ``gold_too_large`` per decoding mode and for the split, and a note says what to do."""
    examples = list(read_jsonl(CorpusLayout(corpus).split("dev")))
    settings = make_settings(eval={"splits": ["dev"], "vote_k": 2, "pass_k": 2, "ts": False})
    counts = sorted(len(gold_result(CorpusLayout(corpus).database(ex.db_id), comparison_sql(ex.gold_sql), None,
                                    100_000).rows) for ex in examples)
    max_rows = counts[len(counts) // 2]
    too_large = sum(n > max_rows for n in counts)
    assert 0 < too_large < len(counts)
    settings = settings.model_copy(update={"sandbox": settings.sandbox.model_copy(update={"max_rows": max_rows})})
    result = run_eval(settings, ORACLE, corpus, None, tmp_path / "eval", progress=False)
    m = result.metrics["dev"]
    assert (m["n"], m["gold_too_large"], m["gold_errors"]) == (len(examples), too_large, 0)
    for mode in ("greedy", "vote_at_2", "pass_at_2"):
        assert (m[mode]["ex"], m[mode]["gold_too_large"]) == (1.0, too_large), mode
    assert any(note.startswith(f"dev: {too_large} gold queries return more than sandbox.max_rows rows")
               and "raise sandbox.max_rows or fix the questions" in note for note in result.notes)


class ProbeThenAnswer:
    """The SQL-tool protocol with known turns: turn 1 probes a wrong query; turn 2 answers the
    gold for questions of even length (a fix) and submits the probe again, respaced and in
    lower case, for odd ones (a repeat). Greedy single-turn answers are wrong."""

    name = "probe-then-answer"

    def complete(self, requests, *, n, temperature, top_p, seed):
        out = []
        for r in requests:
            turn = 1 + sum(m["role"] == "assistant" for m in r.messages)
            if r.fmt != "trail":
                text = f"<think>t</think><sql>{WRONG}</sql>"
            elif turn == 1:
                text = f"<think>probe</think><sql>{WRONG}</sql>"
            elif len(r.example.question) % 2 == 0:
                text = f"<think>done</think><solution>{r.example.gold_sql}</solution>"
            else:
                text = f"<think>done</think><solution>{WRONG.lower().replace(' ', '  ')};</solution>"
            out.append([Completion(text, 5, "stop")] * n)
        return out


def test_multi_turn_counts_fixes_and_repeats_at_turn_2(corpus, tmp_path):
    """Issue 53: the multi-turn pass reports wrong first turns fixed at turn 2 and second turns
    that repeat the first, in metrics.json and report.md."""
    settings = make_settings(eval={"splits": ["dev"], "vote_k": 0, "pass_k": 0, "multi_turn": True, "ts": False,
                                   "max_examples": 10})
    result = run_eval(settings, ProbeThenAnswer(), corpus, None, tmp_path / "eval", progress=False)
    examples = list(read_jsonl(CorpusLayout(corpus).split("dev")))[:10]
    even = sum(len(ex.question) % 2 == 0 for ex in examples)
    assert 0 < even < 10
    m = result.metrics["dev"]["multi_turn"]
    assert m["ex"] == even / 10 and m["mean_turns"] == 2.0
    assert m["turn2"] == {"wrong_at_1": 10, "fixed": even, "fix_rate": even / 10, "second_turns": 10,
                          "repeats": 10 - even, "repeat_rate": (10 - even) / 10}
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["dev"]["multi_turn"]["turn2"] == m["turn2"]
    assert result.flat["dev/multi_turn/turn2/fix_rate"] == even / 10
    report = (tmp_path / "eval" / "report.md").read_text()
    row = f"| Dev | 10 | {even} | {100 * even / 10:.1f} | 10 | {10 - even} | {100 * (10 - even) / 10:.1f} |"
    assert "## Multi-turn: second turns" in report and row in report


# ----------------------------------------------------------------------------- a real tiny model
@pytest.fixture(scope="module")
def tiny_model(corpus, tmp_path_factory):
    torch = pytest.importorskip("torch")
    from progress_sql.train.tiny import build_tiny_model

    torch.set_num_threads(2)
    return build_tiny_model(corpus, make_settings(model=TINY_MODEL), tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.slow
def test_tiny_model_end_to_end(tiny_model, corpus, tmp_path):
    settings = make_settings(
        model=TINY_MODEL, generation={"max_new_tokens": 8, "batch_size": 16}, env={"trail_max_turns": 1},
        eval={"splits": ["dev"], "vote_k": 2, "pass_k": 2, "max_examples": 4, "multi_turn": True, "batch_size": 2},
    )
    result = run_eval(settings, str(tiny_model), corpus, None, tmp_path / "eval", progress=False)
    m = result.metrics["dev"]
    assert m["n"] == 4 and m["prompt_too_long"] == 0
    for mode in ("greedy", "vote_at_2", "multi_turn"):
        for key in ("ex", "ts", "exec_rate", "format_rate"):
            assert 0.0 <= m[mode][key] <= 1.0
        assert 0 < m[mode]["mean_response_tokens"] <= 8 * (2 if mode == "multi_turn" else 1)
    assert 1 <= m["multi_turn"]["mean_turns"] <= 2 and 0.0 <= m["pass_at_2"]["ex"] <= 1.0
    assert all(result.files[k].is_file() for k in ("metrics", "report", "hardness_png", "robustness_csv"))
    lines = [json.loads(x) for x in result.files["predictions/dev"].read_text().splitlines()]
    assert len(lines) == 4 and all(isinstance(ln["greedy"]["text"], str) for ln in lines)
    assert result.model == str(tiny_model) and "dev/greedy/ex" in result.flat


def test_model_generator_skips_prompts_over_the_limit(tiny_model, corpus):
    from progress_sql.inference.policy import ChatModel
    from progress_sql.inference.backends import TransformersBackend
    from progress_sql.inference.models import load_policy

    model, tokenizer = load_policy(tiny_model)
    settings = make_settings(generation={"max_prompt_tokens": 32, "max_new_tokens": 4})
    gen = ChatModel("tiny", TransformersBackend(model, tokenizer, 4), tokenizer, settings.generation)
    example = next(read_jsonl(CorpusLayout(corpus).split("dev")))
    short = Request([{"role": "user", "content": "hi"}], "think_sql", example)
    long = Request([{"role": "user", "content": "word " * 200}], "think_sql", example)
    rows = gen.complete([long, short], n=2, temperature=1.0, top_p=1.0, seed=3)
    assert [c.finish_reason for c in rows[0]] == [PROMPT_TOO_LONG] * 2 and rows[0][0].text == ""
    assert all(0 < c.n_tokens <= 4 and c.finish_reason != PROMPT_TOO_LONG for c in rows[1])


# ----------------------------------------------------------------------------- inputs and errors
def test_missing_or_unknown_splits_fail_before_any_model_is_loaded(corpus, tmp_path):
    settings = make_settings()
    with pytest.raises(ValueError, match="unknown split 'bird'"):
        run_eval(settings, "no/such/model", corpus, ["bird"], tmp_path)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "dev.jsonl").write_text((corpus / "dev.jsonl").read_text())
    with pytest.raises(CorpusError, match="database .* not found"):
        run_eval(settings, "no/such/model", tmp_path / "partial", ["dev"], tmp_path / "out")
    with pytest.raises(CorpusError, match="test.jsonl not found"):
        run_eval(settings, "no/such/model", tmp_path / "partial", ["test"], tmp_path / "out")
    with pytest.raises(ValueError, match="twice"):
        run_eval(settings, ORACLE, corpus, ["dev", "dev"], tmp_path / "out")


def test_eval_settings_are_validated():
    with pytest.raises(ValueError, match="nothing to evaluate"):
        EvalSettings(greedy=False, vote_k=0, pass_k=0)
    with pytest.raises(ValueError, match="twice"):
        EvalSettings(splits=["dev", "dev"])
    with pytest.raises(ValueError):
        EvalSettings(splits=["bird"])


def test_oracle_answers_are_well_formed_in_every_format():
    example = Example(id="x", db_id="d", question="q?", gold_sql="SELECT a FROM t", hardness="easy",
                      reasoning="pick <b> carefully")
    for fmt in FORMATS:
        parsed = parse_output(oracle_answer(example, fmt), fmt)
        assert parsed.well_formed and parsed.sql == "SELECT a FROM t", fmt
    rows = OracleGenerator().complete([Request([], "trail", example)], n=3, temperature=1.0, top_p=1.0, seed=0)
    assert len(rows[0]) == 3 and parse_output(rows[0][0].text, "trail").kind == "solution"


def test_request_policy_answers_each_request_and_counts_its_episode_tokens():
    example = Example(id="x", db_id="d", question="q?", gold_sql="SELECT 1", hardness="easy")
    policy = RequestPolicy(OracleGenerator())
    messages = [{"role": "user", "content": "a prompt"}]
    (out,) = policy.generate([Request(messages, "trail", example, episode_id=4)])
    assert parse_output(out.text, "trail").sql == "SELECT 1"
    policy.generate([Request(messages, "trail", example, episode_id=4)])
    assert policy.tokens == {4: 2 * out.n_tokens}
    with pytest.raises(ValueError, match="needs its episode_id"):
        policy.generate([Request(messages, "trail", example)])


# ----------------------------------------------------------------------------- MLflow
@pytest.mark.slow
def test_metrics_and_reports_go_to_the_active_mlflow_run(corpus, tmp_path, monkeypatch):
    """run_eval logs nothing (eval sits below tracking); ``tracking.log_eval``, which
    ``stages.evaluate`` calls, logs its flat metrics and files."""
    mlflow = pytest.importorskip("mlflow")
    from progress_sql import tracking

    previous = mlflow.get_tracking_uri()
    # A file store is enough to check what is logged (and starts in a fraction of the time of
    # a database store, which runs its schema migrations first).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # mlflow.set_tracking_uri exports MLFLOW_TRACKING_URI, which outranks every later test's
    # settings: monkeypatch owns the variable, so it is put back as it was
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    # MLflow keeps the active experiment process-wide: an earlier test's id means nothing here.
    mlflow.set_experiment("eval-logging")
    try:
        with mlflow.start_run() as run:
            result = run_eval(make_settings(eval={"splits": ["dev"], "vote_k": 2, "pass_k": 0}), ORACLE, corpus, None,
                              tmp_path / "eval", progress=False)
            assert not mlflow.tracking.MlflowClient().get_run(run.info.run_id).data.metrics
            assert tracking.log_eval(result)
        logged = mlflow.tracking.MlflowClient().get_run(run.info.run_id)
        artifacts = {a.path for a in mlflow.tracking.MlflowClient().list_artifacts(run.info.run_id, "eval")}
    finally:
        mlflow.set_tracking_uri(previous)
    assert logged.data.metrics["dev/greedy/ex"] == 1.0 and logged.data.metrics["dev/vote_at_2/ts"] == 1.0
    assert {"eval/metrics.json", "eval/report.md", "eval/hardness.png"} <= artifacts
    assert not any(path.startswith("eval/predictions") or path.endswith(".jsonl") for path in artifacts)
