"""Published history is append-only (`templar.comms.put_new`, checkpoints' latest.json)."""

from __future__ import annotations

import asyncio

import pytest

from templar.comms import CheckpointError, put_aggregate, put_new, save_checkpoint
from templar.comms.keys import aggregate_key
from templar.storage import LocalBucket
from templar.wire import Run

RUN = Run(netuid=7, digest="ab" * 32)


def test_an_object_of_a_past_window_is_never_written_over(tmp_path):
    async def scenario():
        bucket = LocalBucket(tmp_path / "lead")
        assert await put_aggregate(bucket, 3, b"first")
        assert not await put_aggregate(bucket, 3, b"second")
        assert not await put_new(bucket, aggregate_key(3), b"third")
        return await bucket.get(aggregate_key(3), max_bytes=100)

    assert asyncio.run(scenario()) == b"first"


def test_latest_json_never_moves_back(tmp_path):
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"weights")

    async def scenario():
        bucket = LocalBucket(tmp_path / "lead")
        await save_checkpoint(bucket, 8, {"model.safetensors": model}, {"global_step": 5}, run=RUN)
        with pytest.raises(CheckpointError, match="append-only"):
            await save_checkpoint(bucket, 6, {"model.safetensors": model}, {"global_step": 3}, run=RUN)
        with pytest.raises(CheckpointError, match="append-only"):
            await save_checkpoint(bucket, 8, {"model.safetensors": model}, {"global_step": 5}, run=RUN)
        await save_checkpoint(bucket, 10, {"model.safetensors": model}, {"global_step": 7}, run=RUN)

    asyncio.run(scenario())
