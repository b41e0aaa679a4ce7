"""The time model (DESIGN §2): blocks → windows → put windows and deadlines.

`window = block // blocks_per_window`. An upload for window `w` counts only if its timestamp lies
in the put window `[t(first block of w+1), + put_window_seconds]`. Gathers of window `w` start
when that put window closes and never run past `gather_seconds` after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from templar.config import WindowConfig


@dataclass(frozen=True)
class WindowTimes:
    """Wall-clock landmarks (unix seconds) of one window `w`."""

    window: int
    start: float          # first block of w
    end: float            # first block of w+1: training of w stops, put window opens
    put_close: float      # end + put_window_seconds: later uploads are 'late'
    gather_deadline: float  # put_close + gather_seconds: nobody waits past this

    @property
    def put_window(self) -> tuple[float, float]:
        return (self.end, self.put_close)


class Clock:
    """Window arithmetic over a chain's block clock.

    `block_timestamp(block)` must be defined for future blocks too (the chain layer extrapolates
    with the block time), so deadlines of the current window are known in advance.
    """

    def __init__(self, cfg: WindowConfig, block: Callable[[], int], block_timestamp: Callable[[int], float]):
        self.cfg = cfg
        self._block = block
        self._block_timestamp = block_timestamp

    def window_of(self, block: int) -> int:
        return block // self.cfg.blocks_per_window

    def first_block(self, window: int) -> int:
        return window * self.cfg.blocks_per_window

    def current_window(self) -> int:
        return self.window_of(self._block())

    def times(self, window: int) -> WindowTimes:
        start = self._block_timestamp(self.first_block(window))
        end = self._block_timestamp(self.first_block(window + 1))
        put_close = end + self.cfg.put_window_seconds
        return WindowTimes(window, start, end, put_close, put_close + self.cfg.gather_seconds)

    @staticmethod
    def sleep_until(ts: float, stop: Callable[[], bool] | None = None, tick: float = 0.2) -> bool:
        """Sleep until unix time `ts`; return False early if `stop()` becomes true."""
        while (left := ts - time.time()) > 0:
            if stop is not None and stop():
                return False
            time.sleep(min(tick, left))
        return True
