"""Pages on demand against a real SeaweedFS S3 server: ranged reads, verification, cache, faults."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from templar.core.config import load_hparams
from templar.data import LocalCorpus, ManifestError, PageReader, load_manifest
from templar.data.manifest import MANIFEST_KEY, Manifest, TokenizerInfo
from templar.data.prepare import Geometry, upload, write_token_corpus
from templar.data.source import open_reader
from templar.storage import S3Bucket, StorageError

GEOMETRY = Geometry(sequence_length=16, sequences_per_page=2, pages_per_shard=8)
TOKENIZER = TokenizerInfo(name="synthetic", sha256="0" * 64, vocab_size=1000, eos_id=0)
PREFIX = "corpus/"
FAST = {"get_timeout": 2.0, "attempts": 2, "backoff": 0.05}


def _corpus(out: Path, pages: int = 20) -> Manifest:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 1000, size=pages * GEOMETRY.page_tokens, dtype=np.uint16)
    step = GEOMETRY.shard_tokens
    return write_token_corpus(out, (tokens[i:i + step] for i in range(0, len(tokens), step)), GEOMETRY,
                              name="synthetic", tokenizer=TOKENIZER)


@pytest.fixture
def published(s3_maker, tmp_path: Path):
    """A 20-page, 3-shard corpus uploaded to a fresh S3 bucket; returns (maker, manifest, local copy)."""
    local = tmp_path / "local"
    manifest = _corpus(local)

    async def push() -> None:
        async with s3_maker.open() as b:
            await upload(local, b, PREFIX, manifest)

    asyncio.run(push())
    return s3_maker, manifest, LocalCorpus(local, digest=manifest.digest())


def _reader(bucket, manifest: Manifest, cache: Path, cache_bytes: int = 1 << 20, **kw) -> PageReader:
    return PageReader(manifest, bucket, PREFIX, cache, cache_bytes=cache_bytes, **{**FAST, **kw})


def test_pages_by_ranged_get_match_the_local_copy_then_come_from_cache(published, tmp_path: Path) -> None:
    maker, manifest, local = published
    assert len(manifest.shards) == 3 and manifest.num_pages == 20

    async def body() -> None:
        async with maker.open() as b:
            m = await load_manifest(b, PREFIX, manifest.digest(), tmp_path / "cache")
            reader = _reader(b, m, tmp_path / "cache", cache_bytes=4 * m.page_bytes)
            batch, pages = await reader.fetch([3, 17, 8], prefetch=[0, 1, 2, 3, 9])
            assert pages == [3, 17, 8]
            assert batch.equal(local.batch([3, 17, 8])) and batch.shape == (6, 16)
            await reader.wait_prefetched()
            assert reader.stats["remote"] == 7  # 3 fetched + 4 prefetched (page 3 was already cached)
            assert len(reader.cache) == 4 and reader.cache.size <= 4 * m.page_bytes  # LRU bound holds
            again, pages = await reader.fetch([9, 2])
            assert pages == [9, 2] and again.equal(local.batch([9, 2]))
            assert reader.stats["cached"] == 2 and reader.stats["remote"] == 7
            _, pages = await reader.fetch([20, -1, 5])  # out of range: skipped, not raised
            assert pages == [5]

    asyncio.run(body())


def test_a_corrupted_page_is_refetched_once_then_skipped(published, tmp_path: Path) -> None:
    maker, manifest, local = published
    shard = bytearray((tmp_path / "local" / manifest.shards[1].key).read_bytes())
    shard[manifest.page_bytes * 2 + 1] ^= 0x55  # global page 10

    async def body() -> None:
        async with maker.open() as b:
            await b.put(PREFIX + manifest.shards[1].key, bytes(shard))
            reader = _reader(b, manifest, tmp_path / "cache")
            batch, pages = await reader.fetch([9, 10, 11])
            assert pages == [9, 11] and batch.equal(local.batch([9, 11]))
            assert reader.stats["bad"] == 2 and reader.stats["failed"] == 1
            assert 10 not in reader.cache

    asyncio.run(body())


def test_a_corrupted_cache_file_costs_one_refetch(published, tmp_path: Path) -> None:
    maker, manifest, local = published

    async def body() -> None:
        async with maker.open() as b:
            reader = _reader(b, manifest, tmp_path / "cache")
            await reader.fetch([4])
            (tmp_path / "cache" / "pages" / "4.page").write_bytes(b"\0" * manifest.page_bytes)
            batch, pages = await reader.fetch([4])
            assert pages == [4] and batch.equal(local.page(4)) and reader.stats["remote"] == 2

    asyncio.run(body())


def test_manifest_faults_stop_the_node_with_one_line(published, tmp_path: Path) -> None:
    maker, manifest, _ = published
    good = manifest.canonical()

    async def body() -> None:
        async with maker.open() as b:
            with pytest.raises(ManifestError, match="does not match the pinned"):
                await load_manifest(b, PREFIX, "1" * 64)
            await b.put(PREFIX + MANIFEST_KEY, good[:40])  # truncated
            with pytest.raises(ManifestError, match="does not match the pinned"):
                await load_manifest(b, PREFIX, manifest.digest())
            import hashlib

            garbage = b"\x00garbage{"
            await b.put(PREFIX + MANIFEST_KEY, garbage)  # even a pinned garbage manifest is refused
            with pytest.raises(ManifestError, match="not JSON"):
                await load_manifest(b, PREFIX, hashlib.sha256(garbage).hexdigest())

    asyncio.run(body())


def test_open_reader_checks_digest_and_geometry_against_hparams(tmp_path: Path) -> None:
    hp = load_hparams("tiny")

    async def body() -> None:
        reader = await open_reader(hp, tmp_path / "cache")
        assert reader.num_pages == 5651
        assert reader.deadline == hp.windows.blocks_per_window * hp.windows.block_time / 4  # a quarter window
        await reader.aclose()
        wrong = hp.model_copy(update={"data": hp.data.model_copy(update={"manifest": "2" * 64})})
        with pytest.raises(ManifestError, match="pinned"):
            await open_reader(wrong, tmp_path / "cache2")
        unpublished = hp.model_copy(update={"data": hp.data.model_copy(update={"manifest": ""})})
        with pytest.raises(ManifestError, match="not published"):
            await open_reader(unpublished, tmp_path / "cache3")
        other = hp.model_copy(update={"data": hp.data.model_copy(update={"sequences_per_page": 8})})
        with pytest.raises(ManifestError, match="hparams say"):
            await open_reader(other, tmp_path / "cache4")

    asyncio.run(body())


def test_missing_shard_and_index_degrade_the_window(published, tmp_path: Path) -> None:
    maker, manifest, local = published

    async def body() -> None:
        async with maker.open() as b:
            await b.delete(PREFIX + manifest.shards[0].key)
            await b.delete(PREFIX + manifest.shards[2].index_key)
            reader = _reader(b, manifest, tmp_path / "cache")
            batch, pages = await reader.fetch([1, 9, 17])
            assert pages == [9] and batch.equal(local.page(9))

    asyncio.run(body())


@pytest.mark.slow(seconds=3, waits=True)
def test_a_down_bucket_is_bounded_and_the_cache_still_serves(published, dead_endpoint: str, tmp_path: Path) -> None:
    maker, manifest, local = published
    cache = tmp_path / "cache"

    async def body() -> None:
        async with maker.open() as b:
            m = await load_manifest(b, PREFIX, manifest.digest(), cache)
            reader = _reader(b, m, cache)
            await reader.fetch([2, 12])
        server = maker.make()  # same bucket name, now through an endpoint where nothing listens
        dead = S3Bucket(dead_endpoint, server.bucket, server._credentials, connect_timeout=1.0, read_timeout=1.0)
        async with dead:
            started = time.monotonic()
            with pytest.raises(StorageError):
                await load_manifest(dead, PREFIX, manifest.digest(), attempts=2)
            m = await load_manifest(dead, PREFIX, manifest.digest(), cache)  # restart while the bucket is down
            reader = _reader(dead, m, cache)
            batch, pages = await reader.fetch([2, 12, 13])
            assert pages == [2, 12] and batch.equal(local.batch([2, 12]))
            assert time.monotonic() - started < 60

    asyncio.run(body())


@pytest.mark.slow(seconds=3, waits=True)
def test_a_hanging_bucket_is_given_up_on_by_the_deadline(published, hanging, tmp_path: Path) -> None:
    maker, manifest, _ = published
    server = maker.make()

    async def body() -> None:
        async with S3Bucket(hanging.url, server.bucket, server._credentials, connect_timeout=1.0,
                            read_timeout=1.0) as slow:
            reader = _reader(slow, manifest, tmp_path / "cache", get_timeout=1.0)
            started = time.monotonic()
            batch, pages = await reader.fetch([1, 2, 3], deadline=3.0)
            assert pages == [] and batch.shape == (0, 16)
            assert time.monotonic() - started < 30  # generous: bounded, never a hang
            await reader.aclose()

    asyncio.run(body())


def test_verify_checks_every_page_in_the_bucket(published, tmp_path: Path) -> None:
    from templar.data.verify import verify

    maker, manifest, _ = published
    shard = bytearray((tmp_path / "local" / manifest.shards[2].key).read_bytes())
    shard[5] ^= 0x01  # global page 16

    async def body() -> None:
        async with maker.open() as b:
            report = await verify(b, PREFIX, digest=manifest.digest())
            assert report.ok and report.shards_ok == 3
            await b.put(PREFIX + manifest.shards[2].key, bytes(shard))
            await b.delete(PREFIX + manifest.shards[0].index_key)
            report = await verify(b, PREFIX, digest=manifest.digest())
            assert report.shards_ok == 1 and len(report.problems) == 3, report.problems
            assert any("page 0 does not match" in p for p in report.problems)
            with pytest.raises(ManifestError):
                await verify(b, PREFIX, digest="4" * 64)

    asyncio.run(body())
