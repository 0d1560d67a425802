"""Progress-SQL's progressive reward (progress-sql.md §4.2, Algorithm 1 of Appendix C).

R(Y) = R_fmt + R_exec + R_late + R_align over the trajectory Y = (y_1, …, y_K):

- R_align = ω_align+ · Δ if Δ > 0 else ω_align−, with Δ = F(y_K) − F(y_1) and
  F = ½(F_struct + F_lex): F_struct the ODT root score, F_lex the SQL-token 2-gram Jaccard.
  A turn without extractable SQL counts as empty text (F_struct 0, F_lex 0).
  A single-turn trajectory has y_K = y_1, so Δ = 0 and R_align = ω_align− (what the formula
  gives; it is the same for every one-turn rollout, so it does not change GRPO advantages).
- R_late = ω_acc · γ^(k*−1) at the first correct turn k* when 1 ≤ k* ≤ T, else 0.
- R_exec = ω_keep / ω_rec / ω_det / 0 for E(y_1) → E(y_K): executable → executable /
  not → executable / executable → not / not → not.
- R_fmt = ω_fmt when the final output is a well-formed ``<think>…</think><sql>…</sql>``.

Two options beyond the paper (issue 53: after SFT, a small policy answered turn 2 with turn 1's
SQL in most wrong episodes and fixed almost none); at their defaults the reward is the paper's:

- R_improve = α · (c_K − c_1), c a turn's correctness (0/1), α = ``improve``: SCoRe's bonus for
  wrong → right and malus for right → wrong. An Algorithm 1 episode stops at its first correct
  turn, so in practice it pays α for a fix at a later turn. A best-case fix at turn 2 then
  outscores a right first answer once α ≥ the gap between their bounds (0.1 with the default
  weights, tests/test_rewards_properties.py): the paper's reward analysis no longer holds and a
  staged first mistake pays.
- ``repeat_credit: false``: a final SQL that repeats an earlier turn's (``same_sql``) earns no
  credit for it: R_align is ω_align− (no progress) and R_exec keeps no positive value (keep,
  recover → 0; deteriorate stays).
"""

from __future__ import annotations

import re

from pydantic import Field

from progress_sql.odt import structural_score
from progress_sql.odt.settings import ODTSettings
from progress_sql.rewards.components import executable, format_ok, ngram_similarity
from progress_sql.rewards.types import Judge, Recipe, RecipeSettings, RewardOutput, Trajectory, reward_output
from progress_sql.sections import Section
from progress_sql.sql.parse import sql_tokens


# The recipe's weights (params.yaml ``rewards.progress``).
class ProgressRewardSettings(Section):
    align_pos: float = Field(0.8, ge=0.0)
    align_neg: float = Field(-0.1, le=0.0)
    acc: float = Field(2.0, gt=0.0)
    gamma: float = Field(0.5, gt=0.0, le=1.0)  # 1.0: no latency decay, the paper's Table 3 ablation (App. E.2)
    keep: float = Field(0.5, ge=0.0)
    recover: float = Field(0.5, ge=0.0)
    deteriorate: float = Field(-0.5, le=0.0)
    format: float = Field(0.5, ge=0.0)
    improve: float = Field(0.0, ge=0.0)  # α of R_improve = α·(c_K − c_1); 0: the paper's reward
    repeat_credit: bool = True  # false: a final SQL repeating an earlier turn's earns no R_align / R_exec credit


NAME = "progress"
FORMAT = "think_sql"
COMPONENTS = ("align", "late", "exec", "format", "improve")
LEX_N = 2  # F_lex is a 2-gram Jaccard by the paper's definition, not a tunable


def alignment(sql: str | None, gold_sql: str, odt: ODTSettings | None = None) -> tuple[float, float]:
    """(F, F_struct) of one SQL against the gold; missing SQL counts as empty text."""
    f_struct = structural_score(sql, gold_sql, odt) if sql else 0.0
    f_lex = ngram_similarity(sql, gold_sql, LEX_N)
    return 0.5 * (f_struct + f_lex), f_struct


# Quoted text ('…' literals, "…" identifiers that SQLite may read as literals): compared as written.
_QUOTED = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*")""")


