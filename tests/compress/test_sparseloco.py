"""SparseLoCo: the 2-bit grid, top-k without a transform under error feedback, and the
median-clipped mean (exact norms, bit-identical for any peer order and on both kernel paths)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from templar.compress import Compressed, DeMo, native, plan_chunks
from templar.compress.sparseloco import (
    SparseLoCoCompressor,
    aggregate_clipped_mean,
    apply_mean_update,
    clip_factors,
    clip_level,
    join,
    payload_norm_squared,
    quantise,
    split,
)
from templar.compress.sparseloco.grid import EXP_MAX, EXP_MIN


def _grid_scale(values: torch.Tensor) -> list[float]:
    """Per chunk, the one magnitude its non-zero values share (0 for an all-zero chunk)."""
    return [float(row.abs().amax()) for row in values]


# -- the grid -------------------------------------------------------------------------------------


def test_quantised_values_are_sign_times_the_rounded_mean_magnitude() -> None:
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(50, 64, generator=gen) * torch.rand(50, 1, generator=gen) * 10
    values[3] = 0.0  # an all-zero chunk
    values[4, :10] = 0.0  # a chunk with a few zeros
    q = quantise(values)
    assert q.dtype == torch.float32 and q.shape == values.shape
    assert torch.equal(torch.sign(q), torch.sign(values))
    for row, qrow in zip(values, q, strict=True):
        nonzero = row[row != 0].double()
        if nonzero.numel() == 0:
            assert bool((qrow == 0).all())
            continue
        scale = float(qrow.abs().amax())
        assert bool(((qrow.abs() == scale) | (qrow == 0)).all())
        mean = float(nonzero.abs().mean())
        m, e = math.frexp(scale)
        assert float(m * 256).is_integer() and 128 <= m * 256 <= 255  # an 8-bit mantissa
        assert abs(scale - mean) <= 2.0 ** (e - 9)  # rounded to the nearest of that format


def test_scale_format_limits() -> None:
    tiny = torch.full((1, 4), 2.0**-122)  # below the smallest scale: sent as zeros
    assert bool((quantise(tiny) == 0).all())
    smallest = torch.full((1, 4), 128 * 2.0**EXP_MIN)
    assert torch.equal(quantise(smallest), smallest)
    largest = torch.full((1, 4), 255 * 2.0**EXP_MAX)
    assert torch.equal(quantise(largest), largest) and bool(torch.isfinite(largest).all())
    rounding_up = torch.full((1, 4), float(torch.finfo(torch.float32).max))  # rounds to 2^128
    with pytest.raises(ValueError):
        quantise(rounding_up)
    with pytest.raises(ValueError):
        quantise(torch.tensor([[1.0, float("nan")]]))
    carry = torch.full((1, 2), 255.75)  # mantissa rounds to 256: renormalised to 128·2^1
    assert torch.equal(quantise(carry), torch.full((1, 2), 256.0))


def test_split_and_join_are_inverse_and_refuse_values_off_the_grid() -> None:
    gen = torch.Generator().manual_seed(1)
    q = quantise(torch.randn(20, 16, generator=gen))
    q[5] = 0.0
    levels, mantissa, exponent = split(q)
    assert levels.dtype == torch.int8 and mantissa.dtype == torch.uint8 and exponent.dtype == torch.int8
    assert set(levels.unique().tolist()) <= {-1, 0, 1}
    assert int(mantissa[5]) == 0 and int(exponent[5]) == 0
    assert torch.equal(join(levels, mantissa, exponent), q)
    with pytest.raises(ValueError, match="more than one magnitude"):
        split(torch.tensor([[1.0, -2.0]]))
    with pytest.raises(ValueError, match="8-bit"):
        split(torch.tensor([[1.0 + 2.0**-10, -(1.0 + 2.0**-10)]]))
    with pytest.raises(ValueError):
        split(torch.tensor([[2.0**-125, 0.0]]))  # on one magnitude, but below the scale format


# -- the compressor -------------------------------------------------------------------------------


def _brute_topk(x: torch.Tensor, plan, k: int) -> torch.Tensor:
    """Indices of the k largest |x| per chunk, ties to the lower index, by a stable sort."""
    p_rows, p_cols = plan.padded
    padded = torch.zeros(p_rows, p_cols)
    padded[: plan.rows, : plan.cols] = x.reshape(plan.rows, plan.cols)
    r, c = plan.grid
    chunks = padded.view(r, plan.h, c, plan.w).permute(0, 2, 1, 3).reshape(r * c, -1)
    order = torch.sort(chunks.abs(), dim=1, descending=True, stable=True).indices
    return order[:, :k].sort(dim=1).values


@pytest.mark.parametrize("shape", [(256, 192), (131, 64), (64, 131), (200, 131), (128,), (5, 3), (4100,), (4099,)])
def test_top_k_is_exact_and_ties_go_to_the_lower_index(shape, kernel_path) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=gen)
    x = torch.where(torch.rand(shape, generator=gen) < 0.3, torch.sign(x) * 0.5, x)  # many exact ties
    compressor = SparseLoCoCompressor(64, 64)
    c = compressor.compress(x)
    plan = compressor.plan(shape)
    k = compressor.k_for(plan)
    assert c.plan == plan and c.k == k and c.indices.dtype == torch.int64
    assert torch.equal(c.indices, _brute_topk(x, plan, k))
    assert torch.equal(compressor.compress(x.clone()).values, c.values)


def test_both_kernel_paths_select_the_same() -> None:
    x = torch.randn(320, 256, generator=torch.Generator().manual_seed(3))
    x[:64, :64] = 0.0  # an all-zero chunk
    x[64:128, :64] = torch.sign(x[64:128, :64])  # every value tied
    compressor = SparseLoCoCompressor(64, 64)
    native_c = compressor.compress(x)
    with native.disabled():
        torch_c = compressor.compress(x)
    assert torch.equal(native_c.indices, torch_c.indices) and torch.equal(native_c.values, torch_c.values)


def test_error_feedback_keeps_everything_not_sent() -> None:
    torch.manual_seed(4)
    shapes = {"w": (256, 128), "b": (128,), "emb": (131, 64), "odd": (5, 3)}
    compressor = SparseLoCoCompressor(64, 64)
    demo = DeMo({n: torch.zeros(s) for n, s in shapes.items()}, compressor=compressor, decay=0.95)
    for step in range(4):
        deltas = {n: torch.randn(s) * (1 + step) for n, s in shapes.items()}
        before = {n: e.clone() for n, e in demo.buffers.items()}
        sent = demo.step(deltas, lr=1.0)
        for name, e in demo.buffers.items():
            accumulated = 0.95 * before[name] + deltas[name]
            decoded = compressor.decompress(sent[name])
            assert torch.allclose(e + decoded, accumulated, rtol=0, atol=4e-6 * float(accumulated.abs().max()))
            assert torch.equal(sent[name].indices, compressor.compress(accumulated).indices)
            # the quantisation error of the sent positions stayed behind, not only the unsent ones
            sent_positions = decoded != 0
            assert bool((e[sent_positions] != 0).any())


def test_zero_and_padded_chunks_send_exact_zeros() -> None:
    compressor = SparseLoCoCompressor(64, 64)
    e = torch.zeros(131, 64)  # 3 chunks of 44 x 64, the last with 43 real rows and one padded row
    e[130, :5] = torch.tensor([1.0, -2.0, 3.0, 0.0, 4.0])
    before = e.clone()
    q = compressor.compress_residual_(e)
    assert int((q.values != 0).sum()) == 4  # a chunk with 4 non-zero entries sends 60 zeros
    assert torch.equal(e + compressor.decompress(q), before)  # exact: 1, 2, 3, 4 -> 2.5 each
    assert float(q.values.abs().max()) == 2.5


def test_non_finite_buffers_are_refused_untouched() -> None:
    compressor = SparseLoCoCompressor(64, 64)
    e = torch.randn(128, 128)
    e[70, 3] = float("inf")
    before = e.clone()
    with pytest.raises(ValueError):
        compressor.compress_residual_(e)
    assert torch.equal(e, before)


def test_subtract_matches_decompress() -> None:
    compressor = SparseLoCoCompressor(64, 32)
    x = torch.randn(131, 64)
    c = compressor.compress(x)
    target = torch.randn(131, 64)
    assert torch.equal(compressor.subtract_(target.clone(), c), target - compressor.decompress(c))


# -- the aggregate --------------------------------------------------------------------------------

SHAPES = {"w": torch.Size([256, 128]), "b": torch.Size([128]), "emb": torch.Size([131, 64]), "odd": torch.Size([5, 3])}


def _peers(g: int, seed: int = 0, scales: list[float] | None = None) -> list[dict[str, Compressed]]:
    gen = torch.Generator().manual_seed(seed)
    compressor = SparseLoCoCompressor(64, 64)
    scales = scales or [float(2 ** (i % 3)) for i in range(g)]
    return [
        {n: compressor.compress(torch.randn(s, generator=gen) * scale) for n, s in SHAPES.items()} for scale in scales
    ]


def _reference(peers, weights, ceiling: float | None = None) -> dict[str, torch.Tensor]:
    """The definition in float64: dense peers, norms, lower median (or the ceiling below it), clip,
    weighted sum."""
    dense = [{n: SparseLoCoCompressor().decompress(c).double() for n, c in p.items()} for p in peers]
    norms = [math.sqrt(sum(float(t.square().sum()) for t in d.values())) for d in dense]
    contributing = sorted(n for n, w in zip(norms, weights, strict=True) if n > 0 and w > 0)
    median = min(contributing[(len(contributing) - 1) // 2], math.inf if ceiling is None else ceiling)
    out = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    for d, n, w in zip(dense, norms, weights, strict=True):
        if n > 0 and w > 0:
            for name in SHAPES:
                out[name] += w * min(1.0, median / n) * d[name]
    return out


def test_matches_the_float64_definition(kernel_path) -> None:
    peers = _peers(5)
    weights = [0.2] * 5
    got = aggregate_clipped_mean(peers, weights, SHAPES)
    want = _reference(peers, weights)
    for name, shape in SHAPES.items():
        assert got[name].dtype == torch.float32 and got[name].shape == shape
        assert torch.allclose(got[name].double(), want[name], rtol=2**-22, atol=0)
        assert torch.equal(got[name] != 0, want[name] != 0)


def test_any_peer_order_and_either_kernel_path_give_bit_identical_results() -> None:
    peers = _peers(5, seed=1)
    weights = [0.1, 0.3, 0.2, 0.15, 0.25]
    first = aggregate_clipped_mean(peers, weights, SHAPES)
    with native.disabled():
        on_torch = aggregate_clipped_mean(peers, weights, SHAPES)
    assert all(torch.equal(first[n], on_torch[n]) for n in SHAPES)
    for order in itertools.permutations(range(5)):
        again = aggregate_clipped_mean([peers[i] for i in order], [weights[i] for i in order], SHAPES)
        assert all(torch.equal(first[n], again[n]) for n in SHAPES), order


def test_norms_are_exact() -> None:
    (peer,) = _peers(1, seed=2)
    exact = Fraction(0)
    for c in peer.values():
        for v in c.values.reshape(-1).tolist():
            exact += Fraction(v) ** 2  # a float32 widened to a double is exact, so is its Fraction
    assert payload_norm_squared(peer, list(SHAPES)) == exact
    with pytest.raises(ValueError, match="significant bits"):
        noisy = {n: Compressed(c.indices, c.values * 1.1, c.shape, c.chunk) for n, c in peer.items()}
        aggregate_clipped_mean([noisy], [1.0], SHAPES)


def test_a_payloads_norms_in_one_pass_are_each_tensors_own_and_refuse_the_same(monkeypatch) -> None:
    """`_payload_norm_terms` computes a payload's consecutive tensors of one chunk width together: each
    result, and the first refusal, must be `_norm_terms`'s for that tensor, whatever the grouping."""
    from templar.compress.sparseloco import aggregate
    from templar.compress.sparseloco.aggregate import _norm_terms, _payload_norm_terms

    gen = torch.Generator().manual_seed(11)
    shapes = [(64, 64), (64,), (256, 64), (64,), (32, 64), (5, 3), (64, 16)]
    widths = [8, 8, 8, 8, 8, 4, 2]  # top-k per chunk: the last two tensors have chunks of their own widths
    named = [(f"t{i}", SparseLoCoCompressor(64, k).compress(torch.randn(s, generator=gen) * 2.0 ** (6 * i - 20)).values)
             for i, (s, k) in enumerate(zip(shapes, widths, strict=True))]
    named[3] = ("t3", torch.zeros_like(named[3][1]))  # all zero: (0, None)
    named.insert(5, ("empty", torch.zeros(0, 8)))  # no chunks at all: (0, None) too
    want = [_norm_terms(values, name) for name, values in named]
    assert want[3] == want[5] == (Fraction(0), None)
    assert all(top is not None for i, (_, top) in enumerate(want) if i not in (3, 5))
    assert len({values.shape[1] for _, values in named}) == 3  # three chunk widths
    passes = []
    in_one_pass = aggregate._norms_in_one_pass
    monkeypatch.setattr(aggregate, "_norms_in_one_pass",
                        lambda group: passes.append([name for name, _ in group]) or in_one_pass(group))
    for group_values in (1, 64, 600, 1 << 20):
        passes.clear()
        assert _payload_norm_terms(named, group_values) == want, group_values
    assert passes == [["t0", "t1", "t2", "t3", "t4", "empty"], ["t5"], ["t6"]]  # the other widths, alone
    monkeypatch.undo()
    # a tensor off the grid before a non-finite one: the off-grid one is refused, as one by one
    off_grid, non_finite = named[2][1].clone(), named[4][1].clone()
    off_grid[0, :2] = torch.tensor([0.75, 1.0])
    non_finite[0, 1] = float("inf")
    hostile = [*named[:2], ("t2", off_grid), named[3], ("t4", non_finite)]
    with pytest.raises(ValueError, match="t2: values are not on the 2-bit grid"):
        _payload_norm_terms(hostile)
    with pytest.raises(ValueError, match="t4: non-finite"):
        _payload_norm_terms([*named[:2], named[3], ("t4", non_finite)])


