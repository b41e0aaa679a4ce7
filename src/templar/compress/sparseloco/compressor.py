"""SparseLoCo's compression of one parameter: per-chunk top-k of the values themselves (no
transform), each kept value on the 2-bit grid of `templar.compress.sparseloco.grid`.

The chunks, the index layout and `Compressed` are DeMo's (`templar.compress.dct.plan_chunks`,
`topk_per_chunk`, `select_topk`): the k largest |value| of every chunk, ties towards the lower
within-chunk index, indices ascending; only the values differ (sign × one magnitude per chunk
instead of a DCT coefficient). Without a transform, a value's "coefficient" is the sample itself,
so the matrix layout of an unpadded parameter is the parameter, and selection reads it in place.
"""

from __future__ import annotations

import torch

from templar.compress.compressor import Compressed
from templar.compress.dct import ChunkPlan, plan_chunks, topk_per_chunk
from templar.compress.select import select_topk
from templar.compress.sparseloco.grid import quantise

__all__ = ["SparseLoCoCompressor"]


def _real_positions(plan: ChunkPlan, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Flat row-major positions in the unpadded parameter of within-chunk `indices`, and which of
    them are real (None when the plan has no padding: all are)."""
    positions = plan.positions(indices).view(-1)
    if not plan.is_padded:
        return positions, None
    p_cols = plan.padded[1]
    row, col = torch.div(positions, p_cols, rounding_mode="floor"), positions % p_cols
    real = (row < plan.rows) & (col < plan.cols)
    return row * plan.cols + col, real


class SparseLoCoCompressor:
    """Chunked top-k with 2-bit values; the interface of `DCTCompressor`, so `DeMo` runs it as is.

    Args:
        target_chunk: chunk side, as for DeMo (`plan_chunks`).
        topk: values kept per chunk (clamped to the chunk size for small parameters).
    """

    def __init__(self, target_chunk: int = 64, topk: int = 64) -> None:
        if target_chunk <= 0 or topk <= 0:
            raise ValueError("target_chunk and topk must be positive")
        self.target_chunk = target_chunk
        self.topk = topk

    def plan(self, shape: torch.Size | tuple[int, ...]) -> ChunkPlan:
        return plan_chunks(shape, self.target_chunk)

    def k_for(self, plan: ChunkPlan) -> int:
        return topk_per_chunk(plan, self.topk)

    def _select(self, x: torch.Tensor, plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k of every chunk of `x` (float32, `plan.shape`), read in place where possible.

        The selection reads the padded matrix. Without padding that is `x` itself; with padding of
        the rows only (a prime vocabulary), only the last chunk row is copied and padded: chunk rows
        are selected independently and numbered in order, so the two parts concatenate.
        """
        k = self.k_for(plan)
        matrix = x.reshape(plan.rows, plan.cols)
        if not plan.is_padded:
            return select_topk(matrix.reshape(-1), plan, k)
        p_rows, p_cols = plan.padded
        full = 0 if p_cols != plan.cols else (plan.grid[0] - 1) * plan.h  # rows selected in place
        padded = torch.zeros(p_rows - full, p_cols, dtype=torch.float32, device=x.device)
        padded[: plan.rows - full, : plan.cols] = matrix[full:]
        tail = select_topk(padded.view(-1), ChunkPlan(torch.Size(padded.shape), plan.h, plan.w), k)
        if full == 0:
            return tail
        head = select_topk(matrix[:full].reshape(-1), ChunkPlan(torch.Size((full, plan.cols)), plan.h, plan.w), k)
        return torch.cat([head[0], tail[0]]), torch.cat([head[1], tail[1]])

    def compress(self, x: torch.Tensor) -> Compressed:
        """The `topk` largest-|value| entries of every chunk of `x`, quantised to the 2-bit grid.
        ValueError when a kept value is not finite (NaN and ±inf rank above every finite value,
        so any non-finite entry of `x` is kept and refused)."""
        plan = self.plan(x.shape)
        x = x.detach().to(torch.float32).contiguous()
        indices, values = self._select(x, plan)
        return Compressed(indices=indices, values=quantise(values), shape=torch.Size(x.shape), chunk=plan.chunk)

    def decompress(self, c: Compressed) -> torch.Tensor:
        """Dense float32 tensor of `c.shape`: zeros, with `c`'s values at their positions."""
        plan = c.plan
        out = torch.zeros(plan.shape, dtype=torch.float32, device=c.values.device)
        positions, real = _real_positions(plan, c.indices)
        values = c.values.reshape(-1).to(torch.float32)
        if real is not None:
            positions, values = positions[real], values[real]
        out.view(-1)[positions] = values
        return out

    def subtract_(self, target: torch.Tensor, c: Compressed) -> torch.Tensor:
        """`target -= decompress(c)` in place, touching only the kept positions."""
        plan = c.plan
        if target.shape != plan.shape:
            raise ValueError(f"target shape {tuple(target.shape)} != compressed shape {tuple(plan.shape)}")
        if not target.is_contiguous():
            raise ValueError("target must be contiguous")
        positions, real = _real_positions(plan, c.indices)
        values = c.values.reshape(-1).to(device=target.device, dtype=target.dtype)
        if real is not None:
            positions, values = positions[real], values[real]
        target.view(-1).index_add_(0, positions, values, alpha=-1)  # unique positions: one rounding each
        return target

    def compress_residual_(self, e: torch.Tensor) -> Compressed:
        """`q = compress(e)`, then `e <- e - decompress(q)` in place: one step of error feedback.

        What stays in `e` is everything not sent, the quantisation error of the sent values
        included, so `e_before == e_after + decompress(q)` up to one float32 rounding per kept
        position. `e` must be contiguous float32; on ValueError (non-finite values) it is untouched.
        """
        if e.dtype != torch.float32 or not e.is_contiguous():
            raise ValueError("error-feedback buffers must be contiguous float32")
        q = self.compress(e)
        self.subtract_(e, q)
        return q
