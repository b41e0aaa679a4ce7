"""The `rice-mxint8` codec: exactness of indices, value precision, size, and sign agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from templar.compress import Compressed, DCTCompressor, aggregate, plan_chunks
from templar.wire import PayloadError, codec


def _encoded_bytes(parts: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in parts.values())


@pytest.mark.parametrize("shape", [(128,), (5, 3), (131, 64), (256, 512)])
def test_round_trip_keeps_indices_exactly_and_values_within_int8_precision(shape) -> None:
    torch.manual_seed(0)
    c = DCTCompressor(64, 32).compress(torch.randn(shape) * 1e-3)
    parts = codec.encode(c)
    assert {n: t.dtype for n, t in parts.items()} == codec.PART_DTYPES
    back = codec.decode(parts, c.plan, c.k, "x")
    assert torch.equal(back.indices, c.indices)
    scale = c.values.abs().amax(dim=1, keepdim=True)
    assert torch.all((back.values - c.values).abs() <= scale / 127 + 1e-12)
    assert _encoded_bytes(parts) <= codec.max_encoded_bytes(c.plan, c.k)


def test_worst_case_indices_stay_under_the_cap() -> None:
    plan = plan_chunks((256, 256), 64)
    gen = torch.Generator().manual_seed(1)
    for spread in ("uniform", "clustered", "extremes"):
        if spread == "uniform":
            idx = torch.stack([torch.randperm(4096, generator=gen)[:32] for _ in range(plan.n_chunks)])
        elif spread == "clustered":
            idx = torch.arange(32).expand(plan.n_chunks, 32)
        else:
            idx = torch.cat([torch.arange(16), torch.arange(4080, 4096)]).expand(plan.n_chunks, 32)
        c = Compressed(idx.sort(dim=1).values.contiguous(), torch.randn(plan.n_chunks, 32), plan.shape, plan.chunk)
        parts = codec.encode(c)
        assert _encoded_bytes(parts) <= codec.max_encoded_bytes(plan, 32)
        assert torch.equal(codec.decode(parts, plan, 32, "x").indices, c.indices)
        if spread == "uniform":  # close to the entropy bound of 8.3 bits, far below int16
            bits = 8 * (parts["idx_lo"].numel() + parts["idx_hi"].numel()) / idx.numel()
            assert bits < 9.0


def test_real_gradients_fit_target_size_and_keep_the_aggregated_sign(real_peers) -> None:
    shapes, peers = real_peers
    total_bytes = total_coefficients = 0
    decoded = []
    for peer in peers:
        out = {}
        for name, c in peer.items():
            parts = codec.encode(c)
            total_bytes += _encoded_bytes(parts)
            total_coefficients += c.n_coefficients
            out[name] = codec.decode(parts, c.plan, c.k, name)
        decoded.append(out)
    assert total_bytes / total_coefficients <= 2.1  # reference wire: 6 bytes (int16 + fp32)
    weights = [1 / len(peers)] * len(peers)
    exact = aggregate(peers, weights, shapes)
    compact = aggregate(decoded, weights, shapes)
    agree = sum(int((exact[n] == compact[n]).sum()) for n in shapes) / sum(exact[n].numel() for n in shapes)
    assert agree >= 0.99


def test_encoder_refuses_what_it_cannot_represent() -> None:
    plan = plan_chunks((64, 64), 64)
    values = torch.ones(1, 2)
    with pytest.raises(ValueError):
        codec.encode(Compressed(torch.tensor([[3, 3]]), values, plan.shape, plan.chunk))  # duplicate
    with pytest.raises(ValueError):
        codec.encode(Compressed(torch.tensor([[5, 2]]), values, plan.shape, plan.chunk))  # not ascending
    with pytest.raises(ValueError):
        codec.encode(Compressed(torch.tensor([[1, 2]]), torch.tensor([[1.0, float("inf")]]), plan.shape, plan.chunk))


def test_decoder_rejects_non_canonical_streams() -> None:
    # A fixed input: the forged stream below stays within idx_hi's size cap for this one, while
    # for about 1 draw in 6 of the global RNG it did not (`bad_shape`, not `index_range`).
    c = DCTCompressor(64, 32).compress(torch.randn(128, 128, generator=torch.Generator().manual_seed(0)))
    good = codec.encode(c)

    def attempt(**changes: torch.Tensor) -> str:
        with pytest.raises(PayloadError) as info:
            codec.decode({**good, **changes}, c.plan, c.k, "x")
        return info.value.reason

    hi = good["idx_hi"]
    assert attempt(idx_hi=torch.cat([hi, torch.zeros(1, dtype=torch.uint8)])) == "bad_encoding"
    lo_padded = good["idx_lo"].clone()
    n_bits = c.n_coefficients * int(good["rice"][0])
    if n_bits % 8:
        lo_padded[-1] |= 0x80
        assert attempt(idx_lo=lo_padded) == "bad_encoding"
    assert attempt(rice=torch.tensor([13], dtype=torch.uint8)) == "bad_encoding"
    assert attempt(idx_lo=good["idx_lo"][:-1]) == "bad_shape"
    bits = np.unpackbits(hi.numpy(), bitorder="little")
    last_one = int(np.flatnonzero(bits)[-1])
    shifted = np.concatenate([bits[:last_one], np.zeros(4096 >> int(good["rice"][0]), np.uint8), [1]])
    forged = torch.from_numpy(np.packbits(shifted, bitorder="little"))
    assert attempt(idx_hi=forged) == "index_range"
    assert attempt(exp=torch.full_like(good["exp"], 127)) == "non_finite"


def recoded_indices(parts: dict[str, torch.Tensor], c: Compressed, b: int) -> dict[str, torch.Tensor]:
    """`c`'s indices Rice-coded under parameter `b` instead of the writer's: the same index set."""
    idx = c.indices.to(torch.int64)
    gaps = (torch.diff(idx, dim=1, prepend=torch.full((c.plan.n_chunks, 1), -1)) - 1).reshape(-1).numpy()
    low = ((gaps[:, None] >> np.arange(b)) & 1).reshape(-1)
    high = gaps >> b
    unary = np.zeros(int(high.sum()) + gaps.size, dtype=np.uint8)
    unary[np.cumsum(high + 1) - 1] = 1
    pack = lambda bits: torch.from_numpy(np.packbits(bits.astype(np.uint8), bitorder="little"))  # noqa: E731
    return {**parts, "idx_lo": pack(low), "idx_hi": pack(unary), "rice": torch.tensor([b], dtype=torch.uint8)}


def test_one_update_has_one_encoding(monkeypatch) -> None:
    """An update re-coded under another Rice parameter, or with a chunk scaled by more than its values
    need (or holding -128), decoded to the same values under a new content digest: a miner re-posting
    an earlier upload that way passed the validators' replay memory. The reader now refuses both."""
    x = torch.randn(128, 128, generator=torch.Generator().manual_seed(0))
    x[:64] = 0.0  # the first chunks hold only zeros
    c = DCTCompressor(64, 32).compress(x)
    good = codec.encode(c)
    b = int(good["rice"][0])
    for other in (b - 1, b + 1):  # each decodes to c's indices exactly, but is not the writer's
        parts = recoded_indices(good, c, other)
        # b - 1's unary stream is longer than the cheapest parameter's can be (2n high bits): refused by its size
        with pytest.raises(PayloadError, match=f"rice parameter {other}, where these indices' is {b}|idx_hi: 73 bytes"):
            codec.decode(parts, c.plan, c.k, "x")
        if other == b + 1:
            with monkeypatch.context() as patch:  # the reader before: any parameter within the bound
                patch.setattr(codec, "_is_rice_parameter", lambda gaps, b, max_bits: True)
                assert torch.equal(codec.decode(parts, c.plan, c.k, "x").indices, c.indices)

    def refused(**changes: torch.Tensor) -> None:
        with pytest.raises(PayloadError, match="scaled by") as info:
            codec.decode({**good, **changes}, c.plan, c.k, "x")
        assert info.value.reason == "bad_encoding"

    val, exp = good["val"].view(c.plan.n_chunks, c.k), good["exp"]
    signal = int(torch.nonzero(val.abs().amax(dim=1) > 0)[0, 0])
    halved, coarser = val.clone(), exp.clone()
    halved[signal] //= 2
    coarser[signal] += 1  # half the integers at twice the scale
    refused(val=halved.reshape(-1), exp=coarser)
    small = val.clone()
    small[signal] //= 4  # the same scale for a quarter of the values
    refused(val=small.reshape(-1))
    low = val.clone()
    low[signal, 0] = -128
    refused(val=low.reshape(-1))
    assert int(val[0].abs().max()) == 0
    scaled_zeros = exp.clone()
    scaled_zeros[0] = 3
    refused(exp=scaled_zeros)
    # a chunk whose values all round to 0 (under 2^-128: float32's subnormals, where error feedback that
    # stopped getting gradient decays) is written as a chunk of zeros, which the reader takes; written
    # with the clamped exponent 2^-127, an honest upload was refused
    tiny = x.clone()
    tiny[64:] *= 1e-40
    c = DCTCompressor(64, 32).compress(tiny)
    parts = codec.encode(c)
    decoded = codec.decode(parts, c.plan, c.k, "x")
    small = c.values.abs().amax(dim=1) < 2.0 ** -128
    assert bool(small.any()) and not bool(parts["exp"][small].any()) and not bool(decoded.values[small].any())


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=140),
    cols=st.integers(min_value=1, max_value=140),
    k=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_any_index_set_round_trips(rows: int, cols: int, k: int, seed: int) -> None:
    plan = plan_chunks((rows, cols), 64)
    k = min(k, plan.chunk_numel)
    gen = torch.Generator().manual_seed(seed)
    keys = torch.rand(plan.n_chunks, plan.chunk_numel, generator=gen)
    indices = torch.topk(keys, k, dim=1).indices.sort(dim=1).values
    values = torch.randn(plan.n_chunks, k, generator=gen) * torch.rand(plan.n_chunks, 1, generator=gen) * 10
    c = Compressed(indices, values, plan.shape, plan.chunk)
    parts = codec.encode(c)
    back = codec.decode(parts, plan, k, "x")
    assert torch.equal(back.indices, indices)
    assert sum(t.numel() for t in parts.values()) <= codec.max_encoded_bytes(plan, k)


