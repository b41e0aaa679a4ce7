"""What the score book remembers and how it is written: one record per hotkey, and the file's schema.

The records are state only (plain floats and ints, revalidated whenever the book is written); what
the book does with them under the run's rules is `templar.gauntlet.book`. The JSON form (schema
`SCHEMA_VERSION`) round-trips exactly (floats are written as their shortest repr). It is standard
JSON except that an infinite sync score is written as `Infinity`, which Python's `json` and pydantic
read back.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from templar.core.strict import HISTORY_LIMIT
from templar.gauntlet.rating import DEFAULT_RATING, loss_rating

SCHEMA_VERSION = 1
MAX_POOL = 256
"""The most hotkeys one pool record holds: a subnet has at most 256 uids (a bound of the schema)."""

Hotkey = Annotated[str, Field(min_length=1, max_length=64)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class ScoreBookError(ValueError):
    """A persisted ScoreBook is unreadable or fails its schema; the message names the file and field."""


class PrimaryResult(NamedTuple):
    """One peer's primary evaluation in a window (Algorithm 1): LossScore on D_t^p and D_t^rand."""

    delta_assigned: float
    delta_rand: float
    pages: tuple[float, ...] = ()
    """δ of each evaluated assigned page on its own (empty: judge the mean only); see `page_credit`."""
    sequences: tuple[float, ...] = ()
    """δ of each evaluated assigned sequence (empty: judge the pages); see `size_credit`."""
    work: float = 1.0
    """The work the payload declared, in units of the assigned work ((A + K) / A, `declared_work`)."""
    declared_units: int = 0
    """How many of `sequences` (the last ones) are units of declared pages (`extra_work.class_credits`)."""
    random_units: tuple[float, ...] = ()
    """δ of each unit of the random pages (`extra_work.dilution_multiple`: the evaluation's noise per unit)."""


class PeerRecord(BaseModel):
    """Everything the validator remembers about one hotkey.

    Mutable in memory (the book's methods update it in place); revalidated whenever the book is
    serialised, so a record corrupted in memory fails `to_json` instead of writing a file that
    `load` would refuse.
    """

    model_config = ConfigDict(
        extra="forbid", strict=True, ser_json_inf_nan="constants", revalidate_instances="always"
    )

    uid: int = Field(ge=0)
    mu: float = Field(default=0.0, ge=-1.0, le=1.0, allow_inf_nan=False,
                      description="proof-of-computation EMA μ_p (paper eq. 3); starts at 0")
    rating: tuple[Finite, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default=DEFAULT_RATING, description="OpenSkill (mu, sigma)")
    last_delta_assigned: float | None = Field(default=None, description="LossScore on D_t^p; may be -inf")
    last_delta_rand: float | None = Field(default=None, description="LossScore on D_t^rand; may be -inf")
    last_sync_steps: float | None = Field(default=None, ge=0.0, description="SyncScore in steps; may be +inf")
    primary_evals: int = Field(default=0, ge=0)
    last_primary_window: int | None = Field(default=None, ge=0,
                                            description="window of the last primary evaluation (None: never)")
    fast_eval_passes: int = Field(default=0, ge=0)
    fast_eval_fails: int = Field(default=0, ge=0)
    last_status: str = Field(default="new", min_length=1, max_length=64)
    first_seen_window: int = Field(ge=0)
    last_seen_window: int = Field(ge=0)
    score: float = Field(default=0.0, ge=0.0, allow_inf_nan=False, description="PeerScore (eq. 4)")
    weight: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False,
                          description="x_p (eq. 5) from the last weights() call")
    relative_delta: float = Field(default=1.0, ge=-1.0, le=4.0, allow_inf_nan=False,
                                  description="EMA of δ_rand / median δ_rand of S_t (relative LossRating)")
    relative_evals: int = Field(default=0, ge=0, description="evaluations in relative_delta")
    declared: float = Field(default=0.0, ge=0.0, le=4096.0, allow_inf_nan=False,
                            description="EMA over primary evaluations of the declared work beyond the assigned "
                            "(w − 1, gauntlet.extra_work); starts at 0")
    assigned_credit: float = Field(default=0.0, ge=-1.0, le=1.0, allow_inf_nan=False,
                                   description="EMA of the proof credit on assigned pages' units (extra_work)")
    assigned_credit_evals: int = Field(default=0, ge=0)
    declared_credit: float = Field(default=0.0, ge=-1.0, le=1.0, allow_inf_nan=False,
                                   description="EMA of the proof credit on declared pages' units (extra_work)")
    declared_credit_evals: int = Field(default=0, ge=0)
    pool: list[Hotkey] = Field(default_factory=list, max_length=MAX_POOL,
                               description="hotkeys whose uploads shared work with this one (itself included)")
    pool_window: int | None = Field(default=None, ge=0, description="window the pool was last seen sharing")
    warmup_window: int | None = Field(default=None, ge=0,
                                      description="window of the first warm-up upload seen of the peer's current "
                                      "warm-up (None: not warming up; ScoreBook.warmup_overdue)")
    warmups: list[int] = Field(default_factory=list, max_length=HISTORY_LIMIT,
                               description="windows of the newest warm-up uploads seen of the peer, ascending, at most "
                               "gauntlet.warmup_overdue_windows of them (ScoreBook.warmup_overdue)")

    @field_validator("last_delta_assigned", "last_delta_rand", "last_sync_steps")
    @classmethod
    def _not_nan(cls, value: float | None) -> float | None:
        if value is not None and math.isnan(value):
            raise ValueError("must not be NaN")
        return value

    @model_validator(mode="after")
    def _windows_ordered(self) -> PeerRecord:
        if self.first_seen_window > self.last_seen_window:
            raise ValueError("first_seen_window is after last_seen_window")
        return self

    @property
    def loss_rating(self) -> float:
        """LossRating_p (the rating's mu; see `rating.loss_rating` for why)."""
        return loss_rating(self.rating)


class BookFile(BaseModel):
    """The score book's file (`ScoreBook.to_json`): its records, the rating's noise and the proof gaps' history."""

    model_config = ConfigDict(extra="forbid", strict=True, ser_json_inf_nan="constants")

    version: Literal[1] = SCHEMA_VERSION
    peers: dict[Hotkey, PeerRecord]
    relative_noise: float = Field(default=0.0, ge=0.0, le=8.0, allow_inf_nan=False,
                                  description="EMA of the windows' relative_spread (relative LossRating)")
    relative_noise_windows: int = Field(default=0, ge=0, description="windows in relative_noise")
    proof_gaps: list[tuple[Annotated[int, Field(ge=0)] | None, Finite]] = Field(
        default_factory=list, max_length=HISTORY_LIMIT,
        description="(window, own median proof gap) of the last windows, oldest first (typical_gap's history)")

    @model_validator(mode="after")
    def _uids_unique(self) -> BookFile:
        seen: dict[int, str] = {}
        for hotkey, record in self.peers.items():
            if record.uid in seen:
                raise ValueError(f"uid {record.uid} held by both {seen[record.uid]} and {hotkey}")
            seen[record.uid] = hotkey
        return self
