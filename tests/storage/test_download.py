"""The resumable download (`Bucket.get_file`) when the stream drops part-way through a transfer."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from templar.storage import LocalBucket
from templar.storage.base import BucketUnreachable, StorageTimeout
from templar.storage.download import _version

KEY = "ckpt/model.safetensors"
CHUNK = 1 << 20  # LocalBucket's read size: a drop after the first chunk has bytes on disk


def _dropping(bucket: LocalBucket, drops: list[int], error: type[Exception]) -> list[int]:
    """Make `bucket`'s streams fail once per entry of `drops`, after that many bytes of a stream were
    delivered; returns the start offsets of every stream opened."""
    real = bucket._read_range
    starts: list[int] = []

    async def flaky(key, start, expect):
        starts.append(start)
        sent, limit = 0, drops.pop(0) if drops else None
        async for chunk in real(key, start, expect):
            if limit is not None and sent + len(chunk) > limit:
                raise error("connection reset mid-stream")
            sent += len(chunk)
            yield chunk

    bucket._read_range = flaky  # type: ignore[method-assign]
    return starts


@pytest.mark.parametrize("error", [BucketUnreachable, StorageTimeout])
def test_a_stream_dropped_mid_transfer_resumes_without_splicing(tmp_path: Path, error) -> None:
    """Bytes written before a drop are on disk: the retry continues after them, so the file is the
    object, byte for byte, not the object with a stretch of it written twice."""
    data = os.urandom(3 * CHUNK + 12_345)

    async def body() -> None:
        bucket = LocalBucket(tmp_path / "b")
        await bucket.put(KEY, data)
        starts = _dropping(bucket, [CHUNK, CHUNK], error)
        dest = tmp_path / "fresh.bin"
        await bucket.get_file(KEY, dest, max_bytes=len(data))
        assert dest.read_bytes() == data
        assert starts == [0, CHUNK, 2 * CHUNK]

        # The same from a partial file a previous run left, with its version record.
        info = await bucket.head(KEY)
        dest = tmp_path / "resumed.bin"
        dest.with_name(dest.name + ".part").write_bytes(data[:1000])
        dest.with_name(dest.name + ".part.json").write_text(json.dumps(_version(info)))
        starts = _dropping(bucket, [CHUNK], error)
        await bucket.get_file(KEY, dest, max_bytes=len(data))
        assert dest.read_bytes() == data
        assert starts == [1000, 1000 + CHUNK]

    asyncio.run(body())
