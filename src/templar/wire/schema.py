"""Strict types of the `templar` metadata document (hivemind-style: no coercion, no extras)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

__all__ = ["MAX_INPUTS", "AggregateDocument", "BundleDocument", "GradientDocument", "InputsDocument", "Run"]

_HOTKEY_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
_MAX_COUNTER = 2**53  # exactly representable in every JSON implementation
MAX_INPUTS = 256
"""Most payloads one outer step can aggregate (top_g is far below; a bound on what a reader accepts)."""


@dataclass(frozen=True)
class Run:
    """The run a signed object belongs to: the subnet, and the digest of the run's hparams
    (`HParams.digest()`: model, data seeds, compression, schedule). Every signed payload names
    both, so a payload of another subnet or another run with the same shapes and codec is refused
    (`wrong_run`) instead of being replayed into this one."""

    netuid: int
    digest: str

    def check(self, netuid: int, digest: str) -> str | None:
        """None when a document's (netuid, run) is this run's; else what differs."""
        if netuid != self.netuid:
            return f"netuid {netuid} != {self.netuid}"
        if digest != self.digest:
            return f"run {digest[:12]} != {self.digest[:12]}"
        return None


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    protocol: int
    netuid: int = Field(ge=0, le=2**16 - 1)
    run: str = Field(pattern=r"^[0-9a-f]{64}$")
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
    extra_pages: int = Field(default=0, ge=0, le=4096)
    """Pages trained beyond the assigned ones, declared (`templar.data.PagePlan.declared_pages`): at most
    the run's `data.max_extra_pages` (`read_gradient` refuses more)."""


class AggregateDocument(_Document):
    """The lead validator's signed update applied at `window`."""

    kind: Literal["aggregate"]
    learning_rate: float = Field(gt=0, allow_inf_nan=False)


class InputsDocument(_Document):
    """The lead's record of the payloads it aggregated at `window` (`templar.wire.inputs`)."""

    kind: Literal["inputs"]
    peers: list[Annotated[str, StringConstraints(pattern=_HOTKEY_PATTERN)]] = Field(max_length=MAX_INPUTS)
    clip_norm: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The lead's ceiling on the size every payload is clipped to (SparseLoCo; None: the peers' lower
    median alone, `templar.compress.sparseloco.clip_level`): it can only lower that median."""

    @field_validator("peers")
    @classmethod
    def _unique(cls, peers: list[str]) -> list[str]:
        if len(set(peers)) != len(peers):
            raise ValueError("duplicate hotkeys")
        return peers


class BundleDocument(_Document):
    """The lead's SparseLoCo update of `window`: the payloads it aggregated (`templar.wire.bundle`)."""

    kind: Literal["bundle"]
    learning_rate: float = Field(gt=0, allow_inf_nan=False)
    codec: str = Field(max_length=32)
    peers: list[Annotated[str, StringConstraints(pattern=_HOTKEY_PATTERN)]] = Field(max_length=MAX_INPUTS)
    clip_norm: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The lead's ceiling on the size every payload is clipped to (SparseLoCo; None: the peers' lower
    median alone, `templar.compress.sparseloco.clip_level`): it can only lower that median."""

    @field_validator("peers")
    @classmethod
    def _unique(cls, peers: list[str]) -> list[str]:
        if len(set(peers)) != len(peers):
            raise ValueError("duplicate hotkeys")
        return peers
