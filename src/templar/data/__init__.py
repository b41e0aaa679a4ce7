"""Training data: a run's corpus as pre-tokenized shards, pages read on demand, page assignment.

    manifest  the format: manifest.json + shards/NNNNN.tok + shards/NNNNN.idx (docs/data.md)
    prepare   text → shards (`templar data prepare`), deterministic and resumable
    verify    a prepared corpus against its manifest (`templar data verify`)
    reader    PageReader: ranged GETs, per-page verification, on-disk LRU cache, prefetch
    local     LocalCorpus: the same format memory-mapped from a folder (tests, benchmarks)
    plan      PagePlan: which pages each uid trains on in each window (keyed permutation)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from templar.data.manifest import Manifest, ManifestError, parse_manifest
from templar.data.plan import MAX_UIDS, PagePlan, assigned_pages, random_pages

if TYPE_CHECKING:
    from templar.data.local import LocalCorpus
    from templar.data.reader import PageBatch, PageError, PageReader, load_manifest

_TORCH_NAMES = {"LocalCorpus": "templar.data.local", "PageBatch": "templar.data.reader",
                "PageError": "templar.data.reader", "PageReader": "templar.data.reader",
                "load_manifest": "templar.data.reader"}
"""Names that need torch, imported on first use: the format, the plan and `templar data` commands
that only read and write files (`prepare`'s upload, `pin`, `verify`) start without it."""


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        return getattr(importlib.import_module(_TORCH_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
