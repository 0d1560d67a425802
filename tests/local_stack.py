"""A throwaway local stack for the tests: the servers of ``progress_sql.servers`` (what
``progress-sql ui`` starts, and the REST calls the UI's buttons make) with their state in a
temporary folder, ``progress-sql ui`` itself as a process, and the demo configuration with
every path under one folder.

Every process is started in its own session and stopped (SIGINT, then SIGKILL) by the
context managers, however the block ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx

from progress_sql.params import dotted_items, load_preset
from progress_sql.servers import (  # noqa: F401  (re-exported for the tests)
    DEPLOYMENTS,
    QUIET_ENV,
    MlflowServer,
    PrefectStack,
    Process,
    Served,
    api_post,
    create_flow_run,
    flow_run_logs,
    free_port,
    mlflow_server,
    port_in_use,
    prefect_server as _prefect_server,
    served_deployments,
    stop,
    wait_for_flow_run,
)

REPO = Path(__file__).resolve().parents[1]
DEMO_PRESET = "cpu-demo"
# Served deployments pick up a new run within ~2 s instead of ~10 s.
FAST_POLL = {"PREFECT_RUNNER_POLL_FREQUENCY": "2"}


@contextmanager
def prefect_server(state_dir: Path, *, timeout_s: float = 120.0) -> Iterator[PrefectStack]:
    """``prefect server start`` on a free port with ``PREFECT_HOME`` under ``state_dir``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with _prefect_server(state_dir, home=state_dir / "prefect-home", extra_env=FAST_POLL,
                         timeout_s=timeout_s) as stack:
        yield stack


# ----------------------------------------------------------------------------- `progress-sql ui`
def ui_command(*args: str) -> list[str]:
    """The documented command line, ``progress-sql ui ARGS``, as this interpreter runs it."""
    exe = Path(sys.executable).with_name("progress-sql")
    if exe.is_file():
        return [str(exe), "ui", *args]
    return [sys.executable, "-c", "from progress_sql.cli import main; main()", "ui", *args]


def isolated_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """An environment for a UI stack under ``state_dir``: its own PREFECT_HOME, no API URL of
    the caller's, the MLflow store a SQLite file under ``state_dir``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_SERVER_UI_API_URL")}
    return {**env, **QUIET_ENV, **FAST_POLL, "PREFECT_HOME": str(state_dir / "prefect-home"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{state_dir / 'mlruns' / 'mlflow.db'}", **extra}


@contextmanager
def ui_process(args: list[str], env: dict[str, str], cwd: Path, log: Path) -> Iterator[subprocess.Popen]:
    """``progress-sql ui ARGS`` in its own session; on the way out SIGINT (what Ctrl-C sends),
    then SIGKILL of its group and of the server pids it printed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(ui_command(*args), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        stop(Process("progress-sql ui", proc, log), grace_s=60.0)
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():  # leftovers of a crash
            if ": pid " in line:
                try:
                    os.killpg(int(line.rsplit(" ", 1)[-1]), 9)
                except (ProcessLookupError, PermissionError, ValueError):
                    pass


def wait_for_output(text: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> str:
    """Wait until ``text`` appears in the log of ``proc``; the log so far."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        printed = log.read_text(encoding="utf-8", errors="replace")
        if text in printed:
            return printed
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before printing {text!r}:\n{printed[-4000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"{text!r} not printed after {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def wait_for_deployments(api: str, names: tuple[str, ...], proc: subprocess.Popen, log: Path,
                         timeout_s: float) -> dict[str, str]:
    """Poll the API until every deployment of ``names`` is registered; name → id."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, str] = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"progress-sql ui exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            found = {d["name"]: d["id"] for d in api_post(api, "/deployments/filter", {})}
        except httpx.HTTPError:
            found = {}
        if all(name in found for name in names):
            return found
        time.sleep(1.0)
    raise TimeoutError(f"deployments {names} not served after {timeout_s:.0f} s (have {sorted(found)}):\n"
                       f"{log.read_text()[-4000:]}")


# ----------------------------------------------------------------------------- the demo configuration
def tiny_overrides(root: Path, tracking_uri: str | None = None) -> dict[str, Any]:
    """Settings overrides for a pipeline run of about a minute on a CPU: the sizes of the
    ``cpu-demo`` preset (configs/presets/cpu-demo.yaml) as dotted keys, every path under
    ``root``, MLflow at ``tracking_uri`` (default a SQLite file under ``root``)."""
    overlay, _ = load_preset(DEMO_PRESET, REPO / "configs" / "presets")
    return {
        **dotted_items(overlay),
        "data.out_dir": str(root / "corpus"), "model.base_dir": str(root / "tiny"),
        "sft.init_from": str(root / "tiny"), "sft.out_dir": str(root / "sft"),
        "rl.init_from": str(root / "sft"), "rl.out_dir": str(root / "rl"), "eval.out_dir": str(root / "eval"),
        "eval.zero_shot_out_dir": str(root / "eval-zero-shot"), "eval.sft_out_dir": str(root / "eval-sft"),
        "tracking.tracking_uri": tracking_uri or f"sqlite:///{root / 'mlruns' / 'mlflow.db'}",
        "tracking.model_cache_dir": str(root / "registry"),
    }
