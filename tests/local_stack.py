"""A throwaway local stack: a Prefect server, ``flows/serve.py`` serving the deployments, an
MLflow server, all on 127.0.0.1 free ports with state in a temporary folder.

The deployment test (tests/test_prefect_deployment.py) and scripts/screenshots.py use it to
see the pipeline as a user does: a real server, a served deployment, a run started over the
REST API. Every process is started in its own session and stopped (SIGINT, then SIGKILL) by
the context managers, however the block ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

REPO = Path(__file__).resolve().parents[1]
TERMINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# Offline and quiet (the Makefile exports the same).
QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Process:
    """A started command and its log file."""

    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> Process:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:  # the child keeps its own descriptor
        popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    return Process(popen, log)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop(process: Process, grace_s: float = 15.0) -> None:
    """SIGINT (twice: a Prefect runner may need it), then SIGKILL the whole process group."""
    proc = process.popen
    for sig, wait_s in ((signal.SIGINT, grace_s / 2), (signal.SIGINT, grace_s / 2)):
        if proc.poll() is not None:
            break
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    _signal_group(proc, signal.SIGKILL)  # stragglers of the group (flow-run subprocesses, workers)
    if proc.poll() is None:
        proc.wait(timeout=10)


def _wait_healthy(url: str, process: Process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{process.log.name} exited with {process.popen.returncode}:\n{process.tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout_s:.0f} s:\n{process.tail()}")


# ----------------------------------------------------------------------------- Prefect
@dataclass
class PrefectStack:
    """A running Prefect server; ``env`` is what a client process needs to talk to it."""

    url: str  # http://127.0.0.1:PORT (the UI)
    env: dict[str, str]
    state_dir: Path

    @property
    def api(self) -> str:
        return f"{self.url}/api"


@contextmanager
def prefect_server(state_dir: Path, *, timeout_s: float = 90.0) -> Iterator[PrefectStack]:
    """``prefect server start`` on a free port with ``PREFECT_HOME`` under ``state_dir``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **QUIET_ENV,
           "PREFECT_HOME": str(state_dir / "prefect-home"),
           "PREFECT_API_URL": f"{url}/api",
           "PREFECT_SERVER_UI_API_URL": f"{url}/api",
           # Served deployments pick up a new run within ~2 s instead of ~10 s.
           "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    server = _start([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env,
                    state_dir / "prefect-server.log")
    try:
        _wait_healthy(f"{url}/api/health", server, timeout_s)
        yield PrefectStack(url, env, state_dir)
    finally:
        stop(server)


@contextmanager
def served_deployments(stack: PrefectStack, names: tuple[str, ...], *, extra_env: dict[str, str] | None = None,
                       timeout_s: float = 90.0) -> Iterator[dict[str, str]]:
    """``python flows/serve.py`` against ``stack``; yields deployment name → id once all of
    ``names`` are registered."""
    env = {**stack.env, **(extra_env or {})}
    serve = _start([sys.executable, str(REPO / "flows" / "serve.py")], env, stack.state_dir / "serve.log")
    try:
        deadline = time.monotonic() + timeout_s
        found: dict[str, str] = {}
        while time.monotonic() < deadline:
            if serve.popen.poll() is not None:
                raise RuntimeError(f"flows/serve.py exited with {serve.popen.returncode}:\n{serve.tail()}")
            found = {d["name"]: d["id"] for d in _post(stack, "/deployments/filter", {})}
            if all(name in found for name in names):
                break
            time.sleep(1.0)
        else:
            raise TimeoutError(f"deployments {names} not served after {timeout_s:.0f} s (have {sorted(found)}):\n"
                               f"{serve.tail()}")
        yield found
    finally:
        stop(serve)  # before the server: the runner pauses its deployments on the way out


def _post(stack: PrefectStack, path: str, body: dict[str, Any], attempts: int = 5) -> Any:
    # A busy SQLite-backed server answers 503 now and then; the request is simply retried.
    for attempt in range(1, attempts + 1):
        response = httpx.post(f"{stack.api}{path}", json=body, timeout=30)
        if response.status_code != 503 or attempt == attempts:
            response.raise_for_status()
            return response.json()
        time.sleep(1.0)


