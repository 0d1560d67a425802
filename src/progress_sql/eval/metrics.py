"""The reported metrics: a registry, ``METRICS``, of what is computed for every decoding mode
(pure: no I/O, no torch).

A decoding mode (greedy, Vote@k, the multi-turn protocol) yields one ``Outcome`` per example;
``mode_metrics`` turns them into

    {"n", "ex", "ts", "ts_n", "exec_rate", "format_rate", "mean_response_tokens", "gold_too_large",
     "wrong": {"no_sql": n, ...}, "by_hardness": {"easy": {"n", "ex", "ts"}, ...}, "by_difficulty": {...}}

- ``ex``: execution accuracy over the n examples that can be judged; ``exec_rate``: the chosen
  SQL ran without error; ``format_rate``: the output followed the format;
  ``mean_response_tokens``: mean generated length (all samples for Vote@k).
- ``ts``: test-suite accuracy over the ``ts_n`` examples whose database has neighbours
  (None when there are none, or TS is off); an example without neighbours has ``ts=None``.
- ``gold_too_large``: examples whose gold's result passed ``sandbox.max_rows``
  (``Verdict.unjudged``): no answer can be judged against it, so they are counted here and
  left out of EX and TS (and of pass@k), not counted as wrong answers of the model.
- ``wrong``: the wrong answers counted by why they are wrong (``WRONG_KINDS``: no SQL, syntax,
  unknown table, unknown column, other execution error, timeout, wrong result).
- ``by_hardness``: Spider hardness (every level listed, n=0 with None rates when absent);
  ``by_difficulty``: the dataset's own labels (BIRD: simple/moderate/challenging), only when
  the examples carry them; both hold the ``grouped`` metrics.

Every entry of ``METRICS`` lands in metrics.json in that order, in MLflow (``flat_metrics``:
``dev/greedy/ex``) and as a column of report.md's decoding-mode table: adding a metric is one
entry here (with its function when a lambda is not enough) and its test. What a decoding mode
alone has (Vote@k's votes, the multi-turn turns) the runner adds to that mode.

Rates are fractions in [0, 1]; the Markdown tables show percentages (``pct``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from progress_sql.corpus.records import Example
from progress_sql.rewards.progress import same_sql
from progress_sql.rewards.types import Turn
from progress_sql.sql.hardness import HARDNESS_LEVELS
from progress_sql.sql.verdict import Verdict

# BIRD's difficulty labels, in their natural order; other labels follow alphabetically.
DIFFICULTY_ORDER = ("simple", "moderate", "challenging")


@dataclass(frozen=True)
class Outcome:
    """One example under one decoding mode: what every metric reads. ``verdict`` holds the
    raw and comparison executions and the gold's result; ``ts`` is None when not computed
    (TS off, or no neighbour databases); ``response_tokens`` is the mean over the mode's
    generations for this example."""

    example: Example
    verdict: Verdict
    ts: bool | None
    well_formed: bool
    response_tokens: float
    sql: str | None = None

    @property
    def judged(self) -> bool:
        """False when the gold's result passed ``sandbox.max_rows`` (``Verdict.unjudged``)."""
        return not self.verdict.unjudged

    @property
    def ex(self) -> bool | None:
        """The verdict; None when the example cannot be judged."""
        return self.verdict.correct if self.judged else None

    @property
    def judged_ts(self) -> bool | None:
        return self.ts if self.judged else None

    @property
    def executed(self) -> bool:
        return self.verdict.executed


