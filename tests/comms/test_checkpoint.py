"""Checkpoints: commit order, verification, resume, caps and cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from templar.comms import (
    CheckpointError,
    ChecksumMismatch,
    cleanup_checkpoints,
    download_latest_checkpoint,
    save_checkpoint,
)
from templar.comms.keys import checkpoint_file_key, checkpoint_manifest_key, latest_checkpoint_key
from templar.core.config import PROTOCOL_VERSION
from templar.storage import ObjectTooLarge
from templar.wire import Run

DIGEST = "ab" * 32
RUN = Run(netuid=7, digest=DIGEST)


def files(tmp: Path, window: int, size: int = 300_000) -> dict[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ("model.safetensors", "optimizer.safetensors"):
        path = tmp / f"{window}-{name}"
        path.write_bytes(os.urandom(size))
        out[name] = path
    return out


def meta(step: int) -> dict:
    return {"global_step": step, "hparams_digest": DIGEST, "hparams": {"name": "tiny"}}


def test_save_then_download_verified(maker, tmp_path: Path) -> None:
    src = files(tmp_path / "src", 40)

    async def body() -> None:
        async with maker.open() as b:
            assert await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                    deadline=time.time() + 30) is None
            manifest = await save_checkpoint(b, 40, src, meta(17), run=RUN)
            assert manifest.global_step == 17 and set(manifest.files) == set(src)
            ckpt = await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                    deadline=time.time() + 30, progress=True)
            assert ckpt is not None and ckpt.window == 40 and ckpt.global_step == 17
            assert ckpt.hparams_digest == DIGEST and ckpt.meta == meta(17)
            for name, path in ckpt.files.items():
                assert path.read_bytes() == src[name].read_bytes()
                assert path.parent == tmp_path / "dl" / "40"
            with pytest.raises(ObjectTooLarge):
                await download_latest_checkpoint(b, tmp_path / "dl2", run=RUN, max_bytes=500_000,
                                                 deadline=time.time() + 30)

    asyncio.run(body())


def test_reader_never_sees_half_written_checkpoint(maker, tmp_path: Path) -> None:
    """Files and even the manifest of window 50 are up but latest.json is not: readers get 40."""
    old, new = files(tmp_path / "old", 40), files(tmp_path / "new", 50)

    async def body() -> None:
        async with maker.open() as b:
            await save_checkpoint(b, 40, old, meta(1), run=RUN)
            for name, path in new.items():  # a crash after the uploads, before latest.json
                await b.put_file(checkpoint_file_key(50, name), path)
            await b.put(checkpoint_manifest_key(50), b'{"half": true}')
            ckpt = await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                    deadline=time.time() + 30)
            assert ckpt is not None and ckpt.window == 40
            assert ckpt.files["model.safetensors"].read_bytes() == old["model.safetensors"].read_bytes()

    asyncio.run(body())


def test_corrupted_file_is_rejected_and_deleted(maker, tmp_path: Path) -> None:
    src = files(tmp_path / "src", 40)

    async def body() -> None:
        async with maker.open() as b:
            await save_checkpoint(b, 40, src, meta(1), run=RUN)
            await b.put(checkpoint_file_key(40, "model.safetensors"), os.urandom(300_000))  # same size
            with pytest.raises(ChecksumMismatch):
                await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                 deadline=time.time() + 30)
            assert not (tmp_path / "dl" / "40" / "model.safetensors").exists()
            await b.put(checkpoint_file_key(40, "model.safetensors"), b"short")  # size mismatch
            with pytest.raises(ChecksumMismatch):
                await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                 deadline=time.time() + 30)
            await b.put(checkpoint_file_key(40, "model.safetensors"), os.urandom(400_000))  # too big
            with pytest.raises(ObjectTooLarge):
                await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                 deadline=time.time() + 30)

    asyncio.run(body())


@pytest.mark.parametrize("latest, manifest", [
    (b"{", None),
    (b'{"protocol": 1, "window": "40"}', None),
    (b'{"protocol": 1, "window": 40}', b'{"protocol": 1}'),
    (b'{"protocol": 1, "window": 40}', json.dumps({
        "protocol": PROTOCOL_VERSION, "netuid": 7, "window": 41, "global_step": 1, "hparams_digest": DIGEST, "meta": {},
        "files": {"m": {"sha256": "0" * 64, "size": 1}}}).encode()),
    (b'{"protocol": 1, "window": 40}', json.dumps({
        "protocol": 1, "window": 40, "global_step": 1, "hparams_digest": DIGEST, "meta": {},
        "files": {"../../etc/passwd": {"sha256": "0" * 64, "size": 1}}}).encode()),
    (b'{"protocol": 1, "window": 40}', None),  # manifest missing entirely
])
def test_malformed_pointers_raise_checkpoint_error(tmp_path: Path, latest: bytes, manifest: bytes | None) -> None:
    from templar.storage import LocalBucket

    async def body() -> None:
        b = LocalBucket(tmp_path / "b")
        await b.put(latest_checkpoint_key(), latest)
        if manifest is not None:
            await b.put(checkpoint_manifest_key(40), manifest)
        with pytest.raises(CheckpointError):
            await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9, deadline=time.time() + 30)
        assert not list(tmp_path.rglob("passwd"))

    asyncio.run(body())


def test_a_manifest_nested_too_deep_is_a_checkpoint_error_not_a_crash(tmp_path: Path) -> None:
    """A manifest whose `meta` nested 300 levels parsed, and its files downloaded and verified, but writing it
    beside them failed in pydantic's serialiser (a ValueError): every joining node's restore stopped on it."""
    import hashlib

    from templar.storage import LocalBucket

    nested: dict = {}
    for _ in range(300):
        nested = {"a": nested}

    async def body() -> None:
        b = LocalBucket(tmp_path / "b")
        await b.put(checkpoint_file_key(40, "m"), b"x")
        await b.put(checkpoint_manifest_key(40), json.dumps({
            "protocol": PROTOCOL_VERSION, "netuid": RUN.netuid, "window": 40, "global_step": 1,
            "hparams_digest": RUN.digest, "meta": nested,
            "files": {"m": {"sha256": hashlib.sha256(b"x").hexdigest(), "size": 1}}}).encode())
        await b.put(latest_checkpoint_key(), json.dumps({"protocol": PROTOCOL_VERSION, "window": 40}).encode())
        with pytest.raises(CheckpointError, match="meta nests deeper"):
            await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9, deadline=time.time() + 30)

    asyncio.run(body())


def test_interrupted_download_resumes(maker, tmp_path: Path) -> None:
    src = files(tmp_path / "src", 40, size=2_000_000)

    async def body() -> None:
        async with maker.open() as b:
            await save_checkpoint(b, 40, src, meta(3), run=RUN)
            # What an interrupted get_file leaves behind: a partial file and its version record.
            info = await b.head(checkpoint_file_key(40, "model.safetensors"))
            target = tmp_path / "dl" / "40"
            target.mkdir(parents=True)
            (target / "model.safetensors.part").write_bytes(src["model.safetensors"].read_bytes()[:700_000])
            (target / "model.safetensors.part.json").write_text(json.dumps(
                {"key": info.key, "size": info.size, "timestamp": info.timestamp, "etag": info.etag}))
            starts: list[int] = []
            real = b._read_range

            def spy(key, start, expect):
                starts.append(start)
                return real(key, start, expect)

            b._read_range = spy  # type: ignore[method-assign]
            ckpt = await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                    deadline=time.time() + 30)
            assert ckpt is not None
            assert sorted(starts) == [0, 700_000]
            assert ckpt.files["model.safetensors"].read_bytes() == src["model.safetensors"].read_bytes()
            starts.clear()
            again = await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                     deadline=time.time() + 30)
            assert again is not None and starts == []  # verified local copies are reused

    asyncio.run(body())


def test_cleanup_keeps_newest_and_latest(maker, tmp_path: Path) -> None:
    async def body() -> None:
        async with maker.open() as b:
            for w in (10, 20, 30, 40):
                await save_checkpoint(b, w, files(tmp_path / str(w), w, size=1000), meta(w), run=RUN)
            # An in-progress save newer than latest.json must survive cleanup.
            await b.put(checkpoint_file_key(50, "model.safetensors"), b"in progress")
            deleted = await cleanup_checkpoints(b, keep=2)
            assert deleted == [10, 20]
            keys = {o.key for o in await b.list(f"v{PROTOCOL_VERSION}/checkpoint/")}
            windows = {k.split("/")[2] for k in keys}
            assert windows == {"30", "40", "50", "latest.json"}
            ckpt = await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                    deadline=time.time() + 30)
            assert ckpt is not None and ckpt.window == 40
            assert await cleanup_checkpoints(b, keep=2) == []

    asyncio.run(body())


def test_save_refuses_bad_meta(tmp_path: Path) -> None:
    from templar.storage import LocalBucket

    async def body() -> None:
        b = LocalBucket(tmp_path / "b")
        src = files(tmp_path / "src", 1, size=10)
        with pytest.raises(CheckpointError):
            await save_checkpoint(b, 1, src, {"hparams_digest": DIGEST}, run=RUN)  # no global_step
        with pytest.raises(CheckpointError):
            await save_checkpoint(b, 1, {"../x": src["model.safetensors"]}, meta(1), run=RUN)
        with pytest.raises(CheckpointError):
            await save_checkpoint(b, 1, src, {**meta(1), "bad": object()}, run=RUN)
        assert await b.list("") == []

    asyncio.run(body())


def test_a_checkpoint_of_another_run_is_refused_before_download(maker, tmp_path):
    src = files(tmp_path / "src", 40)

    async def scenario():
        async with maker.open() as b:
            await save_checkpoint(b, 40, src, meta(1), run=Run(netuid=8, digest=DIGEST))
            with pytest.raises(CheckpointError, match="another run"):
                await download_latest_checkpoint(b, tmp_path / "dl", run=RUN, max_bytes=10**9,
                                                 deadline=time.time() + 30)
            assert not (tmp_path / "dl" / "40" / "model.safetensors").exists()

    asyncio.run(scenario())
