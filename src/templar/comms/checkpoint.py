"""Checkpoints in a bucket: files, then a sha256 manifest (create-only), then `latest.json`, in that order.

A reader starts from `latest.json`, which is only written once the manifest and every file it
lists are in place, so it never sees a half-written checkpoint. Downloads are resumable (a
partial file from an interrupted run is continued), capped by the manifest's sizes and the
caller's total, and every file is sha256-verified before it is handed back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator

from templar.comms.exchange import RecordError, _Record, dump_record, parse_record, put_new
from templar.comms.keys import (
    checkpoint_file_key,
    checkpoint_manifest_key,
    checkpoint_prefix,
    latest_checkpoint_key,
)
from templar.core.clock import Now
from templar.core.config import PROTOCOL_VERSION
from templar.core.log import context
from templar.storage.base import Bucket, ObjectNotFound, ObjectTooLarge, StorageError, StorageTimeout
from templar.wire import Run

MAX_MANIFEST_BYTES = 1 << 20
MAX_META_DEPTH = 8
"""A manifest's `meta` is flat (the lead writes `global_step` and the hparams' name); 8 levels leave room."""
_NAME = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}$"
_HASH_CHUNK = 8 << 20

FileName = Annotated[str, StringConstraints(pattern=_NAME)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class CheckpointError(StorageError):
    """A checkpoint is malformed, inconsistent or fails its checksum."""


class ChecksumMismatch(CheckpointError):
    """A downloaded file's sha256 differs from the manifest's."""


class FileEntry(_Record):
    sha256: Sha256
    size: Annotated[int, Field(ge=0)]


class Manifest(_Record):
    """`v{P}/checkpoint/{window}/manifest.json`."""

    protocol: Literal[PROTOCOL_VERSION]  # type: ignore[valid-type]
    netuid: Annotated[int, Field(ge=0, le=2**16 - 1)]
    window: Annotated[int, Field(ge=0)]
    global_step: Annotated[int, Field(ge=0)]
    hparams_digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,128}$")]
    files: dict[FileName, FileEntry] = Field(min_length=1, max_length=256)
    meta: dict[str, Any]

    @field_validator("files")
    @classmethod
    def _no_manifest_name(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        if "manifest.json" in files:
            raise ValueError("a checkpoint file may not be called manifest.json")
        return files

    @field_validator("meta")
    @classmethod
    def _shallow_meta(cls, meta: dict[str, Any]) -> dict[str, Any]:
        """`meta` nests at most `MAX_META_DEPTH` levels: a manifest nested 300 deep parsed, then failed
        to serialise again once its files were downloaded (pydantic's depth limit, a ValueError no
        caller expected), and every joining node's restore stopped on it instead of taking an older
        checkpoint."""
        pending: list[tuple[Any, int]] = [(meta, 1)]
        while pending:
            value, depth = pending.pop()
            if depth > MAX_META_DEPTH:
                raise ValueError(f"meta nests deeper than {MAX_META_DEPTH} levels")
            children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            pending.extend((child, depth + 1) for child in children)
        return meta


class Latest(_Record):
    """`v{P}/checkpoint/latest.json`: the newest complete checkpoint."""

    protocol: Literal[PROTOCOL_VERSION]  # type: ignore[valid-type]
    window: Annotated[int, Field(ge=0)]


@dataclass(frozen=True)
class Checkpoint:
    """A verified local copy: `files` maps each name to its path under the download folder;
    `meta` is the saved meta dict (global_step and hparams_digest included)."""

    window: int
    global_step: int
    hparams_digest: str
    meta: dict[str, Any]
    files: dict[str, Path]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


async def save_checkpoint(bucket: Bucket, window: int, files: dict[str, Path], meta: dict[str, Any], *,
                          run: Run, timeout: float | None = None) -> Manifest:
    """Upload `files`, then the manifest, then `latest.json` (the commit point).

    `meta` must hold `global_step` (int); the rest is free-form JSON (e.g. hparams, tokens seen).
    The manifest names `run` (netuid and hparams digest). Returns the manifest written.
    """
    extra = {k: v for k, v in meta.items() if k not in {"global_step", "hparams_digest"}}
    entries = {}
    for name, path in files.items():
        digest = await asyncio.to_thread(sha256_file, Path(path))
        entries[name] = FileEntry(sha256=digest, size=Path(path).stat().st_size)
    try:
        manifest = Manifest(protocol=PROTOCOL_VERSION, netuid=run.netuid, window=window,
                            global_step=meta.get("global_step"), hparams_digest=run.digest, files=entries,
                            meta=json.loads(json.dumps(extra)))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"refusing to save an invalid checkpoint manifest: {exc}") from exc
    log = context(window=window, phase="checkpoint")
    started = time.perf_counter()
    latest = await _latest_window(bucket, timeout or 60.0)
    if latest is not None and latest >= window:
        raise CheckpointError(f"{bucket.name}: refusing to publish checkpoint {window}: checkpoint {latest} is "
                              "already published (published history is append-only; latest.json never moves back)")
    for name, path in files.items():
        await bucket.put_file(checkpoint_file_key(window, name), Path(path), timeout=timeout)
    if not await put_new(bucket, checkpoint_manifest_key(window), dump_record(manifest), timeout=timeout or 60.0):
        raise CheckpointError(f"{bucket.name}/{checkpoint_manifest_key(window)}: already published (create-only): "
                              "a checkpoint's manifest is never written over")
    await bucket.put(latest_checkpoint_key(), dump_record(Latest(protocol=PROTOCOL_VERSION, window=window)),
                     timeout=timeout or 60.0)
    total = sum(e.size for e in entries.values())
    log.info(f"checkpoint saved: {len(entries)} files, {total / 1e6:.1f} MB in "
             f"{time.perf_counter() - started:.1f}s")
    return manifest


async def _latest_window(bucket: Bucket, timeout: float) -> int | None:
    """The window `latest.json` names, None without one (an unreadable one names none either: a
    checkpoint published over it repairs the pointer)."""
    try:
        data = await bucket.get(latest_checkpoint_key(), max_bytes=4096, timeout=timeout)
        return parse_record(data, Latest, f"{bucket.name} latest.json").window
    except (ObjectNotFound, RecordError):
        return None


async def latest_checkpoint_window(bucket: Bucket, *, timeout: float = 60.0) -> int | None:
    """The window `latest.json` names; None when the bucket has none. Unlike the publisher's own
    look (`_latest_window`), a reader never takes an unreadable pointer for "no checkpoint":
    `StorageError` when it cannot be read, `CheckpointError` when it is malformed."""
    try:
        data = await bucket.get(latest_checkpoint_key(), max_bytes=4096, timeout=timeout)
    except ObjectNotFound:
        return None
    try:
        return parse_record(data, Latest, f"{bucket.name} latest.json").window
    except RecordError as exc:
        raise CheckpointError(str(exc)) from exc


async def _read_manifest(bucket: Bucket, remaining, window: int | None = None) -> Manifest | None:
    if window is None:
        try:
            data = await bucket.get(latest_checkpoint_key(), max_bytes=4096, timeout=remaining())
        except ObjectNotFound:
            return None
        try:
            window = parse_record(data, Latest, f"{bucket.name} latest.json").window
        except RecordError as exc:
            raise CheckpointError(str(exc)) from exc
    try:
        raw = await bucket.get(checkpoint_manifest_key(window), max_bytes=MAX_MANIFEST_BYTES, timeout=remaining())
        manifest: Manifest = parse_record(raw, Manifest, f"{bucket.name} manifest {window}")
    except RecordError as exc:
        raise CheckpointError(str(exc)) from exc
    if manifest.window != window:
        raise CheckpointError(f"manifest of window {window} claims window {manifest.window}")
    return manifest


async def checkpoint_windows(bucket: Bucket, *, timeout: float = 60.0) -> list[int]:
    """The windows that have a checkpoint manifest in `bucket`, newest first (one LIST)."""
    prefix = checkpoint_prefix()
    found = {int(m.group(1)) for obj in await bucket.list(prefix, timeout=timeout)
             if (m := re.fullmatch(re.escape(prefix) + r"(0|[1-9][0-9]{0,17})/manifest\.json", obj.key))}
    return sorted(found, reverse=True)


async def download_latest_checkpoint(bucket: Bucket, dest_dir: Path, *, run: Run, max_bytes: int,
                                     deadline: float, progress: bool = True,
                                     now: Now = time.time, window: int | None = None) -> Checkpoint | None:
    """Fetch the newest complete checkpoint of `run` (or the one of `window`) into
    `dest_dir/<window>/`; None if there is none. A checkpoint of another run (netuid or hparams
    digest) is a `CheckpointError`, found from its manifest before any file is fetched.

    `max_bytes` caps the checkpoint's total size (checked from the manifest before any file is
    fetched); `deadline` is unix seconds by `now` for the whole download. Files already present and
    verified are kept; a partial file resumes. Raises `ChecksumMismatch` (and deletes the bad
    file) if a download does not match its manifest entry.
    """

    def remaining() -> float:
        left = deadline - now()
        if left <= 0:
            raise StorageTimeout(f"{bucket.name}: checkpoint download deadline passed")
        return left

    try:
        manifest = await _read_manifest(bucket, remaining, window)
    except ObjectNotFound:
        if window is not None:
            return None
        # latest.json moved on and its old window was cleaned up between our two reads: once more.
        try:
            manifest = await _read_manifest(bucket, remaining)
        except ObjectNotFound as exc:
            raise CheckpointError(f"{bucket.name}: latest.json names a checkpoint with no manifest") from exc
    if manifest is None:
        return None
    if (other := run.check(manifest.netuid, manifest.hparams_digest)) is not None:
        raise CheckpointError(f"{bucket.name}: checkpoint {manifest.window} belongs to another run: {other}")
    total = sum(e.size for e in manifest.files.values())
    if total > max_bytes:
        raise ObjectTooLarge(f"{bucket.name}: checkpoint {manifest.window} is {total} bytes > cap {max_bytes}")
    log = context(window=manifest.window, phase="download")
    log.info(f"downloading checkpoint {manifest.window} (global_step {manifest.global_step}, "
             f"{total / 1e6:.1f} MB) from {bucket.name}")
    target = Path(dest_dir) / str(manifest.window)
    target.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, entry in manifest.files.items():
        path = target / name
        if not (path.exists() and path.stat().st_size == entry.size
                and await asyncio.to_thread(sha256_file, path) == entry.sha256):
            await bucket.get_file(checkpoint_file_key(manifest.window, name), path, max_bytes=entry.size,
                                  timeout=remaining(), progress=progress)
            if await asyncio.to_thread(sha256_file, path) != entry.sha256:
                path.unlink(missing_ok=True)
                raise ChecksumMismatch(f"{bucket.name}: {name} of checkpoint {manifest.window} "
                                       "does not match its manifest sha256")
        paths[name] = path
    (target / "manifest.json").write_bytes(dump_record(manifest))
    log.info(f"checkpoint {manifest.window} verified ({len(paths)} files)")
    meta = {**manifest.meta, "global_step": manifest.global_step, "hparams_digest": manifest.hparams_digest}
    return Checkpoint(window=manifest.window, global_step=manifest.global_step,
                      hparams_digest=manifest.hparams_digest, meta=meta, files=paths)


async def cleanup_checkpoints(bucket: Bucket, *, keep: int = 2, timeout: float = 60.0) -> list[int]:
    """Delete all but the `keep` newest complete checkpoints older than `latest.json`'s.

    Never touches the latest checkpoint or any window newer than it (a save in progress).
    Each old window loses its manifest first, so no manifest ever lists a deleted file.
    Returns the windows deleted.
    """
    if keep < 1:
        raise ValueError("keep must be >= 1")
    prefix = checkpoint_prefix()
    try:
        latest: Latest = parse_record(await bucket.get(latest_checkpoint_key(), max_bytes=4096,
                                                       timeout=timeout), Latest, "latest.json")
    except ObjectNotFound:
        return []
    by_window: dict[int, list[str]] = {}
    for obj in await bucket.list(prefix, timeout=timeout):
        match = re.fullmatch(re.escape(prefix) + r"(0|[1-9][0-9]*)/(.+)", obj.key)
        if match:
            by_window.setdefault(int(match.group(1)), []).append(obj.key)
    older = sorted(w for w in by_window if w <= latest.window)
    doomed = [w for w in older[:-keep] if w != latest.window]
    for w in doomed:
        keys = sorted(by_window[w], key=lambda k: not k.endswith("/manifest.json"))
        for key in keys:
            await bucket.delete(key, timeout=timeout)
    if doomed:
        context(window=latest.window, phase="checkpoint").info(f"deleted old checkpoints {doomed}")
    return doomed
