"""Presets (configs/presets/*.yaml): overlays of params.yaml merged before the --set overrides.
Every shipped preset validates and runs one RL step with the tiny model in place of its model;
the papers' presets carry the papers' numbers and the ablations differ from progress-sql only in
their terms; an unknown name lists the available ones; a malformed file is an error naming the
file; ``--preset`` is a global option that every command reading settings takes; a missing model
folder stops the stage that loads it at once, naming the setting; ``preset show --as-set`` gives
``dvc exp run`` the preset's values; the test helpers' demo configuration is the cpu-demo preset."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO
from progress_sql import sources
from progress_sql.cli import app
from progress_sql.params import (
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


def test_cpu_long_is_the_hour_long_run_and_cpu_demo_is_small():
    long, default = load_settings(PARAMS, preset="cpu-long"), load_settings(PARAMS, preset="tiny")
    # the tiny policy's values before its 15-minute run, explicitly (docs/experiments/2026-12-03-...)
    assert (long.data.n_databases, long.data.train_size, long.data.renamed_copies) == (16, 3000, 2)
    assert long.model.copy_warmup.steps == 3000 and long.sft.epochs == 7.0 and long.sft.copy_rows == 16
    assert (long.rl.steps, long.rl.max_minutes) == (40, 10.0)
    assert (long.eval.vote_k, long.eval.pass_k, long.eval.max_examples) == (4, 4, 30)
    assert long.model == default.model.model_copy(update={"copy_warmup": long.model.copy_warmup})  # the same policy
    assert long.sft.epochs > default.sft.epochs
    assert long.rl.recipe == default.rl.recipe == "progress" and long.eval.splits == default.eval.splits
    assert "indomain" in default.eval.splits
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
        assert overrides[key] == (value if not key.endswith(("_dir", "init_from")) else overrides[key])  # paths: root's
    assert load_settings(PARAMS, overrides).data == demo.data.model_copy(update={"out_dir": str(tmp_path / "corpus")})


# ----------------------------------------------------------------------------- the papers' presets
MODEL = "models/Qwen2.5-Coder-7B-Instruct"
PAPERS = ("progress-sql", "oneshot", "reasoning-sql", "sql-trail", "skyrl-sql")
ABLATIONS = {  # Table 3 of the Progress-SQL paper: what each changes in the progress-sql preset
    "progress-sql-single-turn": {"rl.env": "single_turn", "rewards.progress.align_pos": 0.0,
                                 "rewards.progress.align_neg": 0.0},
    "progress-sql-no-decay": {"rewards.progress.gamma": 1.0},
    "progress-sql-no-align": {"rewards.progress.align_pos": 0.0, "rewards.progress.align_neg": 0.0},
    "progress-sql-no-exec-status": {"rewards.progress.keep": 0.0, "rewards.progress.recover": 0.0,
                                    "rewards.progress.deteriorate": 0.0},
}


def _overlay(name: str) -> dict:
    return _leaves(load_preset(name, PRESETS)[0])


def test_the_papers_presets_and_ablations_are_shipped_and_name_their_sources():
    assert set(PAPERS) | set(ABLATIONS) <= set(SHIPPED)
    for name in (*PAPERS, *ABLATIONS):
        header = [line for line in (PRESETS / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
                  if line.startswith("#")]
        assert any(word in " ".join(header) for word in ("Source", "Table 3", "Appendix E.1")), name
        assert f"preset show {name} --as-set" in " ".join(header), f"{name}: its dvc exp run line"


def test_progress_sql_has_the_papers_numbers():
    s = load_settings(PARAMS, preset="progress-sql")
    assert s.rl.init_from == MODEL and s.rl.init_from != s.sft.out_dir  # no SFT: RL from the instruct model
    assert (s.rl.recipe, s.rl.env, s.rl.algorithm, s.env.prompt_style) == ("progress", "odt_feedback", "grpo", "paper")
    assert (s.rl.group_size, s.generation.temperature, s.env.max_turns, s.rewards.progress.gamma) == (8, 1.0, 4, 0.5)
    # the trajectory limit (train.trajectories.max_sequence_tokens): prompt + T generations
    assert s.generation.max_prompt_tokens + s.env.max_turns * s.generation.max_new_tokens == 8192
    d = s.data
    drawn_from = {name for name in d.import_train if getattr(d, f"import_{name}")}  # of the datasets given
    assert (d.source, d.import_sampling, d.mix_total, drawn_from) == ("import", "random", 20000, {"spider", "bird", "synsql"})
    assert all((d.import_spider, d.import_bird, d.import_synsql, d.import_spider_syn, d.import_spider_realistic,
                d.import_spider_dk))
    e = s.eval
    assert e.greedy and (e.vote_k, e.max_examples) == (8, 0)  # greedy and Vote@8 on every example
    assert set(e.splits) == {"dev", "test", "syn", "realistic", "dk"}
    assert (s.rl.deepspeed, s.rl.deepspeed_config, s.generation.backend) == ("always", "configs/deepspeed/zero3.json",
                                                                            "vllm")
    assert s.tracking.model_name != load_settings(PARAMS).tracking.model_name  # not the CPU policy's champion


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_an_ablation_is_progress_sql_but_for_its_terms(name):
    assert _overlay(name) == {**_overlay("progress-sql"), **ABLATIONS[name]}
    load_settings(PARAMS, preset=name)  # γ = 1.0 validates: the no-decay ablation can run


def test_oneshot_is_progress_sql_with_the_one_shot_reward():
    expected = {k: v for k, v in _overlay("progress-sql").items() if not k.startswith("rewards.")}
    expected.update({"rl.recipe": "oneshot", "rl.env": "single_turn", "rewards.oneshot.correct": 2.0,
                     "rewards.oneshot.executable": 0.5, "rewards.oneshot.format": 0.5})
    assert _overlay("oneshot") == expected


def test_reasoning_sql_sql_trail_and_skyrl_sql_have_their_numbers():
    r = load_settings(PARAMS, preset="reasoning-sql")
    assert (r.rl.recipe, r.rl.env, r.rl.group_size, r.rl.lr, r.rl.schedule) == ("reasoning_sql", "single_turn", 6,
                                                                                1e-6, "constant")
    assert r.rl.questions_per_step * 8 == 32 and r.rl.warmup_steps == math.ceil(0.001 * r.rl.steps)
    assert r.rl.algorithm == "dr_grpo" and r.rl.aggregation == "seq_mean_token_mean"  # r − mean, GRPO's loss
    w = r.rewards.reasoning_sql
    assert (w.exec, w.judge, w.syntax, w.schema_linking, w.ngram, w.format, w.ngram_n) == (3, 2, 1, 1, 1, 1, 2)
    assert w.judge_backend == "openai" and w.judge_endpoint and r.rl.init_from == MODEL

    t = load_settings(PARAMS, preset="sql-trail")
    assert (t.rl.recipe, t.rl.env, t.rl.group_size, t.rl.kl_beta, t.rl.clip_eps, t.rl.clip_eps_high) == (
        "sql_trail", "exec_feedback", 6, 0.0, 0.2, 0.28)
    assert t.env.trail_max_turns == 10 and t.generation.temperature == 1.0
    p = t.rewards.sql_trail
    assert (p.exec, p.turns, p.schema_linking, p.bigram, p.syntax, p.format) == (5, 2, 1, 1, 1, 1)
    assert t.sft.init_from == MODEL and t.rl.init_from == t.sft.out_dir  # SFT, then RL from its checkpoint
    assert t.eval.multi_turn

    k = load_settings(PARAMS, preset="skyrl-sql")
    assert (k.rl.recipe, k.rl.env, k.rl.kl_beta, k.rl.group_size) == ("skyrl", "exec_feedback", 0.0, 5)
    assert (k.rewards.skyrl.bad_format, k.rewards.skyrl.wrong, k.rewards.skyrl.correct) == (-1, 0, 1)
    assert k.env.trail_max_turns + 1 == 6 and (k.generation.temperature, k.generation.top_p) == (0.6, 0.95)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_preset_names_its_import_lists_only_to_leave_out_a_dataset_it_gives(name):
    """data.import_train / import_eval default to every registered source and take those given,
    so a preset that pinned the list a paper's datasets make would silently leave out a source
    added later; a pin must leave out a dataset the preset gives (the paper says so)."""
    overlay, data = _overlay(name), load_settings(PARAMS, preset=name).data
    for key, role in (("data.import_train", "train"), ("data.import_eval", "evaluation")):
        if key in overlay:
            given = {s.name for s in sources.SOURCES if getattr(s, role) is not None and getattr(data, s.setting)}
            assert set(overlay[key]) < given, f"{name}: {key} pins every dataset it gives: leave it to the default"


# ----------------------------------------------------------------------------- the model folder
def test_model_settings_name_local_folders_or_hub_ids(tmp_path):
    from progress_sql.params import is_local_model_path

    for local in (MODEL, "outputs/sft", str(tmp_path / "x"), "./m", "~/m", str(tmp_path)):
        assert is_local_model_path(local), local
    for remote in ("Qwen/Qwen2.5-Coder-7B-Instruct", "smollm2", "org/models"):
        assert not is_local_model_path(remote), remote


def test_a_missing_model_stops_the_stage_at_once_naming_the_setting(tmp_path, monkeypatch):
    from progress_sql.params import check_model_paths

    monkeypatch.chdir(tmp_path)  # no params.yaml, no corpus, no model: built-in defaults, the checkout's presets
    runner = CliRunner()
    off = ["--set", "tracking.enabled=false", "--no-progress"]
    rl = runner.invoke(app, ["--preset", "progress-sql", "train", "rl", *off])
    assert rl.exit_code == 1 and f"rl.init_from: {MODEL} does not exist" in rl.output, rl.output
    sft = runner.invoke(app, ["--preset", "sql-trail", "train", "sft", *off])
    assert sft.exit_code == 1 and f"sft.init_from: {MODEL} does not exist" in sft.output, sft.output
    assert not any(tmp_path.iterdir()), "nothing ran before the check"
    # what needs no model runs with the preset: its settings load, the ODT answers
    settings = load_settings(PARAMS, preset="progress-sql")
    assert runner.invoke(app, ["--preset", "progress-sql", "odt", "diff", "SELECT 1", "SELECT 1"]).exit_code == 0
    (tmp_path / "models" / "Qwen2.5-Coder-7B-Instruct").mkdir(parents=True)
    check_model_paths(settings, "rl.init_from")  # there now
    with pytest.raises(SettingsError, match="sft.init_from: outputs/smollm2-base does not exist"):
        check_model_paths(settings, "rl.init_from", "sft.init_from")  # the pipeline's own folders too


# ----------------------------------------------------------------------------- every command
def test_every_command_that_reads_settings_takes_the_preset():
    import typer.main

    def leaves(cmd, path=()):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from leaves(sub, path + (name,))
        else:
            yield path, cmd

    runner, without = CliRunner(), set()
    for path, cmd in leaves(typer.main.get_command(app)):
        if path[0] == "preset":  # the presets' own commands take a preset by name
            continue
        if not any("--params" in p.opts for p in cmd.params):  # typer's own click classes: by name
            without.add(path)
            continue
        required = [p for p in cmd.params if p.required]
        args = [a for p in required for a in (["1"] if p.param_type_name == "argument" else [p.opts[0], "1"])]
        result = runner.invoke(app, ["--preset", "cpu-huge", *path, *args])
        assert result.exit_code == 2 and "unknown preset 'cpu-huge'" in result.output, (path, result.output)
    assert without <= {("compare",), ("ui",)}, without  # they read no settings


# ----------------------------------------------------------------------------- DVC
def _as_set(name: str) -> list[str]:
    """``progress-sql preset show NAME --as-set`` split as the shell splits ``$(...)``."""
    result = CliRunner().invoke(app, ["preset", "show", name, "--as-set", "--params", str(PARAMS)])
    assert result.exit_code == 0, result.output
    return result.output.split()


def _dvc_applies(args: list[str], params_file) -> None:
    """What ``dvc exp run ARGS`` does to params.yaml before it runs (dvc.repo.experiments:
    ``-S`` grouped by file, then Hydra's overrides applied to it)."""
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides

    assert args[::2] == ["-S"] * (len(args) // 2) and len(args) % 2 == 0
    groups = to_path_overrides(args[1::2])
    assert set(groups) <= {"params.yaml"}  # every preset is an overlay of params.yaml
    if groups:
        apply_overrides(params_file, groups["params.yaml"])


@pytest.mark.parametrize("name", SHIPPED)
def test_dvc_exp_run_takes_a_preset_as_set_params(name, tmp_path):
    pytest.importorskip("dvc")
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.read_text(encoding="utf-8"), encoding="utf-8")
    _dvc_applies(_as_set(name), params)
    assert load_settings(params) == load_settings(PARAMS, preset=name)


def test_set_params_quote_what_yaml_would_misread(tmp_path):
    pytest.importorskip("dvc")
    mine = tmp_path / "mine.yaml"
    mine.write_text("rewards:\n  reasoning_sql:\n    judge_backend: 'off'\n    judge_model: \"it's-1.0\"\n"
                    "rl:\n  lr: 1.0e-7\n  hardness: [easy, hard]\n  save_rollouts: false\n")
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.read_text(encoding="utf-8"), encoding="utf-8")
    _dvc_applies(_as_set(str(mine)), params)
    loaded = load_settings(params)
    assert loaded == load_settings(PARAMS, preset=str(mine))
    assert loaded.rewards.reasoning_sql.judge_model == "it's-1.0" and loaded.rl.hardness == ["easy", "hard"]
    spaced = tmp_path / "spaced.yaml"
    spaced.write_text("rewards:\n  reasoning_sql:\n    judge_model: two words\n")
    result = CliRunner().invoke(app, ["preset", "show", str(spaced), "--as-set", "--params", str(PARAMS)])
    assert result.exit_code == 2 and "a value with a space" in result.output


