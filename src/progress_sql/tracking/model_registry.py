"""The model registry: log a trained policy as an MLflow model, register it, and move the
``champion`` alias only when the gate metric beats the current champion's.

A version is a ``pyfunc`` model whose artifact ``hf_model`` is the policy's Hugging Face
folder (weights, config, tokenizer, chat template) exactly as ``save_pretrained`` wrote it:
it loads with ``inference.load_policy`` after a download, offline, and as a pyfunc it
answers questions (``pyfunc.PolicyModel``). MLflow's transformers flavour was not used:
it reaches for the Hugging Face hub (model card, licence) and for torchvision when saving.

Decisions are recorded on the version as tags: ``gate.metric``, ``gate.value``,
``promotion.decision`` (``promoted`` | ``kept`` | ``manual``), ``promotion.reason``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from progress_sql.params import Settings, default_settings
from progress_sql.files import write_json
from progress_sql.tracking.mlflow_runs import (
    TrackingError,
    configure,
    log_artifacts,
    log_metrics,
    mlflow_key,
)
from progress_sql.tracking.model_card import render_model_card

import mlflow  # noqa: E402  (after mlflow_runs has set the quiet environment)
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

HF_ARTIFACT = "hf_model"
MODEL_ARTIFACT = "model"  # the logged model's name within its run
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")
_COMPLETE = ".complete"  # marker of a fully downloaded version in the model cache


@dataclass(frozen=True)
class PromotionDecision:
    """The gate's verdict: ``champion_version`` is the champion after the decision;
    ``previous_version`` the one before (None when there was none)."""

    promoted: bool
    reason: str
    champion_version: int | None
    previous_version: int | None = None
    candidate_value: float | None = None
    champion_value: float | None = None


@dataclass(frozen=True)
class VersionRow:
    """One registered version as ``registry show`` lists it."""

    version: int
    aliases: tuple[str, ...]
    run_id: str
    created: int  # epoch milliseconds
    metrics: dict[str, float] = field(default_factory=dict)
    decision: str = ""
    reason: str = ""


def _client(settings: Settings) -> MlflowClient:
    configure(settings)
    return MlflowClient()


def _settings(settings: Settings | None) -> Settings:
    return settings if settings is not None else default_settings()


# ----------------------------------------------------------------------------- register
def register_model(
    model_dir: str | os.PathLike,
    name: str | None = None,
    *,
    settings: Settings | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> int:
    """Log the policy folder ``model_dir`` as a pyfunc model on the active run (a new run
    when none is active), register it under ``name`` (default ``tracking.model_name``) and
    return the version number. ``metrics`` (the evaluation's) are logged on the run, so the
    version shows them, and go into the model card logged beside the model."""
    from progress_sql.tracking.pyfunc import SIGNATURE, PolicyModel, pyfunc_requirements

    settings = _settings(settings)
    name = name or settings.tracking.model_name
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise TrackingError(f"{model_dir} is not a model directory (no config.json)")
    configure(settings)
    started_here = mlflow.active_run() is None
    if started_here:
        mlflow.start_run(run_name=f"register-{name}")
    try:
        if metrics:
            log_metrics(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            card = Path(tmp) / "model_card.md"
            card.write_text(render_model_card(model_dir, settings, metrics or {}), encoding="utf-8")
            log_artifacts(card)
            with _quiet_pickle_warning():
                info = mlflow.pyfunc.log_model(
                    name=MODEL_ARTIFACT,
                    python_model=PolicyModel(),
                    signature=SIGNATURE,
                    artifacts={HF_ARTIFACT: str(model_dir), "model_card": str(card)},
                    model_config={"format": _output_format(settings),
                                  "max_new_tokens": settings.generation.max_new_tokens,
                                  "max_prompt_tokens": settings.generation.max_prompt_tokens},
                    pip_requirements=pyfunc_requirements(),
                )
            version = mlflow.register_model(info.model_uri, name)
            MlflowClient().update_model_version(name, version.version, description=card.read_text(encoding="utf-8")[:5000])
    except MlflowException as err:
        raise TrackingError(f"cannot register {model_dir} as {name}: {err}") from err
    finally:
        if started_here:
            mlflow.end_run()
    return int(version.version)


@contextmanager
def _quiet_pickle_warning() -> Iterator[None]:
    # pyfunc warns that a Python object is pickled (ours pickles by reference to the installed
    # package, which the loading side needs anyway) and that no input example was given (an
    # example would make MLflow load the model and predict while logging).
    logger = logging.getLogger("mlflow.pyfunc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"mlflow\.")
            yield
    finally:
        logger.setLevel(level)


def _output_format(settings: Settings) -> str:
    from progress_sql import rewards

    return rewards.get(settings.rl.recipe).fmt


# ----------------------------------------------------------------------------- gate
def _gate_value(client: MlflowClient, name: str, version: int, gate_metric: str) -> float | None:
    """The gate metric of a version: its ``gate.value`` tag when recorded for this metric,
    else the metric on its source run, else None."""
    mv = client.get_model_version(name, str(version))
    if mv.tags.get("gate.metric") == gate_metric and "gate.value" in mv.tags:
        return float(mv.tags["gate.value"])
    if mv.run_id:
        value = client.get_run(mv.run_id).data.metrics.get(mlflow_key(gate_metric))
        if value is not None:
            return float(value)
    return None


def _champion(client: MlflowClient, name: str, alias: str) -> int | None:
    try:
        return int(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def promote_if_better(
    name: str,
    version: int,
    gate_metric: str,
    value: float | None,
    settings: Settings | None = None,
) -> PromotionDecision:
    """Move the champion alias to ``version`` when its ``gate_metric`` (``value``, or the
    metric on its run when None) beats the current champion's by more than
    ``tracking.gate_min_delta``; the first version becomes champion; a tie does not promote.
    The decision and its reason are tagged on the version."""
    settings = _settings(settings)
    client = _client(settings)
    alias = settings.tracking.champion_alias
    version = int(version)
    try:
        client.get_model_version(name, str(version))
    except MlflowException as err:
        raise TrackingError(f"{name} has no version {version}") from err
    if value is None:
        value = _gate_value(client, name, version, gate_metric)
    if value is not None and math.isnan(value):
        value = None
    current = _champion(client, name, alias)
    champion_value = _gate_value(client, name, current, gate_metric) if current is not None else None

    if value is None:
        promoted, reason = False, f"candidate v{version} has no {gate_metric}"
    elif current is None:
        promoted, reason = True, f"first champion: no version held '{alias}' ({gate_metric} {value:.4f})"
    elif current == version:
        promoted, reason = False, f"v{version} already holds '{alias}'"
    elif champion_value is None:
        promoted, reason = True, f"champion v{current} has no recorded {gate_metric}; candidate {value:.4f}"
    elif value > champion_value + settings.tracking.gate_min_delta:
        promoted, reason = True, f"{gate_metric} {value:.4f} beats champion v{current} ({champion_value:.4f})"
    else:
        promoted, reason = False, f"{gate_metric} {value:.4f} does not beat champion v{current} ({champion_value:.4f})"

    tags = {"promotion.decision": "promoted" if promoted else "kept", "promotion.reason": reason,
            "gate.metric": gate_metric}
    if value is not None:
        tags["gate.value"] = repr(float(value))
    for key, text in tags.items():
        client.set_model_version_tag(name, str(version), key, text)
    if promoted:
        client.set_registered_model_alias(name, alias, str(version))
    return PromotionDecision(
        promoted=promoted, reason=reason, champion_version=version if promoted else current,
        previous_version=current, candidate_value=None if value is None else float(value),
        champion_value=champion_value,
    )


def promote(name: str, version: int, settings: Settings | None = None) -> int | None:
    """Move the champion alias to ``version`` unconditionally (a manual promotion, tagged as
    such); the previous champion's version, or None."""
    settings = _settings(settings)
    client = _client(settings)
    alias = settings.tracking.champion_alias
    try:
        client.get_model_version(name, str(int(version)))
    except MlflowException as err:
        raise TrackingError(f"{name} has no version {version}") from err
    previous = _champion(client, name, alias)
    client.set_registered_model_alias(name, alias, str(int(version)))
    client.set_model_version_tag(name, str(int(version)), "promotion.decision", "manual")
    client.set_model_version_tag(name, str(int(version)), "promotion.reason",
                                 f"promoted by hand (previous champion: {f'v{previous}' if previous else 'none'})")
    return previous


def show(name: str, settings: Settings | None = None) -> list[VersionRow]:
    """Every version of ``name``, newest first, with its aliases, its run's metrics and the
    gate's decision; an unknown model is a TrackingError."""
    settings = _settings(settings)
    client = _client(settings)
    try:
        registered = client.get_registered_model(name)
    except MlflowException as err:
        raise TrackingError(f"no registered model named {name!r}") from err
    aliases: dict[str, list[str]] = {}
    for alias, version in (registered.aliases or {}).items():
        aliases.setdefault(str(version), []).append(alias)
    rows = []
    for mv in client.search_model_versions(f"name = '{name}'"):
        metrics = client.get_run(mv.run_id).data.metrics if mv.run_id else {}
        rows.append(VersionRow(
            version=int(mv.version), aliases=tuple(sorted(aliases.get(str(mv.version), ()))), run_id=mv.run_id or "",
            created=int(mv.creation_timestamp or 0), metrics=dict(metrics),
            decision=mv.tags.get("promotion.decision", ""), reason=mv.tags.get("promotion.reason", ""),
        ))
    return sorted(rows, key=lambda r: -r.version)


# ----------------------------------------------------------------------------- loading
def is_registry_uri(ref: str) -> bool:
    """``models:/name@alias``, ``models:/name/N`` or a ``runs:/`` URI (not a local path)."""
    return str(ref).startswith(("models:/", "runs:/"))


def local_model_dir(ref: str | os.PathLike, settings: Settings | None = None) -> Path:
    """A local policy folder for ``ref``: a path as is; a ``models:/name@alias`` or
    ``models:/name/N`` URI resolved to its version and downloaded once into
    ``tracking.model_cache_dir/<name>/v<N>``; a ``runs:/`` URI downloaded into a temporary
    folder of the cache. The folder loads with ``load_policy``."""
    settings = _settings(settings)
    ref = str(ref)
    if not is_registry_uri(ref):
        return Path(ref)
    client = _client(settings)
    cache = Path(settings.tracking.model_cache_dir)
    match = _MODELS_URI.match(ref)
    try:
        if match:
            name = match["name"]
            mv = (client.get_model_version_by_alias(name, match["alias"]) if match["alias"]
                  else client.get_model_version(name, match["version"]))
            target = cache / name / f"v{mv.version}"
            uri = f"models:/{name}/{mv.version}"
        elif ref.startswith("runs:/"):
            cache.mkdir(parents=True, exist_ok=True)
            target = Path(tempfile.mkdtemp(prefix="run-", dir=cache))
            uri = ref
        else:
            raise TrackingError(f"{ref!r}: expected models:/NAME@ALIAS, models:/NAME/VERSION or runs:/RUN_ID/PATH")
        if not (target / _COMPLETE).exists():
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(target))
            (target / _COMPLETE).touch()
    except MlflowException as err:
        raise TrackingError(f"cannot resolve {ref}: {err}") from err
    return _hf_folder(target)


