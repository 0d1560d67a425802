"""Reasoning-SQL's partial rewards (reasoning-sql.md §3.2 and Algorithm 1 of its A.7).

r = w_exec·1[correct] + w_judge·r_judge + w_syntax·1[executes] + w_schema·Jaccard(schema items)
  + w_ngram·Jaccard(n-grams) + w_format·1[<reasoning>…</reasoning><answer>…</answer>]

r_judge = 1 when the answer is correct (the judge is asked only when exec = 0), else the
judge's score in [0, 1]; 0 when there is no SQL to judge or the judge fails (info says which).
Without a judge its weight is spread over the other terms in proportion to their weights, so
the maximum stays Σw and "no incorrect SQL outscores a correct one" still holds; the judge
component is then 0 and ``info["notes"]`` says so. "Without a judge" means ``judge=None`` in the
call: build the judge that ``judge_backend`` names with ``make_judge`` (None for ``off``).
Single turn: the final turn is scored.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from progress_sql.rewards.components import (
    exec_match,
    executable,
    format_ok,
    ngram_similarity,
    schema_linking,
)
from progress_sql.rewards.judge import check_score
from progress_sql.rewards.types import Judge, Recipe, RecipeSettings, RewardOutput, Trajectory, reward_output
from progress_sql.sections import Section


# The recipe's weights (params.yaml ``rewards.reasoning_sql``).
class ReasoningSQLRewardSettings(Section):
    exec: float = Field(3.0, ge=0.0)
    judge: float = Field(2.0, ge=0.0)
    syntax: float = Field(1.0, ge=0.0)
    schema_linking: float = Field(1.0, ge=0.0)
    ngram: float = Field(1.0, ge=0.0)
    format: float = Field(1.0, ge=0.0)
    ngram_n: int = Field(2, ge=1, le=8)
    # "off": no judge; its weight is redistributed over the other components (and reported).
    judge_backend: Literal["off", "openai", "local"] = "off"
    judge_endpoint: str = ""
    judge_model: str = ""
    judge_timeout_s: float = Field(60.0, gt=0.0)  # one judge request, seconds


NAME = "reasoning_sql"
FORMAT = "reasoning_answer"
COMPONENTS = ("exec", "judge", "syntax", "schema_linking", "ngram", "format")


def _judge_score(trajectory: Trajectory, correct: bool, judge: Judge) -> tuple[float, str]:
    last = trajectory.last
    if correct:
        return 1.0, "not asked: the answer is correct"
    if last.sql is None:
        return 0.0, "not asked: no SQL to judge"
    try:
        value = judge.score(trajectory.question, trajectory.schema, last.sql, trajectory.gold_sql)
        return check_score(value), "asked"
    except Exception as err:  # an external service or user callable: never let it kill a batch
        return 0.0, f"judge failed ({type(err).__name__}: {err}); scored 0"


def score(trajectory: Trajectory, cfg: RecipeSettings, judge: Judge | None = None) -> RewardOutput:
    """Weighted partial rewards of the final turn; ``judge`` None redistributes its weight."""
    w = cfg.weights
    last = trajectory.last
    correct = exec_match(last)
    raw = {
        "exec": float(correct),
        "judge": 0.0,
        "syntax": float(executable(last)),
        "schema_linking": schema_linking(last.sql, trajectory.gold_sql),
        "ngram": ngram_similarity(last.sql, trajectory.gold_sql, w.ngram_n),
        "format": float(format_ok(last.text, FORMAT)),
    }
    weight = {key: float(getattr(w, key)) for key in COMPONENTS}
    notes: list[str] = []
    if judge is None:
        others = sum(v for k, v in weight.items() if k != "judge")
        if weight["judge"] > 0 and others > 0:
            factor = (others + weight["judge"]) / others
            notes.append(
                f"judge off: weight {weight['judge']} redistributed over the other components (×{factor:.6g})"
            )
            weight = {k: (0.0 if k == "judge" else v * factor) for k, v in weight.items()}
        elif weight["judge"] > 0:
            notes.append("judge off and every other weight is 0: the judge weight is lost")
        judge_status = "off"
    else:
        raw["judge"], judge_status = _judge_score(trajectory, correct, judge)
        if judge_status.startswith("judge failed"):
            notes.append(judge_status)
    return reward_output(
        {key: weight[key] * raw[key] for key in COMPONENTS}, raw=raw, judge=judge_status, notes=notes
    )


def bounds(w: ReasoningSQLRewardSettings) -> tuple[float, float]:
    """[0, Σw]: the same with or without a judge (redistribution keeps the maximum)."""
    return 0.0, sum(float(getattr(w, key)) for key in COMPONENTS)


RECIPE = Recipe(NAME, FORMAT, COMPONENTS, score, bounds, ReasoningSQLRewardSettings, uses_judge=True)