def sql_key(sql: str) -> tuple[str, ...]:
    """``sql`` as ``same_sql`` compares it: its tokens, whitespace and a final ';' dropped,
    lower-cased outside quoted text (SQLite's keywords and names ignore case; literals do not)."""
    parts = _QUOTED.split(sql.strip().rstrip(";"))
    return tuple(token for i, part in enumerate(parts) for token in ([part] if i % 2 else sql_tokens(part)))


def same_sql(a: str | None, b: str | None) -> bool:
    """Whether two turns' SQL is the same query up to whitespace and the case of keywords and
    names (``sql_key``); a turn without SQL repeats nothing."""
    return a is not None and b is not None and sql_key(a) == sql_key(b)


def progress_terms(
    delta: float,
    k_star: int | None,
    max_turns: int,
    exec_first: bool,
    exec_last: bool,
    well_formed: bool,
    w: ProgressRewardSettings,
    *,
    change: int = 0,
    repeat: bool = False,
) -> dict[str, float]:
    """The weighted terms of Eq. (1)-(4), and R_improve, from the trajectory's summary statistics:
    ``change`` is c_K − c_1, ``repeat`` whether the final SQL repeats an earlier turn's.

    Kept separate from the trajectory walk so the reward analysis (upper bound over Δ for each
    k*) runs through exactly the arithmetic the recipe uses.
    """
    no_credit = repeat and not w.repeat_credit
    align = w.align_pos * delta if delta > 0 and not no_credit else w.align_neg
    late = w.acc * w.gamma ** (k_star - 1) if k_star is not None and 1 <= k_star <= max_turns else 0.0
    if exec_first and exec_last:
        status = w.keep
    elif exec_last:
        status = w.recover
    elif exec_first:
        status = w.deteriorate
    else:
        status = 0.0
    if no_credit:
        status = min(status, 0.0)
    return {"align": align, "late": late, "exec": status, "format": w.format if well_formed else 0.0,
            "improve": w.improve * change}


def first_correct_turn(trajectory: Trajectory) -> int | None:
    """k*: the 1-based index of the first turn whose execution matched the gold, or None."""
    return next((i for i, turn in enumerate(trajectory.turns, start=1) if turn.correct), None)


def score(trajectory: Trajectory, cfg: RecipeSettings, judge: Judge | None = None) -> RewardOutput:
    """The progressive reward of one trajectory (``judge`` is unused)."""
    first, last = trajectory.first, trajectory.last
    f_first, s_first = alignment(first.sql, trajectory.gold_sql, cfg.odt)
    if len(trajectory.turns) == 1:
        f_last, s_last = f_first, s_first
    else:
        f_last, s_last = alignment(last.sql, trajectory.gold_sql, cfg.odt)
    delta = f_last - f_first
    k_star = first_correct_turn(trajectory)
    repeat = any(same_sql(last.sql, turn.sql) for turn in trajectory.turns[:-1])
    terms = progress_terms(
        delta,
        k_star,
        trajectory.max_turns,
        executable(first),
        executable(last),
        format_ok(last.text, FORMAT),
        cfg.weights,
        change=int(last.correct) - int(first.correct),
        repeat=repeat,
    )
    return reward_output(
        terms,
        k_star=k_star,
        K=len(trajectory.turns),
        delta=delta,
        F_first=f_first,
        F_last=f_last,
        F_struct_first=s_first,
        F_struct_last=s_last,
        repeat=repeat,
    )


def bounds(w: ProgressRewardSettings) -> tuple[float, float]:
    """Extremes over all trajectories: Δ ∈ [−1, 1], any k*, any executability transition, any
    change of correctness (c_K − c_1 ∈ {−1, 0, 1}); a repeat only takes credit away."""
    status = (w.keep, w.recover, w.deteriorate, 0.0)
    low = min(w.align_neg, 0.0) + min(status) - w.improve  # R_late and R_fmt are at least 0
    high = max(w.align_pos, w.align_neg) + w.acc + max(status) + w.format + w.improve
    return low, high


RECIPE = Recipe(NAME, FORMAT, COMPONENTS, score, bounds, ProgressRewardSettings)
