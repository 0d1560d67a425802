"""The local servers of the UI path: a Prefect server, the deployments of ``flows/serve.py``
served against it, and an MLflow server on the project's tracking store, all on 127.0.0.1.

``progress-sql ui`` runs them in the foreground (``run_ui``); the deployment test and
scripts/screenshots.py use the same context managers, and the REST calls the UI's buttons make
(``create_flow_run``, ``wait_for_flow_run``, ``flow_run_logs``). Each server is started in its
own session, its output in a log file, and stopped (SIGINT, then SIGKILL of its process group)
however the block ends. What a user trips over is set here once:

- the Prefect UI asks the API at ``PREFECT_SERVER_UI_API_URL`` (default port 4200 whatever
  port the server listens on), and ``flows/serve.py`` registers with ``PREFECT_API_URL``: both
  are set to the server's own port;
- the MLflow store is an absolute URI (``sqlite:////abs/mlruns/mlflow.db``), so the UI shows
  the project's runs from any working directory.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from progress_sql.files import no_stray_sqlite_folder, sqlite_path, sqlite_uri

# The deployments flows/serve.py serves (it builds them under these names).
DEPLOYMENTS = ("training-pipeline", "evaluate-model", "promote-model", "run-study")
PREFECT_PORT = 4200  # Prefect's and MLflow's usual ports
MLFLOW_PORT = 5000
# Offline and quiet (the Makefile exports the same); a value already in the environment wins.
QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
}


class ServerError(RuntimeError):
    """A server did not start, or stopped on its own (the message ends with its log's tail)."""


# ----------------------------------------------------------------------------- processes
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Process:
    """A started command, its name and its log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check(self) -> None:
        """ServerError when the process has exited."""
        if self.popen.poll() is not None:
            raise ServerError(f"{self.name} exited with {self.popen.returncode} (log {self.log}):\n{self.tail()}")


def start(name: str, cmd: list[str], env: Mapping[str, str], log: Path, cwd: Path) -> Process:
    """``cmd`` in its own session (a Ctrl-C in the terminal does not reach it; ``stop`` does),
    stdout and stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", encoding="utf-8") as out:  # the child keeps its own descriptor
        popen = subprocess.Popen(cmd, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    return Process(name, popen, log)


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


def wait_healthy(url: str, process: Process, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; ServerError when the process exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process.check()
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServerError(f"{process.name}: {url} not healthy after {timeout_s:.0f} s (log {process.log}):\n"
                      f"{process.tail()}")


def installed_from() -> Path | None:
    """The local folder pip installed this package from, as it records it (PEP 610's
    direct_url.json): the checkout of ``pip install -e .`` or the folder of ``pip install .``;
    None for an install from an index or a wheel file. (The package's own path says nothing:
    after ``pip install .`` it lies in site-packages, far from any checkout.)"""
    try:
        record = importlib.metadata.distribution("progress-sql").read_text("direct_url.json")
        url = json.loads(record or "{}").get("url", "")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None
    parsed = urllib.parse.urlparse(url)
    return Path(urllib.request.url2pathname(parsed.path)) if parsed.scheme == "file" else None


def project_root(start_dir: str | Path | None = None) -> Path:
    """The repository whose ``flows/serve.py`` serves the deployments: ``start_dir`` (default
    the working directory) or a folder above it, else the checkout this package was installed
    from (``installed_from``); FileNotFoundError when there is none."""
    here = Path(start_dir or Path.cwd()).resolve()
    source = installed_from()
    for folder in (here, *here.parents, *([source] if source else [])):
        if (folder / "flows" / "serve.py").is_file() and (folder / "params.yaml").is_file():
            return folder
    raise FileNotFoundError("no flows/serve.py found: run this from the progress-sql repository")


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**QUIET_ENV, **os.environ, **(extra or {})}


# ----------------------------------------------------------------------------- Prefect
@dataclass
class PrefectStack:
    """A running Prefect server; ``env`` is what a client process needs to talk to it."""

    url: str  # http://127.0.0.1:PORT (the UI)
    env: dict[str, str]
    log_dir: Path
    process: Process

    @property
    def api(self) -> str:
        return f"{self.url}/api"


def prefect_env(port: int, home: str | Path | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Prefect server on ``port`` and of its clients: the API and the UI's
    API both at that port (``PREFECT_HOME`` = ``home`` when given)."""
    api = f"http://127.0.0.1:{port}/api"
    return _env({**(extra or {}), "PREFECT_API_URL": api, "PREFECT_SERVER_UI_API_URL": api,
                 **({"PREFECT_HOME": str(home)} if home else {})})


@contextmanager
def prefect_server(log_dir: Path, *, port: int | None = None, home: str | Path | None = None,
                   extra_env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> Iterator[PrefectStack]:
    """``prefect server start`` on ``port`` (default a free one) until healthy."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = prefect_env(port, home, extra_env)
    server = start("prefect server", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                      "--port", str(port)], env, log_dir / "prefect-server.log", cwd=log_dir)
    try:
        wait_healthy(f"{url}/api/health", server, timeout_s)
        yield PrefectStack(url, env, log_dir, server)
    finally:
        stop(server)


def api_post(api: str, path: str, body: dict[str, Any], attempts: int = 5) -> Any:
    """POST to the Prefect API; a busy SQLite-backed server answers 503 now and then: retried."""
    import httpx

    for attempt in range(1, attempts + 1):
        response = httpx.post(f"{api}{path}", json=body, timeout=30)
        if response.status_code != 503 or attempt == attempts:
            response.raise_for_status()
            return response.json()
        time.sleep(1.0)


TERMINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}  # a flow run's state types that end it


def create_flow_run(stack: PrefectStack | str, deployment_id: str, parameters: dict[str, Any]) -> str:
    """Start a run of a deployment as the UI's "Run" button does; the flow run id. ``stack``:
    a PrefectStack or the API URL."""
    return api_post(_api(stack), f"/deployments/{deployment_id}/create_flow_run", {"parameters": parameters})["id"]


def wait_for_flow_run(stack: PrefectStack | str, flow_run_id: str, timeout_s: float) -> dict[str, Any]:
    """Poll the flow run until a terminal state (or raise TimeoutError); the flow run JSON."""
    import httpx

    deadline = time.monotonic() + timeout_s
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = httpx.get(f"{_api(stack)}/flow_runs/{flow_run_id}", timeout=30).json()
        if (run.get("state") or {}).get("type") in TERMINAL_STATES:
            return run
        time.sleep(1.0)
    raise TimeoutError(f"flow run {flow_run_id} still {(run.get('state') or {}).get('type')} after {timeout_s:.0f} s")


def flow_run_logs(stack: PrefectStack | str, flow_run_id: str, limit: int = 200) -> list[str]:
    """The flow run's log messages (oldest first)."""
    rows = api_post(_api(stack), "/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": limit,
                                                  "sort": "TIMESTAMP_ASC"})
    return [row["message"] for row in rows]


