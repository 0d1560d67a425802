"""The verl adapter against the installed verl 0.7.1 (docs/integrations/verl.md).

``import verl`` needs Ray, tensordict and torch (``verl/__init__.py`` imports ``verl.protocol``),
and the project installs verl without its dependencies (the Makefile), so the package cannot be
imported here. These tests load the installed package's own pure-Python modules by file and run
them: ``verl.interactions.base`` (the base class the interaction subclasses),
``verl.interactions.utils.interaction_registry`` (which builds it from the docs' config) and
``verl.utils.import_utils`` (which resolves the docs' reward path). The reward hook is called
exactly as the installed ``NaiveRewardManager.run_single`` calls it (its keyword arguments read
from its source), and the parquet export is read back as verl's ``RLHFDataset`` reads it.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import math
import re
import sys
from pathlib import Path
from uuid import uuid4

import pytest
from typer.testing import CliRunner

from progress_sql import envs, rewards
from progress_sql.cli import app
from progress_sql.integrations import verl as verl_adapter
from progress_sql.integrations.tasks import example_from_row
from conftest import GOLD, REPO, answer
from corpora import small_corpus
from doc_blocks import fenced_blocks

VERL_MODULES = ("verl.interactions.base", "verl.interactions.utils.interaction_registry", "verl.utils.import_utils")
INTERACTION_MODULE = "progress_sql.integrations.verl_interaction"


def _verl_root() -> Path:
    spec = importlib.util.find_spec("verl")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make setup installs verl==0.7.1 with --no-deps)")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def verl_modules():
    """The three pure-Python modules of the installed verl, loaded by file under their names."""
    root = _verl_root()
    loaded = {}
    for name in VERL_MODULES:
        path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        loaded[name] = module
    sys.modules.pop(INTERACTION_MODULE, None)  # its class subclasses this base class
    yield loaded
    for name in (*VERL_MODULES, INTERACTION_MODULE):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("verl") / "corpus")


@pytest.fixture(scope="module")
def exported(corpus, tmp_path_factory):
    """The CLI's parquet export of two splits."""
    out = tmp_path_factory.mktemp("verl-data")
    result = CliRunner().invoke(app, ["data", "export-verl", "--corpus", str(corpus), "--out", str(out),
                                      "--split", "train", "--split", "dev", "--limit", "5"])
    assert result.exit_code == 0, result.output
    return out


def _source(relative: str) -> str:
    return (_verl_root() / relative).read_text(encoding="utf-8")


