"""MLflow runs of the pipeline: one experiment, a parent run per pipeline run, a nested run
per stage, params (flattened settings and the data version), step metrics and artifacts.

Where a stage's run nests, in order:

1. the active run of this thread (a Prefect flow or a script inside ``pipeline_run``);
2. the run named by ``PROGRESS_SQL_PARENT_RUN_ID`` (``pipeline_run`` sets it, so CLI
   subprocesses and worker threads, which do not share MLflow's thread-local active run,
   nest under the same parent);
3. otherwise (a DVC stage, a CLI call by hand) a parent found or created by key: the DVC
   experiment name under ``dvc exp run`` (one parent per experiment), else a hash of the
   settings (one parent per configuration). Such a parent is marked finished at once; its
   stages keep arriving as children.

Every ``log_*`` function is a no-op without an active run, so package code may call them
whether or not tracking is on. The tracking URI is ``MLFLOW_TRACKING_URI`` when set, else
``tracking.tracking_uri``, else a SQLite file ``mlruns/mlflow.db`` under the DVC root (or the
working directory); local experiments keep their artifacts beside that database, and a store
that was moved or copied (with its checkout) is pointed at its own artifacts on first use.

A run whose process died without ending it (SIGKILL, a lost machine) would stay RUNNING for
ever: every run records its host and process, and the next run started on that host marks the
runs of dead processes KILLED.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import socket
import sqlite3
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from progress_sql.params import Settings
from progress_sql.files import disk_error, no_stray_sqlite_folder, sqlite_path, sqlite_uri

if TYPE_CHECKING:  # a type only: importing the runner would pull in the whole eval stack
    from progress_sql.eval.runner import EvalResult

# Quiet and offline before mlflow is imported: no telemetry, no progress bars on downloads.
for _key, _value in (("MLFLOW_DISABLE_TELEMETRY", "true"), ("DO_NOT_TRACK", "true"),
                     ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")):
    os.environ.setdefault(_key, _value)

import mlflow  # noqa: E402
from mlflow.entities import Run, RunStatus  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

PARENT_ENV = "PROGRESS_SQL_PARENT_RUN_ID"
KIND_TAG = "progress_sql.kind"  # "pipeline" or "stage"
STAGE_TAG = "progress_sql.stage"
KEY_TAG = "progress_sql.pipeline_key"
DATA_VERSION = "data_version"  # param on every run that saw a corpus, and on its pipeline run
HOST_TAG = "progress_sql.host"
PROCESS_TAG = "progress_sql.process"  # "<pid>:<start time>": a pid alone may be reused
COMMAND_TAG = "progress_sql.command"  # the whole command line that ran (mlflow.source.name shortens it)
SOURCE_ENV = "PROGRESS_SQL_RUN_SOURCE"  # what ran, when it is not this process's command line (a Prefect flow)
# The experiment's primary metric: MLflow's chart view of the runs opens on it (its bar chart, the
# parallel coordinates); set to eval.gate_metric unless someone chose another.
PRIMARY_METRIC_TAG = "mlflow.experiment.primaryMetric.name"

_configured: dict[str, str] = {}  # tracking URI → experiment id, per process
_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")  # characters MLflow refuses in metric names


class TrackingError(RuntimeError):
    """MLflow cannot do what was asked (unreachable server, unknown model or version, ...)."""


_uri_set_here: str | None = None  # the URI configure() last gave mlflow.set_tracking_uri
_user_env_uri: str | None = None  # MLFLOW_TRACKING_URI as set outside this module


def store_disk_error(err: BaseException) -> OSError | None:
    """A failed write of the local tracking store (SQLite's full disk or I/O error, wrapped by
    SQLAlchemy and MLflow) as an OSError naming the store's file (``files.disk_error``); None for
    any other error, or a store that is not a local SQLite file."""
    db = sqlite_path(mlflow.get_tracking_uri()) if _uri_set_here else None
    seen: set[int] = set()
    pending: list[BaseException] = [err]
    while pending and db is not None:
        e = pending.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, sqlite3.OperationalError):
            return disk_error(e, db)
        pending += [x for x in (e.__cause__, e.__context__, getattr(e, "orig", None)) if isinstance(x, BaseException)]
    return None


def tracking_uri(settings: Settings) -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``tracking.tracking_uri``, else
    ``sqlite:///<root>/mlruns/mlflow.db`` with root = ``$DVC_ROOT`` (set for DVC stages, the
    main repository even for queued experiments) or the working directory."""
    global _user_env_uri
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    # mlflow.set_tracking_uri writes this variable too: only a value that this module did not
    # set itself is the user's choice (else the first store configured would stick forever).
    if env and env != _uri_set_here:
        _user_env_uri = env
    if env and env == _user_env_uri:
        return env
    if settings.tracking.tracking_uri:
        return settings.tracking.tracking_uri
    root = Path(os.environ.get("DVC_ROOT") or Path.cwd())
    return sqlite_uri(root / "mlruns" / "mlflow.db")  # % and ? escaped (a folder may be named so)


