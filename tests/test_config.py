"""Settings: params.yaml is complete, typed and validated; errors name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from progress_sql.params import Settings, SettingsError, load_settings, settings_from_dict

from conftest import REPO

PARAMS = REPO / "params.yaml"


def _leaf_keys(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            keys |= _leaf_keys(value, dotted + ".")
        else:
            keys.add(dotted)
    return keys


def test_params_yaml_is_the_defaults_with_the_real_model_recipe():
    """One home per value: the code's defaults are the tiny policy's, params.yaml is them with
    the cpu-smollm2 recipe (which says why each value), and the tiny preset takes it back."""
    from progress_sql.params import load_preset, merge_overlay

    recipe, _ = load_preset("cpu-smollm2", REPO / "configs" / "presets")
    assert load_settings(PARAMS) == settings_from_dict(merge_overlay(Settings().model_dump(mode="json"), recipe))
    assert load_settings(PARAMS, preset="cpu-smollm2") == load_settings(PARAMS)
    assert load_settings(PARAMS, preset="tiny") == Settings()
    assert load_settings(PARAMS).model.pretrained == "smollm2" and Settings().model.pretrained == ""


def test_params_yaml_lists_every_setting_explicitly():
    """Every setting but a registered part's own (``params.part_settings``: a recipe's weights,
    a backend's section, a source's folder and share), which params.yaml may list (whole) or
    leave to the part's module, and those whose default the registry derives (every source)."""
    from progress_sql.params.reference import missing_params, unlisted_optional

    raw = yaml.safe_load(PARAMS.read_text())
    missing = missing_params(PARAMS.read_text())
    assert not missing, f"params.yaml lacks (python -m progress_sql.params.reference --missing):\n{missing}"
    unlisted = unlisted_optional(PARAMS.read_text())
    assert {"data.import_train", "data.import_eval"} <= unlisted  # a new source is imported without a line here
    expected = {k for k in _leaf_keys(Settings().model_dump()) if not any(k.startswith(p + ".") or k == p for p in unlisted)}
    assert _leaf_keys(raw) == expected


def test_missing_params_gives_the_yaml_of_what_params_yaml_lacks():
    from progress_sql.params.reference import missing_params, reference_markdown, unlisted_parts

    raw = yaml.safe_load(PARAMS.read_text())
    del raw["rewards"]["oneshot"]["correct"]
    del raw["rl"]["lr"]
    missing = yaml.safe_load(missing_params(yaml.safe_dump(raw)))
    defaults = Settings()
    assert missing == {"rl": {"lr": defaults.rl.lr}, "rewards": {"oneshot": {"correct": defaults.rewards.oneshot.correct}}}
    assert missing_params(PARAMS.read_text()) == ""
    # a registered part that params.yaml leaves out is optional: not missing, its defaults its module's
    del raw["rewards"]["skyrl"], raw["generation"]["vllm"], raw["data"]["import_spider_dk"]
    text = yaml.safe_dump(raw)
    assert unlisted_parts(text) - unlisted_parts(PARAMS.read_text()) == {"rewards.skyrl", "generation.vllm",
                                                                         "data.import_spider_dk"}
    assert set(yaml.safe_load(missing_params(text))) == {"rl", "rewards"}
    assert yaml.safe_load(missing_params(text, parts=True))["rewards"]["skyrl"] == defaults.rewards.skyrl.model_dump()
    assert settings_from_dict(yaml.safe_load(text)).rewards.skyrl == defaults.rewards.skyrl
    assert "`rewards.skyrl." not in reference_markdown(text) and "`rewards.progress.gamma`" in reference_markdown(text)


