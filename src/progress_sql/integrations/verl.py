"""verl (PyPI ``verl``, 0.7.1: the last release with ``verl.interactions``): reward hook,
multi-turn interaction and data preparation.

- ``compute_score(data_source, solution_str, ground_truth, extra_info)``: the custom reward
  function (``reward.custom_reward_function.path=pkg://progress_sql.integrations.verl``,
  ``name=compute_score``). The database path comes from ``extra_info["db_path"]``, the recipe
  from the ``recipe`` keyword (``custom_reward_function.reward_kwargs``), else
  ``extra_info["recipe"]``, else ``progress``. It returns a dict: ``score`` and the recipe's
  components, ``correct``, ``turns`` and ``reason`` ('' or why the floor was given), the same
  keys for every call, as verl's reward managers require to batch ``reward_extra_info``.
- ``verl_interaction.ProtocolInteraction``: a protocol's episode as a verl interaction (a
  ``BaseInteraction``), one entry of the interaction config per protocol, its ``config`` naming
  the protocol: ``odt`` (Algorithm 1, named ``progress_sql_odt``) or any other of
  ``sessions.PROTOCOLS`` (``sql_tool``, the SQL tool loop: ``progress_sql_sql_tool``). Each call
  of ``generate_response`` judges the last assistant message as the next turn and answers with
  the environment's feedback; it ends the rollout at the first correct turn or after T turns.
  Its turn score is the recipe's reward of the episode so far, so the last one is the episode's
  reward; ``compute_score`` returns it for rows whose ``extra_info["turn_scores"]`` verl filled.
  verl 0.7.1 drops an interaction's metadata, so for those rows the components and ``correct``
  are NaN (the interaction's ``generate_response`` metadata has them).
- ``export_parquet``: a corpus as verl's RL parquet files (``progress-sql data export-verl``).

verl's agent loop must not cut the episode short: leave ``multi_turn.max_assistant_turns``
unset or above T (verl stops before asking the interaction otherwise), and give
``response_length`` room for T turns and their feedback.

verl is imported only by ``verl_interaction`` (which verl imports itself, from the interaction
config; SkyRL-gym's ``skyrl_text_env`` is the same), pandas only by ``export_parquet``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from progress_sql.integrations.scoring import (
    Scored,
    check_task,
    floor,
    resolve_recipe,
    score_completion,
    task_settings,
)
from progress_sql.integrations.sessions import PROTOCOLS
from progress_sql.integrations.tasks import task_rows
from progress_sql.rewards.types import Recipe

DATA_SOURCE = "progress_sql"


def interaction_name(protocol: str) -> str:
    """The name the interaction config gives ``protocol``'s interaction."""
    return f"progress_sql_{protocol}"


INTERACTION_NAME = interaction_name("odt")


def _info(extra_info: Any) -> dict[str, Any]:
    return extra_info if isinstance(extra_info, dict) else {}


def _recipe_of(recipe: str | Recipe | None, info: dict[str, Any]) -> Recipe:
    return resolve_recipe(recipe or info.get("recipe") or "progress")


def result_dict(scored: Scored, recipe: Recipe) -> dict[str, Any]:
    """What ``compute_score`` returns for one response: ``score`` first (verl reads it), then
    the components, ``correct``, ``turns`` and ``reason``."""
    return {"score": scored.total, **{name: scored.components.get(name, math.nan) for name in recipe.components},
            "correct": float(scored.correct), "turns": scored.turns, "reason": scored.reason}


def _interaction_result(info: dict[str, Any], recipe: Recipe, settings: Any, ground_truth: Any) -> dict[str, Any] | None:
    """The episode's result when the ODT interaction scored it (its last turn score), else None."""
    turn_scores = info.get("turn_scores")
    if turn_scores is None or len(turn_scores) == 0:
        return None
    problem = check_task(info.get("db_path"), ground_truth, settings, info.get("semantics") or "spider")
    if problem:
        return result_dict(floor(recipe, settings, problem, len(turn_scores)), recipe)
    score = float(turn_scores[-1])
    out = {"score": score, **{name: math.nan for name in recipe.components}}
    return {**out, "correct": math.nan, "turns": len(turn_scores), "reason": ""}


