"""The optional C kernels (`_native.c`, `kernels/`) behind the CPU hot paths of compression, aggregation and
reading payloads.

On CPU, torch has no primitive for "top-k of every 4096-value chunk" that is not a full sort,
a dense inverse DCT does ~8x the work of a sparse one, and a forward DCT followed by a top-k
writes and re-reads the whole coefficient matrix; these kernels do each directly. They are built
with the package when a C compiler is present (`pip install -e .`); without one, or on a GPU, or
with `TEMPLAR_NATIVE=0`, every caller uses its torch path, which returns the same aggregation
accumulators and, from the same coefficients, the same selections (tests hold both paths to
that). The fused `compress` computes the coefficients itself and may swap float32 near-ties.
A payload's strict read (`templar.wire.codec`) walks its Rice-coded indices and 2-bit codes in about ten
numpy passes holding the GIL between them; `rice_indices` and `q2_levels` take one pass each, and decide
only well-formed streams: the numpy reader refuses the rest and names why.

Every function here checks device, dtype, contiguity and shapes itself and returns False/None
when the kernels do not apply, so the C code only ever sees buffers it can trust. The kernels
release the GIL and split chunk bands over torch's own OpenMP threads (`torch.get_num_threads()`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from loguru import logger

from templar.compress.dct import ChunkPlan, dct_basis

_ABI = 3  # must equal TEMPLAR_NATIVE_ABI in _native.c

try:  # built from _native.c at install time; optional by design
    from templar.compress import _native
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _native = None
if _native is not None and getattr(_native, "ABI", None) != _ABI:  # pragma: no cover - stale build
    logger.warning(
        "templar.compress._native is out of date (ABI {}, want {}); using the torch paths. "
        "Rebuild with `pip install -e .`",
        getattr(_native, "ABI", None),
        _ABI,
    )
    _native = None


def newer_sources(library: Path, sources: Iterable[Path]) -> list[Path]:
    """The kernel sources changed after `library` was built (by modification time; sources that are not
    there, as in an installed wheel, are none).

    Why: the ABI number changes with the kernels' interface, not with their arithmetic. A checkout
    updated without the bootstrap (a `git pull`, then the neuron) kept the library built from the old
    sources, and a node whose aggregation differs from the others' diverges from the run."""
    try:
        built = library.stat().st_mtime
    except OSError:
        return []
    return [s for s in sources if s.exists() and s.stat().st_mtime > built]


_SOURCES = [Path(__file__).with_name("_native.c"), *sorted(Path(__file__).with_name("kernels").glob("*.[ch]"))]
if _native is not None and (_stale := newer_sources(Path(_native.__file__), _SOURCES)):
    logger.warning(
        "templar.compress._native was built before {} changed; using the torch paths (the same results, "
        "slower on CPU). Rebuild with ./scripts/bootstrap.sh (or `pip install -e .`)",
        ", ".join(s.name for s in _stale),
    )
    _native = None

__all__ = ["accumulate", "available", "compress", "decode_into", "disabled", "q2_levels", "rice_indices", "select_topk"]

_MIN_PARALLEL_NUMEL = 1 << 16  # below this, waking threads costs more than it saves
_state = threading.local()


def available() -> bool:
    """Whether the kernels are built and enabled (`TEMPLAR_NATIVE=0` and `disabled()` turn them off)."""
    if _native is None or getattr(_state, "disabled", False):
        return False
    return os.environ.get("TEMPLAR_NATIVE", "1") != "0"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the block on the torch paths (in this thread), e.g. to compare both."""
    before = getattr(_state, "disabled", False)
    _state.disabled = True
    try:
        yield
    finally:
        _state.disabled = before


def _applies(*tensors: torch.Tensor) -> bool:
    return available() and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)


def _threads(numel: int) -> int:
    return 1 if numel < _MIN_PARALLEL_NUMEL else max(1, torch.get_num_threads())


def select_topk(coef: torch.Tensor, plan: ChunkPlan, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Exact per-chunk top-k of the flat padded matrix-layout `coef` (see `select.select_topk`)."""
    p_rows, p_cols = plan.padded
    if not _applies(coef) or coef.dtype != torch.float32 or coef.numel() != p_rows * p_cols:
        return None
    if not 0 < k <= plan.chunk_numel:
        raise ValueError(f"k={k} must be in [1, {plan.chunk_numel}]")
    idx = torch.empty(plan.n_chunks, k, dtype=torch.int64)
    val = torch.empty(plan.n_chunks, k, dtype=torch.float32)
    _native.select(
        coef.data_ptr(),
        p_cols,
        plan.h,
        plan.w,
        k,
        plan.grid[0],
        idx.data_ptr(),
        val.data_ptr(),
        _threads(coef.numel()),
    )
    return idx, val


@lru_cache(maxsize=16)
def dct_factors(n: int) -> torch.Tensor:
    """The factored DCT-II of size `n` as `_native.c`'s `dct_rows` walks it (float32, flat).

    While n is even and > 2: the odd rows of the current basis restricted to its first n/2 columns
    (`(n/2)^2` values); the current basis becomes its even rows on those columns (the DCT-II of
    size n/2, up to scale). Then the last basis, dense. Built in float64 and rounded once.
    """
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    basis[0] *= 1.0 / math.sqrt(2.0)
    parts = []
    while basis.shape[0] % 2 == 0 and basis.shape[0] > 2:
        half = basis.shape[0] // 2
        parts.append(basis[1::2, :half].reshape(-1))
        basis = basis[0::2, :half]
    parts.append(basis.reshape(-1))
    return torch.cat(parts).to(torch.float32).contiguous()


