"""The registries are the one list of names: settings are checked against them, callers look
parts up in them, and each part owns its settings (a recipe its weights, an environment its
formats); no document and no test copies a registry's names (tests check a registry by prefix or
by property). Also the output formats' one home."""

from __future__ import annotations

import re

import pytest

from progress_sql import envs, rewards, sources
from progress_sql.params import ALGORITHMS, SettingsError, registered_names, registered_settings, settings_from_dict
from progress_sql.params.settings import AGGREGATIONS
from progress_sql.params.reference import params_comments
from progress_sql.envs import TaskSettings
from progress_sql.formats import FORMATS, SINGLE_ANSWER_FORMATS, answer_tags, answer_text, parse_output, stop_strings
from progress_sql.inference.settings import BACKENDS
from progress_sql.rewards import RewardSettings, Trajectory, Turn

from conftest import REPO


@pytest.mark.parametrize(("key", "value", "known"), [
    ("rl.recipe", "progres", "progress"),
    ("rl.env", "odt", "odt_feedback"),
    ("generation.backend", "no-such-backend", "vllm"),
    ("eval.multi_turn_env", "nope", "exec_feedback"),
])
def test_an_unregistered_name_is_refused_with_the_known_ones(key, value, known):
    with pytest.raises(SettingsError, match=rf"{key}.*unknown .*{value!r}; known: .*{known}"):
        settings_from_dict({}, overrides={key: value})


def test_registered_names_come_from_the_registries():
    names = registered_names()
    assert names["rl.recipe"] == rewards.names()
    assert rewards.names()[:5] == ("progress", "oneshot", "reasoning_sql", "sql_trail", "skyrl")  # the seed methods
    assert names["rl.env"] == envs.names()
    assert names["rl.algorithm"] == tuple(ALGORITHMS) and names["generation.backend"] == ("auto", *BACKENDS)
    assert names["data.import_train"] == tuple(s.name for s in sources.SOURCES if s.train is not None)
    assert set(sources.VARIANTS) <= set(names["eval.splits"])
    assert "odt_feedback" not in names["eval.multi_turn_env"]  # its feedback reads the gold
    with pytest.raises(SettingsError, match="reads the gold"):
        settings_from_dict({}, overrides={"eval.multi_turn_env": "odt_feedback"})


def test_the_rewards_section_is_composed_of_each_recipes_own_weights():
    assert tuple(RewardSettings.model_fields) == rewards.names()
    for name in rewards.names():
        recipe = rewards.get(name)
        assert type(getattr(RewardSettings(), name)) is recipe.weights


def test_a_recipe_reads_its_weights_from_any_settings_that_hold_them():
    recipe = rewards.get("oneshot")
    trajectory = Trajectory(turns=(Turn("<think>t</think><sql>SELECT 1</sql>", "SELECT 1", None, True),),
                            gold_sql="SELECT 1")
    doubled = recipe.weights(correct=4.0)
    pipeline = settings_from_dict({"rewards": {"oneshot": {"correct": 4.0}}})
    task = TaskSettings(rewards=RewardSettings(oneshot=doubled))
    totals = {recipe(trajectory, s).total for s in (doubled, RewardSettings(oneshot=doubled), pipeline, task)}
    assert totals == {4.5}  # correct 4.0 + format 0.5 (no execution result: not executable)
    assert recipe(trajectory).total == 2.5  # the built-in weights
    with pytest.raises(TypeError, match="oneshot: settings must be"):
        recipe(trajectory, rewards.get("skyrl").weights())


def test_an_environment_checks_the_format_it_is_asked_to_speak():
    assert envs.get("single_turn").formats == SINGLE_ANSWER_FORMATS
    assert envs.get("single_turn")(fmt="reasoning_answer").fmt == "reasoning_answer"
    assert envs.get("odt_feedback")().fmt == "think_sql"
    with pytest.raises(ValueError, match="odt_feedback: format must be one of think_sql"):
        envs.get("odt_feedback")(fmt="trail")
    assert envs.get("odt_feedback").reads_gold and not envs.get("exec_feedback").reads_gold


def test_the_lists_in_the_settings_have_their_code():
    """The settings, which validate without torch, hold two lists whose code lives in modules
    that import torch: each backend's module declares its class, and each loss aggregation has
    its branch of train.losses.token_weights."""
    torch = pytest.importorskip("torch")
    from progress_sql.inference.backends import BACKEND_CLASSES
    from progress_sql.train import losses

    # inference.settings.BACKENDS names each backend; its module of that name declares the class
    assert tuple(BACKEND_CLASSES) == tuple(BACKENDS)
    assert all(cls.__module__ == f"progress_sql.inference.backends.{name}" for name, cls in BACKEND_CLASSES.items())
    seq = torch.tensor([0, 0, 1])
    for name in AGGREGATIONS:  # an unknown name raises ValueError
        assert float(losses.token_weights(seq, 2, name, max_tokens=4).sum()) > 0, name
    assert {spec.aggregation for spec in ALGORITHMS.values()} - {None} <= set(AGGREGATIONS)


def test_params_yaml_and_the_reference_name_registries_without_copying_their_names():
    """A setting that names registered parts is documented by its registry (docs/CONFIG.md's
    type column) and params.yaml's comment lists at most one of its names: a new part changes
    neither file."""
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    comments = params_comments(text)
    reference = (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    for key, registered in registered_settings().items():
        named = [n for n in registered.names() if re.search(rf"\b{re.escape(n)}\b", comments.get(key, ""))]
        assert len(named) <= 1, f"params.yaml's comment on {key} copies the names {named} of its registry"
        row = next(line for line in reference.splitlines() if line.startswith(f"| `{key}` |"))
        assert f"| {registered.what} |" in row, key


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_answers_it_parses_and_stops_after_them(fmt):
    text = answer_text(fmt, " looked at t ", " SELECT a FROM t ")
    parsed = parse_output(text, fmt)
    assert parsed.well_formed and parsed.sql == "SELECT a FROM t"
    assert text.endswith(f"</{answer_tags(fmt)[1]}>") and any(text.endswith(s) for s in stop_strings(fmt))


def test_an_unknown_format_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown output format 'xml'; known: think_sql, reasoning_answer, trail"):
        stop_strings("xml")
