"""SQL-Trail's reward panel (sql-trail.md §3.3.2 and Appendix A.4).

R = w_exec·r_exec + w_turns·r_turns + w_schema·r_schema + w_bigram·r_bigram + w_syntax·r_syntax
  + w_format·r_format

What survived in the paper, and our choices where it did not:

- r_exec = 1[exec(final SQL) = exec(gold)], the final SQL taken from ``<solution>`` (A.4). A
  trajectory whose last turn is not a ``<solution>`` has no final SQL: r_exec, r_schema,
  r_bigram and r_syntax are 0.
- r_turns (A.4): 1 when d = simple ∧ t ≤ 2, d = medium ∧ t ≤ 3, d ∈ {hard, extra} ∧ r_exec = 1
  ∧ t ≤ (lost; ours 5); else 0. Limits come from ``turn_limits``. Correctness is required only
  for hard/extra, as the paper writes (docs/design.md, "SQL-Trail reward"); a final answer is required
  for every level ("favors solving within a small number of steps"). t counts the tool-call
  turns before the final answer, which is the turn counter of the paper's Algorithm 1 (it is
  not advanced by the turn that emits ``<solution>``).
- Difficulty: the example's label (Spider easy/medium/hard/extra, or BIRD simple/moderate/
  challenging mapped to easy/medium/hard); otherwise the Spider hardness of the gold SQL;
  a gold that does not parse counts as extra (the strictest rule), and info says so.
- r_schema: Jaccard of schema items; r_bigram: Jaccard of SQL-token 2-grams (the paper: "bi-gram
  overlap"); r_syntax: the final SQL executes without error, as in Reasoning-SQL whose rewards
  SQL-Trail adopts.
- r_format ("interface compliance"): every turn is a well-formed ``trail`` output, the earlier
  ones ``<sql>`` tool calls and the last a ``<solution>``. The paper enforces the interface
  "at each intermediate turn", so one malformed turn loses the format reward.
"""

from __future__ import annotations

from pydantic import Field

from progress_sql.rewards.components import exec_match, executable, ngram_similarity, schema_linking
from progress_sql.formats import parse_output
from progress_sql.rewards.types import Judge, Recipe, RecipeSettings, RewardOutput, Trajectory, reward_output
from progress_sql.sql import HARDNESS_LEVELS, hardness
from progress_sql.sql.parse import SQLParseError
from progress_sql.sections import Section


# The recipe's weights (params.yaml ``rewards.sql_trail``).
class SQLTrailTurnLimits(Section):
    easy: int = Field(2, ge=1)
    medium: int = Field(3, ge=1)
    hard: int = Field(5, ge=1)
    extra: int = Field(5, ge=1)


class SQLTrailRewardSettings(Section):
    exec: float = Field(5.0, ge=0.0)
    turns: float = Field(2.0, ge=0.0)
    schema_linking: float = Field(1.0, ge=0.0)
    bigram: float = Field(1.0, ge=0.0)
    syntax: float = Field(1.0, ge=0.0)
    format: float = Field(1.0, ge=0.0)
    turn_limits: SQLTrailTurnLimits = SQLTrailTurnLimits()


NAME = "sql_trail"
FORMAT = "trail"
COMPONENTS = ("exec", "turns", "schema_linking", "bigram", "syntax", "format")
BIGRAM_N = 2
_ALIASES = {"simple": "easy", "moderate": "medium", "challenging": "hard"}
_NEEDS_CORRECT = frozenset({"hard", "extra"})


def difficulty_of(trajectory: Trajectory) -> tuple[str, str]:
    """(level, how it was obtained: 'given' | 'computed' | 'fallback')."""
    label = trajectory.difficulty.strip().lower()
    label = _ALIASES.get(label, label)
    if label in HARDNESS_LEVELS:
        return label, "given"
    try:
        return hardness(trajectory.gold_sql), "computed"
    except SQLParseError:
        return "extra", "fallback"


def _calls(n_turns: int, answered: bool) -> int:
    return n_turns - 1 if answered else n_turns


def tool_calls(trajectory: Trajectory) -> int:
    """t: turns spent before the final answer (all turns when there is no final answer)."""
    return _calls(len(trajectory.turns), parse_output(trajectory.last.text, FORMAT).kind == "solution")


def turn_reward(level: str, t: int, correct: bool, answered: bool, w: SQLTrailRewardSettings) -> float:
    """r_turns of Appendix A.4 (see the module docstring)."""
    if not answered or t > getattr(w.turn_limits, level):
        return 0.0
    return 0.0 if level in _NEEDS_CORRECT and not correct else 1.0


def score(trajectory: Trajectory, cfg: RecipeSettings, judge: Judge | None = None) -> RewardOutput:
    """The six-term panel of one multi-turn trajectory (``judge`` is unused)."""
    w = cfg.weights
    parsed = [parse_output(turn.text, FORMAT) for turn in trajectory.turns]
    last = trajectory.last
    answered = parsed[-1].kind == "solution"
    final_sql = last.sql if answered else None
    correct = answered and exec_match(last)
    level, source = difficulty_of(trajectory)
    t = _calls(len(trajectory.turns), answered)
    interface_ok = (
        answered
        and all(p.well_formed for p in parsed)
        and all(p.kind == "sql" for p in parsed[:-1])
    )
    raw = {
        "exec": float(correct),
        "turns": turn_reward(level, t, correct, answered, w),
        "schema_linking": schema_linking(final_sql, trajectory.gold_sql),
        "bigram": ngram_similarity(final_sql, trajectory.gold_sql, BIGRAM_N),
        "syntax": float(answered and executable(last)),
        "format": float(interface_ok),
    }
    notes = []
    if source == "fallback":
        notes.append("gold SQL does not parse: difficulty taken as extra")
    if not answered:
        notes.append("no final <solution>: no final SQL to score")
    return reward_output(
        {key: float(getattr(w, key)) * raw[key] for key in COMPONENTS},
        raw=raw,
        difficulty=level,
        difficulty_source=source,
        t=t,
        turn_limit=getattr(w.turn_limits, level),
        notes=notes,
    )


def bounds(w: SQLTrailRewardSettings) -> tuple[float, float]:
    return 0.0, sum(float(getattr(w, key)) for key in COMPONENTS)


RECIPE = Recipe(NAME, FORMAT, COMPONENTS, score, bounds, SQLTrailRewardSettings)
