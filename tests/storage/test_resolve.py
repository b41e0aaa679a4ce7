"""Looking up buckets' endpoint names (`storage.resolve`): a silent name server never holds the
threads a validator works in, and on a public network a name is judged by the addresses it resolves to.
Names come from a table here (the tests reach no DNS), or from the machine's own resolver."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.conftest import KeepAliveServer

from templar.storage import EndpointNotPublic, StorageError, StorageTimeout, open_bucket
from templar.storage.locator import BucketLocator, is_public_address
from templar.storage.resolve import PeerResolver


class _Names:
    """A name table in `getaddrinfo`'s form, counting the lookups; a name outside it is unknown."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table, self.lookups = table, 0

    def __call__(self, host: str, port: int, family: int) -> list[tuple]:
        self.lookups += 1
        if host not in self.table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        answers = []
        for address in self.table[host]:
            if ":" in address:
                text, _, scope = address.partition("%")
                answers.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (text, port, 0, 2 if scope else 0)))
            else:
                answers.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return answers


def test_a_hostname_that_resolves_to_a_private_address_is_never_connected_to() -> None:
    """The locator judges only its text: `http://bucket.peer.example` whose DNS answers 127.0.0.1 sent a
    mainnet validator's requests to its own machine. With `allow_private=False` the name is judged by
    the addresses it resolves to, and no request leaves; with `allow_private=True` (a localnet) the
    same locator reaches the server, so the refusal is the policy's, not the table's."""
    server = KeepAliveServer(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    locator = BucketLocator.s3(f"http://bucket.peer.example:{server.url.rsplit(':', 1)[1]}", "peer",
                               "key", "secretsecret")
    names = _Names({"bucket.peer.example": ["127.0.0.1"]})

    async def head(allow_private: bool) -> None:
        async with open_bucket(locator, allow_private=allow_private, lookup=names, max_attempts=1) as b:
            await b.head("k", timeout=5.0)

    try:
        with pytest.raises(EndpointNotPublic, match=r"resolves only to addresses that are not public \(127\.0\.0\.1\)"):
            asyncio.run(head(allow_private=False))
        assert names.lookups == 1 and server.requests == 0
        with pytest.raises(StorageError, match="404"):
            asyncio.run(head(allow_private=True))
        assert server.requests == 1
    finally:
        server.close()


def test_only_a_names_public_addresses_are_kept() -> None:
    """A name answering public and private addresses is connected to at the public ones only; every
    kind of address that is not globally routable counts as private, IPv4 inside IPv6 included."""
    private = ["127.0.0.1", "10.1.2.3", "192.168.0.1", "100.100.100.200", "169.254.169.254", "::1",
               "fe80::1%eth0", "fd00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "0.0.0.0", "224.0.1.1",
               # IPv6 that a gateway turns into a private IPv4 (NAT64, local NAT64, 6to4, IPv4-compatible)
               "64:ff9b::a00:5", "64:ff9b:1::5", "2002:a00:5::1", "::a9fe:a9fe"]
    public = ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c", "::ffff:93.184.215.14",
              "64:ff9b::5db8:d70e", "2002:5db8:d70e::1"]
    assert not any(map(is_public_address, private)) and all(map(is_public_address, public))
    names = _Names({"mixed.example": private + public, "lan.example": private})
    guard, open_to_all = PeerResolver(public_only=True, lookup=names), PeerResolver(lookup=names)

    async def body() -> None:
        assert [a["host"] for a in await guard.resolve("mixed.example", 443)] == public
        assert "fe80::1%2" in [a["host"] for a in await open_to_all.resolve("mixed.example", 443)]  # its scope kept
        with pytest.raises(OSError, match="not public"):
            await guard.resolve("lan.example", 443)
        assert len(await open_to_all.resolve("lan.example", 443)) == len(private)  # a localnet's peers
        with pytest.raises(socket.gaierror):
            await guard.resolve("unknown.example", 443)

    asyncio.run(body())


def test_the_operators_own_proxy_is_resolved_as_it_is(monkeypatch) -> None:
    """botocore sends through `HTTPS_PROXY` when one is set: aiohttp then resolves the proxy's name,
    often a LAN address, and the proxy resolves the peer's. The proxy is this machine's choice."""
    names = _Names({"proxy.corp": ["10.0.0.8"], "bucket.peer.example": ["10.0.0.9"]})

    async def body() -> None:
        guard = PeerResolver(public_only=True, lookup=names)
        assert [a["host"] for a in await guard.resolve("proxy.corp", 3128)] == ["10.0.0.8"]
        with pytest.raises(OSError, match="not public"):
            await guard.resolve("bucket.peer.example", 443)
        with pytest.raises(OSError, match="not public"):  # a peer naming the proxy's host, at another port
            await guard.resolve("proxy.corp", 443)

    for value in ("http://proxy.corp:3128", "proxy.corp:3128"):  # botocore reads a bare host:port as http://
        monkeypatch.setenv("HTTPS_PROXY", value)
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
        asyncio.run(body())


def test_the_machines_own_resolver_is_asked_by_default() -> None:
    """Without a table, the system's resolver answers: `localhost` is in every hosts file, loopback only."""
    async def body() -> None:
        assert {a["host"] for a in await PeerResolver().resolve("localhost", 80)} <= {"127.0.0.1", "::1"}
        with pytest.raises(OSError, match="localhost resolves only to addresses that are not public"):
            await PeerResolver(public_only=True).resolve("localhost", 80)

    asyncio.run(body())


def test_silent_name_servers_never_hold_the_threads_a_validator_works_in() -> None:
    """A peer's name whose name server never answers: aiohttp's own resolver waited for it in the event
    loop's default executor, where a validator evaluates, saves and sets weights (`asyncio.to_thread`);
    a few dozen such names held every thread. Each bucket's calls end at their deadline, and the
    executor's work goes on while the lookups still wait."""
    silent = threading.Event()  # set when the test ends: the name servers finally give up

    def never_answers(host: str, port: int, family: int) -> list[tuple]:
        silent.wait(60)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    threads, hostile = 4, 8  # a validator's executor, and twice as many silent names

    async def body() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads))
        async def read(i: int) -> None:
            locator = BucketLocator.s3(f"https://bucket{i}.silent.example", "peer", "key", "secretsecret")
            async with open_bucket(locator, allow_private=False, lookup=never_answers, connect_timeout=0.5,
                                   max_attempts=1) as bucket:
                with pytest.raises(StorageError) as caught:
                    await bucket.head("v4/commit/7.json", timeout=0.5)
                assert isinstance(caught.value, StorageTimeout | StorageError)

        await asyncio.gather(*(read(i) for i in range(hostile)))  # every call ended at its deadline
        # the lookups still wait; the executor is free
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "evaluated"), 10.0) == "evaluated"

    try:
        asyncio.run(body())
    finally:
        silent.set()
