"""Data shards from S3 into a local corpus that PageStore reads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from templar.comms import fetch_dataset_shards
from templar.config import REPO_ROOT
from templar.data import PageStore
from templar.storage import ObjectTooLarge

TOKENIZER = REPO_ROOT / "assets" / "tokenizer"


def _shard(path: Path, docs: list[str]) -> bytes:
    pq.write_table(pa.table({"text": docs}), path)
    return path.read_bytes()


def test_fetch_shards_then_build_pages(s3_maker, tmp_path: Path) -> None:
    docs = [f"Document number {i} talks about windows, buckets and gradients. " * 20 for i in range(40)]
    shard_a = _shard(tmp_path / "a.parquet", docs[:20])
    shard_b = _shard(tmp_path / "b.parquet", docs[20:])
    dest = tmp_path / "corpus"

    async def body() -> None:
        async with s3_maker.open() as b:
            await b.put("data/train/a.parquet", shard_a)
            await b.put("data/train/sub/b.parquet", shard_b)
            await b.put("data/train/README.txt", b"not a shard")
            paths = await fetch_dataset_shards(b, "data/train/", dest, max_bytes=10**7)
            assert paths == [dest / "a.parquet", dest / "sub" / "b.parquet"]
            assert paths[0].read_bytes() == shard_a
            mtimes = [p.stat().st_mtime_ns for p in paths]
            again = await fetch_dataset_shards(b, "data/train/", dest, max_bytes=10**7)
            assert again == paths and [p.stat().st_mtime_ns for p in again] == mtimes  # not re-downloaded
            with pytest.raises(ObjectTooLarge):
                await fetch_dataset_shards(b, "data/train/", tmp_path / "other", max_bytes=100)

    asyncio.run(body())
    assert not (dest / "README.txt").exists()
    store = PageStore.from_corpus(dest, TOKENIZER, text_field="text", sequence_length=32, sequences_per_page=2)
    assert store.num_pages > 10
    assert tuple(store.page(0).shape) == (2, 32)