@pytest.mark.parametrize("b", range(0, 21))
def test_fixed_width_fields_match_the_bit_stream(b: int) -> None:
    rng = np.random.default_rng(b)
    n = 37
    fields = rng.integers(0, 1 << b, size=n) if b else np.zeros(n, dtype=np.int64)
    bits = ((fields[:, None] >> np.arange(b)) & 1).reshape(-1)
    stream = np.packbits(bits.astype(np.uint8), bitorder="little")
    assert np.array_equal(codec._fixed_width(stream, n, b), fields)


@settings(max_examples=200, deadline=None)
@given(gaps=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=64), max_bits=st.integers(0, 13))
def test_the_readers_rice_check_accepts_the_writers_parameter_only(gaps: list[int], max_bits: int) -> None:
    """The reader checks `b` against its neighbours' costs only (the cost is convex in b); that must
    accept exactly the writer's choice, the first minimum over every b."""
    g = np.array(gaps, dtype=np.int64)
    writers = codec._rice_parameter(g, max_bits)
    assert [b for b in range(max_bits + 1) if codec._is_rice_parameter(g, b, max_bits)] == [writers]


def test_an_index_stream_of_ones_is_refused_by_its_size_before_it_is_expanded() -> None:
    """idx_hi of 0xFF bytes up to the bound the reader had (n + every chunk's worst high bits): one int64
    per set bit was made before the count was checked, 72x the field's size (a 8.2 MB field of a
    production payload cost 564 MB and 2.5 s). The cheapest Rice parameter leaves at most 2n high bits."""
    c = DCTCompressor(64, 32).compress(torch.randn(128, 128, generator=torch.Generator().manual_seed(1)))
    good = codec.encode(c)
    n, b = c.plan.n_chunks * c.k, 0
    old_bound = -(-(n + c.plan.n_chunks * ((c.plan.chunk_numel - c.k) >> b)) // 8)
    bomb = {**good, "idx_lo": torch.zeros(0, dtype=torch.uint8), "rice": torch.tensor([b], dtype=torch.uint8),
            "idx_hi": torch.full((old_bound,), 0xFF, dtype=torch.uint8)}
    with pytest.raises(PayloadError, match=f"bytes outside \\(0, {-(-3 * n // 8)}\\]") as info:
        codec.decode(bomb, c.plan, c.k, "x")
    assert info.value.reason == "bad_shape"
    within = {**bomb, "idx_hi": torch.full((3 * n // 8,), 0xFF, dtype=torch.uint8)}
    with pytest.raises(PayloadError, match=f"{3 * n} terminators, expected {n}"):  # counted, not expanded
        codec.decode(within, c.plan, c.k, "x")


def test_the_largest_float32_values_are_written_as_the_reader_reads_them() -> None:
    """A chunk near float32's limit took exponent 122, where a full int8 overflows to inf: the writer's
    own payload was refused as non-finite. Exponents stop at 121 on both sides."""
    c = DCTCompressor(64, 32).compress(torch.randn(128, 128, generator=torch.Generator().manual_seed(2)))
    values = c.values.clone()
    values[0, :4] = torch.tensor([3.4e38, -3.39e38, 1.0, 3.3e38])
    c = Compressed(indices=c.indices, values=values, shape=c.shape, chunk=c.chunk)
    parts = codec.encode(c)
    decoded = codec.decode(parts, c.plan, c.k, "x")
    assert int(parts["exp"][0]) == 121 and bool(torch.isfinite(decoded.values).all())
    assert decoded.values[0, 0] == 127 * 2.0**121 and decoded.values[0, 3] == pytest.approx(3.3e38, rel=1e-2)
