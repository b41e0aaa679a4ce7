"""Looking up the names of buckets' endpoints: each lookup in a thread of its own, and for peers on a
public network, public addresses only.

A peer chooses its endpoint's hostname, and with it the DNS server that answers for the name. Two
things follow, and `PeerResolver` answers both.

- **A lookup that never ends.** aiohttp's default resolver runs `getaddrinfo` on the event loop's
  default executor: the same few threads (`min(32, cores + 4)`) that run a validator's evaluation,
  its state saves and its chain calls (`asyncio.to_thread`). A name server that never answers holds
  a thread for the system resolver's whole timeout (glibc: 5 s, twice, for each name server), and
  aiohttp looks again as soon as a lookup fails. A few such peers held every thread of that executor,
  and the validator's work waited behind them (`benchmarks/performance/peer_dns.py`). Here each
  lookup runs in a daemon thread of its own, so a stalled name holds a thread that only waits.
  aiohttp already lets one lookup of a name run at a time per bucket and caches what it answers
  for 10 s, so an honest name costs a thread for milliseconds now and then.
- **A name that resolves to a private address.** The locator's checks see only its text: a name
  whose DNS answers 127.0.0.1, 10.x or 100.100.100.200 (one cloud's metadata service) aimed a
  mainnet validator's requests at its own machine or LAN. With `public_only`, only the globally
  routable addresses a name resolves to are handed to aiohttp, which connects to exactly those: a
  name that answers a public address to one lookup and a private one to the next gains nothing.
  A name with none fails to connect (`NotPublicAddress`, reported as `EndpointNotPublic`).
- **A proxy.** The operator's own HTTP(S) proxy (botocore reads `HTTPS_PROXY` and friends,
  `operator_proxies`) is the one name taken as it resolves: it is this machine's choice, not a
  peer's. Behind it the proxy resolves peers' names and connects to them, so the public-address
  guard is the proxy's to keep; a validator on a public network says so when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver

from templar.core.log import peer_text
from templar.storage.locator import is_public_address

Lookup = Callable[[str, int, int], list[tuple[Any, ...]]]
"""`getaddrinfo`'s answer for (host, port, family): what a `PeerResolver` asks."""

_NO_ANSWER = {getattr(socket, name) for name in ("EAI_NONAME", "EAI_ADDRFAMILY", "EAI_NODATA") if hasattr(socket, name)}
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV  # what aiohttp passes on to connect: no second lookup


class NotPublicAddress(OSError):
    """A peer's endpoint name resolved to no globally routable address."""


def system_lookup(host: str, port: int, family: int) -> list[tuple[Any, ...]]:
    """The system's resolver (`/etc/hosts`, then DNS), as aiohttp's own resolver asks it: only the
    address families this machine has an address of, unless that leaves none (a machine whose only
    interface is loopback, where glibc then answers nothing even for `localhost`)."""
    try:
        return socket.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
    except socket.gaierror as exc:
        if exc.errno not in _NO_ANSWER:
            raise  # a name server that timed out is not asked twice
        return socket.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)


async def _in_own_thread(lookup: Lookup, host: str, port: int, family: int) -> list[tuple[Any, ...]]:
    """`lookup(host, port, family)` in a daemon thread started for it: the caller may stop waiting
    (its deadline), the thread ends when the system resolver gives up, and no pool waits on it."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[tuple[Any, ...]]] = loop.create_future()

    def settle(result: list[tuple[Any, ...]] | None, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result or [])

    def run() -> None:
        try:
            result, error = lookup(host, port, family), None
        except Exception as exc:  # gaierror and the rest: the caller's to raise
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed while the name server was silent
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"lookup {host[:40]}", daemon=True).start()
    return await answer


def operator_proxies() -> set[tuple[str, int]]:
    """The (host, port) of each HTTP(S) proxy this process is configured with (`HTTPS_PROXY` and the
    rest, `NO_PROXY` aside), read as botocore reads them: a value without a scheme is `http://`."""
    found = set()
    for scheme, url in urllib.request.getproxies().items():
        if scheme == "no" or not url:
            continue
        parts = urlsplit(url if "://" in url else f"http://{url}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # a port that is not a number: botocore cannot use it either
            continue
        if parts.hostname:
            found.add((parts.hostname, port))
    return found


class PeerResolver(AbstractResolver):
    """aiohttp's resolver for buckets' endpoints (see the module): lookups in their own threads,
    and with `public_only` only the public addresses a name resolves to. `lookup` asks the names
    (the system's resolver unless given a table)."""

    def __init__(self, *, public_only: bool = False, lookup: Lookup = system_lookup) -> None:
        self.public_only = public_only
        self._lookup = lookup
        self._proxies = operator_proxies()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[dict[str, Any]]:
        answers = []
        for found, _, proto, _, address in await _in_own_thread(self._lookup, host, port, family):
            if found == socket.AF_INET6:
                if len(address) < 4:
                    continue  # a Python built without IPv6
                address_text = f"{address[0]}%{address[3]}" if address[3] else address[0]  # scope: link-local
            else:
                address_text = address[0]
            answers.append({"hostname": host, "host": address_text, "port": address[1], "family": found,
                            "proto": proto, "flags": _NUMERIC})
        if not self.public_only or (host, port) in self._proxies:
            return answers
        public = [answer for answer in answers if is_public_address(answer["host"])]
        if not public:
            shown = ", ".join(sorted({answer["host"] for answer in answers})[:4])
            raise NotPublicAddress(f"{peer_text(host, 64)} resolves only to addresses that are not public ({shown}): "
                                   "peers' buckets are read at public addresses only")
        return public

    async def close(self) -> None:
        pass
