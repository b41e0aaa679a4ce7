"""The time model (docs/design.md §2): blocks → windows → put windows and deadlines.

`window = block // blocks_per_window`. An upload for window `w` counts only if its timestamp lies
in the put window `[t(first block of w+1), + put_window_seconds]`, widened by `clock_skew_seconds`
at both ends. Every node starts gathering window `w` only once the last acceptable timestamp has
passed (plus `settle_seconds` for the object to become visible), so all honest readers see the
same set of uploads and aggregate the same update. A gather never runs past `gather_seconds`.
A miner commits to its gradient's digest by `commit_close`, before any gradient of the window can
be readable, and validators read the commitments in `commit_read` (`templar.comms.commit`).
Every span here is a field of the run's `WindowConfig` (`HParams.windows`), so it is part of the
run's digest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from templar.core.clock import SYSTEM_TIME, TimeSource, sleep_until
from templar.core.config import WindowConfig

STOP_SAVE_SECONDS = 120.0
"""Allowed, in a stop timeout, for the outer step and the state file's write after a window's last
landmark (the production model's state is tens of GB, written to a local disk and fsynced)."""
STOP_CHECKPOINT_SECONDS = 300.0
"""Allowed on top for a validator: a stopping lead first finishes the checkpoint upload under way
(the production model's checkpoint is several GB, on the uplink of one machine)."""


def stop_timeout_seconds(cfg: WindowConfig, role: str) -> int:
    """How long a neuron may take, from SIGTERM to exit 0, on these windows: what is left of its
    window (at most a whole one), the put window, the clock skew, the settle time, the gather and
    the wait for the lead's inputs, then the outer step and the state save (and a validator's
    checkpoint upload); rounded up to whole minutes. systemd's `TimeoutStopSec` must be at least
    this (`deploy/systemd/`), or a stop kills a window half-saved."""
    last = window_times(cfg, 0, 0.0, cfg.window_seconds).apply_deadline  # from the window's first block
    seconds = last + STOP_SAVE_SECONDS + (STOP_CHECKPOINT_SECONDS if role == "validator" else 0.0)
    return int(-(-seconds // 60) * 60)


@dataclass(frozen=True)
class WindowTimes:
    """Wall-clock landmarks (unix seconds) of one window `w`."""

    window: int
    start: float            # first block of w
    end: float              # first block of w+1: the put window opens (training stopped by commit_close)
    put_close: float        # end + put_window_seconds: later uploads are 'late'
    gather_start: float     # put_close + clock skew + settle: every reader sees the same uploads
    gather_deadline: float  # gather_start + gather_seconds: nobody waits past this
    commit_close: float     # end − clock skew − read span: a miner's commitment is written by then
    skew: float             # the clock-skew allowance these landmarks were computed with
    apply_deadline: float   # gather_deadline + apply span: followers hold the lead's inputs by then
    settle: float           # how long an upload takes to become visible to readers (`settle_seconds`)

    @property
    def put_window(self) -> tuple[float, float]:
        return (self.end, self.put_close)

    @property
    def commit_read(self) -> tuple[float, float]:
        """When validators read the commitments: from `commit_close` (+ settle) to the earliest
        instant a gradient of the window can be stamped and still count (end − clock skew), so
        every commitment read was written before any gradient it could borrow from was readable."""
        return (self.commit_close + self.settle, self.end - self.skew)


class Clock:
    """A node's clock: window arithmetic over the chain's block clock, and "now" from one
    injectable `TimeSource` (the wall clock in production, virtual time in tests).

    `block_timestamp(block)` must be defined for future blocks too (the chain layer extrapolates
    with the block time), so deadlines of the current window are known in advance. Everything
    in a node that asks the time or waits for a landmark goes through here.
    """

    def __init__(self, cfg: WindowConfig, block: Callable[[], int], block_timestamp: Callable[[int], float],
                 time: TimeSource = SYSTEM_TIME):
        self.cfg = cfg
        self._block = block
        self._block_timestamp = block_timestamp
        self.time = time
        self._skew_reported = False

    def now(self) -> float:
        """Unix seconds by this node's time source."""
        return self.time.now()

    def skew(self) -> float:
        """How far this node's clock is from the chain's block timestamps, in seconds (negative:
        behind). The head block was stamped at most one block time ago, so a clock within
        [its timestamp, + block_time] counts as 0; outside it, the distance to that interval."""
        stamped = self._block_timestamp(self._block())
        ahead = self.now() - stamped
        return ahead if ahead < 0 else max(0.0, ahead - self.cfg.block_time)

    def check_skew(self) -> float:
        """`skew`, logged once (a WARNING) when it first exceeds `clock_skew_seconds`, and once
        more when it is back within it: uploads are judged by the storage server's clock and every
        deadline by the chain's, so a node whose clock is off uploads late and gathers at the wrong
        time (it still applies the lead's step: `templar.runtime.follow`)."""
        off = self.skew()
        if abs(off) > self.cfg.clock_skew_seconds:
            if not self._skew_reported:
                logger.bind(phase="clock").warning(
                    f"[CLOCK] this machine's clock is {abs(off):.1f}s {'behind' if off < 0 else 'ahead of'} the "
                    f"chain's block timestamps (more than clock_skew_seconds {self.cfg.clock_skew_seconds:g}): "
                    "its uploads will be judged late or early; synchronise it (NTP, chrony)")
                self._skew_reported = True
        elif self._skew_reported:
            logger.bind(phase="clock").info(f"[CLOCK] clock back within {self.cfg.clock_skew_seconds:g}s of the chain's")
            self._skew_reported = False
        return off

    async def sleep_until(self, ts: float, stop: asyncio.Event | None = None) -> bool:
        """Wait until unix time `ts`; False if `stop` is set first."""
        return await sleep_until(self.time.now, ts, stop)

    def window_of(self, block: int) -> int:
        return block // self.cfg.blocks_per_window

    def first_block(self, window: int) -> int:
        return window * self.cfg.blocks_per_window

    def current_window(self) -> int:
        return self.window_of(self._block())

    def times(self, window: int) -> WindowTimes:
        return window_times(self.cfg, window, self._block_timestamp(self.first_block(window)),
                            self._block_timestamp(self.first_block(window + 1)))


def window_times(cfg: WindowConfig, window: int, start: float, end: float) -> WindowTimes:
    """The one rule for a window's landmarks, given the timestamps of its first block (`start`) and
    of the next window's (`end`). The commitment is due `commit_read_seconds` (at most half the put
    window, so runs with short windows, tests and `tiny`, leave miners time to train) before the
    earliest instant a gradient can count; the lead's inputs are waited for `apply_seconds` (at
    most `gather_seconds`) past the gather deadline: it publishes them the moment its gather ends."""
    put_close = end + cfg.put_window_seconds
    gather_start = put_close + cfg.clock_skew_seconds + cfg.settle_seconds
    skew = cfg.clock_skew_seconds
    commit_close = end - skew - min(cfg.commit_read_seconds, cfg.put_window_seconds / 2)
    gather_deadline = gather_start + cfg.gather_seconds
    apply_deadline = gather_deadline + apply_span(cfg)
    return WindowTimes(window, start, end, put_close, gather_start, gather_deadline, commit_close, skew,
                       apply_deadline, cfg.settle_seconds)


def apply_span(cfg: WindowConfig) -> float:
    """How long past a gather deadline a node waits for the lead's inputs (and fetches the payloads
    its own gather lacks) before it falls back to the lead's aggregate."""
    return min(cfg.apply_seconds, cfg.gather_seconds)
