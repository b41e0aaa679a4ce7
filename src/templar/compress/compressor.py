"""DCT + top-k compression of one parameter (DeMo's `DCTEncode` + `TopKCompress`).

`Compressed` is the in-memory form every other module exchanges: per chunk, the `k` kept
within-chunk indices (ascending) and their coefficients. The chunking is part of it (`chunk`), so a
decoder never needs the compressor's settings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from templar.compress import native
from templar.compress.dct import ChunkedDCT, ChunkPlan, plan_chunks, topk_per_chunk
from templar.compress.select import select_topk

__all__ = ["Compressed", "DCTCompressor", "check_peers"]


@dataclass(frozen=True, eq=False)
class Compressed:
    """Top-k DCT coefficients of one parameter.

    `indices`: int64 `[n_chunks, k]`, within-chunk flat index `i*w + j`, ascending per chunk.
    `values`: float32 `[n_chunks, k]`. `shape`: the parameter's shape. `chunk`: chunk side per
    dimension (`(w,)` or `(h, w)`); chunks are numbered row-major over the chunk grid.
    """

    indices: torch.Tensor
    values: torch.Tensor
    shape: torch.Size
    chunk: tuple[int, ...]

    @property
    def plan(self) -> ChunkPlan:
        shape = torch.Size(self.shape)
        h = 1 if len(shape) == 1 else self.chunk[0]
        return ChunkPlan(shape=shape, h=h, w=self.chunk[-1])

    @property
    def k(self) -> int:
        return self.indices.shape[-1]

    @property
    def n_coefficients(self) -> int:
        return self.indices.numel()

    def to(self, device: torch.device | str) -> Compressed:
        """The same coefficients on `device` (e.g. to aggregate on the GPU)."""
        return Compressed(self.indices.to(device), self.values.to(device), self.shape, self.chunk)


def check_peers(name: str, peers: Sequence[Mapping[str, Compressed]], shape: torch.Size) -> ChunkPlan:
    """Parameter `name` as every aggregate needs it from each peer, and its chunk plan: present, of
    `shape`, chunked alike with one k, float32 values and int64 indices, each index inside its chunk.

    The aggregates add the peers' coefficients into one accumulator by index, so one index outside
    its chunk would land in a neighbour's. `templar.wire` refuses such a payload as it reads it; this
    holds every aggregate (the signed one and SparseLoCo's) to the same, whatever its caller passes.
    """
    missing = [i for i, p in enumerate(peers) if name not in p]
    if missing:
        raise ValueError(f"{name}: missing from peers {missing}")
    items = [p[name] for p in peers]
    plan = items[0].plan
    if plan.shape != shape:
        raise ValueError(f"{name}: compressed shape {tuple(plan.shape)} != expected {tuple(shape)}")
    k = items[0].k
    for c in items:
        if c.plan != plan or c.indices.shape != (plan.n_chunks, k) or c.values.shape != c.indices.shape:
            raise ValueError(f"{name}: peers disagree on chunking or k")
        if c.values.dtype != torch.float32 or c.indices.dtype != torch.int64:
            raise ValueError(f"{name}: values must be float32 and indices int64")
    # one pass over all peers: per-peer checks cost more in dispatch than in arithmetic
    indices = torch.cat([c.indices.reshape(-1) for c in items]) if len(items) > 1 else items[0].indices
    low, high = torch.aminmax(indices)
    if int(low) < 0 or int(high) >= plan.chunk_numel:
        raise ValueError(f"{name}: index outside its chunk")
    return plan


class DCTCompressor:
    """Chunked DCT-II + per-chunk top-k, with a sparse decoder.

    Args:
        target_chunk: chunk side; each dimension uses its largest divisor not above this (padded
            when that divisor is poor, see `templar.compress.dct`).
        topk: coefficients kept per chunk (clamped to the chunk size for small parameters).
        dct: the transform (and its scratch buffers); share one between compressors to share memory.
    """

    def __init__(self, target_chunk: int = 64, topk: int = 32, *, dct: ChunkedDCT | None = None) -> None:
        if target_chunk <= 0 or topk <= 0:
            raise ValueError("target_chunk and topk must be positive")
        self.target_chunk = target_chunk
        self.topk = topk
        self.dct = dct if dct is not None else ChunkedDCT()

    def plan(self, shape: torch.Size | tuple[int, ...]) -> ChunkPlan:
        return plan_chunks(shape, self.target_chunk)

    def k_for(self, plan: ChunkPlan) -> int:
        return topk_per_chunk(plan, self.topk)

    def compress(self, x: torch.Tensor) -> Compressed:
        """Keep the `topk` largest-|coefficient| DCT coefficients of every chunk of `x`."""
        plan = self.plan(x.shape)
        fused = native.compress(x.detach(), plan, self.k_for(plan))
        if fused is not None:
            return Compressed(indices=fused[0], values=fused[1], shape=torch.Size(x.shape), chunk=plan.chunk)
        with self.dct.lock:
            coef = self.dct.forward(x.detach(), plan)
            indices, values = select_topk(coef, plan, self.k_for(plan), scratch=self.dct.scratch)
        return Compressed(indices=indices, values=values, shape=torch.Size(x.shape), chunk=plan.chunk)

    def _scatter(self, c: Compressed) -> torch.Tensor:
        """Matrix-layout coefficient tensor with only `c`'s coefficients non-zero (scratch)."""
        plan = c.plan
        p_rows, p_cols = plan.padded
        coef = self.dct.scratch("sparse", p_rows * p_cols, torch.float32, c.values.device)
        coef.zero_()
        coef[plan.positions(c.indices).view(-1)] = c.values.reshape(-1).to(torch.float32)
        return coef

    def decompress(self, c: Compressed) -> torch.Tensor:
        """Dense float32 tensor of `c.shape`: a sparse inverse DCT (C kernel on CPU), else scatter
        into zeros and one batched dense inverse DCT."""
        plan = c.plan
        out = torch.empty(plan.shape, dtype=torch.float32, device=c.values.device)
        if native.decode_into(c.indices, c.values, plan, out, subtract=False):
            return out
        with self.dct.lock:
            coef = self._scatter(c)
            if plan.is_padded:
                return out.copy_(self.dct.crop(self.dct.inverse(coef, plan), plan))
            self.dct.inverse(coef, plan, out=out)
            return out

    def compress_residual_(self, e: torch.Tensor) -> Compressed:
        """`q = compress(e)`, then `e <- e - decompress(q)` in place: one step of error feedback.

        On CPU with the C kernels the sent coefficients are decoded sparsely and subtracted in
        place; otherwise it is computed as `e <- iDCT(DCT(e) with q's coefficients zeroed)`, which
        equals the definition (the transform is orthonormal). `e` must be contiguous float32.
        """
        if e.dtype != torch.float32 or not e.is_contiguous():
            raise ValueError("error-feedback buffers must be contiguous float32")
        plan = self.plan(e.shape)
        fused = native.compress(e, plan, self.k_for(plan))
        if fused is not None and native.decode_into(*fused, plan, e, subtract=True):
            return Compressed(indices=fused[0], values=fused[1], shape=torch.Size(e.shape), chunk=plan.chunk)
        with self.dct.lock:
            coef = self.dct.forward(e, plan)
            indices, values = select_topk(coef, plan, self.k_for(plan), scratch=self.dct.scratch)
            if native.decode_into(indices, values, plan, e, subtract=True):
                return Compressed(indices=indices, values=values, shape=torch.Size(e.shape), chunk=plan.chunk)
            coef[plan.positions(indices).view(-1)] = 0.0
            if plan.is_padded:
                e.copy_(self.dct.crop(self.dct.inverse(coef, plan), plan))
            else:
                self.dct.inverse(coef, plan, out=e)
        return Compressed(indices=indices, values=values, shape=torch.Size(e.shape), chunk=plan.chunk)

    def subtract_(self, target: torch.Tensor, c: Compressed) -> torch.Tensor:
        """`target -= decompress(c)` in place, without allocating the decoded tensor."""
        plan = c.plan
        if target.shape != plan.shape:
            raise ValueError(f"target shape {tuple(target.shape)} != compressed shape {tuple(plan.shape)}")
        if native.decode_into(c.indices, c.values, plan, target, subtract=True):
            return target
        with self.dct.lock:
            decoded = self.dct.crop(self.dct.inverse(self._scatter(c), plan), plan)
            return target.sub_(decoded)