def test_a_peer_scaled_a_thousand_times_counts_like_a_median_peer() -> None:
    peers = _peers(5, seed=3, scales=[1.0, 1.0, 1.0, 1.0, 1.0])
    loud = {n: Compressed(c.indices, c.values * 1024, c.shape, c.chunk) for n, c in peers[4].items()}
    weights = [0.2] * 5
    norms = [payload_norm_squared(p, list(SHAPES)) for p in [*peers[:4], loud]]
    factors = clip_factors(norms, weights)
    assert factors[4] < 0.002 and factors.count(1.0) >= 2
    clipped = aggregate_clipped_mean([*peers[:4], loud], weights, SHAPES)
    loud_contribution = math.sqrt(float(norms[4])) * factors[4]
    assert loud_contribution == pytest.approx(math.sqrt(float(sorted(norms)[2])), rel=1e-12)
    want = _reference([*peers[:4], loud], weights)
    for name in SHAPES:
        assert torch.allclose(clipped[name].double(), want[name], rtol=2**-22, atol=0)
    unclipped_norm = math.sqrt(sum(float((0.2 * SparseLoCoCompressor().decompress(c)).double().square().sum())
                                   for c in loud.values()))
    total_norm = math.sqrt(sum(float(t.double().square().sum()) for t in clipped.values()))
    assert total_norm < 0.01 * unclipped_norm  # without clipping the loud peer alone would dominate


