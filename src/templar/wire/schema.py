"""Strict types of the `templar` metadata document (hivemind-style: no coercion, no extras)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AggregateDocument", "GradientDocument"]

_HOTKEY_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
_MAX_COUNTER = 2**53  # exactly representable in every JSON implementation


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    protocol: int
    window: int = Field(ge=0, le=_MAX_COUNTER)
    global_step: int = Field(ge=0, le=_MAX_COUNTER)
    hotkey: str = Field(pattern=_HOTKEY_PATTERN)


class GradientDocument(_Document):
    """A miner's pseudo-gradient for `window`."""

    kind: Literal["gradient"]
    warmup: bool
    target_chunk: int = Field(gt=0, le=4096)
    topk: int = Field(gt=0, le=2**24)
    codec: str = Field(max_length=32)


class AggregateDocument(_Document):
    """The lead validator's signed update applied at `window`."""

    kind: Literal["aggregate"]
    learning_rate: float = Field(gt=0, allow_inf_nan=False)