def create_flow_run(stack: PrefectStack, deployment_id: str, parameters: dict[str, Any]) -> str:
    """Start a run of a deployment as the UI's "Run" button does; the flow run id."""
    return _post(stack, f"/deployments/{deployment_id}/create_flow_run", {"parameters": parameters})["id"]


def wait_for_flow_run(stack: PrefectStack, flow_run_id: str, timeout_s: float) -> dict[str, Any]:
    """Poll the flow run until a terminal state (or raise TimeoutError); the flow run JSON."""
    deadline = time.monotonic() + timeout_s
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = httpx.get(f"{stack.api}/flow_runs/{flow_run_id}", timeout=30).json()
        if (run.get("state") or {}).get("type") in TERMINAL_STATES:
            return run
        time.sleep(1.0)
    raise TimeoutError(f"flow run {flow_run_id} still {(run.get('state') or {}).get('type')} after {timeout_s:.0f} s")


def flow_run_logs(stack: PrefectStack, flow_run_id: str, limit: int = 200) -> list[str]:
    """The flow run's log messages (oldest first)."""
    rows = _post(stack, "/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": limit,
                                         "sort": "TIMESTAMP_ASC"})
    return [row["message"] for row in rows]


# ----------------------------------------------------------------------------- MLflow
@contextmanager
def mlflow_server(state_dir: Path, *, hostnames: tuple[str, ...] = (), timeout_s: float = 120.0) -> Iterator[str]:
    """``mlflow server`` (SQLite backend, artifacts under ``state_dir``) on a free port; yields
    its URL, the value for ``MLFLOW_TRACKING_URI``. ``hostnames``: other names a browser may
    use for 127.0.0.1 (MLflow 3 refuses a Host header it does not know)."""
    port = free_port()
    state_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    allowed = ["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", *hostnames, *(f"{h}:*" for h in hostnames)]
    server = _start([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{state_dir / 'mlflow.db'}",
                     "--artifacts-destination", str(state_dir / "artifacts"), "--host", "127.0.0.1",
                     "--port", str(port), "--workers", "1", "--allowed-hosts", ",".join(allowed),
                     *(["--cors-allowed-origins", ",".join(f"http://{h}:*" for h in hostnames)] if hostnames else [])],
                    {**os.environ, **QUIET_ENV}, state_dir / "mlflow-server.log")
    try:
        _wait_healthy(f"{url}/health", server, timeout_s)
        yield url
    finally:
        stop(server)


# ----------------------------------------------------------------------------- a tiny configuration
def tiny_overrides(root: Path, tracking_uri: str | None = None) -> dict[str, Any]:
    """Settings overrides for a pipeline run of about a minute on a CPU: every path under
    ``root``, a corpus of a few dozen questions, a 64-wide 2-layer policy, one SFT step, one
    RL step, four dev questions evaluated greedily; MLflow at ``tracking_uri`` (default a
    SQLite file under ``root``)."""
    return {
        "data.out_dir": str(root / "corpus"), "data.n_databases": 4, "data.n_dev_databases": 1,
        "data.n_test_databases": 1, "data.train_size": 24, "data.dev_size": 6, "data.test_size": 6,
        "data.neighbours": 1,
        "model.base_dir": str(root / "tiny"), "model.vocab_size": 1024, "model.hidden_size": 64,
        "model.num_layers": 2, "model.num_heads": 4, "model.num_kv_heads": 2, "model.intermediate_size": 128,
        "model.copy_warmup.steps": 3,
        "sft.init_from": str(root / "tiny"), "sft.out_dir": str(root / "sft"), "sft.epochs": 1.0,
        "sft.batch_size": 8, "sft.max_examples": 8, "sft.max_seq_len": 2048,
        "rl.init_from": str(root / "sft"), "rl.out_dir": str(root / "rl"), "rl.group_size": 2,
        "rl.questions_per_step": 2, "rl.steps": 1, "rl.micro_batch_size": 4,
        "generation.max_new_tokens": 32, "generation.batch_size": 8, "env.max_turns": 2,
        "eval.splits": ["dev"], "eval.vote_k": 0, "eval.pass_k": 0, "eval.max_examples": 4,
        "eval.out_dir": str(root / "eval"),
        "tracking.tracking_uri": tracking_uri or f"sqlite:///{root / 'mlruns' / 'mlflow.db'}",
        "tracking.model_cache_dir": str(root / "registry"),
    }
