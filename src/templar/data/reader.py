"""Pages on demand: ranged GETs on the data bucket, verified, cached on disk, prefetched.

A node never downloads a shard. For each page it needs it reads `page_bytes` at the page's
offset (one ranged GET), checks the bytes against the page's sha256 from the shard's index
(itself checked against the pinned manifest), and keeps the page in a bounded LRU folder. The
miner asks for the next window's pages while it trains on this window's (`prefetch`), so they
are local before the next window starts.

Faults degrade, never crash or hang: every GET has a timeout and a few retries with backoff;
a page whose bytes do not match is fetched once more and otherwise skipped with a logged
reason; `fetch` returns the pages it could use, so a window runs on fewer pages rather than
none. Memory is the manifest (a few hundred bytes per shard), a bounded set of shard indexes
(32 bytes per page of the shards in use) and the pages of the current call: it does not grow
with the corpus.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from templar.core.log import context
from templar.data.manifest import (
    MANIFEST_KEY,
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    page_hash,
    parse_index,
    parse_manifest,
)
from templar.storage import Bucket, ObjectNotFound, StorageError

GET_TIMEOUT = 10.0
"""Seconds for one ranged GET of a page (256 KiB in production: generous even on slow links)."""
ATTEMPTS = 3
BACKOFF = 0.5
"""Seconds before the first retry; doubled each time."""
CONCURRENCY = 16
MAX_INDEXES = 64
"""Shard indexes kept in memory (32 KiB each for a 1024-page shard)."""


class PageBatch(NamedTuple):
    """What `fetch` returns: the stacked sequences of the pages it could verify, and which."""

    batch: torch.Tensor
    pages: list[int]


class PageError(Exception):
    """One page cannot be used (unreachable, or bytes that do not match the manifest)."""


def page_tensor(data: bytes | memoryview, manifest: Manifest) -> torch.Tensor:
    """A page's bytes as a [sequences_per_page, sequence_length] int64 tensor."""
    dtype = np.dtype("<u2" if manifest.dtype == "uint16" else "<u4")
    tokens = np.frombuffer(data, dtype=dtype).reshape(manifest.sequences_per_page, manifest.sequence_length)
    return torch.from_numpy(tokens.astype(np.int64))


def empty_batch(manifest: Manifest) -> torch.Tensor:
    return torch.zeros((0, manifest.sequence_length), dtype=torch.int64)


class PageCache:
    """A folder of verified pages, at most `max_bytes`, least recently used evicted first.

    Pages are re-verified when read back (a disk is not trusted more than a bucket), so a
    corrupted cache file costs one refetch, never a bad batch.
    """

    def __init__(self, root: Path, max_bytes: int):
        self.root = root
        self.max_bytes = max_bytes
        root.mkdir(parents=True, exist_ok=True)
        entries = []
        for path in root.glob("*.page"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, path.name, st.st_size))
        self._lru: OrderedDict[str, int] = OrderedDict((name, size) for _, name, size in sorted(entries))
        self.size = sum(self._lru.values())
        self._evict()

    @staticmethod
    def _name(page: int) -> str:
        return f"{page}.page"

    def get(self, page: int) -> bytes | None:
        name = self._name(page)
        if name not in self._lru:
            return None
        try:
            data = (self.root / name).read_bytes()
            os.utime(self.root / name)
        except OSError:
            self._drop(name)
            return None
        self._lru.move_to_end(name)
        return data

    def write(self, page: int, data: bytes) -> bool:
        """Write the file only (safe in a worker thread); `record` it from the owner's thread."""
        if len(data) > self.max_bytes:
            return False
        name = self._name(page)
        tmp = self.root / f".{name}.{os.getpid()}.tmp"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.root / name)
        except OSError as exc:
            context(phase="data").warning(f"page cache: cannot write page {page}: {exc}")
            tmp.unlink(missing_ok=True)
            return False
        return True

    def record(self, page: int, size: int) -> None:
        name = self._name(page)
        self.size += size - self._lru.pop(name, 0)
        self._lru[name] = size
        self._evict()

    def put(self, page: int, data: bytes) -> None:
        if self.write(page, data):
            self.record(page, len(data))

    def discard(self, page: int) -> None:
        self._drop(self._name(page))

    def _drop(self, name: str) -> None:
        self.size -= self._lru.pop(name, 0)
        (self.root / name).unlink(missing_ok=True)

    def _evict(self) -> None:
        while self.size > self.max_bytes and self._lru:
            self._drop(next(iter(self._lru)))

    def __contains__(self, page: int) -> bool:
        return self._name(page) in self._lru

    def __len__(self) -> int:
        return len(self._lru)


