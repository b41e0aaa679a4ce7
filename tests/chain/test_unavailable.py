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
    from the last one known, asking the endpoint again once a block, with one warning; past that, the
    read fails as before."""
    from templar.chain.client import HEAD_EXTRAPOLATION_SECONDS, Chain
    from templar.core.config import load_hparams
    from templar.runtime.consensus.windows import Clock

    asked: list[str] = []

    class Silent:
        def call(self, what, fn, write=False):
            asked.append(what)
            raise ChainUnavailable(f"{what}: no answer within 30s")

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    chain = object.__new__(Chain)  # a node's adapter, its session and caches only (no endpoint)
    chain._clock, chain._block_time, chain._session, chain._head_retry_at = None, 12.0, Silent(), None
    chain._head, chain._timestamps = (7000, now[0] - 30.0), {7000: 1_700_000_000.0}
    assert chain.block() == 7002 and asked == ["read block"]
    assert chain.block() == 7002 and asked == ["read block"], "asked again within the block"
    clock = Clock(load_hparams("tiny").windows, chain.block, chain.block_timestamp)
    window = clock.current_window()
    assert clock.times(window).start == 1_700_000_000.0 + (window * 20 - 7000) * 12.0  # counted from the last known
    now[0] += 13.0
    assert chain.block() == 7003 and asked.count("read block") == 2
    now[0] += HEAD_EXTRAPOLATION_SECONDS
    with pytest.raises(ChainUnavailable):
        chain.block()
