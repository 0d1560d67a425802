"""The report of a study, from the files its runs wrote: ``REPORT/<name>/<scale>/``

- ``report.md`` and ``report.html``, each standing alone (the figures inlined as data URIs, so
  the Prefect artifact, a mail or a copy show them): the budget, the table in the papers' shape
  (EX per split and mode per arm, mean ± standard deviation over seeds), each arm against the
  first by the exact McNemar test of ``eval.paired`` (pooled over seeds, and per seed with each
  EX's 95 % Wilson interval), the ODT
  mismatch profile per arm, the cost of each arm, the failures;
- ``table.json``: the table's numbers (what the three ways of running must agree on);
- ``curves.png``: RL reward and rollout EX per step, every arm (mean over seeds);
- ``ex.png``: greedy EX per arm, a panel per split, the seeds' spread as error bars.
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from progress_sql.studies.spec import JobResult, Plan
from progress_sql.eval.paired import MODES, compare_split, read_predictions
from progress_sql.eval.reports import markdown_table
from progress_sql.eval.plots import save_png
from progress_sql.files import write_json, write_text, written_aside

# The report's files, replaced whole by each report; other files in its folder are kept.
REPORT_FILES = ("report.md", "report.html", "table.json", "curves.png", "ex.png")
_DPI = 110
ODT_KEYS = ("select", "join", "where", "group", "avg", "parse_error_rate")
Block = tuple  # ("p", text) | ("table", header, rows) | ("img", file name, alt)


@dataclass
class Report:
    folder: Path
    table: str  # the main table, markdown
    note: str  # a short markdown note for the MLflow parent run
    data: dict[str, Any]  # table.json's numbers


def _pct(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mean = 100 * statistics.fmean(values)
    return f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f} ± {100 * statistics.stdev(values):.1f}"


def _done(results: Sequence[JobResult]) -> list[JobResult]:
    return [r for r in results if r.status == "done"]


def ex_columns(plan: Plan, results: Sequence[JobResult]) -> list[tuple[str, str]]:
    """(split, mode) pairs with an EX in any finished run, splits in the budget's order."""
    found = {tuple(k.split("/")[:2]) for r in _done(results) for k in r.metrics if k.count("/") == 2 and k.endswith("/ex")}
    return sorted(found, key=lambda c: (plan.budget.splits.index(c[0]) if c[0] in plan.budget.splits else 99, c[1]))


def table_data(plan: Plan, results: Sequence[JobResult]) -> dict[str, Any]:
    """Per arm: the seeds that finished and, per ``split/mode``, the EX of each seed (seed order)."""
    columns = ex_columns(plan, results)
    out: dict[str, Any] = {"columns": [f"{s}/{m}" for s, m in columns], "arms": {}}
    for arm in plan.arms:
        mine = sorted((r for r in _done(results) if r.arm == arm), key=lambda r: r.seed)
        out["arms"][arm] = {"seeds": [r.seed for r in mine],
                            "ex": {f"{s}/{m}": [r.metrics.get(f"{s}/{m}/ex") for r in mine] for s, m in columns}}
    return out


def table_means(data: dict[str, Any]) -> dict[str, float]:
    """The table as flat metrics, ``<arm>/<split>/<mode>/ex``: the mean over the arm's seeds."""
    return {f"{arm}/{column}/ex": statistics.fmean(values)
            for arm, d in data["arms"].items() for column in data["columns"]
            if (values := [v for v in d["ex"][column] if v is not None])}


def _main_table(data: dict[str, Any]) -> Block:
    header = ["arm", "seeds", *(f"{c} EX %" for c in data["columns"])]
    rows = [[arm, str(len(d["seeds"])), *(_pct([v for v in d["ex"][c] if v is not None]) for c in data["columns"])]
            for arm, d in data["arms"].items()]
    return ("table", header, rows)


def _predictions(result: JobResult, split: str) -> dict[str, dict[str, Any]]:
    path = Path(result.run_dir) / "eval" / "predictions" / f"{split}.jsonl"
    return read_predictions(path) if path.is_file() else {}


def _paired_rows(plan: Plan, results: Sequence[JobResult]) -> list[list[str]]:
    """Each arm against the first: per split and mode, pooled over the seeds both finished
    (examples keyed by seed and id), then per seed."""
    by = {(r.arm, r.seed): r for r in _done(results)}
    first = plan.arms[0]
    rows = []
    for arm in plan.arms[1:]:
        seeds = sorted(s for (a, s) in by if a == arm and (first, s) in by)
        for split in plan.budget.splits:
            per_seed = {s: (_predictions(by[(first, s)], split), _predictions(by[(arm, s)], split)) for s in seeds}
            pooled_a = {f"{s}:{i}": row for s, (a, _) in per_seed.items() for i, row in a.items()}
            pooled_b = {f"{s}:{i}": row for s, (_, b) in per_seed.items() for i, row in b.items()}
            for mode in MODES:
                pooled = compare_split(pooled_a, pooled_b, split, mode) if pooled_a and pooled_b else None
                if pooled is None:
                    continue
                rows.append(_paired_row(arm, split, mode, "pooled" if len(seeds) > 1 else str(seeds[0]), pooled))
                if len(seeds) > 1:
                    for s, (a, b) in per_seed.items():
                        c = compare_split(a, b, split, mode) if a and b else None
                        if c is not None:
                            rows.append(_paired_row(arm, split, mode, str(s), c))
    return rows


