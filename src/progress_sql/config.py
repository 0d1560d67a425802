"""Typed settings for params.yaml: the one home of every tunable number.

The defaults below are the project's defaults (``../shared/design/DEFAULTS.md``); params.yaml
lists every one of them explicitly (a test keeps the two in sync). Unknown keys, wrong types
and out-of-range values are errors that name the key.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class SettingsError(ValueError):
    """params.yaml (or an override) is missing, malformed or out of range."""


class _Section(BaseModel):
    # Every section forbids unknown keys and re-validates on assignment, so a typo or a bad
    # override never passes silently.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


# ----------------------------------------------------------------------------- sandbox
class SandboxSettings(_Section):
    timeout_s: float = Field(5.0, gt=0.0, le=600.0)
    max_rows: int = Field(10_000, ge=1)
    max_sql_chars: int = Field(100_000, ge=1)
    workers: int = Field(2, ge=1, le=256)
    gold_cache_size: int = Field(4096, ge=0)


# ----------------------------------------------------------------------------- ODT
class ODTFeatureWeights(_Section):
    select: float = Field(0.20, ge=0.0)
    tables: float = Field(0.15, ge=0.0)
    joins: float = Field(0.15, ge=0.0)
    where: float = Field(0.15, ge=0.0)
    group_by: float = Field(0.10, ge=0.0)
    having: float = Field(0.05, ge=0.0)
    order_by: float = Field(0.05, ge=0.0)
    booleans: float = Field(0.10, ge=0.0)
    counts: float = Field(0.05, ge=0.0)

    @model_validator(mode="after")
    def _positive_total(self) -> "ODTFeatureWeights":
        if sum(self.model_dump().values()) <= 0:
            raise ValueError("odt.weights: the weights must not all be zero")
        return self


class ODTThresholds(_Section):
    """A tag is emitted when its feature similarity falls below its threshold."""

    select: float = Field(1.0, ge=0.0, le=1.0)
    select_count: float = Field(1.0, ge=0.0, le=1.0)
    tables: float = Field(1.0, ge=0.0, le=1.0)
    join_count: float = Field(1.0, ge=0.0, le=1.0)
    joins: float = Field(1.0, ge=0.0, le=1.0)
    where: float = Field(1.0, ge=0.0, le=1.0)
    group_by: float = Field(1.0, ge=0.0, le=1.0)
    having: float = Field(1.0, ge=0.0, le=1.0)
    order_by: float = Field(1.0, ge=0.0, le=1.0)
    limit: float = Field(1.0, ge=0.0, le=1.0)
    distinct: float = Field(1.0, ge=0.0, le=1.0)
    aggregation: float = Field(1.0, ge=0.0, le=1.0)


class ODTSettings(_Section):
    alpha: float = Field(0.70, ge=0.0, le=1.0)
    weights: ODTFeatureWeights = ODTFeatureWeights()
    thresholds: ODTThresholds = ODTThresholds()
    profile_cache_size: int = Field(8192, ge=0)


# ----------------------------------------------------------------------------- rewards
class ProgressRewardSettings(_Section):
    align_pos: float = Field(0.8, ge=0.0)
    align_neg: float = Field(-0.1, le=0.0)
    acc: float = Field(2.0, gt=0.0)
    gamma: float = Field(0.5, gt=0.0, lt=1.0)
    keep: float = Field(0.5, ge=0.0)
    recover: float = Field(0.5, ge=0.0)
    deteriorate: float = Field(-0.5, le=0.0)
    format: float = Field(0.5, ge=0.0)


class OneShotRewardSettings(_Section):
    correct: float = Field(2.0, ge=0.0)
    executable: float = Field(0.5, ge=0.0)
    format: float = Field(0.5, ge=0.0)


class ReasoningSQLRewardSettings(_Section):
    exec: float = Field(3.0, ge=0.0)
    judge: float = Field(2.0, ge=0.0)
    syntax: float = Field(1.0, ge=0.0)
    schema_linking: float = Field(1.0, ge=0.0)
    ngram: float = Field(1.0, ge=0.0)
    format: float = Field(1.0, ge=0.0)
    ngram_n: int = Field(2, ge=1, le=8)
    # "off": no judge; its weight is redistributed over the other components (and reported).
    judge_backend: Literal["off", "openai", "local"] = "off"
    judge_endpoint: str = ""
    judge_model: str = ""
    judge_timeout_s: float = Field(60.0, gt=0.0)  # one judge request, seconds


class SQLTrailTurnLimits(_Section):
    easy: int = Field(2, ge=1)
    medium: int = Field(3, ge=1)
    hard: int = Field(5, ge=1)
    extra: int = Field(5, ge=1)


class SQLTrailRewardSettings(_Section):
    exec: float = Field(5.0, ge=0.0)
    turns: float = Field(2.0, ge=0.0)
    schema_linking: float = Field(1.0, ge=0.0)
    bigram: float = Field(1.0, ge=0.0)
    syntax: float = Field(1.0, ge=0.0)
    format: float = Field(1.0, ge=0.0)
    turn_limits: SQLTrailTurnLimits = SQLTrailTurnLimits()


class SkyRLRewardSettings(_Section):
    bad_format: float = Field(-1.0, le=0.0)
    wrong: float = 0.0
    correct: float = Field(1.0, gt=0.0)


class RewardSettings(_Section):
    progress: ProgressRewardSettings = ProgressRewardSettings()
    oneshot: OneShotRewardSettings = OneShotRewardSettings()
    reasoning_sql: ReasoningSQLRewardSettings = ReasoningSQLRewardSettings()
    sql_trail: SQLTrailRewardSettings = SQLTrailRewardSettings()
    skyrl: SkyRLRewardSettings = SkyRLRewardSettings()


# ----------------------------------------------------------------------------- environments
class EnvSettings(_Section):
    max_turns: int = Field(4, ge=1, le=32)  # T of Algorithm 1
    trail_max_turns: int = Field(10, ge=1, le=64)  # SQL-Trail / SkyRL tool budget
    observation_max_rows: int = Field(50, ge=1)
    observation_max_chars: int = Field(9000, ge=100)


# ----------------------------------------------------------------------------- data
class MixRatios(_Section):
    """Shares of a mixed training set drawn from downloaded corpora (paper: BIRD+Spider+SynSQL)."""

    bird: float = Field(0.4, ge=0.0)
    spider: float = Field(0.3, ge=0.0)
    synsql: float = Field(0.3, ge=0.0)


class HardnessMix(_Section):
    """Target shares of Spider hardness levels in each bundled split (normalised when drawn)."""

    easy: float = Field(0.25, ge=0.0)
    medium: float = Field(0.35, ge=0.0)
    hard: float = Field(0.20, ge=0.0)
    extra: float = Field(0.20, ge=0.0)

    @model_validator(mode="after")
    def _positive_total(self) -> "HardnessMix":
        if sum(self.model_dump().values()) <= 0:
            raise ValueError("data.hardness_mix: the shares must not all be zero")
        return self


class DataSettings(_Section):
    seed: int = Field(0, ge=0)
    out_dir: str = "data/corpus"
    n_databases: int = Field(16, ge=3)
    n_dev_databases: int = Field(2, ge=1)
    n_test_databases: int = Field(2, ge=1)
    train_size: int = Field(3000, ge=1)
    dev_size: int = Field(400, ge=1)
    test_size: int = Field(400, ge=1)
    neighbours: int = Field(5, ge=0, le=50)
    max_empty_gold_share: float = Field(0.05, ge=0.0, le=1.0)
    gold_timeout_s: float = Field(2.0, gt=0.0)
    mix_total: int = Field(20_000, ge=1)
    mix: MixRatios = MixRatios()
    # Bundled corpus (progress_sql.data.build): rows, hardness, empty golds, evidence, fuzzing.
    rows_scale: float = Field(1.0, gt=0.0, le=20.0)  # × each table's catalogue row range
    hardness_mix: HardnessMix = HardnessMix()
    empty_gold_share: float = Field(0.02, ge=0.0, le=1.0)  # empty-result golds the build keeps
    evidence_share: float = Field(0.3, ge=0.0, le=1.0)  # DK-phrased with evidence, where a rule applies
    fuzz_keep: float = Field(0.5, ge=0.0, le=1.0)  # neighbour values kept from the original row
    fuzz_rows: float = Field(0.2, ge=0.0, le=0.9)  # neighbour row count within ±this share

    @model_validator(mode="after")
    def _splits_fit(self) -> "DataSettings":
        if self.n_dev_databases + self.n_test_databases >= self.n_databases:
            raise ValueError(
                "data.n_databases must exceed data.n_dev_databases + data.n_test_databases"
            )
        if self.empty_gold_share > self.max_empty_gold_share:
            raise ValueError("data.empty_gold_share must not exceed data.max_empty_gold_share")
        return self


# ----------------------------------------------------------------------------- root
class Settings(_Section):
    seed: int = Field(0, ge=0)
    sandbox: SandboxSettings = SandboxSettings()
    odt: ODTSettings = ODTSettings()
    rewards: RewardSettings = RewardSettings()
    env: EnvSettings = EnvSettings()
    data: DataSettings = DataSettings()


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid settings in {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        else:
            got = e.get("input")
            shown = repr(got) if not isinstance(got, dict) else "{...}"
            lines.append(f"  {key}: {e['msg']} (got {shown})")
    return "\n".join(lines)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SettingsError(f"override {dotted}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def settings_from_dict(raw: Any, source: str = "<dict>", overrides: dict[str, Any] | None = None) -> Settings:
    """Validate a parsed params tree (plus ``{"a.b": value}`` overrides) into Settings."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SettingsError(f"invalid settings in {source}: the top level must be a mapping")
    raw = dict(raw)
    for key, value in (overrides or {}).items():
        _set_dotted(raw, key, value)
    try:
        return Settings.model_validate(raw)
    except ValidationError as err:
        raise SettingsError(_format_errors(err, source)) from None


def load_settings(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Settings:
    """Load and validate params.yaml; raise SettingsError with the offending key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"settings file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SettingsError(f"cannot read settings file {path}: {err}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SettingsError(f"{path} is not valid YAML: {err}") from None
    return settings_from_dict(raw, str(path), overrides)


@lru_cache(maxsize=1)
def default_settings() -> Settings:
    """The built-in defaults (identical to the shipped params.yaml)."""
    return Settings()