def test_the_leads_ceiling_only_lowers_the_clip_level_and_stays_exact(kernel_path) -> None:
    """Three peers of five at 5x the others' size hold the list's median; the lead's ceiling (the
    typical size it drew, `templar.validator.fast_eval.step_ceiling`) holds them, and every payload,
    to it. A ceiling above the median changes nothing, so a lead cannot make the step larger."""
    peers = _peers(5, seed=6, scales=[1.0, 1.0, 5.0, 5.0, 5.0])
    weights = [0.2] * 5
    names = list(SHAPES)
    norms = [payload_norm_squared(p, names) for p in peers]
    median = sorted(norms)[2]
    honest = math.sqrt(float(min(norms)))
    assert clip_level(norms) == median and math.sqrt(float(median)) > 4 * honest  # the group's size
    assert clip_level(norms, honest) == Fraction(honest) ** 2  # taken exactly: every node gets the same
    assert clip_level(norms, 10 * honest) == median  # a ceiling never raises the level
    held = aggregate_clipped_mean(peers, weights, SHAPES, ceiling=honest)
    want = _reference(peers, weights, ceiling=honest)
    for name in SHAPES:
        assert torch.allclose(held[name].double(), want[name], rtol=2**-22, atol=0)
    factors = clip_factors(norms, weights, ceiling=honest)
    assert factors[0] == 1.0 and all(f < 0.25 for f in factors[2:])
    for order in itertools.permutations(range(5)):  # bit-identical for any order, as without a ceiling
        again = aggregate_clipped_mean([peers[i] for i in order], [weights[i] for i in order], SHAPES, ceiling=honest)
        assert all(torch.equal(held[n], again[n]) for n in SHAPES), order
    above = aggregate_clipped_mean(peers, weights, SHAPES, ceiling=10 * honest)
    plain = aggregate_clipped_mean(peers, weights, SHAPES)
    assert all(torch.equal(above[n], plain[n]) for n in SHAPES)
    size = lambda update: math.sqrt(sum(float(t.double().square().sum()) for t in update.values()))  # noqa: E731
    assert size(held) < 0.3 * size(plain)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="ceiling"):
            aggregate_clipped_mean(peers, weights, SHAPES, ceiling=bad)


