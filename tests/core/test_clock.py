"""The virtual-time event loop: timers fire in order at their virtual instants without real
waiting, and time never jumps while work runs in a worker thread."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from templar.core.clock import SYSTEM_TIME, LoopTime, VirtualTimeLoop, loop_time, run_virtual, sleep_until

START = 1_700_000_000.0


def test_an_hour_of_sleeps_takes_no_real_time():
    async def main():
        now = loop_time().now
        t0 = now()
        await asyncio.sleep(3600)
        return now() - t0

    started = time.perf_counter()
    elapsed = run_virtual(main(), start=START)
    assert elapsed == pytest.approx(3600, abs=1e-3)
    assert time.perf_counter() - started < 5


def test_timers_fire_in_order_at_their_virtual_times():
    fired: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float):
        await asyncio.sleep(seconds)
        fired.append((name, asyncio.get_running_loop().time()))

    async def main():
        await asyncio.gather(sleeper("c", 30), sleeper("a", 10), sleeper("b", 20))

    run_virtual(main(), start=START)
    assert [n for n, _ in fired] == ["a", "b", "c"]
    assert [t - START for _, t in fired] == pytest.approx([10, 20, 30], abs=1e-3)


def test_time_stands_still_while_a_worker_thread_computes():
    """A timeout must not expire because computation took real time: compute is instantaneous."""

    async def main():
        now = loop_time().now
        t0 = now()
        async with asyncio.timeout(0.05):  # virtual: far shorter than the real work below
            await asyncio.to_thread(time.sleep, 0.3)
        return now() - t0

    assert run_virtual(main(), start=START) == pytest.approx(0.0, abs=1e-6)


def test_deadline_waits_and_stop_events():
    async def main():
        now = loop_time().now
        stop = asyncio.Event()
        assert await sleep_until(now, now() + 5, stop)
        asyncio.get_running_loop().call_later(2, stop.set)
        t0 = now()
        assert not await sleep_until(now, now() + 100, stop)  # stopped after 2 virtual seconds
        return now() - t0

    assert run_virtual(main(), start=START) == pytest.approx(2.0, abs=1e-3)


def test_time_source_follows_the_running_loop():
    async def which():
        return loop_time()

    assert isinstance(run_virtual(which()), LoopTime)
    assert asyncio.run(which()) is SYSTEM_TIME


def test_loop_time_is_readable_from_threads():
    async def main():
        source = loop_time()
        await asyncio.sleep(42)
        return await asyncio.to_thread(source.now)

    assert run_virtual(main(), start=START) == pytest.approx(START + 42, abs=1e-3)


def test_the_loop_closes_cleanly():
    loop = VirtualTimeLoop(START)
    try:
        loop.run_until_complete(asyncio.sleep(1))
        assert loop.time() == pytest.approx(START + 1, abs=1e-3)
    finally:
        loop.close()


def test_computations_take_turns_on_one_thread_unless_told_otherwise():
    """Virtual time makes overlapping computations buy nothing but GIL contention: one compute
    thread by default, every job on it, one after another; more when asked."""
    import threading

    def job(seconds: float) -> tuple[str, float, float]:
        started = time.perf_counter()
        time.sleep(seconds)
        return threading.current_thread().name, started, time.perf_counter()

    async def three_jobs():
        return await asyncio.gather(*(asyncio.to_thread(job, 0.05) for _ in range(3)))

    runs = run_virtual(three_jobs(), start=START)
    assert len({name for name, _, _ in runs}) == 1
    spans = sorted((a, b) for _, a, b in runs)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))

    loop = VirtualTimeLoop(START, compute_threads=3)
    try:
        runs = loop.run_until_complete(three_jobs())
        assert len({name for name, _, _ in runs}) == 3
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    with pytest.raises(ValueError, match="compute_threads"):
        VirtualTimeLoop(START, compute_threads=0)
