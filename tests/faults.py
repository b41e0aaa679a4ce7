"""One fault-injecting bucket for every test that needs a storage server to misbehave.

A `FaultPlan` is a list of rules; `FaultyBucket` is a real `Bucket` with the plan in front of
every call. A rule says which operations (`put`, `get`, `head`, `list`, `delete`), which keys (a
prefix or a predicate), which fault, and when (a callable, usually on the node's clock: see
`between` and `during`; plus `skip` and `times` to pick the n-th matching call). The first rule
that matches a call decides what happens to it:

| fault | what the server does | what the caller sees |
|---|---|---|
| `HANG` | SIGSTOPped: never answers | the call waits while the rule holds, up to its own timeout: `StorageTimeout` |
| `REFUSE` | killed: the port is closed | `BucketUnreachable` at once |
| `ERROR` | answers with an error (a revoked key: AccessDenied) | the rule's exception (`StorageError`) at once |
| `TRUNCATE` | cuts the body short | a read gets, a write stores, the first half of the bytes |
| `CORRUPT` | flips bytes of the body | a read gets, a write stores, bytes with every 97th one inverted |
| `DELAY` | answers late | the call completes `seconds` later |

`TRUNCATE` and `CORRUPT` touch calls that carry a body (`put`, and `fetch`/`get`/`get_range` as
`get`); a streamed download (`get_file`) and `put_file` get the other faults only.

A test gets a fresh plan from the `faults` fixture (tests/conftest.py) and either wraps one
bucket (`faults.wrap(node.bucket)`) or gives a node the plan's factory
(`start_node(..., open_bucket=faults.open_bucket)`; in tests/integration, `subnet.open_bucket =
faults.open_bucket`), so every bucket the node opens, its own and its peers', is on the faulty server.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from templar.storage import (
    DEFAULT_TIMEOUT,
    Blob,
    Bucket,
    BucketUnreachable,
    ObjectInfo,
    StorageError,
    StorageTimeout,
    open_bucket,
)

OPS = frozenset({"put", "get", "head", "list", "delete"})
POLL = 0.25
"""Seconds between two looks at whether a hanging server has come back."""


class Fault(enum.Enum):
    HANG = "hang"
    REFUSE = "refuse"
    ERROR = "error"
    TRUNCATE = "truncate"
    CORRUPT = "corrupt"
    DELAY = "delay"


@dataclass(eq=False)
class FaultRule:
    fault: Fault
    ops: frozenset[str] = OPS
    keys: str | Callable[[str], bool] = ""
    """A key prefix ("" for every key), or a predicate on the key."""
    when: Callable[[], bool] | None = None
    """The rule holds while this is true (None: always)."""
    skip: int = 0
    """Matching calls let through before the rule first fires."""
    times: int | None = None
    """How many calls it fires on (None: every one)."""
    seconds: float = 1.0
    """DELAY's delay."""
    error: type[BaseException] = StorageError
    message: str = "injected fault"
    active: bool = True
    seen: int = 0
    fired: int = 0

    def holds(self) -> bool:
        return self.active and (self.when is None or self.when())

    def covers(self, op: str, key: str, body: bool) -> bool:
        if op not in self.ops or (self.fault in (Fault.TRUNCATE, Fault.CORRUPT) and not body):
            return False
        return key.startswith(self.keys) if isinstance(self.keys, str) else self.keys(key)

    def take(self, op: str, key: str, body: bool) -> bool:
        """Whether this call is one the rule fires on (counted)."""
        if not self.covers(op, key, body) or not self.holds():
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


@dataclass
class FaultPlan:
    rules: list[FaultRule] = field(default_factory=list)

    def add(self, fault: Fault, *, ops: Collection[str] = OPS, **how) -> FaultRule:
        unknown = set(ops) - OPS
        if unknown:
            raise ValueError(f"unknown operations {sorted(unknown)}; choose from {sorted(OPS)}")
        rule = FaultRule(fault, frozenset(ops), **how)
        self.rules.append(rule)
        return rule

    def remove(self, rule: FaultRule) -> None:
        """The server is back: calls hanging on `rule` go on, new ones are not touched."""
        rule.active = False
        self.rules.remove(rule)

    def clear(self) -> None:
        for rule in list(self.rules):
            self.remove(rule)

    def match(self, op: str, key: str, body: bool = False) -> FaultRule | None:
        """The rule that decides this call (`body`: the call carries bytes TRUNCATE/CORRUPT can touch)."""
        return next((rule for rule in self.rules if rule.take(op, key, body)), None)

    def wrap(self, bucket: Bucket) -> FaultyBucket:
        return FaultyBucket(bucket, self)

    def open_bucket(self, *args, **kwargs) -> FaultyBucket:
        """`templar.storage.open_bucket`, with the bucket on this plan's server."""
        return FaultyBucket(open_bucket(*args, **kwargs), self)


