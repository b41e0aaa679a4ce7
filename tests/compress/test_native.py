"""The C kernels against the torch paths: identical selections from the same coefficients, the
fused forward+top-k equal up to float32 near-ties, identical aggregation accumulators, decodes equal
to float rounding, on awkward shapes and hostile values."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from templar.compress import ChunkedDCT, DCTCompressor, aggregate, native, plan_chunks, select_topk
from templar.compress.aggregate import _accumulate
from templar.compress.dct import dct_basis

T = TypeVar("T")

needs_kernels = pytest.mark.skipif(
    not native.available(), reason="C kernels not built (no compiler at install)"
)

# 64x64 chunks (the wide micro-kernel), 64x48 (the 16-lane one), padded, 1-D, and odd tiny ones
SHAPES = [(256, 256), (128, 48), (130, 200), (8191, 128), (96, 4096), (100,), (64,), (2048,), (5, 7), (3, 64)]


def test_a_library_built_before_its_sources_changed_is_not_used(tmp_path) -> None:
    """The ABI number follows the kernels' interface, not their arithmetic: a checkout updated without the
    bootstrap kept the library of the old sources. A source newer than the library turns the kernels off
    (the torch paths give the same results); the sources checked are every source and header the build
    compiles (pyproject.toml's ext-module)."""
    import os
    import tomllib

    from templar.core.config import REPO_ROOT

    library, source = tmp_path / "_native.so", tmp_path / "accumulate.c"
    library.write_bytes(b"")
    source.write_text("")
    os.utime(library, (1000, 1000))
    os.utime(source, (900, 900))
    assert native.newer_sources(library, [source, tmp_path / "absent.c"]) == []
    os.utime(source, (1100, 1100))
    assert native.newer_sources(library, [source]) == [source]
    assert native.newer_sources(tmp_path / "none.so", [source]) == []  # no library: nothing to compare
    ext = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"][0]
    built_from = {(REPO_ROOT / p).resolve() for p in ext["sources"] + ext.get("depends", [])}
    assert built_from <= {p.resolve() for p in native._SOURCES}


def test_kernels_are_built_where_a_compiler_exists() -> None:
    """A silently failed optional build would leave only the torch paths tested and slow."""
    if (
        shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc")
        is None
    ):
        pytest.skip("no C compiler on this machine: the torch paths are the product here")
    assert native._native is not None, (
        "templar.compress._native was not built; reinstall with `pip install -e .`"
    )


def _coefficients(shape: tuple[int, ...], kind: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    plan = plan_chunks(shape, 64)
    x = torch.randn(shape, generator=gen)
    if kind == "structured":
        x = x * torch.logspace(0, -3, shape[-1])
    coef = ChunkedDCT().forward(x, plan).clone()
    if kind == "ties":
        coef = torch.randint(-3, 4, coef.shape, generator=gen).float()
    elif kind == "zeros":
        coef.zero_()
    elif kind == "hostile":
        coef[:: max(1, coef.numel() // 97)] = float("nan")
        coef[1 :: max(1, coef.numel() // 89)] = float("inf")
        coef[2 :: max(1, coef.numel() // 83)] = -float("inf")
        coef[3 :: max(1, coef.numel() // 79)] = -0.0
    return coef


@needs_kernels
@pytest.mark.parametrize("kind", ["gaussian", "structured", "ties", "zeros", "hostile"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("k", [1, 32, 64])
def test_select_matches_the_torch_path_exactly(shape: tuple[int, ...], kind: str, k: int) -> None:
    plan = plan_chunks(shape, 64)
    k = min(k, plan.chunk_numel)
    coef = _coefficients(shape, kind, seed=len(shape) * 1000 + shape[0])
    got = native.select_topk(coef, plan, k)
    assert got is not None
    with native.disabled():
        want = select_topk(coef, plan, k)
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[1], want[1]) or torch.allclose(got[1], want[1], equal_nan=True, atol=0, rtol=0)


def _on_one_and_many_threads(run: Callable[[], T]) -> tuple[T, T]:
    """The kernels split chunks across threads; the split must not change a single bit."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(max(2, threads))
        many = run()
    finally:
        torch.set_num_threads(threads)
    return one, many


@needs_kernels
def test_select_is_independent_of_the_thread_split() -> None:
    coef = _coefficients((1024, 512), "gaussian", seed=7)
    plan = plan_chunks((1024, 512), 64)
    one, many = _on_one_and_many_threads(lambda: native.select_topk(coef, plan, 32))
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_decode_and_subtract_match_the_torch_path(shape: tuple[int, ...]) -> None:
    torch.manual_seed(shape[0])
    x = torch.randn(shape)
    compressor = DCTCompressor(64, 32)
    c = compressor.compress(x)
    decoded = compressor.decompress(c)
    with native.disabled():
        want = compressor.decompress(c)
    assert decoded.shape == x.shape
    assert torch.allclose(decoded, want, atol=2e-6, rtol=1e-5)
    e_native = x.clone()
    sent = compressor.compress_residual_(e_native)
    with native.disabled():
        want = x - compressor.decompress(sent)
    assert torch.allclose(e_native, want, atol=2e-6, rtol=1e-5)


def _assert_same_selection_up_to_near_ties(got: tuple[torch.Tensor, torch.Tensor], coef: torch.Tensor,
                                           plan, k: int) -> None:
    """`got` is the exact top-k of `coef` except where |values| tie to float32 rounding.

    The fused kernel computes the coefficients in another order than torch's GEMMs, so a k-th and
    (k+1)-th coefficient closer than a few ulps may swap; anything else is a bug.
    """
    want = select_topk(coef, plan, k)
    got_idx, got_val = got
    assert got_idx.shape == want[0].shape and got_val.shape == want[1].shape
    assert bool(((got_idx >= 0) & (got_idx < plan.chunk_numel)).all())
    assert bool((got_idx[:, 1:] > got_idx[:, :-1]).all()), "indices ascending and unique per chunk"
    chunk_values = coef[plan.chunk_positions(torch.arange(plan.n_chunks))]
    # float32 rounding of a 64-term sum scales with the chunk's largest coefficient, not each one
    tolerance = 1e-5 * chunk_values.abs().amax(dim=1, keepdim=True) + 1e-6
    assert bool(((got_val - chunk_values.gather(1, got_idx)).abs() <= tolerance).all())
    differ = (got_idx != want[0]).any(dim=1)
    assert float(differ.float().mean()) < 0.01
    for chunk in differ.nonzero().flatten().tolist():
        kth = float(chunk_values[chunk].abs().sort(descending=True).values[k - 1])
        swapped = set(got_idx[chunk].tolist()) ^ set(want[0][chunk].tolist())
        assert all(abs(float(chunk_values[chunk, i].abs()) - kth) <= 2 * float(tolerance[chunk])
                   for i in swapped), f"chunk {chunk}: {swapped} are not near-ties of the k-th value"


FUSED_SHAPES = [(256, 256), (128, 48), (8191, 128), (96, 4096), (64, 8), (8, 64), (2048, 2048)]


@needs_kernels
@pytest.mark.parametrize("kind", ["gaussian", "structured", "smooth"])
@pytest.mark.parametrize("shape", FUSED_SHAPES, ids=str)
@pytest.mark.parametrize("k", [1, 32])
def test_fused_compress_selects_the_top_k_of_the_dct(shape: tuple[int, int], kind: str, k: int) -> None:
    gen = torch.Generator().manual_seed(shape[0] + k)
    x = torch.randn(shape, generator=gen)
    if kind == "structured":
        x = x * torch.logspace(0, -3, shape[-1])
    elif kind == "smooth":
        x = torch.cumsum(torch.cumsum(x, 0), 1)
    plan = plan_chunks(shape, 64)
    k = min(k, plan.chunk_numel)
    got = native.compress(x, plan, k)
    assert got is not None
    coef = ChunkedDCT().forward(x, plan).clone()
    _assert_same_selection_up_to_near_ties(got, coef, plan, k)


@needs_kernels
@pytest.mark.parametrize("shape", [(256, 256), (8191, 128), (64, 8)], ids=str)
def test_fused_compress_keeping_every_coefficient_reconstructs_the_input(shape: tuple[int, int]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    compressor = DCTCompressor(64, 64 * 64)
    c = compressor.compress(x)
    assert native.compress(x, c.plan, compressor.k_for(c.plan)) is not None  # the fused path ran
    assert torch.allclose(compressor.decompress(c), x, atol=1e-5, rtol=1e-5)


@needs_kernels
def test_fused_compress_is_independent_of_the_thread_split() -> None:
    x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(11))
    plan = plan_chunks((1024, 512), 64)
    one, many = _on_one_and_many_threads(lambda: native.compress(x, plan, 32))
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


@needs_kernels
def test_fused_compress_of_non_finite_input_stays_in_bounds() -> None:
    """An error-feedback buffer gone non-finite must not crash or index out of a chunk."""
    x = torch.randn(256, 256)
    x[::37, ::11] = float("nan")
    x[5, 7] = float("inf")
    plan = plan_chunks(x.shape, 64)
    idx, _ = native.compress(x, plan, 32)
    assert bool(((idx >= 0) & (idx < plan.chunk_numel)).all())
    assert bool((idx[:, 1:] > idx[:, :-1]).all())


def test_dct_factors_rebuild_the_orthonormal_basis() -> None:
    """The factor table, applied level by level as the C kernel does, is the DCT-II matrix."""
    for n in (8, 16, 48, 64):
        factors, basis = native.dct_factors(n).double(), torch.eye(n, dtype=torch.float64)
        rebuilt = torch.zeros(n, n, dtype=torch.float64)
        cur, size, scale, offset = basis, n, 1, 0
        while size % 2 == 0 and size > 2:
            half = size // 2
            u, v = cur[:half] + cur[half:].flip(0), cur[:half] - cur[half:].flip(0)
            odd = factors[offset : offset + half * half].view(half, half)
            rebuilt[scale :: 2 * scale] = odd @ v
            offset += half * half
            cur, size, scale = u, half, scale * 2
        rebuilt[::scale] = factors[offset:].view(size, size) @ cur
        assert torch.allclose(rebuilt, dct_basis(n).double(), atol=1e-6)


@needs_kernels
def test_decode_skips_out_of_range_indices_instead_of_writing_out_of_bounds() -> None:
    plan = plan_chunks((128, 128), 64)
    indices = torch.tensor([[-5, 0, 4096, 10**12]] * plan.n_chunks, dtype=torch.int64)
    values = torch.ones(plan.n_chunks, 4)
    out = torch.zeros(128, 128)
    assert native.decode_into(indices, values, plan, out, subtract=False)
    assert torch.isfinite(out).all() and float(out.abs().sum()) > 0
    assert torch.allclose(out, torch.full((128, 128), 1 / 64))  # only index 0 (the DC term) decoded


@needs_kernels
def test_decode_of_unsorted_and_repeated_indices_matches_the_torch_path() -> None:
    """Wire payloads are sorted, but the kernel must not depend on it for memory safety."""
    plan = plan_chunks((128, 128), 64)
    gen = torch.Generator().manual_seed(5)
    indices = torch.randint(0, 4096, (plan.n_chunks, 200), generator=gen)  # > 64 row runs per chunk
    values = torch.randn(plan.n_chunks, 200, generator=gen)
    got = torch.zeros(128, 128)
    assert native.decode_into(indices, values, plan, got, subtract=False)
    want = torch.zeros(plan.padded[0] * plan.padded[1], dtype=torch.float64)
    want.index_add_(0, plan.positions(indices).view(-1), values.double().view(-1))  # repeats add up
    dct = ChunkedDCT()
    expect = dct.inverse(want.float(), plan).view(128, 128)
    assert torch.allclose(got, expect, atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("shape", [(256, 320), (8191, 128), (2048,), (5, 7)], ids=str)
def test_accumulate_is_bit_identical_to_the_torch_path(shape: tuple[int, ...]) -> None:
    torch.manual_seed(11)
    compressor = DCTCompressor(64, 32)
    peers = [compressor.compress(torch.randn(shape) * (10.0**p)) for p in range(-3, 4)]
    plan = peers[0].plan
    scales = [float(torch.rand(()) * 2**60 / torch.linalg.vector_norm(c.values.double())) for c in peers]
    got = torch.empty(plan.padded[0] * plan.padded[1])
    assert native.accumulate([c.indices for c in peers], [c.values for c in peers], scales, plan, got)
    want = torch.empty_like(got)
    _accumulate(ChunkedDCT(), plan, list(zip(peers, scales, strict=True)), want)
    assert torch.equal(got, want)
    reversed_order = torch.empty_like(got)
    native.accumulate(
        [c.indices for c in peers[::-1]], [c.values for c in peers[::-1]], scales[::-1], plan, reversed_order
    )
    assert torch.equal(got, reversed_order)


@needs_kernels
def test_aggregate_signs_are_identical_on_both_paths() -> None:
    torch.manual_seed(12)
    shapes = {"w": torch.Size((192, 256)), "b": torch.Size((300,)), "e": torch.Size((8191, 64))}
    compressor = DCTCompressor(64, 32)
    peers = [{n: compressor.compress(torch.randn(s)) for n, s in shapes.items()} for _ in range(6)]
    weights = [0.5, 1.0, 2.0, 0.0, 1.5, 0.25]
    got = aggregate(peers, weights, shapes)
    with native.disabled():
        want = aggregate(peers, weights, shapes)
    for name in shapes:
        assert torch.equal(got[name], want[name])


def test_kernels_decline_what_they_do_not_handle() -> None:
    plan = plan_chunks((128, 128), 64)
    coef = torch.randn(128 * 128)
    assert native.select_topk(coef.double(), plan, 32) is None  # float32 only
    assert native.select_topk(coef[:-1], plan, 32) is None  # wrong size
    indices = torch.zeros(plan.n_chunks, 4, dtype=torch.int64)
    values = torch.zeros(plan.n_chunks, 4)
    assert not native.decode_into(indices, values, plan, torch.zeros(128, 127), subtract=False)
    assert not native.decode_into(indices.int(), values, plan, torch.zeros(128, 128), subtract=False)
    assert not native.decode_into(indices, values, plan, torch.zeros(256, 128)[::2], subtract=False)
    x = torch.randn(128, 128)
    assert native.compress(x.double(), plan, 32) is None  # float32 only
    assert native.compress(x.t(), plan, 32) is None  # contiguous only
    assert native.compress(torch.randn(100, 100), plan_chunks((100, 100), 64), 32) is None  # 50 % 8 != 0
    assert native.compress(torch.randn(4096), plan_chunks((4096,), 64), 32) is None  # 1-D: torch forward
    with native.disabled():
        assert not native.available()
        assert native.select_topk(coef, plan, 32) is None
        assert native.compress(x, plan, 32) is None
