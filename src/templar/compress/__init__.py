"""DeMo compression: chunked DCT + top-k, error feedback, and the deterministic signed aggregate.

Pure tensor maths, no I/O (see docs/design.md §7 and Algorithm 2 of the paper). The byte format
of a compressed gradient lives in `templar.wire`.
"""

from templar.compress.aggregate import aggregate, apply_signed_update
from templar.compress.compressor import Compressed, DCTCompressor
from templar.compress.dct import ChunkedDCT, ChunkPlan, chunk_side, dct_basis, plan_chunks, topk_per_chunk
from templar.compress.demo import DeMo
from templar.compress.select import select_topk

__all__ = [
    "ChunkPlan",
    "ChunkedDCT",
    "Compressed",
    "DCTCompressor",
    "DeMo",
    "aggregate",
    "apply_signed_update",
    "chunk_side",
    "dct_basis",
    "plan_chunks",
    "select_topk",
    "topk_per_chunk",
]
