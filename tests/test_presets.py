"""Presets (configs/presets/*.yaml): overlays of params.yaml merged before the --set overrides.
Every shipped preset validates; an unknown name lists the available ones; a malformed file is
an error naming the file; ``--preset`` is a global option of the CLI; the test helpers' demo
configuration is the cpu-demo preset."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import REPO
from progress_sql.cli import app
from progress_sql.config import (
    NO_PRESET,
    SettingsError,
    load_preset,
    load_settings,
    merge_overlay,
    preset_names,
    presets_dir,
)

PARAMS = REPO / "params.yaml"
PRESETS = REPO / "configs" / "presets"
SHIPPED = sorted(p.stem for p in PRESETS.glob("*.yaml"))


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def test_the_demo_and_the_long_cpu_run_are_shipped():
    assert {"cpu-demo", "cpu-long"} <= set(SHIPPED)
    assert preset_names(PRESETS) == tuple(SHIPPED) and NO_PRESET not in SHIPPED
    assert presets_dir(PARAMS) == PRESETS


@pytest.mark.parametrize("name", SHIPPED)
def test_every_preset_validates_over_params_yaml_and_says_what_it_is(name):
    settings = load_settings(PARAMS, preset=name)
    overlay, path = load_preset(name, PRESETS)
    assert path == PRESETS / f"{name}.yaml"
    dumped = _leaves(settings.model_dump(mode="json"))
    for key, value in _leaves(overlay).items():  # each key of the overlay is a setting, and took effect
        assert key in dumped, f"{name}: {key} is not a setting"
        assert dumped[key] == value, f"{name}: {key}"
    assert path.read_text(encoding="utf-8").startswith(f"# {name}:"), "a preset starts with a comment saying what it is"


def test_cpu_long_is_params_yaml_and_cpu_demo_is_small():
    assert load_settings(PARAMS, preset="cpu-long") == load_settings(PARAMS)
    demo = load_settings(PARAMS, preset="cpu-demo")
    assert demo.data.train_size < 100 and demo.rl.steps == 1 and demo.eval.splits == ["dev"]
    assert demo.tracking.model_name == "progress-sql-policy-demo"  # never the real policy's champion
    assert demo.data.out_dir == "data/corpus"  # paths are the work_dir's business, not the preset's


def test_overrides_go_on_top_of_the_preset():
    settings = load_settings(PARAMS, {"rl.steps": 3, "data.train_size": 30}, preset="cpu-demo")
    assert settings.rl.steps == 3 and settings.data.train_size == 30 and settings.data.dev_size == 6
    assert merge_overlay({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}}) == {"a": {"b": 1, "c": [2]}, "d": 1}


def test_an_unknown_preset_lists_the_available_ones():
    with pytest.raises(SettingsError) as err:
        load_settings(PARAMS, preset="cpu-huge")
    assert "unknown preset 'cpu-huge'" in str(err.value)
    assert all(name in str(err.value) for name in SHIPPED)


@pytest.mark.parametrize("text, message", [
    ("data: [1, 2\n", "is not valid YAML"),
    ("- data\n", "the top level must be a mapping"),
    ("rl:\n  grup_size: 4\n", "rl.grup_size: unknown key"),
    ("rl:\n  group_size: 1\n", "rl.group_size: Input should be greater than or equal to 2"),
])
def test_a_malformed_preset_is_an_error_naming_its_file(tmp_path, text, message):
    (tmp_path / "params.yaml").write_text(PARAMS.read_text())
    folder = tmp_path / "configs" / "presets"
    folder.mkdir(parents=True)
    (folder / "broken.yaml").write_text(text)
    assert preset_names(presets_dir(tmp_path / "params.yaml")) == ("broken",)
    with pytest.raises(SettingsError) as err:
        load_settings(tmp_path / "params.yaml", preset="broken")
    assert message in str(err.value) and str(folder / "broken.yaml") in str(err.value)


def test_a_preset_may_be_a_file_path(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("rl:\n  steps: 7\n")
    assert load_settings(PARAMS, preset=str(mine)).rl.steps == 7
    with pytest.raises(SettingsError, match="preset file not found"):
        load_settings(PARAMS, preset=str(tmp_path / "missing.yaml"))


def test_preset_is_a_global_option_of_the_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no params.yaml here: built-in defaults, presets of the checkout
    runner = CliRunner()
    result = runner.invoke(app, ["--preset", "cpu-demo", "data", "build", "--out", "corpus", "--no-progress",
                                 "--set", "data.dev_size=5"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    assert manifest["splits"]["train"]["examples"] == 24 and manifest["splits"]["dev"]["examples"] == 5
    bad = runner.invoke(app, ["--preset", "cpu-huge", "odt", "diff", "SELECT 1", "SELECT 1"])
    assert bad.exit_code == 2 and "unknown preset 'cpu-huge'" in bad.output and "cpu-demo" in bad.output
    plain = runner.invoke(app, ["odt", "diff", "SELECT 1", "SELECT 1"])  # the option does not stick
    assert plain.exit_code == 0, plain.output


def test_the_test_helpers_demo_configuration_is_the_cpu_demo_preset(tmp_path):
    from local_stack import tiny_overrides

    overrides = tiny_overrides(tmp_path)
    demo = load_settings(PARAMS, preset="cpu-demo")
    for key, value in _leaves(load_preset("cpu-demo", PRESETS)[0]).items():
        assert overrides[key] == value
    assert load_settings(PARAMS, overrides).data == demo.data.model_copy(update={"out_dir": str(tmp_path / "corpus")})
