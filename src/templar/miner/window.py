"""One miner window's record and its compute half: what the phases of `templar.miner.loop.Miner`
hand to each other (`MinerWindow`, which also builds the window's record) and the compute half
that may run while the previous window's exchange is in flight (`Training`)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from templar.runtime.consensus.windows import WindowTimes
from templar.runtime.records import MinerWindowRecord, newest_record
from templar.runtime.restore import Phase
from templar.runtime.train import TrainStats


@dataclass
class MinerWindow:
    """What one window's phases hand to the next, and the one place its record is built from."""

    window: int
    times: WindowTimes
    pages: list[int] = field(default_factory=list)
    stats: TrainStats | None = None
    """The inner steps' figures; None for a window this node did not train (its step alone)."""
    base_step: int | None = None
    """The global_step of the θ the update was computed from (its base): what the payload declares."""
    probes: dict[str, torch.Tensor] | None = None
    """The base's values at the window's probe positions (taken while θ holds the base)."""
    warmup: bool = False
    """One of the first `warmup_windows` windows trained after joining: its payload weighs 0."""
    in_sync: bool = True
    payload: bytes = b""
    uploaded: bool = False
    upload_bytes: int = 0
    upload_seconds: float = 0.0
    peers_aggregated: int = 0
    stepped: bool = False
    """Whether the window's outer step was taken (else the node stopped before it)."""
    busy_seconds: float = 0.0
    """Time spent on the window outside the waits for its landmarks (training included)."""
    pace_seconds: float = 0.0
    """Its inner steps begun to done on the node's clock, page reads included (`Miner.can_finish`'s pace)."""

    @contextmanager
    def busy(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.busy_seconds += time.perf_counter() - started

    @property
    def wall_seconds(self) -> float:
        """The window's wall-clock length (its first block to the next window's)."""
        return self.times.end - self.times.start

    @property
    def utilisation(self) -> float:
        """Compute utilisation: the window's training seconds (forward, backward, inner optimizer)
        over its wall-clock seconds. An overlapped miner trains window w+1 while w's exchange runs,
        so its training of a window may reach the whole window; a blocking one's stops for the
        exchange (docs/mining.md, "Sizing")."""
        return self.stats.seconds / self.wall_seconds if self.stats is not None and self.wall_seconds > 0 else 0.0

    @property
    def overhead_share(self) -> float:
        """Share of the window spent busy outside forward/backward (0 for a window not stepped)."""
        if not self.stepped or self.stats is None:
            return 0.0
        return max(0.0, self.busy_seconds - self.stats.seconds) / self.wall_seconds

    def record(self, phase: Phase, strategy: str, global_step: int) -> MinerWindowRecord:
        """The window's record. One stopped before its step records its loss and upload but no
        peers aggregated, no overhead and no `tokens`: those count the windows this node completed
        (the localnet report's trained tokens). One not trained (its step alone) records no loss."""
        stats = self.stats
        return MinerWindowRecord(
            window=self.window, phase=str(phase), strategy=strategy, global_step=global_step,
            loss=stats.loss if stats is not None else None,
            tokens_per_second=stats.tokens_per_second if stats is not None else 0.0, pages=len(self.pages),
            uploaded=self.uploaded, upload_bytes=self.upload_bytes, upload_seconds=self.upload_seconds,
            peers_aggregated=self.peers_aggregated if self.stepped else 0, overhead_share=self.overhead_share,
            tokens=stats.tokens if self.stepped and stats is not None else 0,
            train_seconds=stats.seconds if stats is not None else 0.0, utilisation=self.utilisation,
            pace_seconds=self.pace_seconds)


def recorded_pace(records: Path) -> float | None:
    """The pace of the newest window this miner recorded training (`MinerWindowRecord.pace_seconds`), for
    the first window after a restart: unknown, it began that window whatever the time left, trained
    past its commitment, and began the next late too (two windows unpaid for one restart, where a known
    pace leaves the late one untrained and begins the next at once). None when none is recorded."""
    def trained(record: dict) -> bool:
        pace = record.get("pace_seconds")
        return isinstance(pace, int | float) and not isinstance(pace, bool) and 0 < pace < math.inf

    record = newest_record(records, trained)
    return None if record is None else float(record["pace_seconds"])


@dataclass
class Training:
    """The compute half of one window (inner steps, then the payload encoded and committed), as a
    task that may run while the previous window's exchange is in flight."""

    work: MinerWindow
    base_window: int
    """The window whose outer step θ held when the inner steps began."""
    lands: bool
    """Eager: it began on a proxy of the previous window's step and forms its pseudo-gradient only
    once that step has landed (`Miner.advanced`)."""
    landed: asyncio.Event = field(default_factory=asyncio.Event)
    given_up: bool = False
    """Eager: the step it waited for did not land in time; its inner steps are ended, unsent."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the window's update is compressed: the GPU is free for the next window's inner steps
    while the payload is encoded, signed and committed."""
    task: asyncio.Task[bool] | None = None
    """True once the payload is encoded and committed; False when the window's work was dropped."""

    @property
    def window(self) -> int:
        return self.work.window
