"""Running a study's plan: the shared stages once each, then every arm × seed (RL, then
evaluation), each recorded in its folder, so a rerun does only what is missing.

The CLI (``progress-sql study``) calls ``run_study``; the Prefect flow calls the same
pieces one by one (``build_shared``, ``run_job``, ``finish``) to make each a task run. Each piece
calls the functions of ``progress_sql.stages``, as ``progress-sql train score``, ``train rl`` and
``eval`` do.

On disk, per job: ``result.json`` when it finished (with the fingerprint of its settings: a
job whose settings changed runs again), ``failed.json`` when it failed (the error; the job runs
again next time). Per shared output: the folder ``SHARED/<key>`` and ``SHARED/<key>.done``.
"""

from __future__ import annotations

import json
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterator

from progress_sql.studies.spec import Job, JobResult, Plan, arm_params, shared_settings
from progress_sql.files import write_json

RESULT_FILE = "result.json"
FAILED_FILE = "failed.json"
SETTINGS_FILE = "settings.json"  # the job's whole settings (its MLflow run's params are the key ones)
Log = Callable[[str], None]
# MLflow run kinds (tag progress_sql.kind) of a study: its parent and one run per arm × seed.
# Neither is a "pipeline" run, so the stages nested in them do not copy their summaries up: each
# logs its own metrics, in its own order.
PARENT_KIND = "study"
ARM_KIND = "arm"


# ----------------------------------------------------------------------------- shared stages
def shared_keys(plan: Plan) -> list[str]:
    """The shared outputs the plan needs, in build order (corpora, tiny policies, SFT, scores)."""
    order = {"corpus": 0, "tiny": 1, "sft": 2, "scores": 3}
    keys = {k for job in plan.jobs for k in job.needs}
    return sorted(keys, key=lambda k: (order[k.split("-")[0]], k))


def build_shared(plan: Plan, key: str, log: Log = print) -> str:
    """Build shared output ``key`` into ``SHARED/<key>`` unless it is there already; its folder."""
    from progress_sql import rewards, stages

    path = plan.shared_dir / key
    marker = plan.shared_dir / f"{key}.done"
    users = sorted({j.arm for j in plan.jobs if key in j.needs})
    if marker.is_file():
        log(f"shared {key}: reused (arms {', '.join(users)})")
        return str(path)
    settings = shared_settings(plan, key)
    start = time.monotonic()
    kind = key.split("-")[0]
    if kind == "corpus":
        stages.build_data(settings, path, progress=False)
    elif kind == "tiny":
        stages.init_model(settings, settings.data.out_dir, path, progress=False)
    elif kind == "scores":
        stages.score_questions(settings, settings.data.out_dir, out=path, report_dir=path / "report", progress=False)
    else:  # its run named by the format it teaches and its arms: two arms of one format may need two
        fmt = rewards.get(settings.rl.recipe).fmt
        stages.sft(settings, settings.data.out_dir, out=path, report_dir=path / "report", progress=False,
                   run_name=f"sft {fmt} ({', '.join(users)})")
    marker.write_text(json.dumps({"arms": users, "seconds": time.monotonic() - start}), encoding="utf-8")
    log(f"shared {key}: built in {time.monotonic() - start:.0f} s (arms {', '.join(users)})")
    return str(path)


# ----------------------------------------------------------------------------- one arm × seed
def read_result(job: Job) -> JobResult | None:
    """The job's recorded outcome: done (and with its current settings), failed, or None."""
    done = job.run_dir / RESULT_FILE
    if done.is_file():
        result = JobResult(**json.loads(done.read_text(encoding="utf-8")))
        if result.fingerprint == job.fingerprint:
            return result
    failed = job.run_dir / FAILED_FILE
    if failed.is_file():
        record = json.loads(failed.read_text(encoding="utf-8"))
        return JobResult(**{k: v for k, v in record.items() if k in JobResult.__dataclass_fields__})
    return None


def is_done(job: Job) -> bool:
    result = read_result(job)
    return result is not None and result.status == "done"


def run_name(job: Job) -> str:
    """The MLflow run name of an arm × seed: ``<arm> seed <k>``."""
    return f"{job.arm} seed {job.seed}"


