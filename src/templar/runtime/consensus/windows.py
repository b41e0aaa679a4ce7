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
from templar.core.config import HParams, WindowConfig

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


def retained_windows(hp: HParams) -> int:
    """How many windows back every candidate keeps its published history (inputs, aggregates,
    progress records): what its oldest kept checkpoint needs, and at least what a node resuming from
    its own state may replay (`max_allowed_stale`) and what tells the slots of a window (the windows
    back to the last multiple of `lead_cadence`). A "not found" of an older window proves nothing
    (it may have been deleted), so no reader takes one for absent (`templar.runtime.consensus.succession`)."""
    return max(hp.windows.retained_checkpoints * hp.windows.checkpoint_frequency, hp.windows.max_allowed_stale + 2,
               hp.windows.lead_cadence + 1)


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
    apply_deadline: float   # the last slot settled + apply span: followers hold the window's inputs by then
    settle: float = 0.0     # how long an upload takes to become visible to readers (`settle_seconds`)
    handover: float = 0.0   # length of one lead slot (`handover_seconds`)
    handover_settle: float = 0.0  # a slot's "not found" is definite this long after its widened deadline

    def slot_deadline(self, slot: int) -> float:
        """The last instant at which candidate `slot` of the succession may store this window's
        inputs (chain time; a storage timestamp gets the clock-skew allowance on top): slot 0 has
        until `gather_deadline + handover`, each next one `handover` after the slot before settled
        (`slot_settled`), so every candidate gets a whole `handover` to publish in."""
        return self.gather_deadline + self.handover + slot * (self.handover + self.skew + self.handover_settle)

    def slot_opens(self, slot: int) -> float:
        """From when candidate `slot`'s inputs may be stored: the window's gather start for the
        lead, the deadline of the slot before for every other one (so a lower candidate's inputs
        published while the slot before is open count for nothing)."""
        return self.gather_start if slot == 0 else self.slot_deadline(slot - 1)

    def slot_settled(self, slot: int) -> float:
        """When a "not found" of candidate `slot`'s inputs is definite: its deadline widened by the
        clock-skew allowance, plus the settle allowance for a write stamped at that instant to
        become visible. Candidate `slot + 1` publishes only after this."""
        return self.slot_deadline(slot) + self.skew + self.handover_settle

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
        time (it still applies the lead's step: `templar.runtime.consensus.follow`)."""
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

    async def ended(self, window: int, stop: asyncio.Event | None = None) -> WindowTimes | None:
        """`window`'s landmarks once it has ended, that is once the next window's first block is out (None
        if `stop` is set first). The end foreseen before then is extrapolated from the head; a block slot
        the chain misses moves the real one later, and validators judge an upload by the real one: one
        missed slot made every punctual miner's upload `early`. Waits at most a window past the foreseen
        end (a halted chain: then the foreseen landmarks, as before)."""
        foreseen = self.times(window).end
        if not await self.sleep_until(foreseen, stop):
            return None
        while self._block() < self.first_block(window + 1) and self.now() < foreseen + self.cfg.window_seconds:
            if not await self.sleep_until(self.now() + min(1.0, self.cfg.block_time / 4), stop):
                return None
        return self.times(window)

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
    earliest instant a gradient can count; each of the `lead_slots` candidates gets a slot after the
    gather deadline (`WindowTimes.slot_deadline`), and a node that could not establish the window's
    inputs keeps trying `apply_seconds` (at most `gather_seconds`) past the last slot's settling."""
    put_close = end + cfg.put_window_seconds
    gather_start = put_close + cfg.clock_skew_seconds + cfg.settle_seconds
    skew = cfg.clock_skew_seconds
    commit_close = end - skew - min(cfg.commit_read_seconds, cfg.put_window_seconds / 2)
    gather_deadline = gather_start + cfg.gather_seconds
    last_settled = gather_deadline + cfg.lead_slots * (cfg.handover_seconds + skew + cfg.handover_settle_seconds)
    apply_deadline = last_settled + apply_span(cfg)
    return WindowTimes(window, start, end, put_close, gather_start, gather_deadline, commit_close, skew,
                       apply_deadline, cfg.settle_seconds, cfg.handover_seconds, cfg.handover_settle_seconds)


def apply_span(cfg: WindowConfig) -> float:
    """How long past the last lead slot a node that could not establish a window's inputs keeps
    trying (and fetches the payloads they name that its own gather lacks) before it falls back to
    catch-up: the lead publishes its inputs the moment its gather ends."""
    return min(cfg.apply_seconds, cfg.gather_seconds)
