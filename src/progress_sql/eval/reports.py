"""Evaluation reports: Markdown tables shaped like the paper's and the rows of the CSV files
for ``dvc plots`` (written by ``progress_sql.files``; MLflow logging is ``tracking``'s).

Tables (progress-sql.md; the paper's numbers did not survive in our copy, its shapes did):

- Table 1, main benchmarks: one row per decoding, EX and TS per split (train/dev/test);
- Table 2, robustness: the same over the variants (syn / realistic / dk);
- Table 8, ODT structural-mismatch rates of the greedy predictions (SELECT, JOIN, WHERE,
  GROUP, Avg. Err.);
- Table 9, accuracy by the dataset's own difficulty labels (BIRD: simple / moderate /
  challenging) when the examples carry them; Tables 10-12, by Spider hardness; per split,
  per decoding, EX and TS;

plus pass@k and the multi-turn protocol (and how its episodes use a second turn). Rates are
printed as percentages with one decimal; "–" marks a value that was not computed.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from progress_sql.params import EvalSettings
from progress_sql.corpus.records import CORPUS_SPLITS
from progress_sql.sources import VARIANTS
from progress_sql.eval import metrics as registry
from progress_sql.eval.metrics import pct
from progress_sql.sql.hardness import HARDNESS_LEVELS

HARDNESS_COLUMNS = ("group", "split", "decoding", "hardness", "n", "ex", "ts")
ROBUSTNESS_COLUMNS = ("group", "split", "decoding", "ex", "ts")
_SPLIT_TITLES = {"train": "Train", "dev": "Dev", "test": "Test", "indomain": "In-domain", "syn": "Syn",
                 "realistic": "Realistic", "dk": "DK"}
_NOT_MODES = ("odt_mismatch",)


# ----------------------------------------------------------------------------- naming
def split_title(name: str) -> str:
    return _SPLIT_TITLES.get(name, name)


def mode_label(key: str) -> str:
    """``greedy`` → Greedy, ``vote_at_8`` → Vote@8, ``pass_at_8`` → Pass@8, ``multi_turn`` → Multi-turn."""
    for prefix, label in (("vote_at_", "Vote@"), ("pass_at_", "Pass@")):
        if key.startswith(prefix):
            return label + key[len(prefix):]
    return {"greedy": "Greedy", "multi_turn": "Multi-turn"}.get(key, key)


def decoding_modes(split_metrics: dict[str, Any], *, with_pass: bool = False) -> list[str]:
    """The decoding-mode keys of one split's metrics, in report order."""
    keys = [k for k, v in split_metrics.items() if isinstance(v, dict) and "ex" in v and k not in _NOT_MODES]
    if not with_pass:
        keys = [k for k in keys if not k.startswith("pass_at_")]
    order = {"greedy": 0, "multi_turn": 3}
    return sorted(keys, key=lambda k: (order.get(k, 1 if k.startswith("vote_at_") else 2), k))


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of ``rows`` under ``header`` (cells as given: escape ``|`` yourself)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- tables
def _accuracy_table(model: str, metrics: dict[str, Any], splits: Sequence[str]) -> str | None:
    present = [s for s in splits if s in metrics]
    if not present:
        return None
    with_ts = {s: any((metrics[s][m] or {}).get("ts") is not None for m in decoding_modes(metrics[s])) for s in present}
    header = ["Model", "Decoding"]
    for s in present:
        header += [f"{split_title(s)} EX"] + ([f"{split_title(s)} TS"] if with_ts[s] else [])
    modes = list(dict.fromkeys(m for s in present for m in decoding_modes(metrics[s])))
    rows = []
    for mode in modes:
        row = [model, mode_label(mode)]
        for s in present:
            m = metrics[s].get(mode) or {}
            row.append(pct(m.get("ex")))
            if with_ts[s]:
                row.append(pct(m.get("ts")))
        rows.append(row)
    return markdown_table(header, rows)


