"""The ODT's settings (params.yaml ``odt``): the α mix, feature weights, tag thresholds."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator

from progress_sql.sections import Section


class ODTFeatureWeights(Section):
    select: float = Field(0.20, ge=0.0)
    tables: float = Field(0.15, ge=0.0)
    joins: float = Field(0.15, ge=0.0)
    where: float = Field(0.15, ge=0.0)
    group_by: float = Field(0.10, ge=0.0)
    having: float = Field(0.05, ge=0.0)
    order_by: float = Field(0.05, ge=0.0)
    booleans: float = Field(0.10, ge=0.0)
    counts: float = Field(0.05, ge=0.0)

    @model_validator(mode="after")
    def _positive_total(self) -> "ODTFeatureWeights":
        if sum(self.model_dump().values()) <= 0:
            raise ValueError("odt.weights: the weights must not all be zero")
        return self


class ODTThresholds(Section):
    """A tag is emitted when its feature similarity falls below its threshold."""

    select: float = Field(1.0, ge=0.0, le=1.0)
    select_count: float = Field(1.0, ge=0.0, le=1.0)
    tables: float = Field(1.0, ge=0.0, le=1.0)
    join_count: float = Field(1.0, ge=0.0, le=1.0)
    joins: float = Field(1.0, ge=0.0, le=1.0)
    where: float = Field(1.0, ge=0.0, le=1.0)
    group_by: float = Field(1.0, ge=0.0, le=1.0)
    having: float = Field(1.0, ge=0.0, le=1.0)
    order_by: float = Field(1.0, ge=0.0, le=1.0)
    limit: float = Field(1.0, ge=0.0, le=1.0)
    distinct: float = Field(1.0, ge=0.0, le=1.0)
    aggregation: float = Field(1.0, ge=0.0, le=1.0)


class ODTSettings(Section):
    alpha: float = Field(0.70, ge=0.0, le=1.0)
    # A SELECT node with no nested query on either side. local: it scores s_local alone (no
    # child term to mix in); one: s_child = 1, the convention that puts a 1 − α floor under
    # any flat pair (docs/design.md, "ODT structural score").
    leaf_score: Literal["local", "one"] = "local"
    weights: ODTFeatureWeights = ODTFeatureWeights()
    thresholds: ODTThresholds = ODTThresholds()
    profile_cache_size: int = Field(8192, ge=0)


@lru_cache(maxsize=1)
def default_odt() -> ODTSettings:
    """The built-in ODT defaults (those of the shipped params.yaml)."""
    return ODTSettings()
