"""The DVC stages' code deps (scripts/stage_deps.py): every stage of dvc.yaml and
studies/dvc.yaml lists exactly the package files its command runs and reads; the import
closure they come from holds every import Python makes; a removed dep is caught; and in a
scratch repository with a dvc.lock, an edit of a module SFT imports makes ``dvc status`` list
``sft`` while an edit of RL-only code does not."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

SCRIPT = REPO / "scripts" / "stage_deps.py"
PYTHON = os.path.abspath(sys.executable)  # the tests run commands in other folders
BIN = os.path.dirname(PYTHON)  # dvc, beside the interpreter


def _load_script():
    spec = importlib.util.spec_from_file_location("stage_deps", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["stage_deps"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


stage_deps = _load_script()


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "DVC_NO_ANALYTICS": "1",
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    return subprocess.run(list(args), cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def scratch(tmp_path) -> Path:
    """A copy of the repository's package, pipelines, params and this script."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "src" / "progress_sql", root / "src" / "progress_sql",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "studies/dvc.yaml", "params.yaml", ".dvcignore", "scripts/stage_deps.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / ".dvc", root / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    return root


def _files(pipeline: str, stage: str) -> set[str]:
    cmd = stage_deps.stage_commands(pipeline)[stage]
    return {str(p.relative_to(REPO / "src" / "progress_sql")) for p in stage_deps.stage_files(cmd)}


def test_every_stage_of_both_pipelines_lists_the_code_it_runs():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for pipeline in stage_deps.PIPELINES:
        for name, deps in stage_deps.written_code_deps(pipeline).items():
            assert "src/progress_sql/stages.py" in deps, (pipeline, name)
            for dep in deps:
                assert "${" in dep or (REPO / dep).exists(), (pipeline, name, dep)


def test_the_closure_follows_lazy_imports_and_stops_at_what_a_stage_never_runs():
    sft = _files("dvc.yaml", "sft")
    # SFT's loss, its adapters, the ODT feedback of its revision dialogues, the evaluation it runs:
    # each imported inside a function body
    assert {"train/logprobs.py", "train/lora.py", "train/sft.py", "odt/feedback.py", "eval/runner.py"} <= sft
    assert not {"train/trainer.py", "train/losses.py", "train/rl_run.py", "train/step_batch.py"} & sft  # RL only
    train = _files("dvc.yaml", "train")
    assert {"train/trainer.py", "train/losses.py", "train/logprobs.py", "configs/deepspeed/zero2.json"} <= train
    assert not any(f.startswith(("train/", "eval/", "configs/")) for f in _files("dvc.yaml", "build_data"))
    assert not any(f.startswith("data/") for f in _files("dvc.yaml", "register"))
    demo = _files("studies/dvc.yaml", "demo")
    assert {"configs/studies/${item}.yaml", "configs/presets/cpu-demo.yaml", "studies/run.py"} <= demo
    assert "configs/studies/methods.yaml" not in demo  # each study reruns for its own file only


@pytest.mark.slow  # imports every module of the package (~10 s)
def test_every_import_python_makes_is_in_the_closure_of_the_code_that_makes_it():
    """Every package module imported for real, each import statement that runs recorded with
    the module (and, at a per-function module's top level, the def) that ran it: the imported
    module is in the closure the script computes from there."""
    code = """
import builtins, importlib, importlib.util, json, sys
edges, real = set(), builtins.__import__
def spy(name, globals=None, locals=None, fromlist=(), level=0):
    module = real(name, globals, locals, fromlist, level)
    importer = (globals or {}).get("__name__") or ""
    if importer.startswith("progress_sql"):
        where = sys._getframe(1).f_code.co_qualname.split(".")[0]
        base = importlib.util.resolve_name("." * level + name, globals.get("__package__")) if level else name
        for target in [base, *(f"{base}.{f}" for f in fromlist or ())]:
            if target.startswith("progress_sql") and target in sys.modules:
                edges.add((importer, where, target))
    return module
builtins.__import__ = spy
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError:  # an optional extra that is not installed
        pass
print(json.dumps(sorted(edges)))
"""
    names = sorted(set(stage_deps.modules()) - {"progress_sql.sql.worker_main"})  # the sandbox's child process
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    edges = json.loads(out.stdout)
    assert len(edges) > 300, len(edges)
    missed = []
    for importer, where, target in edges:
        node = importer
        if stage_deps.per_function(importer):
            node = f"{importer}:" if where == "<module>" else f"{importer}:{where}"
        if target not in stage_deps.closure({node}):
            missed.append(f"{importer} ({where}) imports {target}")
    assert not missed, "\n".join(missed)