def _mismatch_table(model: str, metrics: dict[str, Any]) -> str | None:
    rows = []
    for split, m in metrics.items():
        odt = m.get("odt_mismatch")
        if odt:
            rows.append([model, split_title(split), *(pct(odt[k]) for k in ("select", "join", "where", "group", "avg")),
                         str(odt["n_profiled"]), pct(odt["parse_error_rate"])])
    if not rows:
        return None
    return markdown_table(["Model", "Split", "SELECT", "JOIN", "WHERE", "GROUP", "Avg. Err.", "Profiled", "Unparsed"], rows)


def _breakdown_tables(metrics: dict[str, Any], key: str, labels_of) -> str | None:
    """Per split: one row per decoding and metric (EX, then TS when computed), one column
    per label of ``key`` (``by_hardness`` / ``by_difficulty``) with its n, and All."""
    blocks = []
    for split, m in metrics.items():
        modes = [mode for mode in decoding_modes(m) if (m[mode] or {}).get(key)]
        if not modes:
            continue
        groups = m[modes[0]][key]
        labels = labels_of(groups)
        header = ["Decoding", "Metric", *(f"{label} (n={groups[label]['n']})" for label in labels), f"All (n={m['n']})"]
        rows = []
        for mode in modes:
            for metric in ("ex", "ts"):
                if metric == "ts" and m[mode].get("ts") is None:
                    continue
                rows.append([mode_label(mode), metric.upper(),
                             *(pct(m[mode][key].get(label, {}).get(metric)) for label in labels),
                             pct(m[mode].get(metric))])
        blocks.append(f"{split_title(split)}:\n\n" + markdown_table(header, rows))
    return "\n\n".join(blocks) if blocks else None


def _wrong_table(metrics: dict[str, Any]) -> str | None:
    """One row per split and decoding mode: its wrong answers by kind (``metrics.WRONG_KINDS``)."""
    rows = [[split_title(split), mode_label(mode), *(str(m[mode]["wrong"][kind]) for kind in registry.WRONG_KINDS),
             str(sum(m[mode]["wrong"].values()))]
            for split, m in metrics.items() for mode in decoding_modes(m) if "wrong" in (m[mode] or {})]
    if not rows:
        return None
    return markdown_table(["Split", "Decoding", *(k.replace("_", " ") for k in registry.WRONG_KINDS), "wrong"], rows)


def _second_turn_table(metrics: dict[str, Any]) -> str | None:
    """One row per split of the multi-turn protocol: wrong first turns fixed at turn 2, second
    turns that repeat the first (``metrics.second_turn_counts``)."""
    rows = []
    for split, m in metrics.items():
        t2 = (m.get("multi_turn") or {}).get("turn2")
        if t2:
            rows.append([split_title(split), str(t2["wrong_at_1"]), str(t2["fixed"]), pct(t2["fix_rate"]),
                         str(t2["second_turns"]), str(t2["repeats"]), pct(t2["repeat_rate"])])
    if not rows:
        return None
    return markdown_table(["Split", "Wrong at turn 1", "Fixed at turn 2", "Fix rate", "Second turns",
                           "Repeat turn 1", "Repeat rate"], rows)


def _pass_table(metrics: dict[str, Any]) -> str | None:
    rows = []
    for split, m in metrics.items():
        for key in (k for k in m if k.startswith("pass_at_")):
            rows.append([split_title(split), mode_label(key), pct(m[key]["ex"]),
                         *(pct(m[key]["by_hardness"].get(level, {}).get("ex")) for level in HARDNESS_LEVELS)])
    if not rows:
        return None
    return markdown_table(["Split", "k", "EX", *HARDNESS_LEVELS], rows)