def test_zero_peers_single_peers_and_zero_weights() -> None:
    peers = _peers(3, seed=4)
    zero = {n: Compressed(c.indices, torch.zeros_like(c.values), c.shape, c.chunk) for n, c in peers[0].items()}
    with_zeros = aggregate_clipped_mean([*peers, zero, zero], [0.2] * 5, SHAPES)
    without = aggregate_clipped_mean(peers, [0.2] * 3, SHAPES)  # zeros neither add nor move the median
    assert all(torch.equal(with_zeros[n], without[n]) for n in SHAPES)
    assert all(bool((t == 0).all()) for t in aggregate_clipped_mean([zero], [1.0], SHAPES).values())
    single = aggregate_clipped_mean([peers[1]], [1.0], SHAPES)
    for name in SHAPES:
        assert torch.equal(single[name], SparseLoCoCompressor().decompress(peers[1][name]))
    muted = aggregate_clipped_mean([*peers, peers[2]], [0.2, 0.2, 0.2, 0.0], SHAPES)
    assert all(torch.equal(muted[n], aggregate_clipped_mean(peers, [0.2] * 3, SHAPES)[n]) for n in SHAPES)


def test_exactly_cancelling_peers_give_zero() -> None:
    (peer,) = _peers(1, seed=5)
    negated = {n: Compressed(c.indices, -c.values, c.shape, c.chunk) for n, c in peer.items()}
    for peers in ([peer, negated], [negated, peer]):
        assert all(bool((t == 0).all()) for t in aggregate_clipped_mean(peers, [0.5, 0.5], SHAPES).values())


