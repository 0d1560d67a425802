"""Screenshots of the pipeline as a user sees it, taken with headless Chromium.

Starts a throwaway stack (progress_sql.servers, as ``progress-sql ui`` does, with its state in a
temporary folder): an MLflow server, a Prefect server and ``flows/serve.py``. ``pipeline``: runs
the ``training-pipeline`` deployment twice with the cpu-demo preset (about a minute each on a
CPU; the second with the one-shot recipe, for a study), then photographs

    mlflow-home.png           MLflow's first page (the URL `progress-sql ui` prints)
    prefect-deployments.png   the Prefect UI's deployments page: the four served deployments
    prefect-custom-run.png    training-pipeline → Run → Custom run: preset, work_dir, overrides, ...
    prefect-flow-run.png      the finished flow run: its stages (task runs) and state
    prefect-evaluation.png    the run's ``evaluation`` markdown artifact: the evaluation tables
    mlflow-training-runs.png  MLflow, experiment progress-sql, Model training → Training runs
    mlflow-compare.png        the two pipeline runs compared: their params, data_version among them
    mlflow-pipeline-run.png   the MLflow pipeline run of the first flow run: Prefect tags, stage runs
    mlflow-model.png          the registered model progress-sql-policy-demo: versions, @champion

``compare``: runs the ``run-study`` deployment as its form does (the ``methods``
study at the cpu-demo scale, arms progress-sql and oneshot, one seed: a few minutes), then

    prefect-study-form.png  run-study → Run → Custom run: the study, scale, arms, seeds
    prefect-study.png    the run's ``study`` artifact: the table and the figures inlined
    mlflow-study.png     the MLflow parent run study-methods: the table, the budget, the arms
    mlflow-compare-arms.png   MLflow's Compare view of the two arm runs: EX in the parallel
                              coordinates, the key settings, the metrics, the reports side by side

into docs/screenshots/ (palette PNGs, well under 300 KB each), and stops everything.

    python scripts/screenshots.py [--out docs/screenshots] [--keep-state DIR] [--only pipeline|compare]

Needs Debian's ``chromium`` (``apt-get install chromium``); nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx

from progress_sql.servers import (
    DEPLOYMENTS,
    create_flow_run,
    flow_run_logs,
    free_port,
    mlflow_server,
    prefect_server,
    served_deployments,
    wait_for_flow_run,
)

REPO = Path(__file__).resolve().parents[1]
WINDOW = "1400,900"
COMPARE_WINDOW = "1400,2400"
MODEL = "progress-sql-policy-demo"  # the cpu-demo preset's registered model
# The two runs: the demo as the form starts it, and the same with the one-shot baseline.
RUNS = ({}, {"rl.recipe": "oneshot", "rl.env": "single_turn"})
# The study as a user picks it on the run-study form: two arms of `methods`, one seed.
STUDY = {"study": "methods", "preset": "cpu-demo", "arms": ["progress-sql", "oneshot"], "seeds": 1}
TALL_WINDOW = "1400,1700"  # the study artifact and the parent run: table, then figures or params
WAIT_S = 10.0  # the time a page gets to fetch its data and fade in


class Shot(NamedTuple):
    name: str
    url: str
    window: str = WINDOW
ML_VIEW = "workflowType=machine_learning"  # the "Model training" side of MLflow's GenAI / Model training toggle
# MLflow 3.17 opens its Assistant side panel on a first visit to a localhost URL; the browser
# reaches the MLflow server under this name instead (mapped to 127.0.0.1), so a screenshot
# shows the page itself.
MLFLOW_HOST = "mlflow.test"
# Served deployments pick up a new run within ~2 s instead of ~10 s.
FAST_POLL = {"PREFECT_RUNNER_POLL_FREQUENCY": "2"}
# Headless and offline: no sandbox (root in a container), no GPU, no background fetches.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1",
                  f"--host-resolver-rules=MAP {MLFLOW_HOST} 127.0.0.1"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    sys.exit("error: no chromium on PATH (Debian: apt-get install chromium)")


class Browser:
    """Headless Chromium driven over its DevTools protocol (the websockets client Prefect brings):
    a page gets ``wait_s`` of real time between loading and its photograph, so the single-page
    apps have fetched their data and finished fading in (Chromium's own --screenshot with a
    virtual-time budget caught Prefect's forms half faded, now and then)."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary, self.profile = binary, profile

    def __enter__(self) -> "Browser":
        self.profile.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        with (self.profile / "chromium.log").open("w") as log:
            self.process = subprocess.Popen([self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                             f"--remote-debugging-port={self.port}", "about:blank"],
                                            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self._http}/json/version", timeout=2).raise_for_status()
                return self
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.__exit__()
                    raise RuntimeError(f"chromium did not start: {(self.profile / 'chromium.log').read_text()[-2000:]}")
                time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    @property
    def _http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def screenshot(self, url: str, out: Path, window: str = WINDOW, wait_s: float = WAIT_S) -> None:
        """``url`` in a new tab of ``window`` size, photographed after ``wait_s``, shrunk to a
        palette PNG."""
        from websockets.sync.client import connect

        width, height = (int(v) for v in window.split(","))
        tab = httpx.put(f"{self._http}/json/new?about:blank", timeout=30).json()
        try:
            with connect(tab["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
                def call(method: str, **params: Any) -> dict[str, Any]:
                    ws.send(json.dumps({"id": 1, "method": method, "params": params}))
                    while True:  # events come in between; the answer carries the id
                        message = json.loads(ws.recv(timeout=120))
                        if message.get("id") == 1:
                            if "error" in message:
                                raise RuntimeError(f"{method} on {url}: {message['error']}")
                            return message["result"]

                call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=False)
                call("Page.navigate", url=url)
                time.sleep(wait_s)
                png = base64.b64decode(call("Page.captureScreenshot", format="png")["data"])
        finally:
            httpx.get(f"{self._http}/json/close/{tab['id']}", timeout=30)
        out.write_bytes(png)
        _shrink(out)
        print(f"  {out.name:26s} {out.stat().st_size // 1024:4d} KB  {url}")


def _shrink(path: Path) -> None:
    # UI screenshots have few colours: a 256-colour palette keeps them sharp at a fraction of the size.
    from PIL import Image

    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Screenshots of the Prefect and MLflow UIs after a tiny pipeline run.")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots", help="where the PNGs go")
    parser.add_argument("--keep-state", type=Path, default=None,
                        help="keep the servers' state and the run's files here (default: a temporary folder)")
    parser.add_argument("--only", choices=("pipeline", "compare"), default=None,
                        help="take one set of screenshots (default: both)")
    args = parser.parse_args(argv)
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    state = args.keep_state or Path(tempfile.mkdtemp(prefix="progress-sql-screens-"))
    state.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        with mlflow_server(state / "mlflow", f"sqlite:///{state / 'mlflow' / 'mlflow.db'}",
                           hostnames=(MLFLOW_HOST,)) as mlflow, \
                prefect_server(state / "prefect", home=state / "prefect" / "prefect-home",
                               extra_env=FAST_POLL) as stack, \
                served_deployments(stack, DEPLOYMENTS, extra_env={"MLFLOW_TRACKING_URI": mlflow.url}) as served:
            print(f"Prefect {stack.url}, MLflow {mlflow.url}")
            shots = []
            if args.only in (None, "pipeline"):
                shots += _pipeline_shots(stack, mlflow, served.ids, state, started)
            if args.only in (None, "compare"):
                shots += _compare_shots(stack, mlflow, served.ids, state, started)
            with Browser(browser, state / "chromium-profile") as chrome:
                for shot in shots:
                    chrome.screenshot(shot.url, args.out / shot.name, shot.window)
    finally:
        if args.keep_state is None:
            shutil.rmtree(state, ignore_errors=True)
    print(f"done in {time.monotonic() - started:.0f} s")


def _run(stack: Any, deployment_id: str, parameters: dict[str, Any], started: float) -> str:
    """A run of a deployment as the form's Submit starts it, waited for; its id."""
    run_id = create_flow_run(stack, deployment_id, parameters)
    run = wait_for_flow_run(stack, run_id, timeout_s=1800)
    if run["state"]["type"] != "COMPLETED":
        sys.exit("the run did not complete:\n" + "\n".join(flow_run_logs(stack, run_id)[-30:]))
    print(f"run {run['name']} {parameters} completed, {time.monotonic() - started:.0f} s in")
    return run_id


def _pipeline_shots(stack: Any, mlflow: Any, ids: dict[str, str], state: Path, started: float) -> list[Shot]:
    print("running training-pipeline twice ...")
    run_ids = [_run(stack, ids["training-pipeline"],
                    {"preset": "cpu-demo", "work_dir": str(state / "work"), "overrides": overrides}, started)
               for overrides in RUNS]
    artifact = _artifact_id(stack.api, run_ids[0], "evaluation")
    experiment, pipeline_runs = _pipeline_runs(mlflow.url, run_ids)
    mlflow_ui = mlflow.url.replace("127.0.0.1", MLFLOW_HOST)
    compared = quote(json.dumps(pipeline_runs)), quote(json.dumps([experiment]))
    return [
        Shot("mlflow-home.png", f"{mlflow_ui}/"),
        Shot("prefect-deployments.png", f"{stack.url}/deployments"),
        Shot("prefect-custom-run.png", f"{stack.url}/deployments/deployment/{ids['training-pipeline']}/run"),
        Shot("prefect-flow-run.png", f"{stack.url}/runs/flow-run/{run_ids[0]}"),
        Shot("prefect-evaluation.png", f"{stack.url}/artifacts/artifact/{artifact}"),
        Shot("mlflow-training-runs.png", f"{mlflow_ui}/#/experiments/{experiment}/runs?{ML_VIEW}"),
        # tall: the page goes on to the params, the metrics and the tags (data_version) of both runs
        Shot("mlflow-compare.png",
             f"{mlflow_ui}/#/compare-runs?runs={compared[0]}&experiments={compared[1]}&{ML_VIEW}", COMPARE_WINDOW),
        Shot("mlflow-pipeline-run.png", f"{mlflow_ui}/#/experiments/{experiment}/runs/{pipeline_runs[0]}?{ML_VIEW}"),
        Shot("mlflow-model.png", f"{mlflow_ui}/#/models/{MODEL}?{ML_VIEW}"),
    ]


def _compare_shots(stack: Any, mlflow: Any, ids: dict[str, str], state: Path, started: float) -> list[Shot]:
    print(f"running run-study {STUDY} ...")
    run_id = _run(stack, ids["run-study"], {**STUDY, "work_dir": str(state / "work-compare")}, started)
    artifact = _artifact_id(stack.api, run_id, "study")
    experiment, (parent,) = _pipeline_runs(mlflow.url, [run_id])
    arms = _arm_runs(mlflow.url, experiment, parent)
    mlflow_ui = mlflow.url.replace("127.0.0.1", MLFLOW_HOST)
    compared = quote(json.dumps(arms)), quote(json.dumps([experiment]))
    return [
        Shot("prefect-study-form.png", f"{stack.url}/deployments/deployment/{ids['run-study']}/run"),
        Shot("prefect-study.png", f"{stack.url}/artifacts/artifact/{artifact}", TALL_WINDOW),
        Shot("mlflow-study.png", f"{mlflow_ui}/#/experiments/{experiment}/runs/{parent}?{ML_VIEW}", TALL_WINDOW),
        Shot("mlflow-compare-arms.png",
             f"{mlflow_ui}/#/compare-runs?runs={compared[0]}&experiments={compared[1]}&{ML_VIEW}", COMPARE_WINDOW),
    ]


def _arm_runs(mlflow_url: str, experiment: str, parent: str) -> list[str]:
    """The ids of a study's arm × seed runs, in the order they ran."""
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(mlflow_url).search_runs(
        [experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`progress_sql.kind` = 'arm'",
        order_by=["attributes.start_time ASC"])
    return [r.info.run_id for r in runs]


def _artifact_id(api: str, flow_run_id: str, key: str) -> str:
    rows = httpx.post(f"{api}/artifacts/filter", timeout=30,
                      json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": [key]}}}).json()
    return rows[0]["id"]


def _pipeline_runs(mlflow_url: str, flow_run_ids: list[str]) -> tuple[str, list[str]]:
    """(experiment id, [run id]) of the MLflow pipeline runs tagged with the flow runs' ids."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_url)
    experiment = client.get_experiment_by_name("progress-sql").experiment_id
    found = []
    for flow_run_id in flow_run_ids:
        runs = client.search_runs([experiment], filter_string=f"tags.`prefect.flow_run_id` = '{flow_run_id}'")
        found.append(runs[0].info.run_id)
    return experiment, found


if __name__ == "__main__":
    main()
