"""Counting what nodes ask of object stores: requests and bytes, per bucket and per caller.

Object stores bill per request (R2's Class A writes and lists, Class B reads; S3's PUT/LIST and
GET/HEAD tiers), so how many requests a window makes is a cost, and a LIST in a polling loop is the
classic surprise on the bill. `CountingBucket` wraps any `Bucket` and records each request it makes
at the S3 level (a `get_file` is its HEAD plus its ranged GETs; an upload of a file is one PUT here,
whatever its multipart parts); `counting_buckets()` makes every bucket `open_bucket` opens counted,
attributed to whoever opened it (the `ACTOR` context variable: a node's name, set on its task), and
labelled with the bucket's name, prefixed `own:` when opened as the opener's own (write) bucket.

    with counting_buckets(now=clock.now) as log:
        ...                                       # run nodes
    log.totals(actor="miner1", since=t0, until=t1)   # {"get": 9, "head": 2, "put": 2, ...}
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from templar.storage.base import DEFAULT_TIMEOUT, Blob, Bucket, ObjectInfo

OPERATIONS = ("put", "get", "head", "list", "delete")
"""The S3 requests a node makes (multipart parts count as one `put` at this interface)."""

LIST_PAGE = 1000
"""Keys per LIST response (S3 and R2): a listing of n keys costs ceil(n / 1000) requests, at least one."""

ACTOR: ContextVar[str] = ContextVar("templar_bucket_actor", default="")
"""Who is asking: set it (e.g. a node's name) on the task that opens and uses buckets."""


@dataclass(frozen=True)
class Request:
    """One request: who made it, to which bucket, which operation on which key (a LIST: its prefix),
    bytes moved, and when."""

    actor: str
    bucket: str
    op: str
    key: str
    nbytes: int
    at: float


@dataclass
class OperationLog:
    """Every request counted while the log was installed (thread-safe enough: appends only)."""

    now: Callable[[], float] = time.time
    requests: list[Request] = field(default_factory=list)

    def record(self, actor: str, bucket: str, op: str, key: str, nbytes: int = 0, count: int = 1) -> None:
        stamp = self.now()
        self.requests.extend(Request(actor, bucket, op, key, nbytes if i == 0 else 0, stamp) for i in range(count))

    def select(self, *, actor: str | None = None, bucket: str | None = None, since: float = float("-inf"),
               until: float = float("inf")) -> list[Request]:
        return [r for r in self.requests if (actor is None or r.actor == actor)
                and (bucket is None or r.bucket == bucket) and since <= r.at < until]

    def totals(self, **where: object) -> Counter[str]:
        """Requests per operation (plus `bytes_up` and `bytes_down`) matching `select(**where)`."""
        out: Counter[str] = Counter({op: 0 for op in OPERATIONS})
        for r in self.select(**where):  # type: ignore[arg-type]
            out[r.op] += 1
            out["bytes_up" if r.op == "put" else "bytes_down"] += r.nbytes
        return out


class CountingBucket(Bucket):
    """`inner`, with each request recorded in `log` as made by `actor` on the bucket `label`."""

    def __init__(self, inner: Bucket, log: OperationLog, *, actor: str, label: str) -> None:
        self.inner, self.log, self.actor, self.label = inner, log, actor, label
        self.name = inner.name

    def _count(self, op: str, key: str, nbytes: int = 0, count: int = 1) -> None:
        self.log.record(self.actor, self.label, op, key, nbytes, count)

    async def put(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._count("put", key, len(data))
        await self.inner.put(key, data, timeout=timeout)

    async def create(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._count("put", key, len(data))
        await self.inner.create(key, data, timeout=timeout)

    async def fetch(self, key: str, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> Blob:
        try:
            blob = await self.inner.fetch(key, max_bytes=max_bytes, timeout=timeout)
        except BaseException:
            self._count("get", key)
            raise
        self._count("get", key, len(blob.data))
        return blob

    async def get_range(self, key: str, start: int, length: int, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        self._count("get", key, length)
        return await self.inner.get_range(key, start, length, timeout=timeout)

    async def head(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> ObjectInfo:
        self._count("head", key)
        return await self.inner.head(key, timeout=timeout)

    async def list(self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT, limit: int = 100_000) -> list[ObjectInfo]:
        found = await self.inner.list(prefix, timeout=timeout, limit=limit)
        self._count("list", prefix, count=max(1, -(-len(found) // LIST_PAGE)))
        return found

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._count("delete", key)
        await self.inner.delete(key, timeout=timeout)

    async def put_file(self, key: str, path: Path, *, timeout: float | None = None) -> None:
        self._count("put", key, Path(path).stat().st_size)
        await self.inner.put_file(key, path, timeout=timeout)

    def _read_range(self, key: str, start: int, expect: ObjectInfo) -> AsyncIterator[bytes]:
        self._count("get", key, max(0, expect.size - start))
        return self.inner._read_range(key, start, expect)

    async def aclose(self) -> None:
        await self.inner.aclose()


_observers: list[Callable[[Bucket, bool], Bucket]] = []


def observed(bucket: Bucket, own: bool) -> Bucket:
    """What `templar.storage.open_bucket` returns: `bucket`, wrapped by any installed observer
    (none in a node: `counting_buckets` installs one for tests and measurements)."""
    for wrap in _observers:
        bucket = wrap(bucket, own)
    return bucket


@contextlib.contextmanager
def counting_buckets(now: Callable[[], float] = time.time) -> Iterator[OperationLog]:
    """While active, every bucket `open_bucket` opens counts its requests into the yielded log,
    attributed to the `ACTOR` of the context that opened it. For tests and measurements."""
    log = OperationLog(now=now)

    def wrap(bucket: Bucket, own: bool) -> Bucket:
        return CountingBucket(bucket, log, actor=ACTOR.get(), label=("own:" if own else "") + bucket.name)

    _observers.append(wrap)
    try:
        yield log
    finally:
        _observers.remove(wrap)
