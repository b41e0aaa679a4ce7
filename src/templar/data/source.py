"""A node's way to the run's corpus: which bucket, the pinned manifest, a `PageReader`.

The one start-up check that matters is here: the manifest's sha256 must equal `data.manifest`
from hparams, and its geometry must match hparams' pages, or the node does not start (one line
saying which). A mirror (`--data.locator`) is as good as the original: the digest pins bytes,
not a location.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from templar.core.config import DEFAULT_CACHE_GB, HParams, resolve_asset
from templar.data.manifest import Manifest, ManifestError
from templar.storage import Bucket, LocalBucket, StorageError, open_bucket
from templar.storage.locator import BucketLocator

if TYPE_CHECKING:
    from templar.data.reader import PageReader

FETCH_SHARE = 0.25
"""A page fetch gives up after this share of a window (21 s on finney); the reads go on into the cache."""


def corpus_bucket(location: str, *, allow_private: bool = True) -> Bucket:
    """A read-only view of the corpus: a locator (r2:/s3:/local:) or a local folder."""
    resolved = resolve_asset(location)
    if resolved.startswith(("r2:", "s3:", "local:")):
        return open_bucket(BucketLocator.parse(resolved), allow_private=allow_private)
    if not Path(resolved).is_dir():
        raise StorageError(f"corpus folder {resolved} does not exist (run scripts/build_assets.py for the "
                           "sample corpus, or `templar data prepare`)")
    return LocalBucket(resolved)


def check_geometry(manifest: Manifest, hp: HParams) -> None:
    """The corpus must be cut the way hparams say and fit the model's vocabulary."""
    if (manifest.sequence_length, manifest.sequences_per_page) != (hp.data.sequence_length,
                                                                   hp.data.sequences_per_page):
        raise ManifestError(
            f"corpus pages are {manifest.sequences_per_page}x{manifest.sequence_length} tokens but hparams say "
            f"{hp.data.sequences_per_page}x{hp.data.sequence_length}")
    if manifest.tokenizer.vocab_size > hp.model.vocab_size:
        raise ManifestError(f"corpus tokenizer has {manifest.tokenizer.vocab_size} tokens; the model only "
                            f"{hp.model.vocab_size}")
    if manifest.num_pages < 2:
        raise ManifestError(f"corpus has {manifest.num_pages} pages; need at least 2")


async def open_reader(hp: HParams, cache_root: Path, *, locator: str | None = None, prefix: str | None = None,
                      cache_gb: float = DEFAULT_CACHE_GB, allow_private: bool = True,
                      attempts: int = 3) -> PageReader:
    """The verified corpus of this run, ready to read pages from.

    Raises `ManifestError` (unpublished, wrong, malformed or mismatched corpus), `StorageError`
    (bucket unreachable after bounded retries, and no cached manifest) or `LocatorError`.
    """
    from templar.data.reader import PageReader, load_manifest  # torch: only for a node, not `templar data`

    if not hp.data.manifest:
        raise ManifestError("this run's corpus is not published yet (hparams data.manifest is empty); "
                            "see docs/data.md")
    location = locator or hp.data.corpus
    if not location:
        raise ManifestError("no corpus location: hparams data.corpus is empty; pass --data.locator")
    prefix = hp.data.corpus_prefix if prefix is None else prefix
    cache_dir = cache_root / hp.data.manifest[:16]
    bucket = corpus_bucket(location, allow_private=allow_private)
    try:
        manifest = await load_manifest(bucket, prefix, hp.data.manifest, cache_dir, attempts=attempts)
        check_geometry(manifest, hp)
    except BaseException:
        await bucket.aclose()
        raise
    # A slow data bucket may cost a window a quarter of its length, never the whole window.
    deadline = hp.windows.window_seconds * FETCH_SHARE
    return PageReader(manifest, bucket, prefix, cache_dir, cache_bytes=int(cache_gb * (1 << 30)), deadline=deadline)
