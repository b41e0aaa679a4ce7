"""`LocalBucket`: a directory with S3 semantics, for embedded runs and tests.

Writes are atomic (temporary file in `.staging/`, fsync, rename, fsync of the directory), so a
reader sees the old object or the new one, never a torn write. An object's timestamp is its
modification time, the counterpart of S3's LastModified. Blocking file work runs in threads so
a slow disk never stalls the event loop, and every call honours its timeout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from templar.core.atomic import atomic_write
from templar.storage.base import (
    DEFAULT_TIMEOUT,
    AccessDenied,
    Blob,
    Bucket,
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectTooLarge,
    ShortRead,
    StorageError,
    StorageTimeout,
    validate_key,
    validate_prefix,
    validate_range,
)

_STAGING = ".staging"
_CHUNK = 1 << 20
T = TypeVar("T")


def _info(key: str, path: Path, st: os.stat_result | None = None) -> ObjectInfo:
    st = path.stat() if st is None else st
    if not stat.S_ISREG(st.st_mode):
        raise ObjectNotFound(key)
    return ObjectInfo(key=key, size=st.st_size, timestamp=st.st_mtime_ns / 1e9,
                      etag=f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}")


def _open_regular(key: str, path: Path) -> BinaryIO:
    """An object's file, open for reading; `ObjectNotFound` for anything but a regular file, before
    a byte is read.

    Why non-blocking: opening a FIFO planted at a key waits for a writer, in a worker thread that no
    timeout can stop; a few such reads fill asyncio's default executor (every `to_thread` of the
    node then waits) and `asyncio.run` waits for that thread forever at exit. With `O_NONBLOCK` a
    FIFO opens at once and `fstat` tells it from a file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ObjectNotFound(key)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class LocalBucket(Bucket):
    """A bucket rooted at a directory.

    `create=True` (our own bucket) creates the directory if missing; a peer's bucket is only
    ever read, and nothing is created on disk from a peer's locator. `now` (unix seconds)
    stamps each written object's modification time, so nodes on virtual time judge put windows
    by the same clock; by default the file system stamps it. It is also this "server's" time on a
    not-found (`ObjectNotFound.server_time`).
    """

    def __init__(self, root: str | Path, *, create: bool = True, now: Callable[[], float] | None = None):
        self.root = Path(root).resolve()
        self.name = f"local:{self.root}"
        self._now = now
        if create:
            (self.root / _STAGING).mkdir(parents=True, exist_ok=True)

    def _clock(self) -> float:
        """This "server's" clock: the one that stamps its objects (`now`, else the file system's)."""
        return self._now() if self._now else time.time()

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    async def _run(self, fn: Callable[[], T], key: str, timeout: float | None) -> T:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.to_thread(fn)
        except TimeoutError as exc:
            raise StorageTimeout(f"{self.name}/{key}: no answer within {timeout}s") from exc
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFound(f"{self.name}/{key}", server_time=self._clock()) from exc
        except ObjectNotFound as exc:
            raise ObjectNotFound(str(exc), server_time=self._clock()) from exc
        except PermissionError as exc:
            raise AccessDenied(f"{self.name}/{key}: {exc.strerror}") from exc
        except OSError as exc:
            raise StorageError(f"{self.name}/{key}: {type(exc).__name__}: {exc.strerror}") from exc

    # -- writes ------------------------------------------------------------------------------

    def _commit(self, key: str, write: Callable[[Path], None], *, create_only: bool = False) -> None:
        """Write via `write` to a staging file, then atomically over `key` (`templar.core.atomic`);
        `create_only`: only if `key` is not taken (`ObjectExists`)."""
        dest = self._path(key)
        staging = self.root / _STAGING
        staging.mkdir(parents=True, exist_ok=True)
        if create_only and dest.is_file():
            raise ObjectExists(f"{self.name}/{key}: already published (create-only)")
        try:
            atomic_write(dest, write, staging_dir=staging, stamp=self._now() if self._now else None,
                         create_only=create_only)
        except FileExistsError as exc:
            if create_only and dest.is_file():
                raise ObjectExists(f"{self.name}/{key}: already published (create-only)") from exc
            raise StorageError(f"{self.name}/{key}: key collides with an existing key or prefix") from exc
        except (NotADirectoryError, IsADirectoryError) as exc:
            # A directory can't also be a file: "a" and "a/b" cannot both be keys here.
            raise StorageError(f"{self.name}/{key}: key collides with an existing key or prefix") from exc

    async def put(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        validate_key(key)
        await self._run(lambda: self._commit(key, lambda p: p.write_bytes(data)), key, timeout)

    async def create(self, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        validate_key(key)
        await self._run(lambda: self._commit(key, lambda p: p.write_bytes(data), create_only=True), key, timeout)

    async def put_file(self, key: str, path: Path, *, timeout: float | None = None) -> None:
        validate_key(key)
        await self._run(lambda: self._commit(key, lambda p: shutil.copyfile(path, p)), key, timeout)

    async def delete(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        path = self._path(key)
        await self._run(lambda: path.unlink(missing_ok=True), key, timeout)

    # -- reads -------------------------------------------------------------------------------

    async def head(self, key: str, *, timeout: float = DEFAULT_TIMEOUT) -> ObjectInfo:
        path = self._path(key)
        return await self._run(lambda: _info(key, path), key, timeout)

    def _read_capped(self, key: str, max_bytes: int) -> Blob:
        path = self._path(key)
        with _open_regular(key, path) as fh:
            info = _info(key, path, os.fstat(fh.fileno()))
            if info.size > max_bytes:
                raise ObjectTooLarge(f"{self.name}/{key}: {info.size} bytes > cap {max_bytes}")
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:  # grew between stat and read
            raise ObjectTooLarge(f"{self.name}/{key}: more than {max_bytes} bytes")
        return Blob(info=ObjectInfo(key, len(data), info.timestamp, info.etag), data=data)

    async def fetch(self, key: str, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> Blob:
        validate_key(key)
        return await self._run(lambda: self._read_capped(key, max_bytes), key, timeout)

    def _read_exact(self, key: str, start: int, length: int) -> bytes:
        with _open_regular(key, self._path(key)) as fh:
            fh.seek(start)
            data = fh.read(length)
        if len(data) < length:
            raise ShortRead(f"{self.name}/{key}: range [{start}, {start + length}) past the end "
                            f"({start + len(data)} bytes)")
        return data

    async def get_range(self, key: str, start: int, length: int, *, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        validate_key(key)
        validate_range(start, length)
        return await self._run(lambda: self._read_exact(key, start, length), key, timeout)

    def _scan(self, prefix: str, limit: int) -> list[ObjectInfo]:
        # Walk only the deepest directory the prefix names, not the whole bucket.
        base_dir = (self.root / prefix).parent if prefix and not prefix.endswith("/") else self.root / prefix
        found: list[ObjectInfo] = []
        if not base_dir.is_dir():
            return found
        for dirpath, dirnames, filenames in os.walk(base_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                if name.startswith(".") or not key.startswith(prefix):
                    continue
                try:
                    found.append(_info(key, path))
                except (FileNotFoundError, ObjectNotFound):
                    continue  # deleted while listing
        found.sort(key=lambda o: o.key)
        return found[:limit]

    async def list(self, prefix: str = "", *, timeout: float = DEFAULT_TIMEOUT,
                   limit: int = 100_000) -> list[ObjectInfo]:
        validate_prefix(prefix)
        return await self._run(lambda: self._scan(prefix, limit), prefix, timeout)

    async def _read_range(self, key: str, start: int, expect: ObjectInfo) -> AsyncIterator[bytes]:
        path = self._path(key)
        try:
            fh = await asyncio.to_thread(_open_regular, key, path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, ObjectNotFound) as exc:
            raise ObjectChanged(f"{self.name}/{key}: deleted during download") from exc
        try:
            # The open handle pins this version even if the key is replaced meanwhile.
            current = _info(key, path, os.fstat(fh.fileno()))
            if (current.size, current.etag) != (expect.size, expect.etag):
                raise ObjectChanged(f"{self.name}/{key}: replaced during download")
            fh.seek(start)
            while chunk := await asyncio.to_thread(fh.read, _CHUNK):
                yield chunk
        finally:
            fh.close()