async def _with_retries(what: str, call, *, attempts: int = ATTEMPTS, backoff: float = BACKOFF):
    """`await call()` up to `attempts` times on storage errors (not on a missing object)."""
    delay = backoff
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except ObjectNotFound:
            raise
        except StorageError as exc:
            if attempt == attempts:
                raise
            context(phase="data").debug(f"{what}: {exc}; retry {attempt}/{attempts - 1} in {delay:.1f}s")
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


async def load_manifest(bucket: Bucket, prefix: str, digest: str, cache_dir: Path | None = None, *,
                        timeout: float = 30.0, attempts: int = ATTEMPTS) -> Manifest:
    """The corpus manifest whose sha256 is `digest`: from the cache folder if a copy is there
    (a node restarts while the bucket is down), else from the bucket with bounded retries.

    Raises `ManifestError` (wrong, truncated or garbage manifest) or `StorageError` (bucket down).
    """
    cached = cache_dir / MANIFEST_KEY if cache_dir else None
    if cached is not None and cached.is_file():
        try:
            return parse_manifest(cached.read_bytes(), expected_digest=digest)
        except ManifestError:
            cached.unlink(missing_ok=True)
    data = await _with_retries(
        "manifest", lambda: bucket.get(prefix + MANIFEST_KEY, max_bytes=MAX_MANIFEST_BYTES, timeout=timeout),
        attempts=attempts)
    manifest = parse_manifest(data, expected_digest=digest)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    return manifest


