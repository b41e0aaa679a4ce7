"""Resumable, capped download of one object to a file (large checkpoints, data shards).

Bytes go to `<dest>.part`; a sidecar `<dest>.part.json` records which object version (size,
timestamp, etag) the partial bytes belong to. A later call continues from the partial file only
if the remote object is unchanged, so an interrupted download of a multi-GB checkpoint costs the
missing bytes, not the whole file. `dest` appears, by rename, only once complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from templar.core.atomic import fsync_dir
from templar.storage.base import (
    BucketUnreachable,
    ObjectInfo,
    ObjectTooLarge,
    StorageError,
    StorageTimeout,
)

if TYPE_CHECKING:
    from templar.storage.base import Bucket

RESUME_ATTEMPTS = 4
"""Transfers interrupted by a dropped connection are resumed in-process this many times."""


def _part_paths(dest: Path) -> tuple[Path, Path]:
    return dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")


def _version(info: ObjectInfo) -> dict[str, object]:
    return {"key": info.key, "size": info.size, "timestamp": info.timestamp, "etag": info.etag}


def _resume_offset(part: Path, state: Path, info: ObjectInfo) -> int:
    """Bytes already on disk for this exact object version, else 0 (and the stale part removed)."""
    try:
        recorded = json.loads(state.read_text())
        size = part.stat().st_size
    except (OSError, ValueError):
        recorded, size = None, 0
    if recorded == _version(info) and size <= info.size:
        return size
    part.unlink(missing_ok=True)
    return 0


def _progress_bar(label: str, total: int, done: int):
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), transient=False)
    task = progress.add_task(label, total=total, completed=done)
    return progress, task


async def _copy_range(bucket: Bucket, info: ObjectInfo, out: BinaryIO, offset: int,
                      advance) -> int:
    async with contextlib.aclosing(bucket._read_range(info.key, offset, info)) as stream:
        async for chunk in stream:
            if offset + len(chunk) > info.size:
                raise ObjectTooLarge(f"{bucket.name}/{info.key}: server sent more than the {info.size} "
                                     "bytes it announced")
            out.write(chunk)
            offset += len(chunk)
            advance(len(chunk))
    return offset


async def _transfer(bucket: Bucket, info: ObjectInfo, part: Path, offset: int, progress: bool) -> None:
    bar = _progress_bar(f"{bucket.name}/{info.key}", info.size, offset) if progress else None
    advance = (lambda n: bar[0].update(bar[1], advance=n)) if bar else (lambda n: None)
    with contextlib.ExitStack() as stack:
        if bar:
            stack.enter_context(bar[0])
        out = stack.enter_context(part.open("ab"))
        for attempt in range(RESUME_ATTEMPTS):
            try:
                offset = await _copy_range(bucket, info, out, offset, advance)
                break
            except (BucketUnreachable, StorageTimeout):
                # A dropped or stalled stream: keep what arrived and resume from there. The bytes
                # written before the drop never came back as `_copy_range`'s result, so the file's
                # own end is the offset: resuming from the old one would append them a second time.
                out.flush()
                offset = out.tell()
                if attempt == RESUME_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        out.flush()
        os.fsync(out.fileno())
    if offset != info.size:
        raise StorageError(f"{bucket.name}/{info.key}: stream ended at {offset} of {info.size} bytes")


async def download_to_file(bucket: Bucket, key: str, dest: Path, *, max_bytes: int,
                           timeout: float | None, progress: bool) -> ObjectInfo:
    """Download `key` to `dest` (see module docstring); returns the version downloaded.

    Raises `ObjectTooLarge` before transferring if the object exceeds `max_bytes`,
    `ObjectChanged` if it is replaced mid-transfer, `StorageTimeout` past `timeout` seconds.
    """
    part, state = _part_paths(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        async with asyncio.timeout(timeout):
            info = await bucket.head(key, timeout=timeout or 60.0)
            if info.size > max_bytes:
                raise ObjectTooLarge(f"{bucket.name}/{key}: {info.size} bytes > cap {max_bytes}")
            offset = _resume_offset(part, state, info)
            state.write_text(json.dumps(_version(info)))
            await _transfer(bucket, info, part, offset, progress)
    except TimeoutError as exc:
        raise StorageTimeout(f"{bucket.name}/{key}: download exceeded {timeout}s "
                             f"(partial bytes kept in {part.name})") from exc
    os.replace(part, dest)
    fsync_dir(dest.parent)
    state.unlink(missing_ok=True)
    return info
