"""Peer lists, aggregates and the start window: round trips and hostile records."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from tests.faults import Fault, FaultPlan

from templar.comms import (
    RecordError,
    get_aggregate,
    get_peers,
    get_start_window,
    put_aggregate,
    put_peers,
    put_start_window,
)
from templar.comms.exchange import PEER_INDEX_WINDOWS, PeerIndex, parse_record
from templar.comms.keys import gradient_key, peers_index_key, peers_key, start_window_key, window_of
from templar.core.config import PROTOCOL_VERSION
from templar.storage import ObjectTooLarge
from templar.wire import Run

RUN = Run(netuid=7, digest="ab" * 32)
OTHER_SUBNET, OTHER_RUN = Run(netuid=8, digest="ab" * 32), Run(netuid=7, digest="cd" * 32)


def test_keys_live_under_the_protocol_version() -> None:
    assert gradient_key(5) == f"v{PROTOCOL_VERSION}/gradient/5.safetensors"
    assert peers_key(7, version=3) == "v3/peers/7.json"
    assert window_of("v1/peers/12.json", "v1/peers/", ".json") == 12
    for bad in ("v1/peers/012.json", "v1/peers/-1.json", "v1/peers/1e3.json", "v1/peers/x.json"):
        assert window_of(bad, "v1/peers/", ".json") is None
    with pytest.raises(ValueError):
        gradient_key(-1)


def test_peer_lists_pick_newest_not_after_window(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            assert await get_peers(b, 100, run=RUN) is None
            await put_peers(b, 10, ["alice", "bob"], run=RUN)
            await put_peers(b, 20, ["carol"], run=RUN)
            await put_peers(b, 9, ["zed"], run=RUN)
            assert await get_peers(b, 9, run=RUN) == (9, ["zed"])
            assert await get_peers(b, 15, run=RUN) == (10, ["alice", "bob"])
            assert await get_peers(b, 20, run=RUN) == (20, ["carol"])
            assert await get_peers(b, 10**6, run=RUN) == (20, ["carol"])
            assert await get_peers(b, 8, run=RUN) is None
            assert await get_peers(b, 15, run=RUN, max_peers=2) == (10, ["alice", "bob"])
            with pytest.raises(RecordError, match="names 2 peers, the run aggregates at most 1"):
                await get_peers(b, 15, run=RUN, max_peers=1)  # every node would gather each one

    asyncio.run(body())


@pytest.mark.slow(seconds=4, waits=True)
def test_peer_lists_are_found_without_listing_the_bucket(maker) -> None:
    """Every node asks for the list in effect every window: one GET when the lead named a list for
    that window, the index and the list otherwise; a LIST only past the index's 64 publications."""
    from templar.storage.counting import CountingBucket, OperationLog

    async def body() -> None:
        log = OperationLog()
        async with maker.open() as inner:
            b = CountingBucket(inner, log, actor="reader", label="lead")
            assert await get_peers(b, 5, run=RUN) is None
            assert log.totals()["list"] == 0
            for w in range(10, 30, 2):
                await put_peers(b, w, [f"h{w}"], run=RUN)
            assert log.totals()["list"] == 0, "publishing reads and rewrites the index, never lists"
            mark = len(log.requests)
            assert await get_peers(b, 20, run=RUN) == (20, ["h20"])
            assert [r.op for r in log.requests[mark:]] == ["get"]
            mark = len(log.requests)
            assert await get_peers(b, 21, run=RUN) == (20, ["h20"])
            assert [r.op for r in log.requests[mark:]] == ["get", "get", "get"]  # miss, index, list
            assert await get_peers(b, 9, run=RUN) is None
            assert log.totals()["list"] == 0
            for w in range(30, 30 + PEER_INDEX_WINDOWS):
                await put_peers(b, w, [f"h{w}"], run=RUN)
            index = parse_record(await b.get(peers_index_key(), max_bytes=1 << 16), PeerIndex, "index")
            assert index.windows == list(range(30, 30 + PEER_INDEX_WINDOWS))
            assert await get_peers(b, 29, run=RUN) == (28, ["h28"])  # older than the index: one LIST
            assert log.totals()["list"] == 1

    asyncio.run(body())


