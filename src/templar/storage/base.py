"""The one async `Bucket` interface, its typed errors, and key validation.

Every read of peer data is bounded twice: a byte cap checked from the object's size before the
body is read (and enforced again while streaming, since a hostile server can lie about sizes),
and a timeout that covers the whole call, retries included. Errors are typed so a caller can
tell a missing object from a slow or unreachable bucket without string matching.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

MAX_KEY_LENGTH = 512
DEFAULT_TIMEOUT = 30.0
"""Seconds for one call when the caller gives none (a generous bound, never infinite)."""

_KEY = re.compile(r"[A-Za-z0-9_.=+-]+(/[A-Za-z0-9_.=+-]+)*")


class StorageError(Exception):
    """Base of every storage failure."""


class ObjectNotFound(StorageError):
    """The key does not exist in the bucket. `server_time`: the storage server's clock when it said
    so (unix seconds; an S3 response's `Date`), None when unknown: a reader that must know whether
    an object was absent *by a deadline* judges by the clock that stamps the objects, not its own."""

    def __init__(self, message: str = "", *, server_time: float | None = None) -> None:
        super().__init__(message)
        self.server_time = server_time


class ObjectExists(StorageError):
    """A create-only write found the key taken: the object already published stays as it is (the
    message names it)."""


class ObjectTooLarge(StorageError):
    """The object is bigger than the caller's byte cap (detected before or while reading)."""


class StorageTimeout(StorageError):
    """The call did not finish within its timeout (retries included)."""


class BucketUnreachable(StorageError):
    """The bucket cannot be used: connection refused/reset, DNS, TLS, auth or no such bucket."""


class EndpointNotPublic(BucketUnreachable):
    """A peer's endpoint hostname resolved to no globally routable address, on a network whose nodes
    read peers' buckets at public addresses only (`storage.resolve.PeerResolver`)."""


class AccessDenied(BucketUnreachable):
    """The bucket answered and refused our key for this operation (HTTP 403, a wrong or revoked key,
    a key without this permission). A read-only key refused a write is the expected case."""


class ObjectChanged(StorageError):
    """The object was replaced while a ranged/resumed read was in progress."""


class ShortRead(StorageError):
    """A ranged read ended before the range did (the object is shorter than the caller expects)."""


class InvalidKey(StorageError, ValueError):
    """A key that could escape its bucket or is not in the portable key alphabet."""


def validate_key(key: str) -> str:
    """Portable keys: `[A-Za-z0-9_.=+-]` segments joined by '/', no '.'-leading segment.

    Forbidding a leading '.' in every segment rules out '.', '..' and hidden files, which keeps
    `LocalBucket`'s staging files out of the key space.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"key must be 1-{MAX_KEY_LENGTH} characters")
    if not _KEY.fullmatch(key):
        raise InvalidKey(f"key {key[:80]!r} has characters outside [A-Za-z0-9_.=+-/] or empty segments")
    if any(part.startswith(".") for part in key.split("/")):
        raise InvalidKey(f"key {key[:80]!r} has a segment starting with '.'")
    return key


def validate_range(start: int, length: int) -> None:
    """A byte range must start at or after 0 and hold at least one byte."""
    if not isinstance(start, int) or not isinstance(length, int) or start < 0 or length <= 0:
        raise ValueError(f"invalid byte range start={start!r} length={length!r}")


def validate_prefix(prefix: str) -> str:
    """A list prefix: empty, or a key optionally ending in '/'."""
    if prefix:
        validate_key(prefix.removesuffix("/"))
    return prefix


@dataclass(frozen=True)
class ObjectInfo:
    """An object's key, size in bytes and last-modified time (unix seconds, server clock)."""

    key: str
    size: int
    timestamp: float
    etag: str = ""


@dataclass(frozen=True)
class Blob:
    """An object's bytes together with the metadata of the very response that carried them."""

    info: ObjectInfo
    data: bytes


class Bucket(ABC):
    """Async object store. Implementations: `LocalBucket` (a directory) and `S3Bucket`.

    `timeout` is seconds for the whole call including retries; `max_bytes` caps every read.
    Use as `async with bucket:` or call `aclose()` when done.
    """

    name: str
    """A short human label for logs (never contains credentials)."""

    @abstractmethod
    async def put(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Store `data` under `key` atomically (a reader sees the old or the new object)."""

    @abstractmethod
    async def create(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Store `data` under `key` only if no object has that key, in one step (S3: a conditional
        PUT with `If-None-Match: *`; a directory: an exclusive create). `ObjectExists`, naming the
        object, when it has one: published history is written once and never over."""

    @abstractmethod
    async def fetch(self, key: str, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> Blob:
        """Read a whole object and the metadata of that read; `ObjectTooLarge` past `max_bytes`."""

    async def get(self, key: str, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """Read a whole object of at most `max_bytes` bytes."""
        return (await self.fetch(key, max_bytes=max_bytes, timeout=timeout)).data

    @abstractmethod
    async def get_range(self, key: str, start: int, length: int, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        """Exactly bytes `[start, start + length)` of an object (one ranged GET on S3).

        Why: a node reads one page of a multi-GB data shard without downloading the shard.
        `ShortRead` if the object ends before the range does; a server that sends more than
        `length` bytes is cut at `length` (never buffered past it).
        """

    @abstractmethod
    async def head(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> ObjectInfo:
        """Size and timestamp without the body; `ObjectNotFound` if absent."""

    @abstractmethod
    async def list(self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                   limit: int = 100_000) -> list[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key, at most `limit` of them."""

    @abstractmethod
    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Remove an object; deleting a missing key is not an error (S3 semantics)."""

    @abstractmethod
    async def put_file(self, key: str, path: Path, *, timeout: float | None = None) -> None:
        """Upload a (possibly large) file; S3 uses multipart above a threshold.

        `timeout=None` bounds each request by the connect/read timeouts only, for files whose
        transfer time the caller cannot predict.
        """

    @abstractmethod
    def _read_range(self, key: str, start: int, expect: ObjectInfo) -> AsyncIterator[bytes]:
        """Stream bytes `[start, expect.size)` of the exact version `expect` describes.

        Raises `ObjectChanged` if the object was replaced since `expect` was taken, so a resumed
        download never splices two versions. A stalled stream is bounded by the
        implementation's read timeout; the caller bounds the whole transfer. Used by `get_file`.
        """

    async def get_file(self, key: str, path: Path, *, max_bytes: int, timeout: float | None = None,
                       progress: bool = False) -> ObjectInfo:
        """Download to `path` resumably: a partial `<path>.part` from an interrupted run is
        continued when the remote object is unchanged. `path` appears only when complete.
        """
        from templar.storage.download import download_to_file

        return await download_to_file(self, key, Path(path), max_bytes=max_bytes, timeout=timeout,
                                      progress=progress)

    async def aclose(self) -> None:  # noqa: B027 - optional hook; LocalBucket holds nothing
        """Release connections; the bucket must not be used afterwards."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