def between(now: Callable[[], float], start: float, end: float) -> Callable[[], bool]:
    """`when` for [start, end) on the clock `now` (unix seconds, virtual in tests)."""
    return lambda: start <= now() < end


def during(clock, first: int, last: int) -> Callable[[], bool]:
    """`when` for windows first..last of a node's `Clock`."""
    return lambda: first <= clock.current_window() <= last


def mangle(fault: Fault, data: bytes) -> bytes:
    if fault is Fault.TRUNCATE:
        return data[: len(data) // 2]
    if fault is Fault.CORRUPT:
        out = bytearray(data)
        for i in range(0, len(out), 97):
            out[i] ^= 0xFF
        return bytes(out)
    return data


class FaultyBucket(Bucket):
    """A real bucket (`inner`) behind a server that follows `plan`."""

    def __init__(self, inner: Bucket, plan: FaultPlan) -> None:
        self.inner, self.plan, self.name = inner, plan, inner.name

    async def _before(self, op: str, key: str, timeout: float | None, *, body: bool = False) -> FaultRule | None:
        """Apply the call's fault up to the inner call; the rule if the body is still to be mangled."""
        rule = self.plan.match(op, key, body)
        if rule is None:
            return None
        where = f"{self.name}/{key}"
        if rule.fault is Fault.REFUSE:
            raise BucketUnreachable(f"{where}: connection refused")
        if rule.fault is Fault.ERROR:
            raise rule.error(f"{where}: {rule.message}")
        if rule.fault is Fault.DELAY:
            await asyncio.sleep(rule.seconds)
        if rule.fault is Fault.HANG:
            waited = 0.0
            while rule.holds():
                if timeout is not None and waited >= timeout:
                    raise StorageTimeout(f"{where}: no answer in {timeout:.0f}s")
                await asyncio.sleep(POLL)
                waited += POLL
        return rule if rule.fault in (Fault.TRUNCATE, Fault.CORRUPT) else None

    async def put(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        rule = await self._before("put", key, timeout, body=True)
        await self.inner.put(key, mangle(rule.fault, data) if rule else data, timeout=timeout)

    async def create(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        rule = await self._before("put", key, timeout, body=True)
        await self.inner.create(key, mangle(rule.fault, data) if rule else data, timeout=timeout)

    async def fetch(self, key: str, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> Blob:
        rule = await self._before("get", key, timeout, body=True)
        blob = await self.inner.fetch(key, max_bytes=max_bytes, timeout=timeout)
        return Blob(blob.info, mangle(rule.fault, blob.data)) if rule else blob

    async def get_range(self, key: str, start: int, length: int, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        rule = await self._before("get", key, timeout, body=True)
        data = await self.inner.get_range(key, start, length, timeout=timeout)
        return mangle(rule.fault, data) if rule else data

    async def head(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> ObjectInfo:
        await self._before("head", key, timeout)
        return await self.inner.head(key, timeout=timeout)

    async def list(self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                   limit: int = 100_000) -> list[ObjectInfo]:
        await self._before("list", prefix, timeout)
        return await self.inner.list(prefix, timeout=timeout, limit=limit)

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        await self._before("delete", key, timeout)
        await self.inner.delete(key, timeout=timeout)

    async def put_file(self, key: str, path: Path, *, timeout: float | None = None) -> None:
        await self._before("put", key, timeout)
        await self.inner.put_file(key, path, timeout=timeout)

    async def _read_range(self, key: str, start: int, expect: ObjectInfo) -> AsyncIterator[bytes]:
        await self._before("get", key, None)
        async for chunk in self.inner._read_range(key, start, expect):
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()
