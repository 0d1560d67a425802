"""The SkyRL-gym adapter against the installed ``skyrl_gym``: both ids registered as
``BaseTextEnv`` subclasses, scripted episodes through ``skyrl_gym.make``, stop at the first
correct turn, the episode's reward equal to the recipe's on the same trajectory, bad input, and
the docs example (docs/integrations/skyrl.md)."""

from __future__ import annotations

import math

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from progress_sql import envs, rewards  # noqa: E402
from progress_sql.integrations import skyrl_gym as skyrl_adapter  # noqa: E402
from progress_sql.integrations.tasks import example_from_row  # noqa: E402
from conftest import GOLD, WRONG, answer  # noqa: E402
from corpora import small_corpus  # noqa: E402
from doc_blocks import python_blocks, run_doc_block  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("skyrl") / "corpus")


@pytest.fixture(autouse=True)
def registered():
    skyrl_adapter.register()


def _extras(row: dict, **more) -> dict:
    return {**{k: v for k, v in row.items() if k not in ("prompt", "env_class")}, **more}


def _reference(env_name: str, row: dict, texts: list[str], settings=None):
    """The project's own environment stepped with ``texts`` (until done)."""
    env = envs.get(env_name)(settings)
    info = row["extra_info"]
    env.reset(example_from_row(row["reward_spec"]["ground_truth"], **{k: info[k] for k in (
        "db_id", "question", "difficulty", "evidence", "example_id")}), info["db_path"])
    for text in texts:
        if env.done:
            break
        env.step(text)
    return env.episode


def test_both_environments_are_registered_text_environments(corpus):
    assert set(skyrl_adapter.ENV_IDS) <= set(skyrl_gym.registry)
    skyrl_adapter.register()  # again: no RegistrationError
    for env_id in skyrl_adapter.ENV_IDS:
        row = skyrl_adapter.dataset_rows(corpus, "train", env_id, limit=1)[0]
        env = skyrl_gym.make(env_id, env_config={}, extras=_extras(row))
        assert isinstance(env, BaseTextEnv) and isinstance(env, skyrl_gym.Env)
        assert env.spec.id == env_id and env.session.protocol == skyrl_adapter.ENV_IDS[env_id]
        chat, meta = env.init(row["prompt"])
        assert chat == row["prompt"] and meta == {}


def test_odt_episode_stops_at_the_first_correct_turn_with_the_recipes_reward(corpus):
    rows = skyrl_adapter.dataset_rows(corpus, "train", "progress-sql-odt", limit=3)
    for row in rows:
        gold = row["reward_spec"]["ground_truth"]
        script = [answer("SELECT 1"), "no tags at all", answer(gold), answer("SELECT 2")]
        env = skyrl_gym.make("progress-sql-odt", env_config={"recipe": "progress"}, extras=_extras(row, max_turns=4))
        env.init(row["prompt"])
        outputs = []
        for action in script:
            outputs.append(env.step(action))
            if outputs[-1]["done"]:
                break
        reference = _reference("odt_feedback", row, script)
        assert len(outputs) == 3 and [o["done"] for o in outputs] == [False, False, True]  # stopped at turn 3
        assert [o["reward"] for o in outputs[:2]] == [0.0, 0.0]
        feedback = [m["content"] for m in reference.messages if m["role"] == "user"][1:]
        assert [o["observations"][0]["content"] for o in outputs[:2]] == feedback
        expected = rewards.get("progress")(reference.trajectory())
        final = outputs[-1]
        assert final["reward"] == expected.total and final["metadata"]["components"] == expected.components
        assert final["observations"] == [] and final["metadata"]["correct"] and final["metadata"]["reason"] == ""
        assert env.turns == 3 and env.get_metrics()["correct"] == 1.0


def test_max_turns_from_the_generator_is_the_budget(corpus):
    row = skyrl_adapter.dataset_rows(corpus, "train", "progress-sql-odt", limit=1)[0]
    env = skyrl_gym.make("progress-sql-odt", env_config={}, extras=_extras(row, max_turns=2))
    assert env.max_turns == 2
    first, second = env.step(answer(WRONG)), env.step(answer("SELECT 1"))
    assert not first["done"] and second["done"]
    settings = env.session.settings
    expected = rewards.get("progress")(_reference("odt_feedback", row, [answer(WRONG), answer("SELECT 1")],
                                                  settings).trajectory())
    assert second["reward"] == expected.total and expected.info["K"] == 2


@pytest.mark.parametrize("recipe", ["sql_trail", "skyrl"])
def test_sql_tool_episode_runs_queries_then_takes_the_solution(corpus, recipe):
    row = skyrl_adapter.dataset_rows(corpus, "train", "progress-sql-sql-tool", limit=1)[0]
    gold = row["reward_spec"]["ground_truth"]
    script = [f"<think>look</think><sql>{gold}</sql>", "nothing", answer(gold, "trail")]
    env = skyrl_gym.make("progress-sql-sql-tool", env_config={"recipe": recipe}, extras=_extras(row, max_turns=5))
    outputs = [env.step(action) for action in script]
    assert [o["done"] for o in outputs] == [False, False, True]
    assert outputs[0]["observations"][0]["content"].startswith("<observation>")
    assert "invalid" in outputs[1]["observations"][0]["content"]
    expected = rewards.get(recipe)(_reference("exec_feedback", row, script, env.session.settings).trajectory())
    assert outputs[-1]["reward"] == expected.total and outputs[-1]["metadata"]["correct"]
    assert outputs[-1]["metadata"]["recipe"] == recipe


@pytest.mark.parametrize("broken", ["no database", "no gold", "gold fails", "gold too large"])
def test_bad_rows_end_at_the_first_step_with_the_floor(corpus, tmp_path, broken):
    row = skyrl_adapter.dataset_rows(corpus, "train", "progress-sql-odt", limit=1)[0]
    extras = _extras(row)
    if broken == "no database":
        extras["extra_info"] = {**extras["extra_info"], "db_path": str(tmp_path / "absent.sqlite")}
    elif broken == "no gold":
        extras["reward_spec"] = {}
    elif broken == "gold fails":
        extras["reward_spec"] = {"ground_truth": "SELECT x FROM nowhere"}
    else:  # one row more than the default sandbox.max_rows
        extras["reward_spec"] = {"ground_truth": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                                                 "WHERE x < 10001) SELECT x FROM c"}
    env = skyrl_gym.make("progress-sql-odt", env_config=None, extras=extras)  # never raises
    assert env.init(row["prompt"])[0] == row["prompt"]
    out = env.step(answer(GOLD))
    assert out["done"] and out["reward"] == rewards.get("progress").min_reward()
    assert out["metadata"]["reason"].split(":")[0] in ("no_database", "gold_failed", "gold_too_large")
    assert env.turns == 0 and env.get_metrics()["floored"] == 1.0
    assert math.isfinite(env.step(None)["reward"])


def test_docs_example_runs(corpus, monkeypatch, capsys):
    (code,) = [b for b in python_blocks("docs/integrations/skyrl.md") if "skyrl_episode.py" in b]
    namespace = run_doc_block(code, "docs/integrations/skyrl.md", monkeypatch, {"CORPUS": str(corpus)})
    assert namespace["out"]["done"] and namespace["out"]["reward"] > 0
    assert "reward" in capsys.readouterr().out