def test_as_set_adds_a_part_that_params_yaml_leaves_out(tmp_path):
    """A registered part's settings are optional in params.yaml; DVC sets a key params.yaml lacks
    only as ``++key=value`` (Hydra's add-or-override), which ``--as-set`` writes for it."""
    pytest.importorskip("dvc")
    import yaml

    raw = yaml.safe_load(PARAMS.read_text(encoding="utf-8"))
    del raw["rewards"]["skyrl"]
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    result = CliRunner().invoke(app, ["preset", "show", "skyrl-sql", "--as-set", "--params", str(params)])
    assert result.exit_code == 0, result.output
    args = result.output.split()
    assert "++rewards.skyrl.bad_format=-1.0" in args and "rl.recipe='skyrl'" in args
    _dvc_applies(args, params)
    assert load_settings(params) == load_settings(PARAMS, preset="skyrl-sql")


# ----------------------------------------------------------------------------- one RL step of each
@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """(corpus, policy): the trainer tests' corpus and the tiny model after a short SFT in the
    think_sql format, shared by every preset's step (a preset whose format differs still runs)."""
    torch = pytest.importorskip("torch")
    from corpora import half_right_sft, school_corpus as _corpus, school_settings as _settings

    from progress_sql.train.sft import run_sft
    from progress_sql.train.tiny import build_tiny_model

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("presets")
    corpus = _corpus(root / "corpus")
    s = _settings()
    base = build_tiny_model(corpus, s, root / "base")
    run_sft(half_right_sft(s, base, 15.0), corpus, out_dir=root / "sft", progress=False)
    return corpus, root / "sft"


def _one_step(policy, out, judge_url: str) -> dict:
    """On top of a preset: the tiny model for its model, tiny sizes and lengths, one step, plain
    torch, transformers generation, the judge (where a preset turns it on) at ``judge_url``, every
    question drawn (a band needs question scores: tests/test_trainer.py scores and draws a band).
    The recipe, environment, algorithm, G, turn budgets, rewards and rates stay the preset's."""
    return {"rl.init_from": str(policy), "rl.out_dir": str(out), "rl.steps": 1, "rl.questions_per_step": 1,
            "rl.questions": "all",
            "rl.micro_batch_size": 8, "rl.deepspeed": "never", "rl.max_minutes": 10.0, "rl.checkpoint_every": 1,
            "generation.backend": "transformers", "generation.max_new_tokens": 16,
            "generation.max_prompt_tokens": 1536, "generation.batch_size": 64, "tracking.enabled": False,
            "rewards.reasoning_sql.judge_endpoint": judge_url, "rewards.reasoning_sql.judge_timeout_s": 5.0}


@pytest.mark.parametrize("name", SHIPPED)
def test_one_rl_step_of_each_preset_with_the_tiny_model(name, tiny_policy, tmp_path):
    from test_rl_judge import JudgeServer

    from progress_sql.train.trainer import run_rl

    corpus, policy = tiny_policy
    with JudgeServer() as judge:
        s = load_settings(PARAMS, _one_step(policy, tmp_path / "rl", judge.url), preset=name)
        preset = load_settings(PARAMS, preset=name)
        result = run_rl(s, corpus, progress=False)
    m = result.metrics[0]
    assert result.steps == 1 and math.isfinite(m["loss"]) and math.isfinite(m["reward/mean"]), (name, m)
    ran = json.loads((result.final_dir / "rl_run.json").read_text())["rl"]
    for key in ("recipe", "env", "algorithm", "group_size", "lr", "kl_beta", "clip_eps_high", "loss_aggregation"):
        assert ran[key] == getattr(preset.rl, key), (name, key)
    rows = (result.out_dir / "rollouts" / "step-1.jsonl").read_text().splitlines()
    # one question, G rollouts; with dynamic sampling one more question a draw while no group has a signal
    drawn = int(m["groups/drawn"])
    assert len(rows) == preset.rl.group_size * drawn and (drawn == 1 or preset.rl.dynamic_sampling.enabled), name
    if preset.rl.env == "single_turn":
        assert m["turns/mean"] == 1.0
    if preset.rewards.reasoning_sql.judge_backend != "off" and preset.rl.recipe == "reasoning_sql":
        assert "judge/asked" in m and m["judge/failed"] == 0, m  # the judge was wired in and answered


