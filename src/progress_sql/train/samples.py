"""A few episodes of an RL step as a reader follows them: every turn's prompt tail, output,
the environment's feedback or observation, and its reward so far; the final verdict.

``run_rl`` hands them to its ``on_episodes`` callback (the train stage logs them to MLflow,
``tracking.log_episodes``), ``rl.log_episodes`` a step: spread over the step's rewards (the
best, the worst and between), so a run's table shows what its reward pays for. The per-turn
reward is the recipe's score of the episode cut after that turn: what it would have earned had
it stopped there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from progress_sql import envs, rewards
from progress_sql.params import Settings

TAIL_CHARS = 400  # of the prompt before a turn: the question and the feedback, not the schema
TEXT_CHARS = 2000  # of an output or a feedback message


def _clip(text: str, limit: int, tail: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if tail else text[:limit] + "…"


def spread(values: Sequence[float], k: int) -> list[int]:
    """Indices of ``k`` of ``values`` evenly spread over their order, best first (ties by index)."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    if k >= len(order):
        return order
    if k == 1:
        return order[:1]
    return [order[round(j * (len(order) - 1) / (k - 1))] for j in range(k)]


def episode_view(ep: envs.Episode, scored: rewards.RewardOutput, recipe: rewards.Recipe, settings: Settings,
                 step: int) -> dict[str, Any]:
    """One episode, turn by turn (see the module docstring)."""
    turns, assistant = [], [i for i, m in enumerate(ep.messages) if m["role"] == "assistant"]
    trajectory = ep.trajectory()
    for k, (turn, at) in enumerate(zip(ep.turns, assistant), 1):
        before = next((m["content"] for m in reversed(ep.messages[:at]) if m["role"] != "assistant"), "")
        after = ep.messages[at + 1]["content"] if at + 1 < len(ep.messages) else ""
        # the last turn's is the episode's own (a recipe's LLM judge is not asked again)
        so_far = scored.total if k == ep.K else recipe(replace(trajectory, turns=trajectory.turns[:k]), settings).total
        error = turn.result.error if turn.result is not None and not turn.result.ok else None
        turns.append({
            "turn": k, "prompt_tail": _clip(before, TAIL_CHARS, tail=True), "output": _clip(turn.text, TEXT_CHARS),
            "sql": turn.sql, "executed": turn.result is not None and turn.result.ok, "error": error,
            "correct": turn.correct, "tags": list(ep.tags[k - 1]) if k <= len(ep.tags) else [],
            "feedback": _clip(after, TEXT_CHARS), "reward_so_far": so_far,
        })
    ex = ep.example
    return {"step": step, "episode": ep.id, "example_id": ex.id, "db_id": ex.db_id, "question": ex.question,
            "gold_sql": ex.gold_sql, "hardness": ex.hardness, "reward": scored.total,
            "components": dict(scored.components), "correct": ep.correct, "k_star": ep.k_star,
            "done_reason": ep.done_reason, "turns": turns}