def _paired_row(arm: str, split: str, mode: str, seeds: str, c: Any) -> list[str]:
    """A row of the paired table; one seed's EX with its 95 % Wilson interval (pooled seeds share
    their questions, so their examples are not independent draws: no interval there)."""
    def ex(share: float, ci: tuple[float, float]) -> str:
        return f"{100 * share:.1f}" + ("" if seeds == "pooled" else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]")

    return [arm, split, mode, seeds, str(c.n), ex(c.ex_a, c.ci_a), ex(c.ex_b, c.ci_b), str(len(c.gained)),
            str(len(c.lost)), f"{c.p_value:.3g}"]


def _odt_rows(plan: Plan, results: Sequence[JobResult]) -> list[list[str]]:
    rows = []
    for arm in plan.arms:
        for split in plan.budget.splits:
            values: dict[str, list[float]] = {k: [] for k in ODT_KEYS}
            for r in _done(results):
                if r.arm != arm:
                    continue
                metrics = json.loads((Path(r.run_dir) / "eval" / "metrics.json").read_text(encoding="utf-8"))
                odt = (metrics.get(split) or {}).get("odt_mismatch") or {}
                for k in ODT_KEYS:
                    if odt.get(k) is not None:
                        values[k].append(float(odt[k]))
            if any(values.values()):
                rows.append([arm, split, *(_pct(values[k]) for k in ODT_KEYS)])
    return rows


def _cost_rows(plan: Plan, results: Sequence[JobResult]) -> list[list[str]]:
    rows = []
    for arm in plan.arms:
        mine = [r for r in _done(results) if r.arm == arm]
        if mine:
            rows.append([arm, str(len(mine)), f"{statistics.fmean(r.rl_steps for r in mine):.0f}",
                         f"{statistics.fmean(r.rl_seconds for r in mine):.0f}",
                         f"{statistics.fmean(r.eval_seconds for r in mine):.0f}",
                         f"{statistics.fmean(r.generated_tokens for r in mine):,.0f}"])
    return rows


def _curves(plan: Plan, results: Sequence[JobResult]) -> dict[str, dict[str, list[float]]]:
    """arm → metric → per-step mean over the arm's finished seeds (reward/mean, ex)."""
    out: dict[str, dict[str, list[float]]] = {}
    for arm in plan.arms:
        runs = []
        for r in _done(results):
            if r.arm == arm:
                path = Path(r.run_dir) / "rl" / "metrics.jsonl"
                if not path.is_file():  # an arm without RL has no curve
                    continue
                runs.append([json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()])
        if not runs:
            continue
        steps = min(len(rows) for rows in runs)
        out[arm] = {key: [statistics.fmean(float(rows[i].get(key, 0.0)) for rows in runs) for i in range(steps)]
                    for key in ("reward/mean", "ex")}
    return out


def _plot(plan: Plan, results: Sequence[JobResult], data: dict[str, Any], folder: Path) -> list[Block]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    blocks: list[Block] = []
    curves = _curves(plan, results)
    if curves:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
        for arm, series in curves.items():
            steps = range(1, len(series["ex"]) + 1)
            axes[0].plot(steps, series["reward/mean"], marker="o", label=arm)
            axes[1].plot(steps, [100 * v for v in series["ex"]], marker="o", label=arm)
        axes[0].set_title("RL reward (each recipe's own scale)")
        axes[1].set_title("rollout EX % (train questions)")
        for ax in axes:
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[1].legend(fontsize="small")
        save_png(fig, folder / "curves.png", dpi=_DPI)
        blocks.append(("img", "curves.png", "RL reward and rollout EX per step"))
    greedy = [c for c in data["columns"] if c.endswith("/greedy")]
    if greedy:
        fig, axes = plt.subplots(1, len(greedy), figsize=(max(4.5, 0.9 * len(plan.arms)) * len(greedy), 3.4),
                                 squeeze=False)
        for ax, column in zip(axes[0], greedy):
            arms = list(data["arms"])
            values = [[100 * v for v in data["arms"][a]["ex"][column] if v is not None] for a in arms]
            means = [statistics.fmean(v) if v else 0.0 for v in values]
            spread = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            ax.bar(range(len(arms)), means, yerr=spread, capsize=4, color=[f"C{i}" for i in range(len(arms))])
            ax.set_xticks(range(len(arms)))
            ax.set_xticklabels(arms, rotation=30, ha="right", fontsize="small")
            ax.set_ylabel("EX %")
            ax.set_title(f"{column.split('/')[0]}: greedy EX (± sd over seeds)")
        save_png(fig, folder / "ex.png", dpi=_DPI)
        blocks.append(("img", "ex.png", "greedy EX per arm and split"))
    return blocks


def write_report(plan: Plan, results: Sequence[JobResult], wall_seconds: float) -> Report:
    """The report's files, written aside and swapped into ``plan.report_dir`` whole."""
    with written_aside(plan.report_dir, owned=REPORT_FILES) as aside:
        data = table_data(plan, results)
        write_json(aside / "table.json", data)
        failures = [r for r in results if r.status != "done"]
        done = len(results) - len(failures)
        sections: list[tuple[str, list[Block]]] = [
            ("Budget", [("p", f"Scale `{plan.scale}`, {done} of {len(results)} arm × seed runs finished; "
                              f"this invocation took {wall_seconds / 60:.1f} min, the finished runs' RL and evaluation "
                              f"{sum(r.rl_seconds + r.eval_seconds for r in results) / 60:.1f} min in all (shared stages "
                              "not counted)."), *(("p", n) for n in plan.notes)]),
            ("EX per split and mode (mean ± sd over seeds)", [_main_table(data)]),
            ("Figures", _plot(plan, results, data, aside)),
            (f"Each arm against {plan.arms[0]} (exact McNemar test, paired by question)",
             [("p", "Pooled: the examples of every seed both arms finished, paired by seed and question; then each "
                    "seed alone, EX with its 95 % Wilson interval. gained: right only in the arm; lost: right only in "
                    "the first."),
              ("table", ["arm", "split", "mode", "seeds", "n", f"EX {plan.arms[0]} %", "EX arm %", "gained", "lost",
                         "p"], _paired_rows(plan, results))]),
            ("ODT mismatch profile (greedy, % of profiled predictions; mean ± sd over seeds)",
             [("table", ["arm", "split", "SELECT", "JOIN", "WHERE", "GROUP", "avg", "unparsed"], _odt_rows(plan, results))]),
            ("Cost per run (mean over seeds)",
             [("table", ["arm", "seeds", "RL steps", "RL s", "eval s", "generated tokens (RL)"], _cost_rows(plan, results))]),
        ]
        if failures:
            sections.append(("Failed or missing runs", [
                ("p", "Run the same command again: the finished runs are kept and only these run."),
                ("table", ["run", "error", "folder"], [[r.label, r.error, r.run_dir] for r in failures])]))
        title = f"Study {plan.name}"
        md = _markdown(title, plan.study.description, sections, aside)
        write_text(aside / "report.md", md)
        write_text(aside / "report.html", _html(title, plan.study.description, sections, aside))
    folder = plan.report_dir
    table = _render_table_md(*_main_table(data)[1:])
    # MLflow's markdown preview shows no inlined image (it keeps http(s) sources only); its HTML
    # preview shows report.html whole.
    note = (f"**{title}** at scale `{plan.scale}`\n\n{table}\n\nThe report with its figures: the artifact "
            f"`study/report.html` (on disk: {folder.resolve() / 'report.html'}).")
    return Report(folder, table, note, data)


# ----------------------------------------------------------------------------- rendering
def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _render_table_md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return markdown_table(header, [[_cell(c) for c in row] for row in rows]) if rows else "(none)"


def _markdown(title: str, description: str, sections: Sequence[tuple[str, list[Block]]], folder: Path) -> str:
    out = [f"# {title}", "", description.strip(), ""] if description else [f"# {title}", ""]
    for heading, blocks in sections:
        out += [f"## {heading}", ""]
        for block in blocks:
            if block[0] == "p":
                out += [block[1], ""]
            elif block[0] == "table":
                out += [_render_table_md(block[1], block[2]), ""]
            else:
                out += [f"![{block[2]}]({_data_uri(folder / block[1])})", ""]
    return "\n".join(out)


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _html(title: str, description: str, sections: Sequence[tuple[str, list[Block]]], folder: Path) -> str:
    esc = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title><style>"
           "body{font-family:sans-serif;max-width:72em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #bbb;padding:.25em .6em;text-align:right}td:first-child{text-align:left}"
           "img{max-width:100%}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    if description:
        out.append(f"<p>{esc(description)}</p>")
    for heading, blocks in sections:
        out.append(f"<h2>{esc(heading)}</h2>")
        for block in blocks:
            if block[0] == "p":
                out.append(f"<p>{esc(block[1]).replace('`', '')}</p>")
            elif block[0] == "table":
                if not block[2]:
                    out.append("<p>(none)</p>")
                    continue
                head = "".join(f"<th>{esc(h)}</th>" for h in block[1])
                body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in block[2])
                out.append(f"<table><tr>{head}</tr>{body}</table>")
            else:
                out.append(f"<img alt='{esc(block[2])}' src='{_data_uri(folder / block[1])}'>")
    out.append("</body></html>")
    return "\n".join(out)
