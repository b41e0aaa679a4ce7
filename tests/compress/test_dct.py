"""Chunked DCT, top-k selection and the sparse decoder."""

from __future__ import annotations

import math

import pytest
import torch

from templar.compress import (
    ChunkedDCT,
    DCTCompressor,
    chunk_side,
    dct_basis,
    native,
    plan_chunks,
    select_topk,
)
from templar.compress import select as select_module


def _reference_dct2(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II of the last dimension, straight from the definition (float64)."""
    n = x.shape[-1]
    i = torch.arange(n, dtype=torch.float64)
    k = i[:, None]
    basis = torch.cos(math.pi * (2 * i + 1) * k / (2 * n))
    scale = torch.full((n, 1), math.sqrt(2.0 / n), dtype=torch.float64)
    scale[0] = math.sqrt(1.0 / n)
    return x.double() @ (basis * scale).T


def _chunked_coefficients(x: torch.Tensor, target: int) -> torch.Tensor:
    """Dense per-chunk 2-D DCT, chunk-major `[n_chunks, h*w]`, the slow obvious way."""
    plan = plan_chunks(x.shape, target)
    p_rows, p_cols = plan.padded
    padded = torch.zeros(p_rows, p_cols, dtype=torch.float64)
    padded[: plan.rows, : plan.cols] = x.reshape(plan.rows, plan.cols).double()
    r, c = plan.grid
    chunks = padded.view(r, plan.h, c, plan.w).permute(0, 2, 1, 3)
    rows_done = _reference_dct2(chunks)  # along w
    both = _reference_dct2(rows_done.transpose(-1, -2)).transpose(-1, -2)  # along h
    return both.reshape(r * c, plan.h * plan.w)


@pytest.mark.parametrize("n", [1, 2, 7, 29, 64])
def test_basis_is_orthonormal_and_matches_definition(n: int) -> None:
    d = dct_basis(n).double()
    assert torch.allclose(d @ d.T, torch.eye(n, dtype=torch.float64), atol=1e-6)
    x = torch.randn(3, n, dtype=torch.float64)
    assert torch.allclose(x @ d.T, _reference_dct2(x), atol=1e-5)
    assert dct_basis(n) is dct_basis(n)  # built once per size


@pytest.mark.parametrize(
    ("n", "side", "padded"),
    [
        (2048, 64, 2048),
        (8192, 64, 8192),
        (128, 64, 128),
        (100, 50, 100),
        (37, 37, 37),
        (50257, 64, 50304),
        (32003, 64, 32064),
        (131, 44, 132),
    ],
)
def test_chunk_side_pads_only_poor_divisors(n: int, side: int, padded: int) -> None:
    assert chunk_side(n, 64) == side
    assert math.ceil(n / side) * side == padded
    assert padded - n < math.ceil(n / side)  # fewer than one padding sample per chunk


@pytest.mark.parametrize("shape", [(128,), (7,), (1,), (5, 3), (128, 192), (131, 64), (100, 37), (257, 130)])
def test_round_trip_exact_when_every_coefficient_is_kept(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    full = DCTCompressor(64, 64 * 64)
    c = full.compress(x)
    assert c.indices.shape[-1] == c.plan.chunk_numel
    y = full.decompress(c)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.allclose(y, x, atol=1e-5)


@pytest.mark.parametrize("shape", [(128,), (256, 512), (131, 64), (200, 96)])
def test_topk_selects_the_largest_coefficients(shape: tuple[int, ...]) -> None:
    torch.manual_seed(1)
    x = torch.randn(shape)
    c = DCTCompressor(64, 32).compress(x)
    reference = _chunked_coefficients(x, 64)
    k = c.indices.shape[-1]
    expect = torch.topk(reference.abs(), k, dim=1).indices.sort(dim=1).values
    assert torch.equal(c.indices, expect)
    assert torch.all(c.indices[:, 1:] > c.indices[:, :-1])
    assert torch.allclose(c.values.double(), torch.gather(reference, 1, c.indices), atol=1e-4)


def test_ties_break_towards_the_lower_index_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_chunks((128, 128), 64)
    coef = torch.zeros(128 * 128)
    coef[::7] = 1.0  # many equal magnitudes, straddling every group boundary
    coef[::11] = -1.0
    kernel = select_topk(coef, plan, 32)  # the C kernel where built, else the torch pre-filter
    with native.disabled():
        fast = select_topk(coef, plan, 32)
        monkeypatch.setattr(select_module, "_group_size", lambda plan, k: 0)
        exact = select_topk(coef, plan, 32)
    for got in (kernel, fast):
        assert torch.equal(got[0], exact[0]) and torch.equal(got[1], exact[1])
    chunked = coef.view(2, 64, 2, 64).permute(0, 2, 1, 3).reshape(4, 4096)
    for row in range(4):
        nonzero = chunked[row].nonzero()[:, 0]
        assert torch.equal(exact[0][row], nonzero[:32])  # lowest indices among the equal maxima


def test_prefilter_equals_exact_selection_on_structured_data(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(2)
    x = torch.randn(256, 256) * torch.logspace(0, -3, 256)[None, :]  # energy concentrated in low columns
    x[0:64, 0:64] = 0.0  # an all-zero chunk: every coefficient ties
    plan = plan_chunks(x.shape, 64)
    dct = ChunkedDCT()
    coef = dct.forward(x, plan).clone()
    kernel = select_topk(coef, plan, 32)
    with native.disabled():
        fast = select_topk(coef, plan, 32)
        monkeypatch.setattr(select_module, "_group_size", lambda plan, k: 0)
        exact = select_topk(coef, plan, 32)
    for got in (kernel, fast):
        assert torch.equal(got[0], exact[0]) and torch.equal(got[1], exact[1])


@pytest.mark.usefixtures("kernel_path")
def test_sparse_decode_matches_dense_reference() -> None:
    torch.manual_seed(3)
    x = torch.randn(131, 192)
    compressor = DCTCompressor(64, 16)
    c = compressor.compress(x)
    plan = c.plan
    dense = torch.zeros(plan.n_chunks, plan.chunk_numel, dtype=torch.float64)
    dense.scatter_(1, c.indices, c.values.double())
    r, cg = plan.grid
    blocks = dense.view(r, cg, plan.h, plan.w)
    d_h, d_w = dct_basis(plan.h).double(), dct_basis(plan.w).double()
    samples = (d_h.T @ blocks @ d_w).permute(0, 2, 1, 3).reshape(plan.padded)
    expect = samples[: plan.rows, : plan.cols].float()
    assert torch.allclose(compressor.decompress(c), expect, atol=1e-5)
    target = x.clone()
    compressor.subtract_(target, c)
    assert torch.allclose(target, x - expect, atol=1e-5)


def test_compression_is_deterministic_and_reuses_no_output_memory() -> None:
    x = torch.randn(256, 128)
    compressor = DCTCompressor(64, 32)
    a, b = compressor.compress(x), compressor.compress(x * 1.0)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.values, b.values)
    y1 = compressor.decompress(a)
    y2 = compressor.decompress(b)
    assert torch.equal(y1, y2) and y1.data_ptr() != y2.data_ptr()


def test_rejects_unsupported_shapes() -> None:
    with pytest.raises(ValueError):
        plan_chunks((2, 3, 4), 64)
    with pytest.raises(ValueError):
        plan_chunks((0, 3), 64)