def parent_run_name(plan: Plan) -> str:
    """The MLflow run name of a study: ``study-<name>`` (its scale and flow run are tags)."""
    return f"study-{plan.name}"


def run_job(plan: Plan, job: Job, parent_run_id: str | None = None, log: Log = print) -> JobResult:
    """RL then evaluation of one arm × seed (resumed from a checkpoint of the same settings; an
    arm without RL evaluates ``rl.init_from``), as
    an MLflow child run of ``parent_run_id`` that holds what a study reads off its row: the
    EX of every split and mode first (the single pipeline's metric names), then the other
    evaluation metrics, the RL summary and the cost; the key settings as params; the evaluation
    and RL reports and settings.json as artifacts. A finished job is not run again. Never raises
    for the job's own failure: the result says ``failed`` and names the error (also in failed.json)."""
    from progress_sql import stages, tracking

    if is_done(job):
        log(f"{job.label}: done before, kept")
        return read_result(job)  # type: ignore[return-value]
    (job.run_dir / FAILED_FILE).unlink(missing_ok=True)
    s = job.settings
    corpus = s.data.out_dir
    tags = {tracking.KIND_TAG: ARM_KIND, "progress_sql.study": plan.name, "progress_sql.arm": job.arm,
            "progress_sql.seed": str(job.seed), "progress_sql.preset": plan.scale}
    write_json(job.run_dir / SETTINGS_FILE, s.model_dump(mode="json"))
    try:
        with tracking.child_pipeline_run(s, run_name(job), parent_run_id, tags=tags, params=arm_params(plan, job)):
            start = time.monotonic()
            model, rl_summary = s.rl.init_from, {}
            if job.rl:
                rl, rl_summary = stages.train_rl(s, corpus, out=job.run_dir / "rl", resume="auto",
                                                 report_dir=job.run_dir / "reports", progress=False)
                model = str(rl.final_dir)
            rl_seconds = time.monotonic() - start
            start = time.monotonic()
            ev = stages.evaluate(s, model, corpus, s.eval.splits, job.run_dir / "eval", progress=False)
            eval_seconds = time.monotonic() - start
            steps, tokens = _rollout_cost(job)
            tracking.log_metrics({**tracking.ex_first(ev.flat, plan.budget.splits), **rl_summary,
                                  "study/rl_seconds": rl_seconds, "study/eval_seconds": eval_seconds,
                                  "study/generated_tokens": tokens}, to_parent=False)
            tracking.log_eval_files(ev)
            for path in (job.run_dir / "reports", job.run_dir / SETTINGS_FILE):
                tracking.log_artifacts(path)
    except Exception as err:  # noqa: BLE001  (any failure of one arm is reported, the others go on)
        result = JobResult(job.arm, job.seed, "failed", str(job.run_dir), job.fingerprint,
                           error=f"{type(err).__name__}: {err}")
        write_json(job.run_dir / FAILED_FILE, {**asdict(result), "traceback": traceback.format_exc()})
        log(f"{job.label}: FAILED: {result.error}")
        return result
    result = JobResult(job.arm, job.seed, "done", str(job.run_dir), job.fingerprint, rl_seconds=rl_seconds,
                       eval_seconds=eval_seconds, rl_steps=steps, generated_tokens=tokens,
                       metrics={k: float(v) for k, v in ev.flat.items() if isinstance(v, (int, float))})
    write_json(job.run_dir / RESULT_FILE, asdict(result))
    log(f"{job.label}: RL {rl_seconds:.0f} s ({steps} step{'s' * (steps != 1)}), evaluation {eval_seconds:.0f} s")
    return result


def _rollout_cost(job: Job) -> tuple[int, float]:
    """(RL steps, generated tokens) from the run's metrics.jsonl: each step's mean sampled
    tokens × its trajectories (none without RL)."""
    path = job.run_dir / "rl" / "metrics.jsonl"
    if not job.rl:
        return 0, 0.0
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    n = job.settings.rl.questions_per_step * job.settings.rl.group_size
    return len(rows), float(sum(row.get("response_tokens/mean", 0.0) * n for row in rows))