def test_defaults_md_numbers_are_present():
    s = load_settings(PARAMS)
    assert s.odt.alpha == 0.70
    w = s.odt.weights
    assert (w.select, w.tables, w.joins, w.where, w.group_by, w.having, w.order_by, w.booleans, w.counts) == (
        0.20, 0.15, 0.15, 0.15, 0.10, 0.05, 0.05, 0.10, 0.05)
    p = s.rewards.progress
    assert (p.align_pos, p.align_neg, p.acc, p.gamma, p.keep, p.recover, p.deteriorate, p.format) == (
        0.8, -0.1, 2.0, 0.5, 0.5, 0.5, -0.5, 0.5)
    o = s.rewards.oneshot
    assert (o.correct, o.executable, o.format) == (2.0, 0.5, 0.5)
    r = s.rewards.reasoning_sql
    assert (r.exec, r.judge, r.syntax, r.schema_linking, r.ngram, r.format, r.ngram_n) == (3, 2, 1, 1, 1, 1, 2)
    t = s.rewards.sql_trail
    assert (t.exec, t.turns, t.schema_linking, t.bigram, t.syntax, t.format) == (5, 2, 1, 1, 1, 1)
    # the paper's T is the code's default; the default run (SmolLM2 on 2 cores) revises once
    assert Settings().env.max_turns == 4 and s.env.max_turns == 2 and s.env.trail_max_turns == 10
    assert (s.env.observation_max_rows, s.env.observation_max_chars) == (50, 9000)
    assert (s.rewards.skyrl.bad_format, s.rewards.skyrl.wrong, s.rewards.skyrl.correct) == (-1, 0, 1)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"odt": {"alpha": 1.5}}, "odt.alpha"),
        ({"odt": {"alpah": 0.5}}, "odt.alpah: unknown key"),
        ({"rewards": {"progress": {"gamma": "half"}}}, "rewards.progress.gamma"),
        ({"rewards": {"progress": {"gamma": 1.5}}}, "rewards.progress.gamma"),  # 1.0 is allowed: no decay
        ({"sandbox": {"timeout_s": -1}}, "sandbox.timeout_s"),
        ({"data": {"n_databases": 3, "n_dev_databases": 2, "n_test_databases": 2}}, "n_databases"),
        ({"rewards": {"reasoning_sql": {"judge_backend": "gpt"}}}, "rewards.reasoning_sql.judge_backend"),
        ({"nonsense": 1}, "nonsense: unknown key"),
        ({"rl": {"hardness": ["easy", "simple"]}}, "rl.hardness"),
        ({"rl": {"hardness": []}}, "rl.hardness must name at least one level"),
        ({"rl": {"hardness": ["easy", "easy"]}}, "rl.hardness must name at least one level, each once"),
        ({"odt": {"weights": {k: 0.0 for k in Settings().odt.weights.model_dump()}}}, "odt.weights"),
        # a number must be finite (an infinite rate only fails steps later, as NaN), and a boolean is no number
        ({"rl": {"lr": float("inf")}}, "rl.lr: Input should be a finite number"),
        ({"rewards": {"progress": {"acc": float("inf")}}}, "rewards.progress.acc: Input should be a finite number"),
        ({"sandbox": {"timeout_s": float("nan")}}, "sandbox.timeout_s: Input should be a finite number"),
        ({"rl": {"steps": True}}, "rl.steps: Value error, expected a number, got true"),
        ({"generation": {"temperature": False}}, "generation.temperature: Value error, expected a number"),
        # a key of the flat layout, before each backend had its section, names its new place
        ({"generation": {"vllm_dtype": "bfloat16"}}, "generation.vllm_dtype is now generation.vllm.dtype"),
        ({"generation": {"prefix_cache": False}}, "generation.prefix_cache is now generation.transformers.prefix_cache"),
        ({"generation": {"vllm": {"dtpye": "auto"}}}, "generation.vllm.dtpye: unknown key"),
        # renamed keys name their new name ("pool" is the sandbox's, sql.pool)
        ({"rl": {"question_pool": "solved"}}, "rl.question_pool is now rl.questions"),
        ({"rl": {"pool_candidates": 40}}, "rl.pool_candidates is now rl.solved_candidates"),
        ({"compare": {"max_parallel": 1}}, "compare is now study"),  # the section of `progress-sql study`
    ],
)
def test_invalid_settings_name_the_key(raw, fragment):
    with pytest.raises(SettingsError) as err:
        settings_from_dict(raw, "test")
    assert fragment in str(err.value)


