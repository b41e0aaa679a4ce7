"""Chunked, separable, orthonormal DCT-II over 1-D and 2-D parameters.

Every parameter is viewed as a matrix (a 1-D tensor is one row) cut into equal `h x w` chunks.
Coefficients are kept in *matrix layout*: the coefficient (i, j) of chunk (r, c) sits where the
sample (r*h + i, c*w + j) sat. In that layout both passes of the transform are plain GEMMs over
the whole tensor (no permutes, no per-chunk einsum): `A = X_rows @ C_w^T` on rows of `w`, then
`C_h @ A` batched over the `R` chunk rows. The inverse is the same with transposed bases.

Chunk sides follow docs/design.md §7: the largest divisor of the dimension not above
`target_chunk`. When that divisor is poor (below `target_chunk / 2`, e.g. 29 for the GPT-2 vocab
50257, or 1 for the prime 32003) the dimension is instead split into `ceil(n / target)` equal chunks
and zero-padded by fewer than one sample per chunk; decoders crop the padding away.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["ChunkPlan", "ChunkedDCT", "chunk_side", "dct_basis", "plan_chunks"]


def chunk_side(n: int, target_chunk: int) -> int:
    """Chunk length for a dimension of `n` (see the module docstring for the padding rule)."""
    if n <= 0 or target_chunk <= 0:
        raise ValueError(f"dimension {n} and target_chunk {target_chunk} must be positive")
    if n <= target_chunk:
        return n
    divisor = max(d for d in range(1, target_chunk + 1) if n % d == 0)
    if 2 * divisor >= target_chunk:
        return divisor
    pieces = math.ceil(n / target_chunk)
    return math.ceil(n / pieces)


@dataclass(frozen=True)
class ChunkPlan:
    """How one parameter is chunked: original shape, chunk sides (h, w) and chunk grid (R, C)."""

    shape: torch.Size
    h: int
    w: int

    @property
    def rows(self) -> int:
        return 1 if len(self.shape) == 1 else self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def grid(self) -> tuple[int, int]:
        return math.ceil(self.rows / self.h), math.ceil(self.cols / self.w)

    @property
    def padded(self) -> tuple[int, int]:
        r, c = self.grid
        return r * self.h, c * self.w

    @property
    def is_padded(self) -> bool:
        return self.padded != (self.rows, self.cols)

    @property
    def n_chunks(self) -> int:
        r, c = self.grid
        return r * c

    @property
    def chunk_numel(self) -> int:
        return self.h * self.w

    @property
    def chunk(self) -> tuple[int, ...]:
        """Chunk sides per dimension of the original tensor ((w,) for 1-D, (h, w) for 2-D)."""
        return (self.w,) if len(self.shape) == 1 else (self.h, self.w)

    def positions(self, indices: torch.Tensor) -> torch.Tensor:
        """Flat matrix-layout positions of within-chunk indices `[..., n_chunks, k]` (int64)."""
        base, offsets = _position_tables(self.h, self.w, self.grid, indices.device)
        return base[:, None] + offsets[indices]

    def chunk_positions(self, chunks: torch.Tensor) -> torch.Tensor:
        """Positions of every coefficient of the given chunks, `[len(chunks), chunk_numel]`."""
        base, offsets = _position_tables(self.h, self.w, self.grid, chunks.device)
        return base[chunks][:, None] + offsets[None, :]

    def chunk_origins(self, device: torch.device) -> torch.Tensor:
        """Position of each chunk's (0, 0) coefficient, `[n_chunks]` (int64, cached)."""
        return _position_tables(self.h, self.w, self.grid, device)[0]


