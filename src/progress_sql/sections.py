"""The base of every settings section: unknown keys are errors, and so is a bad assignment.

Each package owns the section of its own settings (``sql.settings``, ``odt.settings``, a
recipe's weights beside its code, ``envs.settings``, ``inference.settings``);
``progress_sql.config`` composes them into the settings of params.yaml.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # Every section forbids unknown keys and re-validates on assignment, so a typo or a bad
    # override never passes silently.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