def compute_score(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, *,
                  recipe: str | Recipe | None = None, settings: Any = None, **_: Any) -> dict[str, Any]:
    """verl's custom reward function (module notes); ``recipe`` and ``settings`` (the task
    sections as a mapping) may come from ``custom_reward_function.reward_kwargs``, other
    keywords verl adds are ignored. Never raises for any row (an unknown recipe name, a
    configuration error, raises KeyError; a sandbox that cannot start, SandboxUnavailable)."""
    info = _info(extra_info)
    settings = task_settings(settings)
    try:
        recipe = _recipe_of(recipe, info)
    except KeyError as err:
        if recipe is not None:  # the configuration's recipe: a setup error, not a row's
            raise
        progress = resolve_recipe("progress")
        return result_dict(floor(progress, settings, f"error: extra_info: {err.args[0]}"), progress)
    try:
        episode = _interaction_result(info, recipe, settings, ground_truth)
    except Exception as err:  # verl's loop gets a number whatever the row holds
        episode = result_dict(floor(recipe, settings, f"error: {type(err).__name__}: {err}"), recipe)
    if episode is not None:
        return episode
    scored = score_completion(solution_str, info.get("db_path"), ground_truth, recipe, settings,
                              question=info.get("question", ""), difficulty=info.get("difficulty", ""),
                              db_id=info.get("db_id", ""), semantics=info.get("semantics", "spider"))
    return result_dict(scored, recipe)


# ----------------------------------------------------------------------------- data
def verl_rows(corpus_dir: str | Path, split: str, recipe: str | Recipe | None = None, settings: Any = None, *,
              protocol: str = "odt", limit: int | None = None) -> list[dict[str, Any]]:
    """verl's RL rows of a corpus split: ``data_source``, ``prompt`` (the round-1 chat for
    ``recipe``'s format; default the ``protocol``'s recipe), ``ability``, ``reward_model``
    (rule, gold) and ``extra_info`` (``db_path``, the example's columns, ``recipe``, ``index``
    and the ``interaction_kwargs`` of the protocol's interaction). One file serves single-turn
    and multi-turn runs: the round-1 prompt is the same."""
    env = PROTOCOLS[protocol]
    recipe = resolve_recipe(recipe or env.adapter.recipe)
    prompt_env = env.name if recipe.fmt in env.formats else "single_turn"  # a single-turn recipe's format
    rows = []
    for index, row in enumerate(task_rows(corpus_dir, split, recipe, settings, env=prompt_env, limit=limit)):
        columns = {k: row[k] for k in ("db_path", "db_id", "question", "difficulty", "evidence", "example_id", "semantics")}
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": row["prompt"],
            "ability": "text2sql",
            "reward_model": {"style": "rule", "ground_truth": row["gold_sql"]},
            "extra_info": {**columns, "split": split, "index": index, "recipe": recipe.name,
                           "interaction_kwargs": {"name": interaction_name(protocol), "gold_sql": row["gold_sql"],
                                                  **columns}},
        })
    return rows


def export_parquet(corpus_dir: str | Path, out_dir: str | Path, splits: Sequence[str] = ("train", "dev"),
                   recipe: str | Recipe | None = None, settings: Any = None, *,
                   protocol: str = "odt", limit: int | None = None) -> dict[str, Path]:
    """Write ``<split>.parquet`` of ``verl_rows`` for each split into ``out_dir``; return the
    paths. verl reads them with ``data.train_files`` / ``data.val_files``."""
    import pandas as pd  # noqa: PLC0415 - the data extra, only when exporting

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for split in splits:
        path = out / f"{split}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        pd.DataFrame(verl_rows(corpus_dir, split, recipe, settings, protocol=protocol, limit=limit)).to_parquet(tmp, index=False)
        tmp.replace(path)  # atomic: a crash never leaves a half-written file
        written[split] = path
    return written