def test_a_real_dvc_exp_run_with_a_preset(tmp_path):
    """``dvc exp run $(progress-sql preset show reasoning-sql --as-set)`` in a fresh repository
    whose one stage writes the settings it loads: they are the preset's."""
    import shutil
    import subprocess
    import sys

    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    cli = shutil.which("progress-sql") or str(Path(sys.executable).with_name("progress-sql"))
    if not Path(dvc).exists() or not Path(cli).exists():
        pytest.skip("dvc or progress-sql is not installed")
    (tmp_path / "params.yaml").write_text(PARAMS.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  settings:\n"
        f"    cmd: {sys.executable} -c \"from progress_sql.params import load_settings; "
        "open('settings.json', 'w').write(load_settings().model_dump_json())\"\n"
        "    params: [rl, env, rewards, generation, data, eval, tracking]\n    outs: [settings.json]\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "DVC_NO_ANALYTICS": "1"}
    env.pop("DVC_EXP_NAME", None)
    script = (f"git init -q && {dvc} init -q && {dvc} config core.analytics false && "
              f"{dvc} config core.check_update false && git add -A && git commit -qm base && "
              f"{dvc} exp run $({cli} preset show reasoning-sql --as-set --params {PARAMS})")
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ran = json.loads((tmp_path / "settings.json").read_text())
    assert ran == json.loads(load_settings(PARAMS, preset="reasoning-sql").model_dump_json())


def test_an_installed_package_finds_its_presets_and_deepspeed_configs_from_any_folder(tmp_path):
    """``pip install .`` (not editable): the presets and DeepSpeed configs ship in the wheel and
    are found from a folder that has no configs/ of its own."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # a copy: building writes build/ and egg-info beside the sources
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).is_file():
            shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("progress_sql-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {f"progress_sql/configs/presets/{p.name}" for p in PRESETS.glob("*.yaml")} <= set(names)
    assert "progress_sql/configs/deepspeed/zero2.json" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = ("import progress_sql, progress_sql.params as c, progress_sql.train.distributed as d; "
             "print(progress_sql.__file__); print(c.load_preset('progress-sql')[1]); "
             "print(d.resolve_config_path('configs/deepspeed/zero3.json'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, check=True).stdout.split("\n")
    package = tmp_path / "site" / "progress_sql"
    assert out[:3] == [str(package / "__init__.py"), str(package / "configs" / "presets" / "progress-sql.yaml"),
                       str(package / "configs" / "deepspeed" / "zero3.json")]


def test_a_preset_extends_another_and_errors_name_both_files(tmp_path):
    """cpu-demo builds on tiny (its overlay merged first); a loop or a bad `extends` is refused."""
    demo, tiny = load_preset("cpu-demo", PRESETS)[0], load_preset("tiny", PRESETS)[0]
    assert "extends" not in demo and demo["model"]["pretrained"] == "" and demo["model"]["hidden_size"] == 64
    assert demo["rl"]["lr"] == tiny["rl"]["lr"] and load_settings(PARAMS, preset="cpu-demo").model.pretrained == ""
    folder = tmp_path / "configs" / "presets"
    folder.mkdir(parents=True)
    (tmp_path / "params.yaml").write_text(PARAMS.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "base.yaml").write_text("# base: a test\nrl:\n  steps: 7\n  lr: 0.5\n")
    (folder / "top.yaml").write_text("# top: a test\nextends: base\nrl:\n  steps: 3\n")
    top = load_settings(tmp_path / "params.yaml", preset="top")
    assert (top.rl.steps, top.rl.lr) == (3, 0.5)  # the extending preset wins
    (folder / "base.yaml").write_text("# base: a bad value\nrl:\n  lr: -0.5\n")
    with pytest.raises(SettingsError, match="base.yaml"):  # the file the bad value came from
        load_settings(tmp_path / "params.yaml", preset="top")
    (folder / "base.yaml").write_text("# base: a loop\nextends: top\n")
    with pytest.raises(SettingsError, match="goes round in a loop"):
        load_settings(tmp_path / "params.yaml", preset="top")
    (folder / "base.yaml").write_text("# base: bad\nextends: [top]\n")
    with pytest.raises(SettingsError, match="`extends` must name a preset"):
        load_settings(tmp_path / "params.yaml", preset="top")