def _local_artifact_root(uri: str) -> str | None:
    """Artifacts of a local SQLite store live beside the database (MLflow's own default is
    ``./mlruns`` under whatever the working directory happens to be)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.parent / "artifacts").resolve().as_uri()


def _relocate_artifacts(uri: str, experiment: Any) -> None:
    """A local store moved (or copied) with its checkout still names the old folder's artifacts:
    rewrite that prefix, in place, to the folder beside this database. Only locations of the shape
    ``configure`` creates (``<folder>/artifacts``) are touched; MLflow has no API to move one."""
    new = _local_artifact_root(uri)
    old = experiment.artifact_location or ""
    if new is None or old == new or not (old.startswith("file:///") and old.endswith("/artifacts")):
        return
    columns = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("logged_models", "artifact_location"),
               ("model_versions", "source"), ("model_versions", "storage_location"))
    con = sqlite3.connect(sqlite_path(uri), timeout=30)
    try:
        with con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table, column in columns:
                if table in tables:
                    con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                                f"WHERE substr({column}, 1, ?) = ?", (new, len(old) + 1, len(old), old))
    finally:
        con.close()
    warnings.warn(f"MLflow store {uri}: artifacts were at {old} (the store was moved or copied); "
                  f"now {new}", stacklevel=3)


def configure(settings: Settings) -> str:
    """Point MLflow at the tracking store and the experiment of ``settings``; the experiment
    id. A local SQLite store (and its folder) is created on first use (a few seconds)."""
    uri = tracking_uri(settings)
    name = settings.tracking.experiment
    global _uri_set_here
    mlflow.set_tracking_uri(uri)
    _uri_set_here = uri
    cache_key = f"{uri}\n{name}"
    if cache_key in _configured:
        mlflow.set_experiment(experiment_id=_configured[cache_key])
        return _configured[cache_key]
    if (db := sqlite_path(uri)) is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    with no_stray_sqlite_folder(uri):  # the client connects to the store as it is made
        client = MlflowClient(uri)
    try:
        experiment = client.get_experiment_by_name(name)
        if experiment is not None and uri.startswith("sqlite:///"):
            _relocate_artifacts(uri, experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else client.create_experiment(name, artifact_location=_local_artifact_root(uri)))
        if experiment is None or PRIMARY_METRIC_TAG not in experiment.tags:
            client.set_experiment_tag(experiment_id, PRIMARY_METRIC_TAG, settings.eval.gate_metric)
        _mark_dead_runs_killed(client, experiment_id)
    except mlflow.exceptions.MlflowException as err:
        raise TrackingError(f"MLflow tracking store {uri} is not usable: {err}") from err
    mlflow.set_experiment(experiment_id=experiment_id)
    _configured[cache_key] = experiment_id
    return experiment_id


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from /proc), "" where there is
    no /proc, None when no such process lives."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else _alive_without_proc(pid)
    except (OSError, IndexError):
        return None


def _alive_without_proc(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


def _process_tags() -> dict[str, str]:
    return {HOST_TAG: socket.gethostname(), PROCESS_TAG: f"{os.getpid()}:{_process_start(os.getpid()) or ''}",
            **_source_tags()}


def _source_tags() -> dict[str, str]:
    """What ran, on every run this module opens (MLflow would name the script that started the
    interpreter: ``engine.py`` under Prefect, ``progress-sql`` for any command): what
    ``run_source`` names, else this process's command line (a worker that multiprocessing spawns
    is given its parent's)."""
    command = os.environ.get(SOURCE_ENV) or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    return {"mlflow.source.name": source_name(command), COMMAND_TAG: command}


