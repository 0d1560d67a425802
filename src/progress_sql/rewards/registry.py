"""The registry of reward recipes: the one list of their names, and ``RewardSettings``, the
``rewards`` section of params.yaml, composed of each recipe's own weights.

Adding a recipe: a module beside the others defining its weights (a ``Section``), ``score``,
``bounds`` and ``RECIPE``, then one entry in ``RECIPES`` below.
"""

from __future__ import annotations


from pydantic import create_model

from progress_sql.rewards import oneshot, progress, reasoning_sql, skyrl, sql_trail
from progress_sql.rewards.types import Recipe
from progress_sql.sections import Section

RECIPES: tuple[Recipe, ...] = (progress.RECIPE, oneshot.RECIPE, reasoning_sql.RECIPE, sql_trail.RECIPE, skyrl.RECIPE)
_BY_NAME = {recipe.name: recipe for recipe in RECIPES}

# params.yaml ``rewards``: one subsection per recipe, named as the recipe.
RewardSettings = create_model(
    "RewardSettings", __base__=Section, **{r.name: (r.weights, r.weights()) for r in RECIPES}
)


def names() -> tuple[str, ...]:
    """The names of every registered recipe."""
    return tuple(_BY_NAME)


def get(name: str) -> Recipe:
    """The recipe called ``name``; KeyError naming the known recipes otherwise."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise KeyError(f"unknown reward recipe {name!r}; known: {', '.join(_BY_NAME)}") from None