def _hf_folder(model_root: Path) -> Path:
    """The policy folder inside a downloaded pyfunc model (named in its MLmodel file)."""
    mlmodel = model_root / "MLmodel"
    if not mlmodel.is_file():
        raise TrackingError(f"{model_root} holds no MLflow model (no MLmodel file)")
    from mlflow.models import Model

    artifacts = Model.load(str(mlmodel)).flavors.get("python_function", {}).get("artifacts", {})
    entry = artifacts.get(HF_ARTIFACT)
    if not entry:
        raise TrackingError(f"{model_root}: the model has no '{HF_ARTIFACT}' artifact; it was not logged by progress-sql")
    folder = model_root / entry["path"]
    if not (folder / "config.json").is_file():
        raise TrackingError(f"{folder}: incomplete download (no config.json)")
    return folder


def write_registry_report(path: str | os.PathLike, name: str, version: int, decision: PromotionDecision) -> None:
    """``reports/registry.json``: the register stage's output (DVC tracks it)."""
    write_json(Path(path), {
        "model": name, "registered": True, "version": version, "promoted": decision.promoted,
        "reason": decision.reason, "champion_version": decision.champion_version,
        "previous_champion": decision.previous_version, "candidate_value": decision.candidate_value,
        "champion_value": decision.champion_value,
    })