def source_name(command: str) -> str:
    """``command`` as MLflow's UI can show it: the UI shows a local source's text after its last
    '/', so each path in it is shortened to its last part (``--params /x/params.yaml`` →
    ``--params params.yaml``); the whole command stays in the ``progress_sql.command`` tag."""
    def short(arg: str) -> str:
        key, eq, value = arg.rpartition("=") if "=" in arg and "/" not in arg.split("=", 1)[0] else ("", "", arg)
        return key + eq + (value.rstrip("/").rsplit("/", 1)[-1] if "/" in value else value)

    return " ".join(short(arg) for arg in command.split(" "))


@contextmanager
def run_source(command: str) -> Iterator[None]:
    """Runs opened inside (in this process and the ones it starts) name ``command`` as their
    source, e.g. a Prefect flow run instead of the interpreter that runs it."""
    previous = os.environ.get(SOURCE_ENV)
    os.environ[SOURCE_ENV] = command
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SOURCE_ENV, None)
        else:
            os.environ[SOURCE_ENV] = previous


def _mark_dead_runs_killed(client: MlflowClient, experiment_id: str) -> None:
    """Runs this host started whose process is gone, still RUNNING: KILLED (with the time found)."""
    host = socket.gethostname().replace("'", "")
    stale = client.search_runs([experiment_id], max_results=1000,
                               filter_string=f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'")
    for run in stale:
        pid, _, started = run.data.tags.get(PROCESS_TAG, "").partition(":")
        if not pid.isdigit():
            continue
        now = _process_start(int(pid))
        if now is None or (started and now and now != started):
            client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))
            client.set_tag(run.info.run_id, "progress_sql.killed", "its process ended without ending the run")