def _compute_score_calls(relative: str) -> list[set[str | None]]:
    """Keyword names of every ``self.compute_score(...)`` call in an installed verl file
    (None stands for a ``**kwargs``)."""
    calls = []
    for node in ast.walk(ast.parse(_source(relative))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compute_score":
            calls.append({kw.arg for kw in node.keywords})
    return calls


def _rows(path: Path) -> list[dict]:
    from datasets import load_dataset

    return list(load_dataset("parquet", data_files=str(path))["train"])  # what RLHFDataset does


# ----------------------------------------------------------------------------- reward hook
def test_compute_score_takes_what_the_installed_reward_manager_passes(exported):
    calls = _compute_score_calls("experimental/reward_loop/reward_manager/naive.py")
    assert calls and all(c - {None} == {"data_source", "solution_str", "ground_truth", "extra_info"} for c in calls)
    assert 'score = result["score"]' in _source("experimental/reward_loop/reward_manager/naive.py")
    row = _rows(exported / "train.parquet")[0]
    # run_single adds these to extra_info before the call
    extra_info = {**row["extra_info"], "num_turns": 2, "rollout_reward_scores": {}}
    result = verl_adapter.compute_score(data_source=row["data_source"], solution_str=answer(row["reward_model"]["ground_truth"]),
                                        ground_truth=row["reward_model"]["ground_truth"], extra_info=extra_info)
    recipe = rewards.get("progress")
    assert list(result) == ["score", *recipe.components, "correct", "turns", "reason"]
    assert result["correct"] == 1.0 and result["reason"] == ""
    assert result["score"] == sum(result[c] for c in recipe.components)


def test_the_docs_reward_path_resolves_through_verls_loader(verl_modules):
    text = (REPO / "docs/integrations/verl.md").read_text(encoding="utf-8")
    path = re.search(r"reward\.custom_reward_function\.path=(\S+)", text).group(1)
    name = re.search(r"reward\.custom_reward_function\.name=(\S+)", text).group(1)
    loaded = verl_modules["verl.utils.import_utils"].load_extern_object(module_path=path, object_name=name)
    assert loaded is verl_adapter.compute_score


def test_reward_kwargs_pick_the_recipe(exported):
    row = _rows(exported / "train.parquet")[0]
    gold, info = row["reward_model"]["ground_truth"], row["extra_info"]
    out = verl_adapter.compute_score("progress_sql", answer(gold, "reasoning_answer"), gold, info, recipe="reasoning_sql")
    assert set(rewards.get("reasoning_sql").components) < set(out) and out["correct"] == 1.0
    assert verl_adapter.compute_score("progress_sql", answer(gold), gold, {**info, "recipe": "oneshot"})["score"] == 3.0


# ----------------------------------------------------------------------------- interaction
def _drive(interaction, row: dict, turns: list[str]) -> tuple[list[dict], list[float], list[tuple]]:
    """What verl's ToolAgentLoop does with an interaction: start it with the row's
    interaction_kwargs, then after each assistant turn ask it for the next user message."""
    kwargs = row["extra_info"]["interaction_kwargs"]
    messages, turn_scores, replies = list(row["prompt"]), [], []

    async def run():
        request_id = uuid4().hex
        await interaction.start_interaction(request_id, **kwargs)
        for text in turns:
            messages.append({"role": "assistant", "content": text})
            done, content, score, metadata = await interaction.generate_response(request_id, messages, **kwargs)
            messages.append({"role": "user", "content": content})
            turn_scores.append(score)
            replies.append((done, content, metadata))
            if done:
                break
        await interaction.finalize_interaction(request_id)

    asyncio.run(run())
    return messages, turn_scores, replies


def _interactions_from_docs(verl_modules, tmp_path) -> dict:
    (config,) = [b for b in fenced_blocks("docs/integrations/verl.md", "yaml") if "interaction:" in b]
    path = tmp_path / "interaction_config.yaml"
    path.write_text(config, encoding="utf-8")
    return verl_modules["verl.interactions.utils.interaction_registry"].initialize_interactions_from_config(str(path))


def _interaction_from_docs(verl_modules, tmp_path):
    return _interactions_from_docs(verl_modules, tmp_path)[verl_adapter.INTERACTION_NAME]


def test_the_docs_config_names_one_interaction_per_protocol(verl_modules, tmp_path):
    """One class for every protocol, the protocol and its default recipe from its config entry; an
    unknown protocol stops verl's start, naming the known ones."""
    interactions = _interactions_from_docs(verl_modules, tmp_path)
    assert {name: (i.protocol, i.recipe) for name, i in interactions.items()} == {
        verl_adapter.interaction_name("odt"): ("odt", "progress"),
        verl_adapter.interaction_name("sql_tool"): ("sql_tool", "sql_trail")}
    cls = type(interactions[verl_adapter.INTERACTION_NAME])
    with pytest.raises(ValueError, match=r"unknown protocol 'sql'; known: odt, sql_tool"):
        cls({"name": "x", "protocol": "sql"})


def test_the_docs_interaction_runs_algorithm_1(verl_modules, exported, tmp_path):
    interaction = _interaction_from_docs(verl_modules, tmp_path)
    assert isinstance(interaction, verl_modules["verl.interactions.base"].BaseInteraction)
    assert interaction.name == verl_adapter.INTERACTION_NAME
    for row in _rows(exported / "train.parquet")[:3]:
        gold = row["reward_model"]["ground_truth"]
        script = [answer("SELECT 1"), "no tags", answer(gold), answer("SELECT 2")]
        messages, turn_scores, replies = _drive(interaction, row, script)
        assert [done for done, _, _ in replies] == [False, False, True]  # the first correct turn ends it
        info = row["extra_info"]
        reference = envs.get("odt_feedback")()
        reference.reset(example_from_row(gold, **{k: info[k] for k in ("db_id", "question", "difficulty", "evidence",
                                                                      "example_id")}), info["db_path"])
        for text in script[:3]:
            reference.step(text)
        feedback = [m["content"] for m in reference.episode.messages if m["role"] == "user"][1:]
        assert [content for _, content, _ in replies[:2]] == feedback
        expected = rewards.get("progress")(reference.episode.trajectory())
        assert turn_scores[-1] == expected.total and replies[-1][2]["components"] == expected.components
        # verl's reward loop passes the turn scores to compute_score in extra_info
        result = verl_adapter.compute_score(row["data_source"], "".join(m["content"] for m in messages[2:]), gold,
                                            {**info, "turn_scores": turn_scores, "num_turns": 7})
        assert result["score"] == expected.total and result["turns"] == 3 and result["reason"] == ""
        assert list(result) == ["score", *rewards.get("progress").components, "correct", "turns", "reason"]
        assert all(math.isnan(result[c]) for c in rewards.get("progress").components)


def test_the_interaction_ends_a_broken_row_at_the_floor(verl_modules, exported, tmp_path):
    interaction = _interaction_from_docs(verl_modules, tmp_path)
    row = _rows(exported / "train.parquet")[0]
    row["extra_info"]["interaction_kwargs"] = {**row["extra_info"]["interaction_kwargs"],
                                               "db_path": str(tmp_path / "absent.sqlite")}
    _, turn_scores, replies = _drive(interaction, row, [answer(GOLD)])
    assert replies[0][0] is True and turn_scores == [rewards.get("progress").min_reward()]
    assert replies[0][2]["reason"].startswith("no_database")
    never_started = asyncio.run(interaction.generate_response("unknown", []))
    assert never_started[0] is True and never_started[2] == rewards.get("progress").min_reward()


def test_the_export_reads_back_as_verls_dataset_reads_it(exported):
    assert sorted(p.name for p in exported.iterdir()) == ["dev.parquet", "train.parquet"]
    for split in ("train", "dev"):
        rows = _rows(exported / f"{split}.parquet")
        assert len(rows) == (5 if split == "train" else 4)
        for index, row in enumerate(rows):
            assert row["data_source"] == verl_adapter.DATA_SOURCE and row["ability"] == "text2sql"
            assert [m["role"] for m in row["prompt"]] == ["system", "user"]
            assert row["reward_model"]["style"] == "rule"
            info = row["extra_info"]
            assert (info["split"], info["index"], info["recipe"]) == (split, index, "progress")
            assert Path(info["db_path"]).is_file()
            kwargs = info["interaction_kwargs"]
            assert kwargs["name"] == verl_adapter.INTERACTION_NAME
            assert (kwargs["db_path"], kwargs["gold_sql"]) == (info["db_path"], row["reward_model"]["ground_truth"])


def test_the_export_command_reports_a_missing_corpus(tmp_path):
    result = CliRunner().invoke(app, ["data", "export-verl", "--corpus", str(tmp_path / "none"), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 1 and "error" in result.output


def test_the_export_limit_is_a_count_or_zero_for_all(corpus, tmp_path):
    # issue 49: --limit -1 wrote all rows but the last, --limit 0 an empty file, both exit 0
    def export(limit: str) -> tuple[int, str, Path]:
        out = tmp_path / f"limit{limit}"
        result = CliRunner().invoke(app, ["data", "export-verl", "--corpus", str(corpus), "--out", str(out),
                                          "--split", "dev", "--limit", limit])
        return result.exit_code, result.output, out / "dev.parquet"

    code, output, written = export("-1")
    assert code == 2 and "--limit" in output and not written.exists()
    code, _, written = export("0")
    assert code == 0 and len(_rows(written)) == 4  # every dev example
    assert [len(_rows(export(n)[2])) for n in ("1", "9")] == [1, 4]
    with pytest.raises(ValueError, match="limit must be"):
        verl_adapter.verl_rows(corpus, "dev", limit=-1)
