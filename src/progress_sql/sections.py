"""The base of every settings section: unknown keys are errors, and so is a bad assignment.

Each package owns the section of its own settings (``sql.settings``, ``odt.settings``, a
recipe's weights beside its code, ``envs.settings``, ``inference.settings``);
``progress_sql.params`` composes them into the settings of params.yaml.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator


class Conflict(ValueError):
    """A rule between settings broken: ``keys`` are the dotted keys whose values break it, so the
    error can say where each value came from (params.yaml, a preset, ``--set``)."""

    def __init__(self, message: str, *keys: str) -> None:
        super().__init__(message)
        self.keys = keys


def _number_type(annotation: Any) -> bool:
    """Whether a field of this annotation holds an int or a float (alone or in a union)."""
    if annotation in (int, float):
        return True
    return any(arg in (int, float) for arg in typing.get_args(annotation))


class Section(BaseModel):
    # Every section forbids unknown keys and re-validates on assignment, so a typo or a bad
    # override never passes silently; numbers are finite (an infinite learning rate or weight
    # only fails steps later, as NaN).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)
    # Keys the section no longer has, as full dotted names (old -> new): an old key in a user's
    # file is an error naming its new place, not just an unknown key.
    moved_keys: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _no_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = [f"{old} is now {new}" for old, new in cls.moved_keys.items() if old.rsplit(".", 1)[-1] in data]
            if moved:
                raise ValueError("; ".join(moved))
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1 for an int; `rl.steps: true` is a mistake, not one step
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _number_type(field.annotation):
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value
