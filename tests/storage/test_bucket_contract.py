"""One contract, two implementations: LocalBucket and S3Bucket (against a real SeaweedFS)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from templar.storage import (
    Bucket,
    InvalidKey,
    ObjectExists,
    ObjectNotFound,
    ObjectTooLarge,
    ShortRead,
    StorageError,
    validate_key,
)


def test_put_get_head_overwrite_delete(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            before = time.time()
            await b.put("v1/gradient/7.safetensors", b"payload-1")
            info = await b.head("v1/gradient/7.safetensors")
            assert info.key == "v1/gradient/7.safetensors" and info.size == 9
            # S3 LastModified has 1 s resolution; local mtime is exact.
            assert before - 1.5 <= info.timestamp <= time.time() + 1.5
            assert await b.get("v1/gradient/7.safetensors", max_bytes=9) == b"payload-1"
            blob = await b.fetch("v1/gradient/7.safetensors", max_bytes=100)
            assert blob.data == b"payload-1" and blob.info.size == 9
            await b.put("v1/gradient/7.safetensors", b"second version, longer")
            assert await b.get("v1/gradient/7.safetensors", max_bytes=100) == b"second version, longer"
            assert (await b.head("v1/gradient/7.safetensors")).size == 22
            await b.delete("v1/gradient/7.safetensors")
            await b.delete("v1/gradient/7.safetensors")  # idempotent
            with pytest.raises(ObjectNotFound):
                await b.head("v1/gradient/7.safetensors")
            with pytest.raises(ObjectNotFound):
                await b.get("v1/gradient/7.safetensors", max_bytes=100)

    asyncio.run(body())


def test_create_only_never_writes_over_an_object(maker) -> None:
    """Published history is written create-only: S3's conditional PUT (`If-None-Match: *`, which the
    bundled SeaweedFS honours), a directory's exclusive create. The refusal names the object, and
    of concurrent creates of one key exactly one wins."""

    async def body() -> None:
        async with maker.open() as b:
            await b.create("v4/inputs/7.safetensors", b"first")
            with pytest.raises(ObjectExists, match=r"inputs/7\.safetensors"):
                await b.create("v4/inputs/7.safetensors", b"second")
            assert await b.get("v4/inputs/7.safetensors", max_bytes=100) == b"first"
            results = await asyncio.gather(*(b.create("v4/inputs/8.safetensors", bytes([i]) * 8) for i in range(6)),
                                           return_exceptions=True)
            assert sum(r is None for r in results) == 1, results
            assert all(isinstance(r, ObjectExists) for r in results if r is not None), results
            winner = results.index(None)
            assert await b.get("v4/inputs/8.safetensors", max_bytes=100) == bytes([winner]) * 8

    asyncio.run(body())


def test_not_found_says_when_by_the_servers_clock(maker) -> None:
    """A not-found carries the storage server's clock (S3's Date header; a directory's: the machine's),
    the clock that stamps its objects: whether an object was absent by a deadline is judged by it."""

    async def body() -> None:
        async with maker.open() as b:
            before = time.time()
            with pytest.raises(ObjectNotFound) as missing:
                await b.get("v4/inputs/9.safetensors", max_bytes=100)
            with pytest.raises(ObjectNotFound) as headless:
                await b.head("v4/inputs/9.safetensors")
            for exc in (missing.value, headless.value):
                assert exc.server_time is not None and before - 2 <= exc.server_time <= time.time() + 2

    asyncio.run(body())


def test_empty_object(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            await b.put("empty", b"")
            assert await b.get("empty", max_bytes=0) == b""
            assert (await b.head("empty")).size == 0

    asyncio.run(body())


def test_get_range_reads_exactly_the_range(maker) -> None:
    data = bytes(range(256)) * 1000

    async def body() -> None:
        async with maker.open() as b:
            await b.put("data/shard.tok", data)
            assert await b.get_range("data/shard.tok", 0, 10) == data[:10]
            assert await b.get_range("data/shard.tok", 12_345, 70_000) == data[12_345:82_345]
            assert await b.get_range("data/shard.tok", len(data) - 1, 1) == data[-1:]
            with pytest.raises(ShortRead):
                await b.get_range("data/shard.tok", len(data) - 5, 10)
            with pytest.raises(ShortRead):
                await b.get_range("data/shard.tok", len(data) + 10, 10)
            with pytest.raises(ObjectNotFound):
                await b.get_range("data/missing.tok", 0, 10)
            with pytest.raises(ValueError):
                await b.get_range("data/shard.tok", -1, 10)
            with pytest.raises(ValueError):
                await b.get_range("data/shard.tok", 0, 0)

    asyncio.run(body())


def test_byte_cap_is_enforced_before_reading(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            await b.put("big", os.urandom(10_000))
            with pytest.raises(ObjectTooLarge):
                await b.get("big", max_bytes=9_999)
            assert len(await b.get("big", max_bytes=10_000)) == 10_000

    asyncio.run(body())


def test_list_prefix_sorted_and_bounded(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            for key in ("v1/peers/10.json", "v1/peers/9.json", "v1/gradient/3.safetensors", "v2/peers/1.json"):
                await b.put(key, key.encode())
            listed = await b.list("v1/peers/")
            assert [o.key for o in listed] == ["v1/peers/10.json", "v1/peers/9.json"]
            assert [o.size for o in listed] == [16, 15]
            assert all(o.timestamp > 0 for o in listed)
            assert [o.key for o in await b.list("v1/")] == [
                "v1/gradient/3.safetensors", "v1/peers/10.json", "v1/peers/9.json"]
            assert len(await b.list("")) == 4
            assert len(await b.list("", limit=2)) == 2
            assert await b.list("v4/") == []
            assert [o.key for o in await b.list("v1/peers/1")] == ["v1/peers/10.json"]

    asyncio.run(body())


BAD_KEYS = ["", "/abs", "a/../b", "..", "a//b", "a/", ".hidden", "a/.staging/x", "sp ace", "nul\x00",
            "x" * 513, "é"]


def test_invalid_keys_rejected_before_io(maker) -> None:
    async def body() -> None:
        async with maker.open() as b:
            for key in BAD_KEYS:
                with pytest.raises(InvalidKey):
                    await b.put(key, b"x")
                with pytest.raises(InvalidKey):
                    await b.get(key, max_bytes=10)
                with pytest.raises(InvalidKey):
                    await b.head(key)
            assert await b.list("") == []

    asyncio.run(body())
    for key in BAD_KEYS:
        with pytest.raises(ValueError):  # InvalidKey is also a ValueError
            validate_key(key)


def test_concurrent_writers_never_tear(maker) -> None:
    """Readers racing writers see one whole version, never a mix (atomic put)."""
    versions = [bytes([i]) * 50_000 for i in range(6)]

    async def body() -> None:
        async with maker.open() as b:
            await b.put("obj", versions[0])

            async def reader() -> None:
                for _ in range(10):
                    data = await b.get("obj", max_bytes=60_000)
                    assert data in versions

            await asyncio.gather(*(b.put("obj", v) for v in versions[1:]), reader(), reader())

    asyncio.run(body())


def _write(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def test_put_file_get_file_and_resume(maker, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = _write(src, 3_000_000)
    dest = tmp_path / "out" / "dst.bin"

    async def body() -> None:
        async with maker.open() as b:
            await b.put_file("ckpt/model.safetensors", src)
            info = await b.get_file("ckpt/model.safetensors", dest, max_bytes=len(data))
            assert info.size == len(data) and dest.read_bytes() == data
            dest.unlink()

            # Simulate an interrupted download: the first 1 MB already on disk with its state file.
            starts: list[int] = []
            real = b._read_range

            def spy(key, start, expect):
                starts.append(start)
                return real(key, start, expect)

            b._read_range = spy  # type: ignore[method-assign]
            part = dest.with_name(dest.name + ".part")
            part.write_bytes(data[:1_000_000])
            from templar.storage.download import _version

            dest.with_name(dest.name + ".part.json").write_text(__import__("json").dumps(_version(info)))
            await b.get_file("ckpt/model.safetensors", dest, max_bytes=len(data), progress=True)
            assert starts == [1_000_000]
            assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(data).digest()
            assert not part.exists()

            # A partial file of a different version is discarded, not spliced.
            starts.clear()
            new = os.urandom(2_000_000)
            await b.put("ckpt/model.safetensors", new)
            part.write_bytes(data[:500_000])
            dest.with_name(dest.name + ".part.json").write_text(__import__("json").dumps(_version(info)))
            await b.get_file("ckpt/model.safetensors", dest, max_bytes=len(data))
            assert starts == [0] and dest.read_bytes() == new

            with pytest.raises(ObjectTooLarge):
                await b.get_file("ckpt/model.safetensors", tmp_path / "capped.bin", max_bytes=1000)
            assert not (tmp_path / "capped.bin").exists()
            with pytest.raises(ObjectNotFound):
                await b.get_file("ckpt/absent", tmp_path / "absent.bin", max_bytes=1000)

    asyncio.run(body())


def test_closed_bucket_refuses_use(maker) -> None:
    async def body() -> Bucket:
        b = maker.open()
        await b.put("k", b"v")
        await b.aclose()
        return b

    b = asyncio.run(body())
    if maker.kind == "s3":
        with pytest.raises(StorageError, match="closed"):
            asyncio.run(b.get("k", max_bytes=1))
