"""A study file (``configs/studies/NAME.yaml``) and the plan it becomes at a scale.

A study is a named list of arms (each a preset of ``configs/presets/`` plus overrides) and
one budget. At a scale (a preset such as ``cpu-demo``, or none: the papers' protocols as they
are) every arm × seed becomes a ``Job`` whose settings are layered, last wins:

1. params.yaml;
2. the scale preset (sizes, model and data paths, generation lengths, evaluation sizes);
3. the arm's method preset: all of it without a scale, with a scale only its ``METHOD_KEYS``
   (recipe, environment, loss, G, clipping, KL, reward weights, turn limits, sampling, the
   test-time protocol): the method presets name 7B models and imported datasets, which the
   scale replaces, and what makes the method is kept;
4. the arm's overrides;
5. the budget: questions_per_step = trajectories_per_step / G, rl.steps, rl.max_minutes,
   eval.splits (and eval.max_examples), then the seed (``seed`` and ``rl.seed``);
6. the paths: shared stages (corpus, tiny policy, SFT, and the question scores that
   ``rl.questions: band`` draws by) in folders keyed by the settings they read, so arms that would
   build the same output share it; each job's RL and evaluation in its own folder.

An arm with ``rl: false`` trains nothing: it evaluates the policy the other arms start RL from
(the SFT baseline of the ``methods`` study), so RL is tested against it question by question.

Everything checkable is checked here, before anything runs (``StudyError``).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from progress_sql import rewards
from progress_sql.train.question_scores import scoring_settings
from progress_sql.params import (
    NO_PRESET,
    PACKAGE_CONFIGS,
    Settings,
    SettingsError,
    check_model_paths,
    dotted_items,
    load_preset,
    load_settings,
    preset_names,
    presets_dir,
    yaml_load,
)

STUDIES_SUBDIR = Path("configs") / "studies"

# The keys of a method preset that make the method, kept at any scale. Prefixes end with ".".
# Not among them: rl.init_from and the data/model/sft sections (the scale's), rl.lr (the presets'
# 1e-6 is for 7B models), steps and batch sizes (the budget's), DeepSpeed and the backend
# (hardware), and the judge's server (rewards.reasoning_sql.judge_*: infrastructure; without one
# its weight is redistributed, as judge_backend "off" does).
METHOD_KEYS = (
    "rl.recipe", "rl.env", "rl.algorithm", "rl.loss_aggregation", "rl.group_size", "rl.kl_beta", "rl.clip_eps",
    "rl.clip_eps_high", "rl.grad_clip", "rl.schedule", "rewards.", "env.max_turns", "env.trail_max_turns",
    "generation.temperature", "generation.top_p", "eval.multi_turn", "eval.multi_turn_env",
)
NOT_METHOD_KEYS = ("rewards.reasoning_sql.judge_backend", "rewards.reasoning_sql.judge_endpoint",
                   "rewards.reasoning_sql.judge_model")
NO_WALL_CLOCK = 100000.0  # rl.max_minutes when the budget is steps only (as the papers' presets)


class StudyError(ValueError):
    """A study file, an arm or the budget is wrong; the message names it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Arm(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a folder and an MLflow run name
    preset: str = Field(min_length=1)
    overrides: dict[str, Any] = {}  # dotted keys, as --set takes them
    rl: bool = True  # false: no RL; the arm evaluates the policy RL would start from (its SFT checkpoint)


class Budget(_Strict):
    """What every arm gets the same of (written into the report)."""

    trajectories_per_step: int = Field(ge=2)  # generated trajectories a step: questions × G
    group_size: int | Literal["method"] = "method"  # G: each preset's own (where its paper fixes it) or one for all
    steps: int = Field(ge=1)
    max_minutes: float = Field(0.0, ge=0.0)  # RL wall-clock budget per run; 0: none, the steps decide
    seeds: int = Field(1, ge=1)  # seeds 1..seeds
    splits: list[str] = Field(min_length=1)  # evaluation splits, the same for every arm
    eval_max_examples: int | None = Field(None, ge=0)  # per split; None: the scale's eval.max_examples


class Study(_Strict):
    description: str = ""
    arms: list[Arm] = Field(min_length=2)
    budget: Budget
    scales: dict[str, dict[str, Any]] = {}  # scale preset → budget keys that differ at that scale

    @field_validator("arms")
    @classmethod
    def _unique_names(cls, arms: list[Arm]) -> list[Arm]:
        seen: set[str] = set()
        for arm in arms:
            if arm.name in seen:
                raise ValueError(f"two arms are named {arm.name!r}; each arm needs its own name")
            seen.add(arm.name)
        return arms

    @model_validator(mode="after")
    def _scale_budgets(self) -> "Study":
        for scale, keys in self.scales.items():
            unknown = set(keys) - set(Budget.model_fields)
            if unknown:
                raise ValueError(f"scales.{scale}: unknown budget key(s) {sorted(unknown)}; "
                                 f"known: {', '.join(Budget.model_fields)}")
        return self


def studies_dir(params: str | Path | None = None) -> Path:
    """``configs/studies/`` beside the params file (or the working folder), else the package's."""
    near = (Path(params).resolve().parent if params else Path.cwd()) / STUDIES_SUBDIR
    return near if near.is_dir() else PACKAGE_CONFIGS / "studies"


def study_names(folder: Path | None = None) -> tuple[str, ...]:
    folder = folder or studies_dir()
    return tuple(sorted(p.stem for p in folder.glob("*.yaml"))) if folder.is_dir() else ()


def arm_names(folder: Path | None = None) -> tuple[str, ...]:
    """The arms of every study in ``folder``, each name once, in file order (the choices of
    the Prefect form's ``arms`` field)."""
    folder = folder or studies_dir()
    arms = (arm.name for name in study_names(folder) for arm in load_study(str(folder / f"{name}.yaml"))[1].arms)
    return tuple(dict.fromkeys(arms))


def load_study(name: str, params: str | Path | None = None) -> tuple[str, Study]:
    """(its name, the validated study) from a name in ``configs/studies/`` or a YAML path."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise StudyError(f"study file not found: {path}")
    else:
        folder = studies_dir(params)
        path = folder / f"{name}.yaml"
        if not path.is_file():
            raise StudyError(f"unknown study {name!r}; available: "
                             f"{', '.join(study_names(folder)) or 'none'} (the .yaml files of {folder})")
    try:
        raw = yaml_load(path.read_text(encoding="utf-8"))
        return path.stem, Study.model_validate(raw if raw is not None else {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise StudyError(f"cannot read study file {path}: {err}") from None
    except ValidationError as err:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in err.errors()]
        raise StudyError(f"invalid study {path}:\n" + "\n".join(lines)) from None


def scale_budget(study: Study, scale: str, overrides: dict[str, Any] | None = None) -> Budget:
    """The budget at ``scale``: the file's, its ``scales`` entry, then ``overrides``."""
    raw = {**study.budget.model_dump(), **study.scales.get(scale, {}), **(overrides or {})}
    try:
        return Budget.model_validate(raw)
    except ValidationError as err:
        lines = [f"  budget.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise StudyError("invalid budget:\n" + "\n".join(lines)) from None


def is_method_key(key: str) -> bool:
    """Whether dotted settings key ``key`` is one of the METHOD_KEYS (what makes a method)."""
    return any(key == m or (m.endswith(".") and key.startswith(m)) for m in METHOD_KEYS) and key not in NOT_METHOD_KEYS


def method_overlay(preset: str, scale: str, folder: Path) -> dict[str, Any]:
    """The arm's preset as dotted keys: all of it without a scale, its METHOD_KEYS with one."""
    overlay, _ = load_preset(preset, folder)
    items = dotted_items(overlay)
    if not scale or scale == NO_PRESET:
        return items
    return {k: v for k, v in items.items() if is_method_key(k)}


def is_scale(preset: str, folder: Path) -> bool:
    """Whether ``preset`` (a name in ``folder`` or a file) is a scale: one that names no method.
    A method preset (progress-sql, oneshot, ...) sets ``rl.recipe``; a scale (cpu-demo, cpu-long)
    sets sizes, model and data, and leaves the method to the arms."""
    return preset == NO_PRESET or "rl.recipe" not in dotted_items(load_preset(preset, folder)[0])


def scale_names(folder: Path) -> tuple[str, ...]:
    """The scales among the presets of ``folder``, "none" first."""
    return (NO_PRESET, *(name for name in preset_names(folder) if is_scale(name, folder)))


def select_arms(study: Study, names: list[str] | None) -> Study:
    """The study with only the arms ``names`` (in that order: the first is the one the others
    are tested against); all of them for an empty list."""
    if not names:
        return study
    known = {arm.name: arm for arm in study.arms}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise StudyError(f"no arm named {', '.join(map(repr, unknown))} in this study; its arms: "
                         f"{', '.join(known)}")
    if len(set(names)) < 2:
        raise StudyError(f"pick at least two arms to compare (got {', '.join(names)})")
    return study.model_copy(update={"arms": [known[n] for n in dict.fromkeys(names)]})


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:10]


# What each shared stage reads (its output is a function of these), without its own paths.
def _without(tree: dict[str, Any], *paths: str) -> dict[str, Any]:
    return {k: v for k, v in dotted_items(tree).items() if k not in paths}


def corpus_key(s: Settings) -> str:
    return "corpus-" + _digest(_without(s.data.model_dump(mode="json"), "out_dir"))


def tiny_key(s: Settings) -> str:
    return "tiny-" + _digest([corpus_key(s), _without(s.model.model_dump(mode="json"), "base_dir")])


def sft_key(s: Settings) -> str:
    """The SFT checkpoint's key: its corpus, start, sections and the output format it teaches
    (arms of one format share it; the recipe itself is not read)."""
    tree = {name: getattr(s, name).model_dump(mode="json") for name in ("env", "generation", "odt", "sandbox")}
    start = tiny_key(s) if s.sft.init_from == s.model.base_dir else s.sft.init_from
    return "sft-" + _digest([corpus_key(s), start, _without(s.sft.model_dump(mode="json"), "out_dir", "init_from"),
                            tree, rewards.get(s.rl.recipe).fmt, s.seed])


def scores_key(s: Settings) -> str:
    """The question scores' key (``rl.questions: band``): their corpus, policy and the settings
    that decide them, the seed among them (arms of one output format share a seed's scores)."""
    return "scores-" + _digest([corpus_key(s), s.rl.init_from, scoring_settings(s)])


@dataclass(frozen=True)
class Job:
    """One arm × seed: its settings (paths resolved) and what it needs built first."""

    arm: str
    seed: int
    settings: Settings
    run_dir: Path  # rl/ and eval/ under it, result.json when done
    corpus: str  # keys of the shared stages (folders under Plan.shared_dir)
    tiny: str | None  # None: SFT starts from sft.init_from as it is
    sft: str | None  # None: RL starts from rl.init_from as it is
    scores: str | None = None  # the question scores RL draws by (rl.questions band); None: none needed
    rl: bool = True  # False: no RL, rl.init_from is evaluated as it is

    @property
    def label(self) -> str:
        return f"{self.arm}/seed-{self.seed}"

    @property
    def needs(self) -> tuple[str, ...]:
        """The shared outputs this job reads, in build order."""
        return tuple(k for k in (self.corpus, self.tiny, self.sft, self.scores) if k is not None)

    @property
    def fingerprint(self) -> str:
        """What the job's result depends on: a finished job with another fingerprint reruns."""
        tree = self.settings.model_dump(mode="json")
        tree.pop("tracking", None)
        tree.pop("study", None)
        return _digest(tree)


@dataclass
class JobResult:
    arm: str
    seed: int
    status: str  # "done" | "failed"
    run_dir: str
    fingerprint: str = ""
    error: str = ""
    rl_seconds: float = 0.0
    eval_seconds: float = 0.0
    rl_steps: int = 0
    generated_tokens: float = 0.0  # RL rollouts' sampled tokens, all steps
    metrics: dict[str, float] = field(default_factory=dict)  # the evaluation's flat metrics

    @property
    def label(self) -> str:
        return f"{self.arm}/seed-{self.seed}"


@dataclass
class Plan:
    name: str
    scale: str
    study: Study
    budget: Budget
    arms: list[str]
    jobs: list[Job]
    base: Settings  # the scale's settings (where the study's own folders are)
    out_dir: Path
    shared_dir: Path
    report_dir: Path
    shared: dict[str, Settings] = field(default_factory=dict)  # shared key → the settings that build it
    notes: list[str] = field(default_factory=list)  # how the budget was matched, for the report


def _group_size(arm: Arm, settings_g: int, budget: Budget) -> int:
    g = settings_g if budget.group_size == "method" else budget.group_size
    if budget.trajectories_per_step % g:
        raise StudyError(f"arm {arm.name!r}: its G = {g} does not divide budget.trajectories_per_step = "
                         f"{budget.trajectories_per_step}; pick a multiple of every arm's G "
                         f"(a common multiple of the Gs), or budget.group_size: an integer for all arms")
    return g


def make_plan(name: str, params: str | Path = "params.yaml", scale: str = NO_PRESET, *,
              budget_overrides: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None,
              arms: list[str] | None = None) -> Plan:
    """The study ``name`` at ``scale`` as jobs, every arm's settings validated; ``overrides``
    (dotted) go on every arm, over the scale and under the budget; ``arms`` picks some of its arms
    (default all). StudyError on bad input."""
    scale = scale or NO_PRESET
    folder = presets_dir(params)
    try:  # the scale first: a bad preset is named as every command names it
        base = load_settings(params, overrides, preset=scale)
    except SettingsError as err:
        raise StudyError(f"scale {scale}: {err}") from None
    if not is_scale(scale, folder):
        raise StudyError(f"preset {scale!r} is a method (it sets rl.recipe), not a scale: the arms name the "
                         f"methods; scales: {', '.join(scale_names(folder))}")
    name, study = load_study(name, params)
    study = select_arms(study, arms)
    budget = scale_budget(study, scale, budget_overrides)
    out_dir = Path(base.study.out_dir) / name / scale
    shared_dir = Path(base.study.shared_dir)
    plan = Plan(name, scale, study, budget, [a.name for a in study.arms], [], base, out_dir, shared_dir,
                Path(base.study.report_dir) / name / scale)
    gs: dict[str, int] = {}
    for arm in study.arms:
        try:
            method = method_overlay(arm.preset, scale, folder)
        except SettingsError as err:
            raise StudyError(f"arm {arm.name!r}: {err}") from None
        layered = {**method, **(overrides or {}), **arm.overrides}
        probe = _load(params, scale, layered, arm)
        g = _group_size(arm, probe.rl.group_size, budget)
        gs[arm.name] = g
        layered.update({"rl.group_size": g, "rl.questions_per_step": budget.trajectories_per_step // g,
                        "rl.steps": budget.steps, "rl.max_minutes": budget.max_minutes or NO_WALL_CLOCK,
                        "eval.splits": budget.splits})
        if budget.eval_max_examples is not None:
            layered["eval.max_examples"] = budget.eval_max_examples
        unseeded = _load(params, scale, layered, arm)
        keys = _shared_stages(plan, unseeded)
        for seed in range(1, budget.seeds + 1):
            run_dir = out_dir / arm.name / f"seed-{seed}"
            paths = _paths(plan, unseeded, keys, run_dir)
            seeded = {**layered, "seed": seed, "rl.seed": seed, **paths}
            settings = _load(params, scale, seeded, arm)
            scores = scores_key(settings) if arm.rl and settings.rl.questions == "band" else None
            if scores is not None:
                settings = _load(params, scale, {**seeded, "rl.scores.out_dir": str(shared_dir / scores)}, arm)
                plan.shared.setdefault(scores, settings)
            plan.jobs.append(Job(arm.name, seed, settings, run_dir, *keys, scores=scores, rl=arm.rl))
    for job in plan.jobs:  # a model that no stage of the study builds must exist now
        try:
            if job.sft is not None and job.tiny is None:
                check_model_paths(job.settings, "sft.init_from")
            if job.sft is None:
                check_model_paths(job.settings, "rl.init_from")
        except SettingsError as err:
            raise StudyError(f"arm {job.arm!r}: {err}") from None
    plan.notes = _budget_notes(plan, gs)
    return plan


# The settings every arm run names as MLflow params, the arms' differing method keys beside them.
KEY_SETTINGS = ("rl.recipe", "rl.env", "rl.algorithm", "rl.group_size", "rl.questions_per_step", "rl.steps", "seed")


def arm_params(plan: Plan, job: Job) -> dict[str, Any]:
    """What tells this arm × seed apart, as the params of its MLflow run: the arm, KEY_SETTINGS
    (recipe, environment, loss, G, the budget's questions and steps, the seed) and each method key
    whose value differs between the plan's arms (of the rewards, its own recipe's weights only),
    under their settings names (a pipeline run's param names). Paths and what every arm shares
    stay out (the whole settings are the run's settings.json): MLflow's Compare view plots the
    first params that differ, in name order."""
    flat = {j.arm: dotted_items(j.settings.model_dump(mode="json")) for j in plan.jobs}  # an arm's last seed
    mine = dotted_items(job.settings.model_dump(mode="json"))  # this job's own: its seed, not the arm's last
    own = (f"rewards.{job.settings.rl.recipe}.",)
    differing = sorted(k for k in mine if is_method_key(k) and (not k.startswith("rewards.") or k.startswith(own))
                       and len({repr(f.get(k)) for f in flat.values()}) > 1)
    params = {"arm": job.arm, **{k: mine[k] for k in (*KEY_SETTINGS, *differing)}}
    return params if job.rl else {**params, "rl.steps": 0}  # evaluated as RL would start it


def _load(params: str | Path, scale: str, layered: dict[str, Any], arm: Arm) -> Settings:
    try:
        return load_settings(params, layered, preset=scale)
    except SettingsError as err:
        raise StudyError(f"arm {arm.name!r} (preset {arm.preset}): {err}") from None


def _shared_stages(plan: Plan, s: Settings) -> tuple[str, str | None, str | None]:
    """The keys of the corpus, tiny policy and SFT checkpoint this arm's settings need, and the
    settings each is built with (recorded in ``plan.shared``: the first arm's; equal keys mean
    equal inputs). SFT is needed when RL starts from sft.out_dir, the tiny policy when SFT starts
    from model.base_dir. Shared stages take the scale's seed, not the job's: the seeds vary RL."""
    corpus = corpus_key(s)
    plan.shared.setdefault(corpus, s)
    sft = sft_key(s) if s.rl.init_from == s.sft.out_dir else None
    tiny = tiny_key(s) if sft is not None and s.sft.init_from == s.model.base_dir else None
    for key in (tiny, sft):
        if key is not None:
            plan.shared.setdefault(key, s)
    return corpus, tiny, sft


def _paths(plan: Plan, s: Settings, keys: tuple[str, str | None, str | None], run_dir: Path) -> dict[str, str]:
    corpus, tiny, sft = keys
    out = {"data.out_dir": str(plan.shared_dir / corpus), "rl.out_dir": str(run_dir / "rl"),
           "eval.out_dir": str(run_dir / "eval")}
    if tiny is not None:
        out.update({"model.base_dir": str(plan.shared_dir / tiny), "sft.init_from": str(plan.shared_dir / tiny)})
    if sft is not None:
        out.update({"sft.out_dir": str(plan.shared_dir / sft), "rl.init_from": str(plan.shared_dir / sft)})
    return out


def shared_settings(plan: Plan, key: str) -> Settings:
    """The settings that build shared output ``key``, with its paths in the shared folder."""
    s = plan.shared[key]
    if key.startswith("scores-"):  # a job's own settings: its policy and scores already in the shared folder
        return s
    corpus, tiny = corpus_key(s), tiny_key(s)
    paths = {"data.out_dir": str(plan.shared_dir / corpus), "model.base_dir": str(plan.shared_dir / tiny),
             "sft.out_dir": str(plan.shared_dir / key)}
    if s.sft.init_from == s.model.base_dir:
        paths["sft.init_from"] = paths["model.base_dir"]
    tree = s.model_dump(mode="json")
    for dotted, value in paths.items():
        section, leaf = dotted.split(".")
        tree[section][leaf] = value
    return Settings.model_validate(tree)


def _budget_notes(plan: Plan, gs: dict[str, int]) -> list[str]:
    b = plan.budget
    per_arm = ", ".join(f"{a} G={g} × {b.trajectories_per_step // g} questions" for a, g in gs.items())
    same_g = len(set(gs.values())) == 1
    lcm = math.lcm(*gs.values())
    no_rl = sorted({j.arm for j in plan.jobs if not j.rl})
    return [
        f"Every arm generates {b.trajectories_per_step} trajectories a step for {b.steps} steps "
        f"({b.trajectories_per_step * b.steps} in all)"
        + (f", within {b.max_minutes:g} minutes of RL" if b.max_minutes else ", with no wall-clock limit") + ".",
        ("G is the same for every arm" if same_g else
         f"G is each method's own (its paper fixes it), so the budget is matched in generated trajectories, "
         f"not in questions (the step size is a multiple of {lcm})") + f": {per_arm}.",
        "The train questions come in the same seeded order for every arm (rl.seed); an arm with a smaller G "
        "reads further down the same list.",
        f"Seeds 1..{b.seeds} (seed and rl.seed); the corpus, tiny policy and SFT checkpoints are shared by the arms "
        "whose settings they read are equal, built once with the scale's seed, so the seeds vary RL and sampling only.",
        f"Every arm is evaluated on {', '.join(b.splits)} with the scale's protocol"
        + (f" ({b.eval_max_examples or 'all'} examples a split)" if b.eval_max_examples is not None else "") + ".",
        *([f"No RL for {', '.join(no_rl)}: evaluated as the policy the other arms start RL from (their SFT "
           "checkpoint); its seeds repeat one evaluation."] if no_rl else []),
        *(["rl.questions is band: the starting policy scores the train questions once a seed, and arms of one output "
           "format draw by the same scores."] if any(j.scores for j in plan.jobs) else []),
        (f"Scale {plan.scale}: the arms' presets contribute their method keys only (recipe, environment, loss, G, "
         "clipping, KL, reward weights, turn limits, sampling, test-time protocol); model, data, sizes and "
         "learning rate are the scale's; an LLM judge is off." if plan.scale != NO_PRESET else
         "No scale: each arm's preset applies whole (the paper's protocol)."),
    ]
