"""The fault plan itself (tests/faults.py): which calls a rule picks, and what each fault does to
them. What the faults do to gather is in tests/comms/test_gather.py (every pair of faults)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.faults import Fault, FaultPlan, between

from templar.core.clock import loop_time, run_virtual
from templar.storage import BucketUnreachable, LocalBucket, StorageError, StorageTimeout


def test_a_rule_picks_its_operations_keys_calls_and_time(tmp_path: Path, faults: FaultPlan) -> None:
    async def body() -> None:
        clock = loop_time()
        bucket = faults.wrap(LocalBucket(tmp_path, now=clock.now))
        faults.add(Fault.ERROR, ops={"put"}, keys="v1/a", skip=1, times=2, message="AccessDenied")
        await bucket.put("v1/a/0", b"x")                          # skipped: the first matching call
        for key in ("v1/a/1", "v1/a/2"):
            with pytest.raises(StorageError, match=r"v1/a/.: AccessDenied"):
                await bucket.put(key, b"x")
        await bucket.put("v1/a/3", b"x")                          # fired twice: done
        await bucket.put("v1/b/0", b"x")                          # another prefix
        assert await bucket.get("v1/a/0", max_bytes=10) == b"x"   # another operation
        start = clock.now() + 10
        faults.add(Fault.REFUSE, keys=lambda key: key.endswith("/0"), when=between(clock.now, start, start + 5))
        assert await bucket.head("v1/b/0")
        await asyncio.sleep(10)
        with pytest.raises(BucketUnreachable, match="connection refused"):
            await bucket.head("v1/b/0")
        await asyncio.sleep(5)
        assert await bucket.head("v1/b/0")
        with pytest.raises(ValueError, match="unknown operations"):
            faults.add(Fault.HANG, ops={"fetch"})

    run_virtual(body())


def test_each_fault_as_the_caller_sees_it(tmp_path: Path, faults: FaultPlan) -> None:
    async def body() -> None:
        clock = loop_time()
        bucket = faults.wrap(LocalBucket(tmp_path, now=clock.now))
        data = bytes(range(200))
        await bucket.put("k", data)
        hang = faults.add(Fault.HANG, ops={"get"})
        started = clock.now()
        with pytest.raises(StorageTimeout):
            await bucket.get("k", max_bytes=1000, timeout=3.0)   # a stopped server: the call's own timeout
        assert clock.now() - started == pytest.approx(3.0, abs=0.3)
        waiting = asyncio.create_task(bucket.get("k", max_bytes=1000, timeout=30.0))
        await asyncio.sleep(2.0)
        faults.remove(hang)                                       # the server resumes: the call completes
        assert await waiting == data
        delay = faults.add(Fault.DELAY, seconds=4.0)
        started = clock.now()
        assert await bucket.get("k", max_bytes=1000) == data and clock.now() - started >= 4.0
        faults.remove(delay)
        faults.add(Fault.TRUNCATE, ops={"get"}, times=1)
        assert await bucket.get("k", max_bytes=1000) == data[:100]
        faults.add(Fault.CORRUPT, ops={"put"}, times=1)
        await bucket.put("c", data)
        stored = (tmp_path / "c").read_bytes()
        assert len(stored) == len(data) and stored != data and stored[1:97] == data[1:97]
        assert await bucket.list("") and await bucket.head("c")  # body faults leave head and list alone

    run_virtual(body())