def test_every_package_data_file_is_read_by_a_rule():
    rules = [*(r for rels in stage_deps.MODULE_DATA.values() for r in rels),
             *(r for rels in stage_deps.ARGUMENT_DATA.values() for r in rels),
             stage_deps.PRESET_FILE.rpartition("/")[0]]
    package = REPO / "src" / "progress_sql"
    for path in package.rglob("*"):
        if path.is_file() and path.suffix not in (".py", ".pyc"):
            relative = str(path.relative_to(package))
            assert any(relative.startswith(rule.partition("{")[0]) for rule in rules), \
                f"{relative}: say which stages read it (scripts/stage_deps.py: MODULE_DATA or ARGUMENT_DATA)"


def test_check_names_a_missing_dep_and_one_never_run_and_the_rewrite_restores_the_file(scratch):
    pipeline = scratch / "dvc.yaml"
    text = pipeline.read_text(encoding="utf-8")
    logprobs = "      - src/progress_sql/train/logprobs.py\n"
    sft_start = text.index("\n  sft:")
    edited = text[:sft_start] + text[sft_start:].replace(logprobs, "      - src/progress_sql/train/trainer.py\n", 1)
    pipeline.write_text(edited, encoding="utf-8")

    check = _run(scratch, PYTHON, "scripts/stage_deps.py", "--check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "dvc.yaml: sft: missing src/progress_sql/train/logprobs.py" in check.stdout
    assert "dvc.yaml: sft: not run by the stage: src/progress_sql/train/trainer.py" in check.stdout
    assert "stage_deps.py` to rewrite them" in check.stdout

    rewrite = _run(scratch, PYTHON, "scripts/stage_deps.py")
    assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
    assert "dvc.yaml: rewritten" in rewrite.stdout
    assert pipeline.read_text(encoding="utf-8") == text  # comments and the other deps kept, in place
    assert _run(scratch, PYTHON, "scripts/stage_deps.py", "--check").returncode == 0


def test_an_import_the_script_cannot_follow_is_an_error_naming_it(scratch):
    module = scratch / "src/progress_sql/train/sft.py"
    module.write_text(module.read_text(encoding="utf-8") + "\n\ndef _plugin(name):\n"
                      "    import importlib\n\n    return importlib.import_module(name)\n", encoding="utf-8")
    check = _run(scratch, PYTHON, "scripts/stage_deps.py", "--check")
    assert check.returncode == 2, check.stdout + check.stderr
    assert "src/progress_sql/train/sft.py:" in check.stderr and "dynamic import" in check.stderr


@pytest.mark.slow  # a few dvc commands on a scratch repository (~10 s)
def test_dvc_status_lists_sft_after_an_edit_of_the_loss_it_computes(scratch):
    """A dvc.lock for sft and train (their outputs stand-ins: `dvc commit` records the hashes
    without running them); an RL-only edit changes train only, an edit of train/logprobs.py both."""
    if shutil.which("dvc", path=f"{BIN}:{os.environ['PATH']}") is None:
        pytest.skip("dvc is not installed")
    params = yaml.safe_load((scratch / "params.yaml").read_text(encoding="utf-8"))
    for folder in (params["data"]["out_dir"], params["sft"]["init_from"], params["sft"]["out_dir"],
                   params["rl"]["scores"]["out_dir"], f"{params['rl']['out_dir']}/final",
                   f"{params['rl']['out_dir']}/checkpoints"):
        (scratch / folder).mkdir(parents=True, exist_ok=True)
        (scratch / folder / "stand-in").write_text("1")
    for name in ("reports/train/sft.json", "reports/train/sft_loss.csv", "reports/train/rl.json",
                 "reports/train/rl_curve.csv", f"{params['rl']['out_dir']}/metrics.jsonl"):
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_text("1")
    assert _run(scratch, "git", "init", "-q").returncode == 0
    commit = _run(scratch, "dvc", "commit", "-f", "sft", "train")
    assert commit.returncode == 0, commit.stdout + commit.stderr

    def status() -> dict:
        out = _run(scratch, "dvc", "status", "--json", "sft", "train")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    assert status() == {}
    with (scratch / "src/progress_sql/train/trainer.py").open("a") as f:
        f.write("# an RL-only edit\n")
    assert list(status()) == ["train"]
    with (scratch / "src/progress_sql/train/logprobs.py").open("a") as f:
        f.write("# an edit of the SFT loss\n")
    changed = status()
    assert changed["sft"] == [{"changed deps": {"src/progress_sql/train/logprobs.py": "modified"}}]
    assert "train" in changed