def _api(stack: PrefectStack | str) -> str:
    return stack if isinstance(stack, str) else stack.api


@dataclass
class Served:
    """``flows/serve.py`` running: deployment name → id, and its process."""

    ids: dict[str, str]
    process: Process


@contextmanager
def served_deployments(stack: PrefectStack, names: tuple[str, ...] = DEPLOYMENTS, *, root: Path | None = None,
                       limit: int = 1, extra_env: Mapping[str, str] | None = None,
                       timeout_s: float = 120.0) -> Iterator[Served]:
    """``python flows/serve.py`` of ``root`` (default ``project_root()``) against ``stack``,
    once all of ``names`` are registered."""
    root = root or project_root()
    env = {**stack.env, **(extra_env or {})}
    serve = start("flows/serve.py", [sys.executable, str(root / "flows" / "serve.py"), "--limit", str(limit)], env,
                  stack.log_dir / "serve.log", cwd=root)
    try:
        deadline = time.monotonic() + timeout_s
        found: dict[str, str] = {}
        while time.monotonic() < deadline:
            serve.check()
            found = {d["name"]: d["id"] for d in api_post(stack.api, "/deployments/filter", {})}
            if all(name in found for name in names):
                break
            time.sleep(1.0)
        else:
            raise ServerError(f"deployments {names} not served after {timeout_s:.0f} s (have {sorted(found)}):\n"
                              f"{serve.tail()}")
        yield Served(found, serve)
    finally:
        stop(serve)  # before the server: the runner pauses its deployments on the way out