class PageReader:
    """The pages of one verified corpus, read on demand from its bucket.

    `fetch(pages)` → `PageBatch`; `prefetch(pages)` starts background reads into the cache.
    """

    def __init__(self, manifest: Manifest, bucket: Bucket, prefix: str, cache_dir: Path, *,
                 cache_bytes: int, get_timeout: float = GET_TIMEOUT, attempts: int = ATTEMPTS,
                 backoff: float = BACKOFF, concurrency: int = CONCURRENCY, deadline: float | None = None):
        self.manifest = manifest
        self.bucket = bucket
        self.prefix = prefix
        self.cache = PageCache(cache_dir / "pages", cache_bytes)
        self.index_dir = cache_dir / "index"
        self.index_dir.mkdir(parents=True, exist_ok=True)
        self.get_timeout = get_timeout
        self.attempts = attempts
        self.backoff = backoff
        self.deadline = deadline
        """Default bound of one `fetch`, seconds (None: only the per-GET timeouts and retries)."""
        self._sem = asyncio.Semaphore(concurrency)
        self._indexes: OrderedDict[int, list[bytes]] = OrderedDict()
        self._index_locks: dict[int, asyncio.Lock] = {}
        self._inflight: dict[int, asyncio.Task[bytes]] = {}
        self._prefetching: set[asyncio.Task[None]] = set()
        self.stats = {"remote": 0, "cached": 0, "bad": 0, "failed": 0}

    @property
    def num_pages(self) -> int:
        return self.manifest.num_pages

    @property
    def empty(self) -> torch.Tensor:
        """A batch of no pages ([0, sequence_length])."""
        return empty_batch(self.manifest)

    # -- indexes -------------------------------------------------------------------------------
    async def _index(self, shard: int) -> list[bytes]:
        if shard in self._indexes:
            self._indexes.move_to_end(shard)
            return self._indexes[shard]
        lock = self._index_locks.setdefault(shard, asyncio.Lock())
        async with lock:
            if shard in self._indexes:
                return self._indexes[shard]
            info = self.manifest.shards[shard]
            local = self.index_dir / f"{shard}.idx"
            hashes = None
            if local.is_file():
                try:
                    hashes = parse_index(local.read_bytes(), info)
                except ManifestError:
                    local.unlink(missing_ok=True)
            if hashes is None:
                size = info.pages * 32
                data = await _with_retries(
                    info.index_key,
                    lambda: self.bucket.get(self.prefix + info.index_key, max_bytes=size, timeout=self.get_timeout),
                    attempts=self.attempts, backoff=self.backoff)
                hashes = parse_index(data, info)  # ManifestError: a bad index poisons its shard's pages
                tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, local)
            self._indexes[shard] = hashes
            while len(self._indexes) > MAX_INDEXES:
                self._indexes.popitem(last=False)
            return hashes

    # -- one page ------------------------------------------------------------------------------
    async def _expected_hash(self, page: int) -> bytes:
        shard, offset = self.manifest.locate(page)
        return (await self._index(shard))[offset]

    async def _remote(self, page: int) -> bytes:
        shard, offset = self.manifest.locate(page)
        key = self.prefix + self.manifest.shards[shard].key
        size = self.manifest.page_bytes
        async with self._sem:
            return await _with_retries(
                f"page {page}",
                lambda: self.bucket.get_range(key, offset * size, size, timeout=self.get_timeout),
                attempts=self.attempts, backoff=self.backoff)

    async def _load(self, page: int) -> bytes:
        """Verified bytes of one page; `PageError` with the reason if it cannot be had."""
        try:
            expected = await self._expected_hash(page)
        except (StorageError, ManifestError) as exc:
            raise PageError(f"page {page}: shard index unavailable: {exc}") from exc
        cached = self.cache.get(page)
        if cached is not None:
            if page_hash(cached) == expected:
                self.stats["cached"] += 1
                return cached
            self.cache.discard(page)
        for attempt in (1, 2):  # a mismatching page is refetched once, then skipped
            try:
                data = await self._remote(page)
            except StorageError as exc:
                raise PageError(f"page {page}: {type(exc).__name__}: {exc}") from exc
            self.stats["remote"] += 1
            if page_hash(data) == expected:
                if await asyncio.to_thread(self.cache.write, page, data):
                    self.cache.record(page, len(data))  # bookkeeping stays on the event loop's thread
                return data
            self.stats["bad"] += 1
            context(phase="data").warning(f"page {page}: bytes do not match the manifest (attempt {attempt}/2)")
        raise PageError(f"page {page}: bytes do not match the manifest after a refetch; skipped")

    def _task(self, page: int) -> asyncio.Task[bytes]:
        """One shared read per page, so a prefetch and a fetch of the same page download it once."""
        task = self._inflight.get(page)
        if task is None:
            task = asyncio.ensure_future(self._load(page))
            self._inflight[page] = task
            task.add_done_callback(lambda _t, p=page: self._inflight.pop(p, None))
        return task

    # -- public --------------------------------------------------------------------------------
    async def fetch(self, pages: Iterable[int], *, prefetch: Iterable[int] = (),
                    deadline: float | None = None) -> PageBatch:
        """The verified pages among `pages`, in order, stacked; the others are skipped with a log line.

        `prefetch`: pages to read into the cache in the background afterwards (next window's).
        `deadline`: seconds after which pages still missing are given up on for this call (their
        reads go on into the cache); default: the reader's `deadline`.
        """
        wanted = list(dict.fromkeys(int(p) for p in pages))
        log = context(phase="data")
        valid = [p for p in wanted if 0 <= p < self.num_pages]
        for p in set(wanted) - set(valid):
            log.warning(f"page {p} outside the corpus [0, {self.num_pages}); skipped")
        tasks = [self._task(p) for p in valid]
        deadline = self.deadline if deadline is None else deadline
        pending: set[asyncio.Future[bytes]] = set()
        if tasks:
            _, pending = await asyncio.wait([asyncio.shield(t) for t in tasks], timeout=deadline)
        got: list[int] = []
        tensors: list[torch.Tensor] = []
        for page, task in zip(valid, tasks, strict=True):
            if not task.done():
                log.warning(f"page {page}: not ready within {deadline}s; skipped this time")
                continue
            if task.cancelled() or task.exception() is not None:
                self.stats["failed"] += 1
                log.warning(f"{task.exception() if not task.cancelled() else f'page {page}: cancelled'}")
                continue
            got.append(page)
            tensors.append(page_tensor(task.result(), self.manifest))
        for fut in pending:
            fut.cancel()  # the shield keeps the shared read going into the cache
        if len(got) < len(wanted):
            log.info(f"window degraded: {len(got)}/{len(wanted)} pages usable")
        self.prefetch(prefetch)
        batch = torch.cat(tensors) if tensors else empty_batch(self.manifest)
        return PageBatch(batch, got)

    def prefetch(self, pages: Iterable[int]) -> None:
        """Start reading `pages` into the cache in the background (errors only logged)."""
        todo = [p for p in dict.fromkeys(int(p) for p in pages)
                if 0 <= p < self.num_pages and p not in self.cache and p not in self._inflight]
        if not todo:
            return

        async def run() -> None:
            results = await asyncio.gather(*(self._task(p) for p in todo), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                context(phase="data").debug(f"prefetch: {len(failed)}/{len(todo)} pages failed: {failed[0]}")

        task = asyncio.ensure_future(run())
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)

    async def wait_prefetched(self) -> None:
        """Wait for background prefetches (tests and benchmarks)."""
        while self._prefetching:
            await asyncio.gather(*list(self._prefetching), return_exceptions=True)

    async def aclose(self) -> None:
        for task in [*self._prefetching, *self._inflight.values()]:
            task.cancel()
        await asyncio.gather(*self._prefetching, *self._inflight.values(), return_exceptions=True)
        await self.bucket.aclose()