def compress(x: torch.Tensor, plan: ChunkPlan, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Top-k of every chunk's DCT coefficients of `x` (`plan.shape`), fused (see `_native.c`).

    Same contract as `select_topk(forward(x))`; the coefficients round differently from the
    GEMM path in the last bits. None when the kernels do not apply (1-D or odd chunk sides).
    """
    if not _applies(x) or x.dtype != torch.float32 or x.shape != plan.shape or len(plan.shape) != 2:
        return None
    if plan.h % 8 or plan.w % 8:
        return None
    if not 0 < k <= plan.chunk_numel:
        raise ValueError(f"k={k} must be in [1, {plan.chunk_numel}]")
    idx = torch.empty(plan.n_chunks, k, dtype=torch.int64)
    val = torch.empty(plan.n_chunks, k, dtype=torch.float32)
    fh, fw = dct_factors(plan.h), dct_factors(plan.w)
    _native.compress(
        x.data_ptr(),
        plan.rows,
        plan.cols,
        plan.h,
        plan.w,
        fh.data_ptr(),
        fw.data_ptr(),
        k,
        idx.data_ptr(),
        val.data_ptr(),
        _threads(x.numel()),
    )
    return idx, val


def decode_into(
    indices: torch.Tensor, values: torch.Tensor, plan: ChunkPlan, out: torch.Tensor, *, subtract: bool
) -> bool:
    """`out` (= or -=) the inverse DCT of `(indices, values)` (`[n_chunks, k]`), in `plan.shape`.

    Returns False, touching nothing, when the kernels do not apply.
    """
    if not _applies(indices, values, out):
        return False
    if indices.dtype != torch.int64 or values.dtype != torch.float32 or out.dtype != torch.float32:
        return False
    if indices.shape != values.shape or indices.dim() != 2 or indices.shape[0] != plan.n_chunks:
        return False
    if out.shape != plan.shape:
        return False
    dh, dw = dct_basis(plan.h), dct_basis(plan.w)
    _native.decode(
        indices.data_ptr(),
        values.data_ptr(),
        indices.shape[1],
        dh.data_ptr(),
        dw.data_ptr(),
        plan.h,
        plan.w,
        plan.rows,
        plan.cols,
        out.data_ptr(),
        plan.cols,
        subtract,
        _threads(out.numel()),
    )
    return True


def accumulate(
    indices: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    scales: Sequence[float],
    plan: ChunkPlan,
    out: torch.Tensor,
) -> bool:
    """`out` (flat padded matrix layout) = float32(Σ_p round_half_even(values_p · scales_p)) in int64.

    Bit-identical to the torch path in `aggregate`. Returns False when the kernels do not apply.
    """
    p_rows, p_cols = plan.padded
    if not indices or not _applies(out, *indices, *values) or out.dtype != torch.float32:
        return False
    if out.numel() != p_rows * p_cols:
        return False
    k = indices[0].shape[-1]
    for i, v in zip(indices, values, strict=True):
        if (
            i.dtype != torch.int64
            or v.dtype != torch.float32
            or i.shape != (plan.n_chunks, k)
            or v.shape != i.shape
        ):
            return False
    idx_ptrs = torch.tensor([t.data_ptr() for t in indices], dtype=torch.int64)
    val_ptrs = torch.tensor([t.data_ptr() for t in values], dtype=torch.int64)
    scale = torch.tensor([float(s) for s in scales], dtype=torch.float64)
    _native.accumulate(
        len(indices),
        idx_ptrs.data_ptr(),
        val_ptrs.data_ptr(),
        scale.data_ptr(),
        k,
        plan.h,
        plan.w,
        p_cols,
        plan.grid[0],
        out.data_ptr(),
        _threads(out.numel()),
    )
    return True



def _byte_stream(*streams: np.ndarray) -> bool:
    return all(s.dtype == np.uint8 and s.ndim == 1 and s.flags.c_contiguous for s in streams)


def rice_indices(lo: np.ndarray, hi: np.ndarray, b: int, n_chunks: int, k: int, chunk_numel: int,
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """The `[n_chunks, k]` chunk indices of a payload's Rice-coded streams (`templar.wire.codec`), and their
    gaps (flat), read in one pass without the GIL, when the streams are well formed.

    None when the kernels do not apply or the streams are not well formed (too few or too many
    terminators in `hi`, its last terminator before its last byte, an index past its chunk): the
    caller's numpy reader then decides, and names the refusal. `lo`'s length and padding bits and the
    Rice parameter's canonical choice are the caller's checks."""
    if not available() or not _byte_stream(lo, hi) or hi.size == 0 or n_chunks < 0 or k <= 0:
        return None
    out = np.empty((n_chunks, k), dtype=np.int64)
    gaps = np.empty(n_chunks * k, dtype=np.int64)
    ok = _native.rice_indices(lo.ctypes.data, lo.size, hi.ctypes.data, hi.size, b, n_chunks, k, chunk_numel,
                              out.ctypes.data, gaps.ctypes.data)
    return (out, gaps) if ok else None


def q2_levels(q: np.ndarray, n_chunks: int, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """`rice-q2`'s packed 2-bit codes as levels `[n_chunks, k]` (int8: 0, +1, -1) and whether each chunk has a
    non-zero one, in one pass without the GIL. None when the kernels do not apply or the codes are not
    well formed (a code 2, non-zero padding codes): the caller's numpy reader then names it."""
    if not available() or not _byte_stream(q) or n_chunks < 0 or k <= 0 or q.size != -(-n_chunks * k // 4):
        return None
    levels = np.empty((n_chunks, k), dtype=np.int8)
    signal = np.empty(n_chunks, dtype=np.bool_)
    ok = _native.q2_levels(q.ctypes.data, q.size, n_chunks, k, levels.ctypes.data, signal.ctypes.data)
    return (levels, signal) if ok else None