def test_a_broken_peer_index_is_an_error_to_readers_and_rewritten_by_the_lead(tmp_path) -> None:
    from templar.storage import LocalBucket

    async def body() -> None:
        b = LocalBucket(tmp_path)
        await put_peers(b, 4, ["a"], run=RUN)
        await b.put(peers_index_key(), b'{"protocol": %d, "windows": [3, 3]}' % PROTOCOL_VERSION)
        with pytest.raises(RecordError):
            await get_peers(b, 5, run=RUN)
        assert await get_peers(b, 4, run=RUN) == (4, ["a"])  # the list of the window itself needs no index
        await put_peers(b, 6, ["b"], run=RUN)
        assert await get_peers(b, 7, run=RUN) == (6, ["b"])
        other = Run(RUN.netuid, "f" * 64)
        with pytest.raises(RecordError, match="another run"):
            await get_peers(b, 7, run=other)

    asyncio.run(body())


@pytest.mark.parametrize("raw", [
    b"not json",
    b"[" * 100_000 + b"]" * 100_000,  # deep nesting: RecursionError, not a crash (cap raised below)
    json.dumps({"protocol": PROTOCOL_VERSION, "window": 3, "peers": ["a", "a"]}).encode(),
    json.dumps({"protocol": PROTOCOL_VERSION, "window": 3.0, "peers": ["a"]}).encode(),
    json.dumps({"protocol": PROTOCOL_VERSION, "window": 3, "peers": ["a"], "extra": 1}).encode(),
    json.dumps({"protocol": 999, "window": 3, "peers": ["a"]}).encode(),
    json.dumps({"protocol": PROTOCOL_VERSION, "window": 3, "peers": ["bad hotkey!"]}).encode(),
    json.dumps({"protocol": PROTOCOL_VERSION, "window": 3, "peers": [f"h{i}" for i in range(2000)]}).encode(),
    json.dumps({"protocol": PROTOCOL_VERSION, "window": 4, "peers": ["a"]}).encode(),  # window mismatch
])
def test_malformed_peer_list_raises_record_error(tmp_path, raw: bytes) -> None:
    from templar.storage import LocalBucket

    async def body() -> None:
        b = LocalBucket(tmp_path)
        await b.put(peers_key(3), raw)
        with pytest.raises(RecordError):
            await get_peers(b, 3, max_bytes=1 << 20, run=RUN)

    asyncio.run(body())


def test_peer_list_byte_cap(tmp_path) -> None:
    from templar.storage import LocalBucket

    async def body() -> None:
        b = LocalBucket(tmp_path)
        await b.put(peers_key(3), b" " * 70_000)
        with pytest.raises(ObjectTooLarge):
            await get_peers(b, 3, run=RUN)

    asyncio.run(body())


def test_put_peers_validates_before_upload(tmp_path) -> None:
    from templar.storage import LocalBucket

    async def body() -> None:
        b = LocalBucket(tmp_path)
        with pytest.raises(ValueError):
            await put_peers(b, 1, ["dup", "dup"], run=RUN)
        assert await b.list("") == []

    asyncio.run(body())


