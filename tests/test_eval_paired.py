"""``progress-sql compare``: two real evaluations of a small built corpus, paired by example."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from progress_sql.cli import app
from progress_sql.params import settings_from_dict
from corpora import small_corpus
from progress_sql.eval import ORACLE, run_eval
from progress_sql.eval.paired import CompareError, compare_runs, mcnemar_exact, read_predictions, wilson_interval
from progress_sql.eval.generators import Completion

SMALL_DATA = {"n_databases": 4, "n_dev_databases": 1, "n_test_databases": 1, "train_size": 30, "dev_size": 12,
              "test_size": 12, "neighbours": 2, "rows_scale": 0.3}
SETTINGS = {"data": SMALL_DATA, "eval": {"vote_k": 0, "pass_k": 0, "max_examples": 0, "ts": False,
                                         "splits": ["dev", "test"]}}


class HalfRight:
    """Greedy answers the gold on questions of even length and a wrong query on the others."""

    name = "half-right"

    def complete(self, requests, *, n, temperature, top_p, seed):
        def answer(r) -> str:
            return r.example.gold_sql if len(r.example.question) % 2 == 0 else "SELECT -1"

        return [[Completion(f"<think>t</think><sql>{answer(r)}</sql>", 7, "stop")] * n for r in requests]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    settings = settings_from_dict(SETTINGS)
    small_corpus(root / "corpus", settings)
    run_eval(settings, ORACLE, root / "corpus", None, root / "oracle", progress=False)
    run_eval(settings, HalfRight(), root / "corpus", None, root / "half", progress=False)
    return root / "corpus", root / "oracle", root / "half"


def test_mcnemar_exact_matches_the_binomial_tail():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(9, 1) == mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(10, 2) < 0.05 < mcnemar_exact(7, 3)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_wilson_interval_matches_published_values_and_stays_inside_0_1():
    """95 % Wilson score intervals (Newcombe 1998, Table I: 81/263 gives 0.2553-0.3662; 0/10 gives
    0-0.2775), and the interval of a paired comparison's EX."""
    low, high = wilson_interval(81, 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_oracle_against_half_right_counts_the_lost_examples(runs):
    _, oracle, half = runs
    comparisons = compare_runs(oracle, half)
    assert [(c.split, c.mode) for c in comparisons] == [("dev", "greedy"), ("test", "greedy")]
    for c in comparisons:
        rows = read_predictions(half / "predictions" / f"{c.split}.jsonl")
        wrong = sorted(i for i, r in rows.items() if not r["greedy"]["ex"])
        assert 0 < len(wrong) < c.n == len(rows) == 12
        assert (c.ex_a, c.ex_b) == (1.0, (12 - len(wrong)) / 12)
        assert c.lost == wrong and c.gained == []
        assert c.p_value == pytest.approx(2 / 2 ** len(wrong))
    back = compare_runs(half, oracle, ["dev"])  # the other way round: the same examples gained
    assert back[0].gained == comparisons[0].lost and back[0].lost == []


def test_a_run_against_itself_changes_nothing(runs):
    _, oracle, _ = runs
    for c in compare_runs(oracle, oracle):
        assert c.gained == c.lost == [] and c.p_value == 1.0 and c.ex_a == c.ex_b == 1.0


def test_only_shared_examples_are_paired(runs, tmp_path):
    _, oracle, half = runs
    cut = tmp_path / "cut"
    (cut / "predictions").mkdir(parents=True)
    lines = (half / "predictions" / "dev.jsonl").read_text().splitlines()
    (cut / "predictions" / "dev.jsonl").write_text("\n".join(lines[:5]) + "\n")
    [c] = compare_runs(oracle, cut)
    assert (c.split, c.n, c.only_a, c.only_b) == ("dev", 5, 7, 0)


def test_cli_prints_the_table_and_json(runs):
    _, oracle, half = runs
    result = CliRunner().invoke(app, ["compare", str(oracle), str(half), "--split", "dev", "--ids"])
    assert result.exit_code == 0, result.output
    assert "| dev | greedy | 12 | 100.00 % [75.8, 100.0] |" in result.output
    assert "dev/greedy lost:" in result.output
    result = CliRunner().invoke(app, ["compare", str(oracle), str(half), "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)
    assert [r["split"] for r in records] == ["dev", "test"]
    assert all(math.isclose(r["p_value"], mcnemar_exact(len(r["gained"]), len(r["lost"]))) for r in records)


@pytest.mark.parametrize("content, message", [
    ("{not json\n", "dev.jsonl:1: not valid JSON"),
    ('{"greedy": {"ex": true}}\n', "dev.jsonl:1: expected an object with a string 'id'"),
    ('{"id": "ID", "greedy": {"ex": 1}}\n', "has no boolean 'ex'"),
    ('{"id": "ID", "greedy": {"ex": true}}\n{"id": "ID", "greedy": {"ex": true}}\n', "appears twice"),
    ('{"id": "zzz", "greedy": {"ex": true}}\n', "share no example id"),
])
def test_corrupt_predictions_get_a_clear_error(runs, tmp_path, content, message):
    _, oracle, _ = runs
    first_id = next(iter(read_predictions(oracle / "predictions" / "dev.jsonl")))
    bad = tmp_path / "bad"
    (bad / "predictions").mkdir(parents=True)
    (bad / "predictions" / "dev.jsonl").write_text(content.replace("ID", first_id))
    with pytest.raises(CompareError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compare_runs(oracle, bad, ["dev"])
    result = CliRunner().invoke(app, ["compare", str(oracle), str(bad), "--split", "dev"])
    assert result.exit_code == 2 and "error:" in result.output


def test_missing_folders_and_unknown_modes_are_refused(runs, tmp_path):
    _, oracle, half = runs
    with pytest.raises(CompareError, match="no predictions folder"):
        compare_runs(oracle, tmp_path / "nowhere")
    with pytest.raises(CompareError, match="unknown mode"):
        compare_runs(oracle, half, modes=["beam"])
    with pytest.raises(CompareError, match="no decoding mode was used by both runs"):
        compare_runs(oracle, half, modes=["vote"])