def run_job_isolated(plan: Plan, job: Job, parent_run_id: str | None = None) -> JobResult:
    """``run_job`` in a fresh process: jobs that run at once (study.max_parallel > 1) do not
    share torch's global random state, so each seed gives what it gives alone."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(run_job, plan, job, parent_run_id, _quiet).result()


def _quiet(_: str) -> None:
    pass


def collect(plan: Plan) -> list[JobResult]:
    """Every job's outcome as recorded on disk (a job never run: failed, "not run")."""
    out = []
    for job in plan.jobs:
        result = read_result(job)
        out.append(result or JobResult(job.arm, job.seed, "failed", str(job.run_dir), job.fingerprint,
                                       error="not run (stopped before it started)"))
    return out


# ----------------------------------------------------------------------------- the whole study
@dataclass
class Outcome:
    report_dir: Path
    results: list[JobResult]
    table: str  # the markdown table (EX per split and mode, mean ± spread over seeds)
    parent_run_id: str | None

    @property
    def failures(self) -> list[JobResult]:
        return [r for r in self.results if r.status != "done"]


def finish(plan: Plan, parent_run_id: str | None, wall_seconds: float, log: Log = print) -> Outcome:
    """The report of what is on disk (finished arms; failures named), logged to the parent run:
    its files under ``study/``, the table in its description and as metrics
    (``<arm>/<split>/<mode>/ex``, the mean over seeds)."""
    from progress_sql.studies.report import table_means, write_report

    results = collect(plan)
    report = write_report(plan, results, wall_seconds)
    if parent_run_id and plan.base.tracking.enabled:
        from progress_sql import tracking

        tracking.log_run_artifacts(parent_run_id, report.folder, "study")
        tracking.set_run_tags(parent_run_id, {"progress_sql.compare_report": str(report.folder.resolve() / "report.html"),
                                              "mlflow.note.content": report.note})
        tracking.log_run_metrics(parent_run_id, table_means(report.data))
    log(f"report: {report.folder / 'report.md'} (and report.html)")
    return Outcome(report.folder, results, report.table, parent_run_id)


def pending(plan: Plan) -> tuple[list[Job], list[str]]:
    """(the jobs not done yet, the shared outputs they need, in build order)."""
    todo = [job for job in plan.jobs if not is_done(job)]
    return todo, shared_keys(Plan(**{**plan.__dict__, "jobs": todo})) if todo else []


@contextmanager
def study_run(plan: Plan, tags: dict[str, str] | None = None) -> Iterator[str | None]:
    """The study's MLflow parent run (``study-<name>``), its id (None when tracking is
    off): the study, scale, arms and budget as params; the shared stages and a run per arm ×
    seed nest under it; ``finish`` adds the table and the report."""
    from progress_sql import tracking

    params = {"study": plan.name, "scale": plan.scale, "arms": plan.arms,
              **{f"budget.{key}": value for key, value in plan.budget.model_dump().items()}}
    all_tags = {tracking.KIND_TAG: PARENT_KIND, "progress_sql.study": plan.name,
                "progress_sql.preset": plan.scale, **(tags or {})}
    with tracking.pipeline_run(plan.base, parent_run_name(plan), tags=all_tags, params=params) as run:
        yield run.info.run_id if run is not None else None


def run_study(plan: Plan, log: Log = print, tags: dict[str, str] | None = None) -> Outcome:
    """The CLI's path: the shared stages, every job not done yet (``study.max_parallel`` at
    once), the report; under one MLflow parent run with a child per arm × seed."""
    start = time.monotonic()
    todo, shared = pending(plan)
    log(f"study {plan.name} at scale {plan.scale}: {len(plan.jobs)} arm × seed runs, "
        f"{len(plan.jobs) - len(todo)} done before, {len(todo)} to run")
    with study_run(plan, tags) as parent:
        for key in shared:
            build_shared(plan, key, log)
        if plan.base.study.max_parallel > 1 and len(todo) > 1:
            with ProcessPoolExecutor(max_workers=plan.base.study.max_parallel, mp_context=get_context("spawn")) as pool:
                for result in pool.map(run_job, [plan] * len(todo), todo, [parent] * len(todo)):
                    log(f"{result.label}: {result.status}{': ' + result.error if result.error else ''}")
        else:
            for job in todo:
                run_job(plan, job, parent, log)
        return finish(plan, parent, time.monotonic() - start, log)
