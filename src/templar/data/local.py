"""A prepared corpus in a local folder, memory-mapped: tests, benchmarks and offline tools.

Nodes read pages through `PageReader` (any bucket, cached, prefetched); this is the synchronous
view of the same format for code that holds the folder itself. Every page is checked against
its index on read, like the reader does.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from templar.data.manifest import MANIFEST_KEY, Manifest, page_hash, parse_index, parse_manifest
from templar.data.reader import PageError, empty_batch, page_tensor


class LocalCorpus:
    """`page(i)` is a [sequences_per_page, sequence_length] tensor; `batch(pages)` stacks pages."""

    def __init__(self, root: str | Path, *, digest: str | None = None):
        self.root = Path(root)
        self.manifest: Manifest = parse_manifest((self.root / MANIFEST_KEY).read_bytes(), expected_digest=digest)
        self._maps: dict[int, np.memmap] = {}
        self._hashes: dict[int, list[bytes]] = {}

    @property
    def num_pages(self) -> int:
        return self.manifest.num_pages

    @property
    def sequence_length(self) -> int:
        return self.manifest.sequence_length

    @property
    def sequences_per_page(self) -> int:
        return self.manifest.sequences_per_page

    def page_bytes(self, index: int) -> memoryview:
        shard, offset = self.manifest.locate(index)
        if shard not in self._maps:
            info = self.manifest.shards[shard]
            self._hashes[shard] = parse_index((self.root / info.index_key).read_bytes(), info)
            self._maps[shard] = np.memmap(self.root / info.key, dtype=np.uint8, mode="r", shape=(info.bytes,))
        size = self.manifest.page_bytes
        data = memoryview(self._maps[shard])[offset * size:(offset + 1) * size]
        if page_hash(data) != self._hashes[shard][offset]:
            raise PageError(f"page {index}: bytes do not match the manifest")
        return data

    def page(self, index: int) -> torch.Tensor:
        return page_tensor(self.page_bytes(index), self.manifest)

    def batch(self, pages: Iterable[int]) -> torch.Tensor:
        tensors = [self.page(i) for i in pages]
        return torch.cat(tensors) if tensors else empty_batch(self.manifest)