# ----------------------------------------------------------------------------- params and keys
def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` → ``{"a.b": "1"}``: nested settings as MLflow params, every leaf a
    string (lists as JSON). Not ``eval.metrics.flat_metrics``, which keeps numbers only."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, dotted + "."))
        elif isinstance(value, (list, tuple)):
            out[dotted] = json.dumps(list(value))
        else:
            out[dotted] = str(value)
    return out


def settings_params(settings: Settings) -> dict[str, str]:
    """The flattened settings (params.yaml as loaded, overrides applied)."""
    return flat_params(settings.model_dump(mode="json"))


def data_version(corpus_dir: str | os.PathLike) -> str | None:
    """A short content hash of a built corpus (its manifest.json holds every file's sha256);
    None when the corpus is not built."""
    manifest = Path(corpus_dir) / "manifest.json"
    if not manifest.is_file():
        return None
    return hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]


def mlflow_key(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric names replaced by '_'."""
    return _MLFLOW_BAD.sub("_", name)


def _metric_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The entries MLflow can log as metrics, under safe keys: numbers, booleans as 0/1;
    infinities and every other value are dropped."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isinf(value)):
            out[mlflow_key(str(key))] = float(value)
    return out


# ----------------------------------------------------------------------------- runs
def _pipeline_key(settings: Settings, version: str | None = None) -> tuple[str, str]:
    """(key, run name) of the parent a standalone stage joins: one per DVC experiment, else one
    per configuration and data version (a corpus rebuilt under the same settings, by changed
    code, starts a new pipeline run instead of joining one that names the old corpus)."""
    exp_name = os.environ.get("DVC_EXP_NAME")
    if exp_name:
        baseline = os.environ.get("DVC_EXP_BASELINE_REV", "")[:7]
        return f"dvc-exp:{exp_name}:{baseline}", f"dvc-exp-{exp_name}"
    digest = hashlib.sha256(json.dumps(settings_params(settings), sort_keys=True).encode()).hexdigest()[:12]
    return f"params:{digest}" + (f":data:{version}" if version else ""), f"pipeline-{digest}"


def _standalone_parent(settings: Settings, experiment_id: str, corpus_dir: str | None) -> str:
    client = MlflowClient()
    key, run_name = _pipeline_key(settings, data_version(corpus_dir or settings.data.out_dir))
    found = client.search_runs([experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(experiment_id, run_name=run_name,
                            tags={KIND_TAG: "pipeline", KEY_TAG: key, **_source_tags()})
    _log_params_with(client, run.info.run_id, settings, corpus_dir or settings.data.out_dir)
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run.info.run_id


def _log_params_with(client: MlflowClient, run_id: str, settings: Settings, corpus_dir: str | None,
                     params: Mapping[str, Any] | None = None) -> None:
    """``params`` (default: the flattened settings) and, when ``corpus_dir`` is given (or, for a
    standalone parent, found in ``data.out_dir``), its data version."""
    params = settings_params(settings) if params is None else flat_params(params)
    version = data_version(corpus_dir) if corpus_dir else None
    if version:
        params[DATA_VERSION] = version
    items = list(params.items())
    for start in range(0, len(items), 100):  # MLflow's batch limit is 100 params
        client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in items[start:start + 100]])


@contextmanager
def pipeline_run(settings: Settings, run_name: str, *, corpus_dir: str | None = None,
                 tags: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None) -> Iterator[Run | None]:
    """The parent run of one pipeline run: logs ``params`` (default: the flattened settings;
    ``tags`` may name another kind of parent, as a study does); stages started inside
    nest under it, in this thread through MLflow's active run, elsewhere through
    ``PROGRESS_SQL_PARENT_RUN_ID``. Its data version is the corpus its stages see: the first
    stage run that sees a built corpus logs it on the pipeline run (a corpus found at the start
    may be rebuilt by the pipeline, or not be built yet), unless ``corpus_dir`` names it here.
    Yields None (and logs nothing) when ``tracking.enabled`` is false."""
    if not settings.tracking.enabled:
        yield None
        return
    configure(settings)
    all_tags = {KIND_TAG: "pipeline", **_process_tags(), **(tags or {})}
    previous = os.environ.get(PARENT_ENV)
    with mlflow.start_run(run_name=run_name, tags=all_tags) as run:
        _log_params_with(MlflowClient(), run.info.run_id, settings, corpus_dir, params)
        os.environ[PARENT_ENV] = run.info.run_id
        try:
            yield run
        finally:
            if previous is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = previous


@contextmanager
def child_pipeline_run(settings: Settings, run_name: str, parent_run_id: str | None, *,
                       tags: Mapping[str, str] | None = None,
                       params: Mapping[str, Any] | None = None) -> Iterator[Run | None]:
    """A pipeline run nested under ``parent_run_id`` (a study's parent run: one child per
    arm × seed, so MLflow's Compare view lines them up), from any thread or process: the
    parent is named, not found through the active run. Logs ``params`` (default: the flattened
    settings) and the data version. Stages started inside nest under it (this thread's active
    run). Yields None when tracking is off or there is no parent."""
    if not settings.tracking.enabled or not parent_run_id:
        yield None
        return
    configure(settings)
    all_tags = {KIND_TAG: "pipeline", **_process_tags(), **(tags or {})}
    nested = mlflow.active_run() is not None
    with mlflow.start_run(run_name=run_name, parent_run_id=parent_run_id, nested=nested, tags=all_tags) as run:
        _log_params_with(MlflowClient(), run.info.run_id, settings, settings.data.out_dir, params)
        yield run


def set_run_tags(run_id: str, tags: Mapping[str, str]) -> None:
    """Tags on a run by id (e.g. where a study's report is, on its parent run)."""
    client = MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def log_run_metrics(run_id: str, metrics: Mapping[str, Any]) -> None:
    """Summary metrics on a run by id (not the active one); as ``log_metrics``, only numbers."""
    values = _metric_values(metrics)
    if values:
        now = int(time.time() * 1000)
        MlflowClient().log_batch(run_id, metrics=[mlflow.entities.Metric(k, v, now, 0) for k, v in values.items()])


def log_run_artifacts(run_id: str, path: str | os.PathLike, artifact_path: str | None = None) -> None:
    """A file or folder as artifacts of a run by id (not the active one); a missing path is skipped."""
    path = Path(path)
    if not path.exists():
        return
    client = MlflowClient()
    if path.is_dir():
        client.log_artifacts(run_id, str(path), artifact_path)
    else:
        client.log_artifact(run_id, str(path), artifact_path)


@contextmanager
def stage_run(name: str, settings: Settings | None = None, *, corpus_dir: str | None = None,
              run_name: str | None = None) -> Iterator[Run | None]:
    """A nested run for one stage (see the module docstring for where it nests), named
    ``run_name`` (default: the stage's name, which its ``progress_sql.stage`` tag always holds).
    Logs the stage's data version when the corpus is built. Yields None when tracking is off; a
    stage that raises leaves its run marked FAILED."""
    if settings is not None and not settings.tracking.enabled:
        yield None
        return
    if settings is not None:
        experiment_id = configure(settings)
    elif mlflow.active_run() is None and not os.environ.get(PARENT_ENV):
        raise TrackingError("stage_run needs settings when no pipeline run is active")
    else:
        experiment_id = None
    tags = {KIND_TAG: "stage", STAGE_TAG: name, **_process_tags()}
    active = mlflow.active_run()
    if active is not None:
        kwargs: dict[str, Any] = {"nested": True}
    else:
        parent = os.environ.get(PARENT_ENV) or _standalone_parent(settings, experiment_id, corpus_dir)
        kwargs = {"parent_run_id": parent}
    with mlflow.start_run(run_name=run_name or name, tags=tags, **kwargs) as run:
        version = data_version(corpus_dir or (settings.data.out_dir if settings else ""))
        if version:
            mlflow.log_param(DATA_VERSION, version)
            _log_parent_data_version(_parent_id(run), version)
        yield run


def _log_parent_data_version(parent_id: str, version: str) -> None:
    """The data version as a param of the pipeline run (the first stage that sees a corpus
    sets it; MLflow params are immutable) and as its tag (the latest). A later stage on another
    corpus (a pipeline run that rebuilt its data half-way) keeps the param and warns."""
    client = MlflowClient()
    logged = client.get_run(parent_id).data.params.get(DATA_VERSION)
    if logged is None:
        client.log_param(parent_id, DATA_VERSION, version)
    elif logged != version:
        warnings.warn(f"pipeline run {parent_id} logged data_version {logged}; this stage sees {version} "
                      "(the corpus changed during the pipeline run)", stacklevel=3)
    client.set_tag(parent_id, DATA_VERSION, version)


def _parent_id(run: Run) -> str:
    """The run's parent id (itself for a top-level run); the tags of an ActiveRun are those it
    was created with, which include the parent link."""
    return run.data.tags.get("mlflow.parentRunId", run.info.run_id)


def active_run_id() -> str | None:
    """The id of this thread's active run, or None."""
    run = mlflow.active_run()
    return run.info.run_id if run else None


# ----------------------------------------------------------------------------- logging
def log_step_metrics(metrics: Mapping[str, Any], step: int) -> None:
    """Numeric entries of ``metrics`` at ``step`` on the active run (others are skipped)."""
    if mlflow.active_run() is None:
        return
    values = _metric_values(metrics)
    if values:
        mlflow.log_metrics(values, step=int(step))


def log_metrics(metrics: Mapping[str, Any], *, to_parent: bool = True) -> None:
    """Summary metrics on the active run and, with ``to_parent``, on its pipeline run too, so
    pipeline runs expose the same keys and compare side by side in the experiment table."""
    if mlflow.active_run() is None:
        return
    values = _metric_values(metrics)
    if values:
        mlflow.log_metrics(values)
    if to_parent:
        log_pipeline_metrics(metrics)


def log_pipeline_metrics(metrics: Mapping[str, Any]) -> None:
    """Summary metrics on the pipeline (parent) run of the active stage run only (for metrics
    the stage's code has logged on the stage run itself already). A parent of another kind (a
    study, an arm of one) logs its own metrics, in its own order."""
    run = mlflow.active_run()
    if run is None or _parent_id(run) == run.info.run_id or not _is_pipeline_run(_parent_id(run)):
        return
    log_run_metrics(_parent_id(run), metrics)


_kinds: dict[str, str] = {}  # run id → its KIND_TAG (a run's kind never changes)


def _is_pipeline_run(run_id: str) -> bool:
    if run_id not in _kinds:
        _kinds[run_id] = MlflowClient().get_run(run_id).data.tags.get(KIND_TAG, "")
    return _kinds[run_id] == "pipeline"


def log_params(params: Mapping[str, Any]) -> None:
    """Params on the active run (values as strings)."""
    if mlflow.active_run() is not None and params:
        mlflow.log_params({mlflow_key(str(k)): str(v) for k, v in params.items()})


def log_artifacts(path: str | os.PathLike, artifact_path: str | None = None) -> None:
    """A file or a folder as artifacts of the active run; a missing path is skipped."""
    path = Path(path)
    if mlflow.active_run() is None or not path.exists():
        return
    if path.is_dir():
        mlflow.log_artifacts(str(path), artifact_path=artifact_path)
    else:
        mlflow.log_artifact(str(path), artifact_path=artifact_path)


def ex_first(flat: Mapping[str, Any], splits: Sequence[str] | None = None) -> dict[str, Any]:
    """An evaluation's flat metrics with the EX of every split and mode (``dev/greedy/ex``) first,
    the splits in the order of ``splits`` (default: the order they come in), to be logged in that
    order: MLflow 3.17's Compare view opens its Parallel Coordinates plot on the first metric the
    runs share in the order they were logged (its Metrics table sorts them by name whatever the
    order)."""
    order = list(splits) if splits is not None else list(dict.fromkeys(key.split("/")[0] for key in flat))

    def rank(key: str) -> tuple[bool, int, str]:
        split, *rest = key.split("/")
        ex = len(rest) == 2 and rest[1] == "ex"
        return not ex, order.index(split) if split in order else len(order), key

    return {key: flat[key] for key in sorted(flat, key=rank)}


def log_eval(result: EvalResult, artifact_path: str = "eval", *, parent_prefix: str = "") -> bool:
    """An evaluation's flat metrics (``dev/greedy/ex``, EX first: ``ex_first``) on the active run
    and its pipeline run (there as ``<parent_prefix>/dev/greedy/ex`` when given: a starting
    point's, beside the policy's own), and its files (metrics.json, report.md, plots) under
    ``artifact_path``; False (and nothing logged) without an active run. The predictions files
    stay out: one line per example, they are large, and DVC keeps them."""
    if mlflow.active_run() is None:
        return False
    metrics = ex_first(result.flat)
    log_metrics(metrics, to_parent=not parent_prefix)
    if parent_prefix:
        log_pipeline_metrics({f"{parent_prefix}/{key}": value for key, value in metrics.items()})
    log_eval_files(result, artifact_path)
    return True


def log_eval_files(result: EvalResult, artifact_path: str | None = None) -> None:
    """An evaluation's files but its predictions (metrics.json, report.md, plots) as artifacts of
    the active run, side by side under ``artifact_path`` (None: at the top, where MLflow's
    Compare view shows two runs' files next to each other)."""
    for name, path in result.files.items():
        if not name.startswith("predictions/"):
            log_artifacts(path, artifact_path)