def test_overrides_are_validated(tmp_path: Path):
    s = load_settings(PARAMS, overrides={"env.max_turns": 2, "rewards.progress.gamma": 0.25})
    assert s.env.max_turns == 2 and s.rewards.progress.gamma == 0.25
    with pytest.raises(SettingsError, match="env.max_turns"):
        load_settings(PARAMS, overrides={"env.max_turns": 0})
    with pytest.raises(SettingsError, match=r"rl\.question_pool is now rl\.questions"):
        load_settings(PARAMS, overrides={"rl.question_pool": "solved"})
    from progress_sql.cli.common import parse_overrides  # what `--set KEY=VALUE` passes on

    with pytest.raises(SettingsError, match="rl.lr: Input should be a finite number"):
        load_settings(PARAMS, overrides=parse_overrides(["rl.lr=.inf"]))
    with pytest.raises(SettingsError, match="rl.steps: Value error, expected a number, got true"):
        load_settings(PARAMS, overrides=parse_overrides(["rl.steps=true"]))
    assert load_settings(PARAMS, overrides=parse_overrides(["rl.save_rollouts=false"])).rl.save_rollouts is False


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("odt: [1, 2\n", "not valid YAML"),
        ("- 1\n- 2\n", "top level must be a mapping"),
        (b"\xff\xfe\x00odt", "cannot read"),
    ],
)
def test_broken_files_get_clear_errors(tmp_path: Path, content, fragment):
    path = tmp_path / "params.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SettingsError, match=fragment):
        load_settings(path)


def test_missing_file(tmp_path: Path):
    with pytest.raises(SettingsError, match="not found"):
        load_settings(tmp_path / "nope.yaml")


def test_empty_file_gives_defaults(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text("")
    assert load_settings(path) == Settings()


def test_configuration_reference_is_in_sync():
    """docs/CONFIG.md is generated from the settings model and params.yaml's comments; the
    README points to it. Regenerate: python -m progress_sql.params.reference > docs/CONFIG.md"""
    from progress_sql.params.reference import reference_markdown

    expected = reference_markdown(PARAMS.read_text(encoding="utf-8"))
    assert (REPO / "docs" / "CONFIG.md").read_text(encoding="utf-8") == expected
    for key in _leaf_keys(yaml.safe_load(PARAMS.read_text())):  # every setting params.yaml lists
        assert f"`{key}`" in expected
    assert "docs/CONFIG.md" in (REPO / "README.md").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- duplicate keys (issue 39)
def test_a_section_given_twice_in_params_yaml_is_an_error_naming_it_and_both_lines(tmp_path: Path):
    # a second rl: section appended to params.yaml used to replace the first silently
    path = tmp_path / "params.yaml"
    text = PARAMS.read_text(encoding="utf-8")
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("rl:"))
    path.write_text(text + "rl:\n  steps: 6\n", encoding="utf-8")
    second = len(text.splitlines()) + 1
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert str(err.value) == (f"{path}: duplicate key 'rl' at line {second} (first at line {first}): YAML would "
                              "keep only the last one; remove or merge one of them")


