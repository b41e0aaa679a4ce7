"""A dead or silent endpoint surfaces as `ChainUnavailable` within the timeout, never a hang."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from templar.chain import ChainUnavailable, connect


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a wedged node)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_silent_endpoint_times_out_as_chain_unavailable(silent_server: int) -> None:
    chain = connect(network=f"ws://127.0.0.1:{silent_server}", netuid=3, wallet_name=None, read_timeout=1.0)
    try:
        start = time.monotonic()
        with pytest.raises(ChainUnavailable, match="within 1s"):
            chain.metagraph()
        assert time.monotonic() - start < 8.0
    finally:
        chain.close()


def test_refused_endpoint_is_chain_unavailable(refused_port) -> None:
    chain = connect(
        network="local", chain_endpoint=f"ws://127.0.0.1:{refused_port}", netuid=3, wallet_name=None, read_timeout=3.0
    )
    try:
        with pytest.raises(ChainUnavailable):
            chain.block()
    finally:
        chain.close()


def test_bad_network_flags_are_rejected_before_connecting(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown network"):
        connect(network="mainnet", netuid=3, wallet_name=None)
    with pytest.raises(ValueError, match=r"needs --subtensor\.chain_endpoint"):
        connect(network="embedded", netuid=3, wallet_name=None)
    with pytest.raises(ValueError, match="must be a ws:// or wss:// URL"):
        connect(network="finney", chain_endpoint=str(tmp_path / "x.sqlite"), netuid=3, wallet_name=None)


def test_an_endpoint_that_stops_answering_is_bridged_by_counting_blocks_for_a_while(monkeypatch) -> None:
    """A node's clock reads the chain's head. One that stops answering (a public endpoint reconnecting) is
    bridged for `HEAD_EXTRAPOLATION_SECONDS` by counting blocks from the last head read, and timestamps
    from the last one known, with one warning; past that, the read fails as before."""
    from templar.chain.head import HEAD_EXTRAPOLATION_SECONDS, ChainHead
    from templar.core.config import load_hparams
    from templar.runtime.consensus.windows import Clock

    asked: list[str] = []

    class Silent:
        closed = False

        def call(self, what, fn, write=False):
            asked.append(what)
            raise ChainUnavailable(f"{what}: no answer within 30s")

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    head = ChainHead(Silent(), lambda: 12.0)  # type: ignore[arg-type]  # a node's, on a session with no endpoint
    head._follower = threading.current_thread()  # a follower running: its reads are made below
    head._last, head._timestamps = (7000, now[0] - 30.0), {7000: 1_700_000_000.0}
    assert head.block() == 7002 and asked == [], "the caller counts, it never asks"
    head.refresh(head._session)
    assert head.block() == 7002 and asked == ["read the chain head"] and head._outage is not None
    clock = Clock(load_hparams("tiny").windows, head.block, head.timestamp)
    window = clock.current_window()
    assert clock.times(window).start == 1_700_000_000.0 + (window * 20 - 7000) * 12.0  # counted from the last known
    assert head.timestamp(7001) == 1_700_000_000.0 + 12.0  # made while the endpoint does not answer
    with pytest.raises(ChainUnavailable, match="none known before it"):
        head.timestamp(6990)
    now[0] += 13.0
    assert head.block() == 7003
    now[0] += HEAD_EXTRAPOLATION_SECONDS
    with pytest.raises(ChainUnavailable):
        head.block()


def test_the_head_is_read_by_a_follower_on_its_own_connection_never_behind_the_nodes_calls() -> None:
    """A node's clock asks the block from its event loop many times a window. A follower thread reads the
    head on a connection of its own, so neither a slow call of the node (a metagraph read, a weights write
    waiting for its inclusion: the session serialises them) nor the read itself stops the caller: before,
    a head read every second waited behind them on the event loop. The blocks made between two reads get
    their timestamps (a window's first block is then known when its landmarks are asked); the count never
    goes back (the follower's backend a block behind); a follower whose connection stops answering reads
    on the node's own (from its thread)."""
    import asyncio
    import datetime

    from templar.chain.client import Chain
    from templar.chain.head import ChainHead

    def stamp(block: int) -> float:
        return 1_700_000_000.0 + 12.0 * block

    class Client:
        def __init__(self, head: list[int]):
            self.head = head

        async def block(self) -> int:
            return self.head[0]

        async def timestamp(self, block: int) -> datetime.datetime:
            return datetime.datetime.fromtimestamp(stamp(block), tz=datetime.UTC)

    held, twin_fails = threading.Event(), threading.Event()  # the node's session held by a long call; the twin dead

    class Session:
        closed = False

        def __init__(self, head: list[int], own: bool):
            self.client, self.own, self.reads = Client(head), own, 0

        def call(self, what, fn, write=False):
            if self.own and held.is_set():
                time.sleep(5.0)  # a weights write waiting for its inclusion
            if not self.own and twin_fails.is_set():
                raise ChainUnavailable(f"{what}: no answer within 30s")
            self.reads += 1
            return asyncio.run(fn(self.client))

        def twin(self):
            self.twin_session = Session(twin_head, own=False)
            return self.twin_session

        def close(self):
            pass

    head, twin_head = [100], [100]
    session = Session(head, own=True)
    chain = Chain(Session(head, own=True), None, 3, network="finney")  # type: ignore[arg-type]
    chain._block_time = 0.4
    assert chain.block() == 100 and chain.block_timestamp(100) == stamp(100)  # the adapter's clock is its head's
    chain.close()
    reader = ChainHead(session, lambda: 0.4)  # type: ignore[arg-type]  # the follower's period: a quarter block
    reader.follow()  # as a node does at start: the first read, here
    assert reader.block() == 100 and reader._follower is not None
    held.set()
    twin_head[0] = 103
    started = time.monotonic()
    while reader._last[0] != 103 and time.monotonic() < started + 4.0:
        time.sleep(0.05)
    assert reader._last[0] == 103 and reader.block() >= 103 and reader.timestamp(103) == stamp(103)
    assert [reader._timestamps.get(b) for b in (101, 102)] == [stamp(101), stamp(102)]  # made between two reads
    twin_head[0] = 102  # the follower's backend, a block behind
    time.sleep(0.3)
    assert reader.block() >= 103
    held.clear()
    twin_fails.set()  # before the new head, which the twin must never be the one to report
    reads = session.reads
    head[0], twin_head[0] = 110, 110
    deadline = time.monotonic() + 8.0
    while reader._last[0] != 110 and time.monotonic() < deadline:  # silent for 3 blocks: the follower reads on
        reader.block()                                                # the node's connection, in its own thread
        time.sleep(0.1)
    assert session.reads > reads and reader._last[0] == 110 and reader.block() >= 110
    reader.close()
    reader._follower.join(2.0)
    assert not reader._follower.is_alive()
    with pytest.raises(ChainUnavailable, match="closed"):
        reader.block()