def test_aggregates_and_start_window(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            assert await get_aggregate(b, 4, max_bytes=100) is None
            await put_aggregate(b, 4, b"\x01\x02signs")
            assert await get_aggregate(b, 4, max_bytes=100) == b"\x01\x02signs"
            with pytest.raises(ObjectTooLarge):
                await get_aggregate(b, 4, max_bytes=3)
            assert await get_start_window(b, run=RUN) is None
            await put_start_window(b, 1234, run=RUN)
            assert await get_start_window(b, run=RUN) == 1234
            await b.put(start_window_key(), b'{"protocol": 1, "start_window": "1234"}')
            with pytest.raises(RecordError):
                await get_start_window(b, run=RUN)

    asyncio.run(body())


def test_records_of_another_run_are_refused(maker):
    """A peer list, start window or progress record left by another subnet or run is an error,
    never taken for this run's."""
    from templar.comms.progress import get_progress, put_progress

    async def scenario():
        async with maker.open() as b:
            await put_peers(b, 10, ["alice"], run=OTHER_RUN)
            await put_start_window(b, 5, run=OTHER_SUBNET)
            await put_progress(b, 10, 3, run=OTHER_RUN)
            for read in (get_peers(b, 10, run=RUN), get_start_window(b, run=RUN), get_progress(b, 10, run=RUN)):
                with pytest.raises(RecordError, match="another run"):
                    await read
            assert await get_peers(b, 10, run=OTHER_RUN) == (10, ["alice"])

    asyncio.run(scenario())


def test_commitments_round_trip_and_refuse_garbage(tmp_path) -> None:
    """Commitments (docs/scoring.md §8): a miner's commitment reads back as its digest; a missing one is None;
    another run's, another window's or a malformed one is a RecordError; `read_commits` maps garbage, absence
    and a bucket that fails or stalls in the read span to b"" (committed nothing: a copier cannot hide its
    commitment behind its own outage), and leaves out only the reads it could not start before the deadline
    (the reader's own lateness)."""
    from templar.comms.commit import get_commit, put_commit, read_commits
    from templar.comms.keys import commit_key
    from templar.storage import LocalBucket

    async def body() -> None:
        good, other, junk, empty = (LocalBucket(tmp_path / n) for n in ("good", "other", "junk", "empty"))
        await put_commit(good, 5, b"\x01" * 32, run=RUN)
        assert await get_commit(good, 5, run=RUN) == b"\x01" * 32
        assert await get_commit(good, 6, run=RUN) is None
        with pytest.raises(RecordError):
            await get_commit(good, 5, run=OTHER_RUN)
        await put_commit(other, 4, b"\x02" * 32, run=RUN)
        await other.put(commit_key(5), await other.get(commit_key(4), max_bytes=4096))  # a replayed record
        with pytest.raises(RecordError):
            await get_commit(other, 5, run=RUN)
        await junk.put(commit_key(5), b'{"digest": "' + b"0" * 64 + b'"}')
        failing = FaultPlan().wrap(LocalBucket(tmp_path / "failing"))
        stalling = FaultPlan().wrap(LocalBucket(tmp_path / "stalling"))
        await put_commit(failing, 5, b"\x03" * 32, run=RUN)
        await put_commit(stalling, 5, b"\x04" * 32, run=RUN)
        failing.plan.add(Fault.REFUSE, ops={"get"})  # its server killed
        stalling.plan.add(Fault.HANG, ops={"get"})   # its server SIGSTOPped
        buckets = {"good": good, "other": other, "junk": junk, "empty": empty, "failing": failing,
                   "stalling": stalling}
        found = await read_commits(buckets, 5, run=RUN, deadline=time.time() + 1.0, now=time.time)
        assert found == {"good": b"\x01" * 32, "other": b"", "junk": b"", "empty": b"", "failing": b"",
                         "stalling": b""}
        # past the read span nothing is known: nobody is judged on a read that came too late
        assert await read_commits(buckets, 5, run=RUN, deadline=time.time() - 1.0, now=time.time) == {}

    asyncio.run(body())


def test_stalling_buckets_cannot_leave_the_peers_read_after_them_unjudged(tmp_path) -> None:
    """A read that waited for a slot held by other peers' stalling buckets was once "not started before the
    deadline" and left its peer out, unjudged on its commitment: forty hotkeys whose buckets hang on every
    read, sorting before a copier's, let the copier post a same-window payload it never committed to. Every
    read now starts at once: the stallers commit nothing, the copier's silence is read as silence, and an
    honest peer behind them is read as committed."""
    from templar.comms.commit import put_commit, read_commits
    from templar.storage import LocalBucket

    async def body() -> None:
        buckets = {}
        for i in range(40):
            staller = FaultPlan().wrap(LocalBucket(tmp_path / f"staller{i}"))
            staller.plan.add(Fault.HANG, ops={"get"})
            buckets[f"a{i:02d}"] = staller
        honest = LocalBucket(tmp_path / "honest")
        await put_commit(honest, 5, b"\x01" * 32, run=RUN)
        buckets["z-copier"], buckets["z-honest"] = LocalBucket(tmp_path / "copier"), honest
        found = await read_commits(buckets, 5, run=RUN, deadline=time.time() + 1.0, now=time.time)
        assert found == {**{f"a{i:02d}": b"" for i in range(40)}, "z-copier": b"", "z-honest": b"\x01" * 32}

    asyncio.run(body())
