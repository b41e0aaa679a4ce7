"""Where a node's time comes from: one injectable source of "now", and an event loop for waits.

Every deadline in the subnet is a unix time derived from the chain's blocks (`templar.runtime.consensus.windows`).
Nodes read "now" only through a `TimeSource` and wait only through asyncio (`asyncio.sleep`,
`asyncio.timeout`, `TimeSource.sleep_until`), so replacing both replaces time:

- `SYSTEM_TIME`: the wall clock and an ordinary event loop. What the neurons run.
- `VirtualTimeLoop` + `LoopTime`: tests run miners, validators and the embedded chain in one
  process on virtual time. The loop's clock stands still while anything runs (a coroutine, or
  work handed to a thread with `asyncio.to_thread`) and jumps to the next timer the moment
  everything is waiting, so a 12-window scenario takes the seconds its computation takes rather
  than the minutes its windows last. Waits that are not asyncio timers (a socket to a real S3
  server, a subprocess) are invisible to it: run those tests on `SYSTEM_TIME`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

Now = Callable[[], float]
"""A function returning unix seconds."""


class TimeSource(Protocol):
    """What a node asks of time."""

    def now(self) -> float:
        """Unix seconds."""
        ...


class SystemTime:
    """The wall clock."""

    def now(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "SystemTime()"


SYSTEM_TIME = SystemTime()


class LoopTime:
    """"Now" read from a `VirtualTimeLoop`, whose `time()` is virtual unix seconds.

    Safe to call from worker threads (the embedded chain's block clock runs there)."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop

    def now(self) -> float:
        return self._loop.time()

    def __repr__(self) -> str:
        return f"LoopTime(now={self.now():.3f})"


async def sleep_until(now: Now, ts: float, stop: asyncio.Event | None = None) -> bool:
    """Wait (without blocking the event loop) until unix time `ts` by the clock `now`; False if
    `stop` is set first."""
    left = ts - now()
    if stop is None:
        if left > 0:
            await asyncio.sleep(left)
        return True
    if left <= 0:
        return not stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), timeout=left)
    except TimeoutError:
        return True
    return False


class _JumpingSelector(selectors.BaseSelector):
    """A real selector that, when the loop would block on a timer with nothing running, returns
    at once after moving the loop's virtual clock to that timer."""

    def __init__(self, loop_ref: Callable[[], VirtualTimeLoop]) -> None:
        self._real = selectors.DefaultSelector()
        self._loop_ref = loop_ref

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None):
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        loop = self._loop_ref()
        if timeout is None or loop.busy:
            # Nothing scheduled, or a worker thread is computing: wait for real (a finishing
            # thread wakes the loop through its self-pipe); virtual time stands still meanwhile.
            return self._real.select(timeout)
        loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual unix time starting at `start` (see the module docstring).

    Work submitted with `run_in_executor` (hence `asyncio.to_thread`) counts as busy until its
    result is back on the loop, so computation never lets timers fire early.

    The default executor has `compute_threads` workers (one unless told otherwise). Virtual time
    makes a run's outcome independent of how its nodes' computations overlap, and on one process
    they overlap badly: each small torch op releases the GIL and every other computing thread
    wakes for it. On an in-process localnet of 9 nodes (5 windows, `micro`, one torch thread)
    asyncio's default (6 workers here) made 2.8 M futex calls in 3 windows and cost 30.6 s of CPU,
    2 workers 27.8 s, one 23.4 s, in the same wall time and with the same weights. Torch's own
    threads still parallelise each op; a job that waits for another executor job would wait
    forever on one worker, and none does."""

    def __init__(self, start: float | None = None, compute_threads: int = 1) -> None:
        self._virtual_now = time.time() if start is None else float(start)
        self._busy = 0
        self._busy_lock = threading.Lock()
        super().__init__(selector=_JumpingSelector(lambda: self))
        if compute_threads < 1:
            self.close()
            raise ValueError(f"VirtualTimeLoop: compute_threads must be >= 1, got {compute_threads}")
        self.set_default_executor(concurrent.futures.ThreadPoolExecutor(compute_threads, thread_name_prefix="compute"))
        # virtual times are ~1.7e9: float spacing is ~2e-7 s, coarser than the monotonic clock's
        self._clock_resolution = 1e-6

    def time(self) -> float:
        return self._virtual_now

    @property
    def busy(self) -> bool:
        return self._busy > 0

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (only the loop's own selector and tests call this)."""
        if seconds > 0:
            self._virtual_now += seconds

    def run_in_executor(self, executor, func, *args):  # type: ignore[override]
        with self._busy_lock:
            self._busy += 1
        try:
            future = super().run_in_executor(executor, func, *args)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(lambda _f: self._release())
        return future

    def _release(self) -> None:
        with self._busy_lock:
            self._busy -= 1


def run_virtual(main: Coroutine[Any, Any, T], *, start: float | None = None) -> T:
    """`asyncio.run(main)` on a fresh `VirtualTimeLoop` (virtual time starting at `start`, default
    the wall clock now)."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)


def loop_time() -> TimeSource:
    """The time source of the running loop: virtual under a `VirtualTimeLoop`, else the wall clock."""
    loop = asyncio.get_running_loop()
    return LoopTime(loop) if isinstance(loop, VirtualTimeLoop) else SYSTEM_TIME