# ----------------------------------------------------------------------------- MLflow
def mlflow_store_uri(root: Path) -> str:
    """The project's tracking store as ``progress_sql.tracking.tracking_uri`` resolves it from
    the project root: ``MLFLOW_TRACKING_URI``, else ``tracking.tracking_uri`` of its
    params.yaml, else ``sqlite:///<root>/mlruns/mlflow.db``; a relative SQLite path made absolute."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri and (root / "params.yaml").is_file():
        from progress_sql.params import SettingsError, load_settings

        try:
            uri = load_settings(root / "params.yaml").tracking.tracking_uri
        except SettingsError:
            uri = ""
    if not uri:
        return sqlite_uri(root / "mlruns" / "mlflow.db")  # % and ? escaped (a folder may be named so)
    db = sqlite_path(uri)
    if db is not None and not db.is_absolute():
        uri = sqlite_uri(root / db)
    return uri


@dataclass
class MlflowServer:
    url: str  # the UI, and the value for MLFLOW_TRACKING_URI
    store: str
    process: Process


@contextmanager
def mlflow_server(log_dir: Path, store: str, *, port: int | None = None, hostnames: tuple[str, ...] = (),
                  timeout_s: float = 120.0) -> Iterator[MlflowServer]:
    """``mlflow server`` on ``store`` (a SQLite URI; artifacts of new experiments beside the
    database, as ``progress_sql.tracking`` keeps them) on ``port`` (default a free one).
    ``hostnames``: other names a browser may use for 127.0.0.1 (MLflow refuses a Host header
    it does not know)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    db = sqlite_path(store)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        cmd += ["--artifacts-destination", str(db.parent / "artifacts")]
    if hostnames:
        allowed = ["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", *hostnames, *(f"{h}:*" for h in hostnames)]
        cmd += ["--allowed-hosts", ",".join(allowed),
                "--cors-allowed-origins", ",".join(f"http://{h}:*" for h in hostnames)]
    with ExitStack() as stack:
        with no_stray_sqlite_folder(store):  # the server connects to its store as it starts
            server = start("mlflow server", cmd, _env(), log_dir / "mlflow-server.log", cwd=log_dir)
            stack.callback(stop, server)
            wait_healthy(f"{url}/health", server, timeout_s)
        yield MlflowServer(url, store, server)


# ----------------------------------------------------------------------------- progress-sql ui
def _start_servers(servers: ExitStack, *, port: int, mlflow_port: int | None, root: Path, store: str,
                   log_dir: Path, limit: int, echo: Callable[[str], None]) -> list[Process]:
    """Start ``run_ui``'s servers inside ``servers`` (MLflow only for a local store) and print
    where they are; the processes to watch."""
    watched: list[Process] = []
    lines = []
    if mlflow_port and not store.startswith(("http://", "https://")):
        echo(f"starting MLflow on port {mlflow_port} (store {store}) ...")
        mlflow = servers.enter_context(mlflow_server(log_dir, store, port=mlflow_port))
        watched.append(mlflow.process)
        lines.append(f"MLflow UI     {mlflow.url}   (store {store})")
    elif store.startswith(("http://", "https://")):
        lines.append(f"MLflow        {store}   (MLFLOW_TRACKING_URI)")
    echo(f"starting the Prefect server on port {port} ...")
    stack = servers.enter_context(prefect_server(log_dir, port=port))
    watched.append(stack.process)
    echo("serving the deployments (flows/serve.py) ...")
    served = servers.enter_context(served_deployments(stack, root=root, limit=limit))
    watched.append(served.process)
    echo("\n".join([
        f"Prefect UI    {stack.url}/deployments   ({', '.join(sorted(served.ids))})",
        f"Prefect API   {stack.api}   (PREFECT_API_URL for other shells)",
        *lines,
        f"logs          {log_dir}",
        "Ctrl-C stops them.",
    ]))
    for process in watched:
        echo(f"  {process.name}: pid {process.popen.pid}")
    return watched


def run_ui(*, port: int = PREFECT_PORT, mlflow_port: int | None = MLFLOW_PORT, root: Path | None = None,
           log_dir: Path | None = None, limit: int = 1, echo: Callable[[str], None] = print) -> int:
    """Start MLflow (unless ``mlflow_port`` is None, or the store is a server already), a
    Prefect server on ``port`` and the deployments, print the URLs and wait; Ctrl-C (or
    SIGTERM) stops them (the deployments first). The exit code: 0 after Ctrl-C, 1 when a
    server failed or stopped on its own."""
    root = root or project_root()
    busy = [p for p in (port, mlflow_port) if p and port_in_use(p)]
    if busy:
        echo(f"error: port {busy[0]} on 127.0.0.1 is in use (a server already running?); choose another with "
             f"{'--port' if busy[0] == port else '--mlflow-port'}")
        return 1
    log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="progress-sql-ui-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    store = mlflow_store_uri(root)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Handled, not merely inherited: a shell's background job starts with SIGINT ignored, which
    # the servers would inherit; a handled signal is reset to the default in each child.
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    servers = ExitStack()
    code = 0
    try:
        watched = _start_servers(servers, port=port, mlflow_port=mlflow_port, root=root, store=store,
                                 log_dir=log_dir, limit=limit, echo=echo)
        while True:
            for process in watched:
                process.check()
            time.sleep(1.0)
    except KeyboardInterrupt:
        echo("stopping ...")
    except (ServerError, FileNotFoundError) as err:
        echo(f"error: {err}")
        code = 1
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        try:
            servers.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    echo("stopped.")
    return code
