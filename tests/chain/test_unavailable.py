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
