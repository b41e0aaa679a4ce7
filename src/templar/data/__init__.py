"""Training data: a run's corpus as pre-tokenized shards, pages read on demand, page assignment.

    manifest  the format: manifest.json + shards/NNNNN.tok + shards/NNNNN.idx (docs/data.md)
    prepare   text → shards (`templar data prepare`), deterministic and resumable
    verify    a prepared corpus against its manifest (`templar data verify`)
    reader    PageReader: ranged GETs, per-page verification, on-disk LRU cache, prefetch
    local     LocalCorpus: the same format memory-mapped from a folder (tests, benchmarks)
    plan      PagePlan: which pages each uid trains on in each window (keyed permutation)
"""

from templar.data.local import LocalCorpus
from templar.data.manifest import Manifest, ManifestError, parse_manifest
from templar.data.plan import MAX_UIDS, PagePlan, assigned_pages, random_pages
from templar.data.reader import PageBatch, PageError, PageReader, load_manifest

__all__ = [
    "MAX_UIDS",
    "LocalCorpus",
    "Manifest",
    "ManifestError",
    "PageBatch",
    "PageError",
    "PagePlan",
    "PageReader",
    "assigned_pages",
    "load_manifest",
    "parse_manifest",
    "random_pages",
]