def _details_table(metrics: dict[str, Any]) -> str:
    """One row per split and decoding mode: n, every registered metric, the mode's own notes."""
    rows = []
    for split, m in metrics.items():
        for mode in decoding_modes(m):
            d = m[mode]
            extra = ""
            if mode == "multi_turn":
                extra = f"turns {d['mean_turns']:.2f}, solution {pct(d['solution_rate'])}%"
            elif mode.startswith("vote_at_"):
                extra = f"mean votes {d['mean_votes']:.2f}, all invalid {pct(d['all_invalid_rate'])}%"
            rows.append([split_title(split), mode_label(mode), str(d["n"]),
                         *(metric.text(d.get(metric.name)) for metric in registry.METRICS), extra])
    return markdown_table(["Split", "Decoding", "n", *(metric.label for metric in registry.METRICS), "Notes"], rows)


def _ordered_hardness(groups: dict[str, Any]) -> list[str]:
    return [level for level in HARDNESS_LEVELS if level in groups] + sorted(set(groups) - set(HARDNESS_LEVELS))


def markdown_report(model: str, metrics: dict[str, Any], cfg: EvalSettings, notes: Sequence[str] = ()) -> str:
    """The Markdown report of one evaluation run."""
    protocol = ["Single-turn inference, no ODT feedback at test time."]
    if cfg.greedy:
        protocol.append("Greedy: temperature 0.")
    if cfg.vote_k or cfg.pass_k:
        protocol.append(f"Samples: {max(cfg.vote_k, cfg.pass_k)} per question at temperature {cfg.temperature:g}, "
                        f"top-p {cfg.top_p:g}" + (f"; Vote@{cfg.vote_k} takes the majority over execution-result "
                                                  f"classes of the first {cfg.vote_k}." if cfg.vote_k else "."))
    if cfg.multi_turn:
        protocol.append("Multi-turn: the SQL-tool protocol (execution feedback only), greedy.")
    protocol.append("EX and TS in %; TS over the examples whose database has test-suite neighbours.")
    parts = [f"# Evaluation: {model}", "", " ".join(protocol)]
    judged = [f"{split_title(split)} {m['semantics']}" for split, m in metrics.items() if m.get("semantics")]
    if judged:
        parts += ["", "Semantics of EX/TS (spider: Spider test-suite, bags up to a column permutation, DISTINCT "
                      "removed, ordered when the gold orders; bird: BIRD's EX, set(pred rows) == set(gold rows)): "
                  + "; ".join(judged) + "."]
    sections = [
        ("Table 1: main splits (EX / TS)", _accuracy_table(model, metrics, CORPUS_SPLITS)),
        ("Table 2: robustness variants (EX / TS)", _accuracy_table(model, metrics, VARIANTS)),
        ("Table 8: ODT structural-mismatch rates, greedy (%; lower is better)", _mismatch_table(model, metrics)),
        ("Table 9: accuracy by the dataset's difficulty labels (BIRD)", _breakdown_tables(metrics, "by_difficulty", list)),
        ("Tables 10-12: accuracy by Spider hardness", _breakdown_tables(metrics, "by_hardness", _ordered_hardness)),
        ("pass@k", _pass_table(metrics)),
        ("All decoding modes", _details_table(metrics)),
        ("Wrong answers by kind (counts)", _wrong_table(metrics)),
        ("Multi-turn: second turns (counts, rates in %)", _second_turn_table(metrics)),
    ]
    for title, table in sections:
        if table:
            parts += ["", f"## {title}", "", table]
    if notes:
        parts += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- plot data
def hardness_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (split, decoding, hardness level with examples): n, EX, TS."""
    rows = []
    for split, m in metrics.items():
        for mode in decoding_modes(m):
            for level, g in m[mode]["by_hardness"].items():
                if g["n"]:
                    rows.append({"group": f"{split} {mode_label(mode)} {level}", "split": split,
                                 "decoding": mode_label(mode), "hardness": level, "n": g["n"], "ex": g["ex"],
                                 "ts": g["ts"]})
    return rows


def robustness_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (split, decoding): EX, TS."""
    return [
        {"group": f"{split} {mode_label(mode)}", "split": split, "decoding": mode_label(mode),
         "ex": m[mode]["ex"], "ts": m[mode]["ts"]}
        for split, m in metrics.items() for mode in decoding_modes(m)
    ]

