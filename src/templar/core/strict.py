"""The base of every settings model of the run, and the bound its histories share."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

HISTORY_LIMIT = 256
"""The most windows any per-window history a rule reads may span (the score book's persisted
schema bounds what it keeps by this, whatever a run sets)."""


class Strict(BaseModel):
    """Frozen, strict and closed: a typo'd key fails at start with its name, a value of the wrong type
    is never coerced, and a loaded setting cannot change under a running node."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