@lru_cache(maxsize=256)
def _position_tables(h: int, w: int, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per chunk the position of its (0, 0) sample; per within-chunk index its offset from there."""
    row_stride = grid[1] * w
    chunk = torch.arange(grid[0] * grid[1], dtype=torch.int64)
    base = (chunk // grid[1]) * h * row_stride + (chunk % grid[1]) * w
    within = torch.arange(h * w, dtype=torch.int64)
    offsets = (within // w) * row_stride + within % w
    return base.to(device), offsets.to(device)


def plan_chunks(shape: torch.Size | tuple[int, ...], target_chunk: int) -> ChunkPlan:
    """The chunk plan of a 1-D or 2-D parameter."""
    shape = torch.Size(shape)
    if len(shape) not in (1, 2) or any(n <= 0 for n in shape):
        raise ValueError(f"only non-empty 1-D and 2-D parameters are chunked, got shape {tuple(shape)}")
    h = 1 if len(shape) == 1 else chunk_side(shape[0], target_chunk)
    return ChunkPlan(shape=shape, h=h, w=chunk_side(shape[-1], target_chunk))


def topk_per_chunk(plan: ChunkPlan, topk: int) -> int:
    """Coefficients kept per chunk: `topk`, clamped to the chunk's size for small parameters.
    With `plan_chunks`, the one rule that fixes a payload's layout for compressor and wire alike."""
    return min(topk, plan.chunk_numel)


@lru_cache(maxsize=64)
def _basis_cpu(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[0] *= 1.0 / math.sqrt(2.0)
    return basis.to(torch.float32).contiguous()


def dct_basis(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Orthonormal DCT-II matrix `D` (`D[k, i]`, float32): `y = D @ x`, `x = D.T @ y`.

    Built in float64 from the closed form and rounded once, so it is bit-identical everywhere.
    """
    basis = _basis_cpu(n)
    return basis if torch.device(device).type == "cpu" else basis.to(device)


class ChunkedDCT:
    """Forward/inverse chunked DCT with cached bases and reusable scratch buffers.

    On CPU, fresh multi-megabyte tensors cost page faults that rival the GEMMs themselves, so the
    intermediates live in per-instance scratch buffers that are reused (other devices rely on
    their caching allocator). Methods returning scratch views say so; a lock makes one instance
    safe to share between threads.
    """

    def __init__(self, *, reuse_buffers: bool = True) -> None:
        self.reuse_buffers = reuse_buffers
        self.lock = threading.RLock()
        self._scratch: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._bases: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def scratch(self, slot: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A flat tensor of `numel` elements, reused across calls on CPU (contents undefined)."""
        if not self.reuse_buffers or device.type != "cpu":
            return torch.empty(numel, dtype=dtype, device=device)
        key = (slot, dtype, device)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._scratch[key] = buf
        return buf[:numel]

    def release(self) -> None:
        """Drop the scratch buffers (they are rebuilt on demand)."""
        with self.lock:
            self._scratch.clear()

    def bases(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(D, D^T) for size `n` on `device`, both contiguous."""
        key = (n, device)
        pair = self._bases.get(key)
        if pair is None:
            d = dct_basis(n, device)
            pair = (d, d.T.contiguous())
            self._bases[key] = pair
        return pair

    def _two_pass(
        self, src: torch.Tensor, plan: ChunkPlan, out: torch.Tensor, inverse: bool, slot: str
    ) -> torch.Tensor:
        r_grid, c_grid = plan.grid
        device = src.device
        d_w, d_w_t = self.bases(plan.w, device)
        right = d_w if inverse else d_w_t
        if plan.h == 1:
            return torch.mm(src.view(-1, plan.w), right, out=out.view(-1, plan.w)).view(-1)
        d_h, d_h_t = self.bases(plan.h, device)
        left = d_h_t if inverse else d_h
        mid = self.scratch(slot, src.numel(), torch.float32, device)
        torch.mm(src.view(-1, plan.w), right, out=mid.view(-1, plan.w))
        torch.matmul(left, mid.view(r_grid, plan.h, c_grid * plan.w), out=out.view(r_grid, plan.h, -1))
        return out

    def forward(self, x: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
        """Matrix-layout coefficients of `x` (flat, padded size). Returns a scratch view."""
        rows, cols = plan.rows, plan.cols
        p_rows, p_cols = plan.padded
        numel = p_rows * p_cols
        x2 = x.reshape(rows, cols)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        if plan.is_padded:
            src = self.scratch("pad", numel, torch.float32, x.device).view(p_rows, p_cols)
            src.zero_()
            src[:rows, :cols].copy_(x2)
        else:
            src = x2.contiguous()
        out = self.scratch("coef", numel, torch.float32, x.device)
        return self._two_pass(src.view(-1), plan, out, inverse=False, slot="mid")

    def inverse(self, coef: torch.Tensor, plan: ChunkPlan, out: torch.Tensor | None = None) -> torch.Tensor:
        """Padded samples (flat) from matrix-layout coefficients; a scratch view unless `out`."""
        p_rows, p_cols = plan.padded
        if out is None:
            out = self.scratch("samples", p_rows * p_cols, torch.float32, coef.device)
        return self._two_pass(coef, plan, out.view(-1), inverse=True, slot="mid")

    def crop(self, padded: torch.Tensor, plan: ChunkPlan) -> torch.Tensor:
        """View of the unpadded region, in the original shape when no padding was added."""
        p_rows, p_cols = plan.padded
        view = padded.view(p_rows, p_cols)[: plan.rows, : plan.cols]
        return view.reshape(plan.shape) if len(plan.shape) == 1 else view