def test_a_key_given_twice_in_a_section_is_an_error(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text("rl:\n  lr: 1\n  steps: 3\n  lr: 2\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=r"duplicate key 'rl\.lr' at line 4 \(first at line 2\)"):
        load_settings(path)


def test_a_preset_with_a_duplicate_key_is_an_error_naming_its_file(tmp_path: Path):
    preset = tmp_path / "twice.yaml"
    preset.write_text("sft:\n  epochs: 1\nsft:\n  epochs: 2\n", encoding="utf-8")
    with pytest.raises(SettingsError, match=rf"{preset}: duplicate key 'sft' at line 3 \(first at line 1\)"):
        load_settings(PARAMS, preset=str(preset))


def test_a_study_file_with_a_duplicate_key_is_an_error(tmp_path: Path):
    from progress_sql.studies.spec import StudyError, load_study

    path = tmp_path / "mine.yaml"
    path.write_text((REPO / "configs" / "studies" / "methods.yaml").read_text(encoding="utf-8")
                    + "description: again\n", encoding="utf-8")
    with pytest.raises(StudyError, match=r"duplicate key 'description' at line \d+ \(first at line \d+\)"):
        load_study(str(path))


def test_yaml_without_duplicates_still_reads_merge_keys_and_aliases():
    from progress_sql.params import yaml_load

    assert yaml_load("base: &b {k: 1, j: 2}\nd:\n  <<: *b\n  k: 3\nl: [*b, *b]\n") == {
        "base": {"k": 1, "j": 2}, "d": {"k": 3, "j": 2}, "l": [{"k": 1, "j": 2}] * 2}


def test_a_duplicate_in_params_yaml_exits_2_from_the_cli(tmp_path: Path):
    from typer.testing import CliRunner

    from progress_sql.cli import app

    path = tmp_path / "params.yaml"
    path.write_text("odt:\n  max_nodes: 5\nodt:\n  max_nodes: 6\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["odt", "diff", "SELECT 1", "SELECT 1", "--params", str(path)])
    assert result.exit_code == 2
    assert "duplicate key 'odt' at line 3 (first at line 1)" in result.output


# ----------------------------------------------------------------------------- who is blamed (issue 39)
def test_a_bad_set_override_is_blamed_on_the_set_not_on_the_preset():
    from progress_sql.cli.common import parse_overrides

    with pytest.raises(SettingsError) as err:
        load_settings(PARAMS, overrides=parse_overrides(["rl.lr=.inf"]), preset="cpu-demo")
    assert str(err.value) == "invalid --set override:\n  rl.lr: Input should be a finite number (got inf)"
    with pytest.raises(SettingsError, match=r"^invalid --set override:\n  rl: .*rl\.question_pool is now"):
        load_settings(PARAMS, overrides={"rl.question_pool": "solved"})


def test_a_bad_file_value_is_still_blamed_on_the_file_beside_a_good_override(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text("rl:\n  lr: -1\n", encoding="utf-8")
    with pytest.raises(SettingsError) as err:
        load_settings(path, overrides={"rl.steps": 3, "env.max_turns": 0})
    assert str(err.value).splitlines() == [
        f"invalid settings in {path}:", "  rl.lr: Input should be greater than 0 (got -1)",
        "invalid --set override:", "  env.max_turns: Input should be greater than or equal to 1 (got 0)"]


def test_a_rule_between_settings_names_where_each_value_came_from(tmp_path: Path):
    # issue 49: both values came from --set, yet the error blamed "params.yaml with preset cpu-demo"
    with pytest.raises(SettingsError) as err:
        load_settings(PARAMS, overrides={"rl.async.enabled": True, "generation.temperature": 0.5}, preset="cpu-demo")
    lines = str(err.value).splitlines()
    assert lines[0].startswith("invalid settings: rl.async needs generation.temperature 1.0")
    assert lines[1:] == ["  rl.async.enabled: true, from --set", "  generation.temperature: 0.5, from --set",
                         f"  generation.top_p: 1.0, from {PARAMS}"]
    # one value each from the file, the preset and --set; one left at its default
    path, preset = tmp_path / "params.yaml", tmp_path / "mine.yaml"
    path.write_text("data:\n  n_test_databases: 2\n", encoding="utf-8")
    preset.write_text("data:\n  n_dev_databases: 1\n", encoding="utf-8")
    with pytest.raises(SettingsError) as err:
        load_settings(path, overrides={"data.n_databases": 3}, preset=str(preset))
    assert str(err.value).splitlines()[1:] == [
        "  data.n_databases: 3, from --set", f"  data.n_dev_databases: 1, from preset {preset} ({preset})",
        f"  data.n_test_databases: 2, from {path}"]
    with pytest.raises(SettingsError) as err:
        settings_from_dict({}, "test", {"eval.greedy": False, "eval.vote_k": 0})
    assert str(err.value).splitlines()[1:] == [
        "  eval.greedy: false, from --set", "  eval.vote_k: 0, from --set",
        "  eval.pass_k: 0, from the defaults", "  eval.multi_turn: false, from the defaults"]


def test_a_rule_between_settings_from_the_cli_exits_2_naming_its_sources(tmp_path: Path):
    from typer.testing import CliRunner

    from progress_sql.cli import app

    result = CliRunner().invoke(app, ["--preset", "cpu-demo", "data", "build", "--params", str(PARAMS),
                                      "--set", "rl.async.enabled=true", "--set", "generation.temperature=0.5"])
    assert result.exit_code == 2
    assert "with preset" not in result.output
    assert "  generation.temperature: 0.5, from --set" in result.output


def test_overrides_leave_the_callers_tree_alone():
    raw = {"rl": {"lr": 0.001}}
    assert settings_from_dict(raw, "test", {"rl.steps": 3}).rl.steps == 3
    assert raw == {"rl": {"lr": 0.001}}
