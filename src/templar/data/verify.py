"""`templar data verify`: check every byte of a prepared corpus against its manifest.

Reads each shard in ranged chunks (never a whole multi-GB shard in memory), recomputing every
page's sha256 and the shard's; works on a local folder and on a bucket alike.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from templar.data.manifest import (
    MANIFEST_KEY,
    MAX_MANIFEST_BYTES,
    Manifest,
    ManifestError,
    page_hash,
    parse_index,
)
from templar.data.manifest import parse_manifest as _parse
from templar.storage import Bucket, StorageError

CHUNK_PAGES = 256


@dataclass
class VerifyReport:
    manifest: Manifest
    shards_ok: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


async def verify(bucket: Bucket, prefix: str = "", *, digest: str | None = None, timeout: float = 60.0,
                 progress: bool = False) -> VerifyReport:
    """Every shard and index against the manifest; the manifest against `digest` if given.

    Raises `ManifestError` when the manifest itself is unusable; shard problems are collected.
    """
    try:
        data = await bucket.get(prefix + MANIFEST_KEY, max_bytes=MAX_MANIFEST_BYTES, timeout=timeout)
    except StorageError as exc:
        raise ManifestError(f"cannot read {bucket.name}/{prefix}{MANIFEST_KEY}: {exc}") from exc
    manifest = _parse(data, expected_digest=digest)
    report = VerifyReport(manifest)
    for i, shard in enumerate(manifest.shards):
        try:
            index = await bucket.get(prefix + shard.index_key, max_bytes=shard.pages * 32, timeout=timeout)
            hashes = parse_index(index, shard)
            whole = hashlib.sha256()
            size = manifest.page_bytes
            for first in range(0, shard.pages, CHUNK_PAGES):
                n = min(CHUNK_PAGES, shard.pages - first)
                chunk = await bucket.get_range(prefix + shard.key, first * size, n * size, timeout=timeout)
                whole.update(chunk)
                view = memoryview(chunk)
                for j in range(n):
                    if page_hash(view[j * size:(j + 1) * size]) != hashes[first + j]:
                        report.problems.append(f"{shard.key}: page {first + j} does not match its hash")
            info = await bucket.head(prefix + shard.key, timeout=timeout)
            if info.size != shard.bytes:
                report.problems.append(f"{shard.key}: {info.size} bytes, manifest says {shard.bytes}")
            elif whole.hexdigest() != shard.sha256:
                report.problems.append(f"{shard.key}: sha256 does not match the manifest")
            else:
                report.shards_ok += 1
        except (StorageError, ManifestError) as exc:
            report.problems.append(f"{shard.key}: {exc}")
        if progress:
            print(f"\rverified {i + 1}/{len(manifest.shards)} shards", end="", flush=True)
    if progress:
        print()
    return report