def test_bad_input_is_refused() -> None:
    peers = _peers(2, seed=6)
    with pytest.raises(ValueError):
        aggregate_clipped_mean(peers, [0.5], SHAPES)
    with pytest.raises(ValueError):
        aggregate_clipped_mean(peers, [0.5, 1.5], SHAPES)
    with pytest.raises(ValueError):
        aggregate_clipped_mean(peers, [0.5, float("nan")], SHAPES)
    with pytest.raises(ValueError):
        aggregate_clipped_mean([peers[0], {k: v for k, v in peers[1].items() if k != "b"}], [0.5, 0.5], SHAPES)
    c = peers[1]["w"]
    nan = c.values.clone()
    nan[3, 5] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        aggregate_clipped_mean([peers[0], {**peers[1], "w": Compressed(c.indices, nan, c.shape, c.chunk)}], [0.5, 0.5], SHAPES)
    bad = Compressed(c.indices.clone(), c.values, c.shape, c.chunk)
    bad.indices[0, 0] = 4096
    with pytest.raises(ValueError):
        aggregate_clipped_mean([peers[0], {**peers[1], "w": bad}], [0.5, 0.5], SHAPES)


def test_tiny_and_huge_values_stay_exact_in_fixed_point() -> None:
    plan = plan_chunks((64, 64), 64)
    indices = torch.arange(4).view(1, 4)
    shapes = {"x": plan.shape}
    for scale in (2.0**-120, 2.0**-60, 1.0, 2.0**100, 255 * 2.0**120):
        peer = {"x": Compressed(indices, torch.tensor([[scale, -scale, 0.0, scale]]), plan.shape, plan.chunk)}
        out = aggregate_clipped_mean([peer, peer], [0.5, 0.5], shapes)["x"]
        assert out.view(-1)[:4].tolist() == [scale, -scale, 0.0, scale]
        assert bool((out.view(-1)[4:] == 0).all())


def test_outer_sgd_step() -> None:
    model = torch.nn.Linear(4, 3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    update = {"weight": torch.randn(3, 4)}
    apply_mean_update(model, update, lr=0.1)
    assert torch.equal(model.weight.detach(), before["weight"] - update["weight"] * 0.1)
    assert torch.equal(model.bias.detach(), before["bias"])
    for bad in ({"nope": torch.zeros(1)}, {"bias": torch.zeros(4)}):
        with pytest.raises(ValueError):
            apply_mean_update(model, bad, lr=0.1)
    assert torch.equal(model.bias.detach(), before["bias"])