def rate(values: Iterable[bool | None]) -> float | None:
    """Share of True among the non-None values; None when there are none."""
    kept = [bool(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def mean(values: Iterable[float]) -> float | None:
    """Arithmetic mean; None for no values."""
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def counted(values: Iterable[Any]) -> int:
    """How many values are not None."""
    return sum(1 for v in values if v is not None)


def pct(value: float | None) -> str:
    """A rate as the reports print it: a percentage with one decimal, "–" when not computed."""
    return "–" if value is None else f"{100 * value:.1f}"


def _one_decimal(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


@dataclass(frozen=True)
class Metric:
    """One reported number of every decoding mode: ``value`` of each example's ``Outcome``
    (None: not counted), ``summary`` of those values over the split (``rate``, ``mean``,
    ``counted``); ``label`` heads its report column, ``text`` prints it there; ``grouped``:
    also reported per hardness and per difficulty label."""

    name: str
    value: Callable[[Outcome], Any]
    summary: Callable[[list[Any]], float | int | None] = rate
    label: str = ""
    text: Callable[[Any], str] = pct
    grouped: bool = False


METRICS: tuple[Metric, ...] = (
    Metric("ex", lambda o: o.ex, rate, "EX", grouped=True),
    Metric("ts", lambda o: o.judged_ts, rate, "TS", grouped=True),
    Metric("ts_n", lambda o: o.judged_ts, counted, "TS n", str),
    Metric("exec_rate", lambda o: o.executed, rate, "Executable"),
    Metric("format_rate", lambda o: o.well_formed, rate, "Format"),
    Metric("mean_response_tokens", lambda o: o.response_tokens, mean, "Mean tokens", _one_decimal),
    Metric("gold_too_large", lambda o: None if o.judged else True, counted, "Gold too large", str),
)


def _summaries(outcomes: Sequence[Outcome], metrics: Iterable[Metric]) -> dict[str, Any]:
    return {m.name: m.summary([m.value(o) for o in outcomes]) for m in metrics}


def _group(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    return {"n": len(outcomes), **_summaries(outcomes, (m for m in METRICS if m.grouped))}


def _difficulty_key(label: str) -> tuple[int, str]:
    return (DIFFICULTY_ORDER.index(label), "") if label in DIFFICULTY_ORDER else (len(DIFFICULTY_ORDER), label)


# Why an answer is wrong, in the order the report lists them (``wrong_kind``): no SQL in the output,
# SQL that does not parse, a table or a column the schema does not have (a model that invents names),
# another execution error, the time limit, or SQL that runs and returns the wrong result.
WRONG_KINDS = ("no_sql", "syntax", "unknown_table", "unknown_column", "other_error", "timeout", "wrong_result")


def wrong_kind(o: Outcome) -> str | None:
    """The ``WRONG_KINDS`` entry of a wrong answer; None for a right one or one that cannot be judged."""
    result = o.verdict.result
    if not o.judged or o.verdict.correct:
        return None
    if o.sql is None or result is None:
        return "no_sql"
    if result.ok:
        return "wrong_result"
    if result.error in ("syntax", "timeout"):
        return result.error
    message = result.message.lower()
    if "no such table" in message:
        return "unknown_table"
    if "no such column" in message:
        return "unknown_column"
    return "other_error"


def mode_metrics(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The metrics of one decoding mode over a split (see the module notes)."""
    out: dict[str, Any] = {"n": len(outcomes), **_summaries(outcomes, METRICS)}
    kinds = [wrong_kind(o) for o in outcomes]
    out["wrong"] = {kind: kinds.count(kind) for kind in WRONG_KINDS}
    hardness = [o.example.hardness for o in outcomes]
    # every level listed, and a loader's unexpected label reported, not dropped
    levels = [*HARDNESS_LEVELS, *sorted(set(hardness) - set(HARDNESS_LEVELS))]
    out["by_hardness"] = {level: _group([o for o in outcomes if o.example.hardness == level]) for level in levels}
    labels = sorted({o.example.difficulty for o in outcomes if o.example.difficulty}, key=_difficulty_key)
    if labels:
        out["by_difficulty"] = {label: _group([o for o in outcomes if o.example.difficulty == label])
                                for label in labels}
    return out


def second_turn_counts(episodes: Iterable[Sequence[Turn]]) -> dict[str, int | float | None]:
    """How episodes use their second turn, from each episode's turns (issue 53: the multi-turn
    signal is a wrong first answer mended at turn 2, not the same answer again). RL's step
    metrics (``turn2/...``) and the multi-turn evaluation (``multi_turn.turn2``) both count here:

    - ``wrong_at_1``: episodes with a second turn whose first turn is wrong; ``fixed``: of those,
      the ones whose second turn is right; ``fix_rate`` = fixed / wrong_at_1 (a question that
      cannot be judged, ``Turn.unjudged``, counts in neither);
    - ``second_turns``: episodes with a second turn; ``repeats``: of those, the ones whose second
      SQL is the first's (``rewards.progress.same_sql``: up to whitespace and the case of keywords
      and names); ``repeat_rate`` = repeats / second_turns.

    Rates are None when nothing was counted (one-turn episodes only)."""
    pairs = [(turns[0], turns[1]) for turns in episodes if len(turns) > 1]
    judged = [(first, second) for first, second in pairs if not (first.unjudged or second.unjudged)]
    wrong = [second for first, second in judged if not first.correct]
    fixed = sum(second.correct for second in wrong)
    repeats = sum(same_sql(first.sql, second.sql) for first, second in pairs)
    return {"wrong_at_1": len(wrong), "fixed": fixed, "fix_rate": fixed / len(wrong) if wrong else None,
            "second_turns": len(pairs), "repeats": repeats, "repeat_rate": repeats / len(pairs) if pairs else None}


def pass_metrics(scores: Sequence[float | None], hardness: Sequence[str]) -> dict[str, Any]:
    """pass@k over a split: ``scores[i]`` is example i's pass@k estimate in [0, 1], None when
    it cannot be judged (counted in ``gold_too_large``, left out of the rest)."""
    if len(scores) != len(hardness):
        raise ValueError("pass_metrics: one hardness label per score")
    by_level = {}
    for level in (*HARDNESS_LEVELS, *sorted(set(hardness) - set(HARDNESS_LEVELS))):
        vals = [s for s, h in zip(scores, hardness) if h == level]
        if vals or level in HARDNESS_LEVELS:
            by_level[level] = {"n": len(vals), "ex": mean(s for s in vals if s is not None)}
    return {"n": len(scores), "ex": mean(s for s in scores if s is not None), "by_hardness": by_level,
            "gold_too_large": sum(s is None for s in scores)}


def flat_metrics(tree: dict[str, Any], sep: str = "/", prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a nested metrics dict under joined keys (``dev/greedy/ex``); None,
    strings and booleans are left out (the gate, the registry and tracking take numbers).
    Not ``tracking.flat_params``, which turns settings into strings."""
    flat: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(flat_metrics(value, sep, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat
