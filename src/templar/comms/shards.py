"""Training-data shards (`*.parquet`) from a data bucket into a local corpus folder.

The folder is then read by `templar.data.PageStore.from_corpus(dest_dir, ...)`. Shards already
present with the listed size are kept, so a restart downloads only what is missing; partial
shards resume (`Bucket.get_file`).
"""

from __future__ import annotations

from pathlib import Path

from templar.log import context
from templar.storage.base import Bucket, ObjectTooLarge, validate_prefix


async def fetch_dataset_shards(bucket: Bucket, prefix: str, dest_dir: Path, *, max_bytes: int,
                               timeout: float | None = None, progress: bool = False) -> list[Path]:
    """Download every `<prefix>…/*.parquet` under `dest_dir` (relative layout kept).

    `max_bytes` caps the total size of all shards listed (checked before downloading anything);
    `timeout` bounds each shard's transfer. Returns the local paths, sorted.
    """
    validate_prefix(prefix)
    dest_dir = Path(dest_dir)
    shards = [o for o in await bucket.list(prefix) if o.key.endswith(".parquet")]
    total = sum(o.size for o in shards)
    if total > max_bytes:
        raise ObjectTooLarge(f"{bucket.name}/{prefix}: {len(shards)} shards, {total} bytes > cap {max_bytes}")
    log = context(phase="data")
    paths: list[Path] = []
    fetched = 0
    for obj in shards:
        # Keys are validated by the bucket (no '..', no leading '/'), so this stays inside dest_dir.
        local = dest_dir / obj.key[len(prefix):].lstrip("/")
        if not local.resolve().is_relative_to(dest_dir.resolve()) or local.name.startswith("."):
            raise ValueError(f"shard key {obj.key!r} would land outside {dest_dir}")
        if not (local.is_file() and local.stat().st_size == obj.size):
            await bucket.get_file(obj.key, local, max_bytes=obj.size, timeout=timeout, progress=progress)
            fetched += 1
        paths.append(local)
    log.info(f"data shards: {len(paths)} in {dest_dir} ({fetched} downloaded, {total / 1e6:.1f} MB total)")
    return sorted(paths)
