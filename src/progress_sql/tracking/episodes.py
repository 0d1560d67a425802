"""What the model says, where a user looks: RL episodes and evaluation examples as MLflow traces.

One trace per episode on the active (stage) run, listed in the run's Traces tab: its root span
holds the question, the gold SQL and the verdict; a span per turn the prompt's tail going in and
the output and the environment's feedback coming out, with the reward so far, the execution and
the ODT tags as attributes. Tags tell them apart in the Traces search: ``progress_sql.kind``
(``rl`` or ``eval``), ``step`` (RL) or ``split`` and ``rank`` (``best``/``worst``, evaluation).

- ``log_episodes(views)``: the views ``run_rl`` hands its ``on_episodes`` callback
  (``train.samples.episode_view``: ``rl.log_episodes`` a step, spread from best to worst);
- ``log_eval_examples(result, k)``: the ``k`` best and ``k`` worst greedy answers of each split
  of an evaluation (right before wrong, executed before not, fewer ODT tags first).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import mlflow
from mlflow.entities import SpanType

if TYPE_CHECKING:  # a type only: importing the runner would pull in the whole eval stack
    from progress_sql.eval.runner import EvalResult

KIND = "progress_sql.kind"
_PREVIEW = 200  # characters of a trace's request/response preview in the Traces list
_DECIMALS = 4  # of a reward as a trace shows it (-0.1, not -0.09999999999999998); training uses the exact one


def _shown(value: Any) -> Any:
    """A reward (or a dict of reward components) rounded to ``_DECIMALS`` for display."""
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    return round(value, _DECIMALS) if isinstance(value, float) else value


def _verdict(correct: bool | None, executed: bool | None = None) -> str:
    if correct:
        return "correct"
    return "wrong" if executed or executed is None else "not executed"


def _trace(name: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any], attributes: Mapping[str, Any],
           turns: Iterable[Mapping[str, Any]], tags: Mapping[str, str]) -> None:
    """One trace: a root span and a child span per turn (each turn: ``inputs``, ``outputs``,
    ``attributes``)."""
    with mlflow.start_span(name=name, span_type=SpanType.AGENT) as root:
        root.set_inputs(dict(inputs))
        root.set_attributes({k: v for k, v in attributes.items() if v is not None})
        for turn in turns:
            with mlflow.start_span(name=f"turn {turn['turn']}", span_type=SpanType.LLM) as span:
                span.set_inputs(turn["inputs"])
                span.set_outputs(turn["outputs"])
                span.set_attributes({k: v for k, v in turn["attributes"].items() if v is not None})
        root.set_outputs(dict(outputs))
        mlflow.update_current_trace(tags=dict(tags), request_preview=str(inputs.get("question", ""))[:_PREVIEW],
                                    response_preview=str(outputs.get("verdict", ""))[:_PREVIEW])


def log_episodes(views: Sequence[Mapping[str, Any]]) -> int:
    """RL episodes (``train.samples.episode_view``) as traces of the active run; how many."""
    if mlflow.active_run() is None:
        return 0
    for v in views:
        turns = [{"turn": t["turn"],
                  "inputs": {"prompt_tail": t["prompt_tail"]},
                  "outputs": {"output": t["output"], "feedback": t["feedback"]},
                  "attributes": {"sql": t["sql"], "executed": t["executed"], "error": t["error"],
                                 "correct": t["correct"], "odt_tags": ", ".join(t["tags"]),
                                 "reward_so_far": _shown(t["reward_so_far"])}}
                 for t in v["turns"]]
        _trace(f"rl step {v['step']} · {v['example_id']}",
               {"question": v["question"], "db_id": v["db_id"], "gold_sql": v["gold_sql"], "hardness": v["hardness"]},
               {"verdict": _verdict(v["correct"]), "reward": _shown(v["reward"]), "components": _shown(v["components"]),
                "turns": len(v["turns"]), "done_reason": v["done_reason"]},
               {"step": v["step"], "reward": _shown(v["reward"]), "correct": v["correct"], "k_star": v["k_star"]},
               turns, {KIND: "rl", "step": str(v["step"]), "verdict": _verdict(v["correct"])})
    mlflow.flush_trace_async_logging()
    return len(views)


def _rank(record: Mapping[str, Any]) -> tuple:
    """Best first: right, executed, well-formed, fewest ODT tags."""
    g = record["greedy"]
    return (not g["ex"], not g["executed"], not g["well_formed"], len(g.get("odt_tags") or ()))


def best_and_worst(records: Sequence[Mapping[str, Any]], k: int) -> list[tuple[str, Mapping[str, Any]]]:
    """(``best``|``worst``, record) for the ``k`` best and ``k`` worst greedy answers (fewer when
    the split is small; none twice), in file order within each rank (a stable choice)."""
    ranked = sorted((r for r in records if r.get("greedy")), key=_rank)
    best = ranked[:k]
    worst = ranked[max(len(best), len(ranked) - k):][::-1]
    return [("best", r) for r in best] + [("worst", r) for r in worst]


def log_eval_examples(result: EvalResult, k: int) -> int:
    """The ``k`` best and ``k`` worst greedy answers of each evaluated split as traces of the
    active run (one turn: the answer); how many."""
    if mlflow.active_run() is None or k <= 0:
        return 0
    logged = 0
    for name, path in result.files.items():
        if not name.startswith("predictions/"):
            continue
        split = name.split("/", 1)[1]
        records = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        for rank, r in best_and_worst(records, k):
            g = r["greedy"]
            verdict = _verdict(g["ex"], g["executed"])
            turn = {"turn": 1, "inputs": {"question": r["question"]},
                    "outputs": {"output": g.get("text") or "", "sql": g["sql"]},
                    "attributes": {"executed": g["executed"], "error": g["error"], "correct": g["ex"],
                                   "well_formed": g["well_formed"], "odt_tags": ", ".join(g.get("odt_tags") or ()),
                                   "tokens": g["tokens"]}}
            _trace(f"eval {split} {rank} · {r['id']}",
                   {"question": r["question"], "db_id": r["db_id"], "gold_sql": r["gold_sql"], "hardness": r["hardness"]},
                   {"verdict": verdict, "sql": g["sql"]},
                   {"split": split, "rank": rank, "correct": g["ex"]},
                   [turn], {KIND: "eval", "split": split, "rank": rank, "verdict": verdict})
            logged += 1
    mlflow.flush_trace_async_logging()
    return logged
