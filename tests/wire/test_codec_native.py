"""A payload's Rice-coded indices and 2-bit value codes read by the C kernels (`templar.compress.native`'s
`rice_indices` and `q2_levels`, one pass each without the GIL) and by the numpy reader agree on every
input: the same tensors from a well-formed payload, and from a malformed one the same refusal, reason
and message (the kernels only accept; every refusal is the numpy reader's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from templar.compress import Compressed, DCTCompressor, native, plan_chunks
from templar.compress.sparseloco import SparseLoCoCompressor
from templar.wire import PayloadError, codec

pytestmark = pytest.mark.skipif(not native.available(),
                                reason="the C kernels are not built here (no C compiler): only the numpy reader runs")


def outcome(parts: dict[str, torch.Tensor], c: Compressed) -> tuple:
    try:
        if "q" in parts:  # rice-q2: the indices and the values
            read = codec.q2_decode(parts, c.plan, c.k, "x")
            return ("read", read.indices.numpy(), read.values.numpy())
        return ("read", codec._decode_indices(parts, c.plan, c.k, "x"))
    except PayloadError as refusal:
        return ("refused", refusal.reason, str(refusal))


def assert_same(parts: dict[str, torch.Tensor], c: Compressed) -> tuple:
    with native.disabled():
        reference = outcome(parts, c)
    ours = outcome(parts, c)
    assert ours[0] == reference[0], (ours, reference)
    if ours[0] == "read":
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ours[1:], reference[1:], strict=True))
    else:
        assert ours[1:] == reference[1:]
    return ours


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 140), cols=st.integers(1, 140), k=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_a_well_formed_stream_gives_the_numpy_reader_s_indices(rows: int, cols: int, k: int, seed: int) -> None:
    plan = plan_chunks((rows, cols), 64)
    k = min(k, plan.chunk_numel)
    gen = torch.Generator().manual_seed(seed)
    indices = torch.rand(plan.n_chunks, plan.chunk_numel, generator=gen).topk(k, dim=1).indices.sort(dim=1).values
    c = Compressed(indices, torch.randn(plan.n_chunks, k, generator=gen), plan.shape, plan.chunk)
    parts = codec.encode(c)
    read = assert_same(parts, c)
    assert read[0] == "read" and np.array_equal(read[1], indices.numpy())


def test_the_kernels_read_a_well_formed_payload_without_the_numpy_reader(monkeypatch) -> None:
    c = SparseLoCoCompressor(64, 64).compress(torch.randn(256, 192, generator=torch.Generator().manual_seed(1)))
    parts = codec.q2_encode(c)

    def numpy_reader(*args):
        raise AssertionError("the numpy reader ran on a well-formed payload")

    monkeypatch.setattr(codec, "_read_indices", numpy_reader)
    monkeypatch.setattr(codec, "_read_levels", numpy_reader)
    read = codec.q2_decode(parts, c.plan, c.k, "x")
    assert torch.equal(read.indices, c.indices) and torch.equal(read.values, c.values)


def _mutations(parts: dict[str, torch.Tensor], rng: np.random.Generator) -> list[dict[str, torch.Tensor]]:
    """Hostile variants of one tensor's index streams: single flipped bits, bytes added, dropped or
    saturated, terminators moved past the chunk."""
    hi, lo, b = parts["idx_hi"].numpy(), parts["idx_lo"].numpy(), int(parts["rice"][0])
    out = []

    def with_(**streams: np.ndarray) -> None:
        out.append({**parts, **{name: torch.from_numpy(np.ascontiguousarray(s, dtype=np.uint8))
                                for name, s in streams.items()}})

    for _ in range(12):
        flipped = hi.copy()
        flipped[rng.integers(hi.size)] ^= np.uint8(1 << int(rng.integers(8)))
        with_(idx_hi=flipped)
        if lo.size:
            flipped = lo.copy()
            flipped[rng.integers(lo.size)] ^= np.uint8(1 << int(rng.integers(8)))
            with_(idx_lo=flipped)
    with_(idx_hi=np.concatenate([hi, [0]]))
    with_(idx_hi=np.concatenate([hi, [int(rng.integers(1, 256))]]))
    with_(idx_hi=hi[:-1])
    saturated = hi.copy()
    saturated[rng.integers(hi.size)] = 0xFF
    with_(idx_hi=saturated)
    with_(idx_hi=np.zeros_like(hi))
    bits = np.unpackbits(hi, bitorder="little")
    last = int(np.flatnonzero(bits)[-1])
    with_(idx_hi=np.packbits(np.concatenate([bits[:last], np.zeros(4096 >> b, np.uint8), [1]]), bitorder="little"))
    if "q" in parts:  # rice-q2's value codes: a code 2 (set its high bit), codes in the padding, one zeroed
        q = parts["q"].numpy()
        for _ in range(6):
            flipped = q.copy()
            at, shift = int(rng.integers(q.size)), 2 * int(rng.integers(4))
            flipped[at] = (flipped[at] & ~np.uint8(3 << shift)) | np.uint8(2 << shift)
            with_(q=flipped)
        padded = q.copy()
        padded[-1] |= 0xC0
        with_(q=padded)
        zeroed = q.copy()
        zeroed[rng.integers(q.size)] = 0
        with_(q=zeroed)
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("encoding", ["rice-mxint8", "rice-q2"])
def test_a_malformed_stream_is_refused_as_the_numpy_reader_refuses_it(seed: int, encoding: str) -> None:
    x = torch.randn(128, 192, generator=torch.Generator().manual_seed(seed))
    if encoding == "rice-q2":  # 6 chunks of 61 values: the last byte of codes has 2 of padding
        c = SparseLoCoCompressor(64, 61).compress(x)
        parts = codec.q2_encode(c)
    else:
        c = DCTCompressor(64, 32).compress(x)
        parts = codec.encode(c)
    outcomes = [assert_same(variant, c) for variant in _mutations(parts, np.random.default_rng(seed))]
    refusals = " | ".join(o[2] for o in outcomes if o[0] == "refused")
    # a flipped low bit may only move an index; the rest are refused, each kind of fault at least once
    wanted = ["terminators", *(["code 2", "padding codes"] if encoding == "rice-q2" else [])]
    assert all(what in refusals for what in wanted), refusals


def test_an_index_past_its_chunk_is_refused_as_the_numpy_reader_refuses_it() -> None:
    """The forged stream of `test_codec.py`'s canonical-stream test: the last terminator moved past the chunk
    (this input keeps the stream inside idx_hi's size cap, so the refusal is the index's, not the size's)."""
    c = DCTCompressor(64, 32).compress(torch.randn(128, 128, generator=torch.Generator().manual_seed(0)))
    parts = codec.encode(c)
    bits = np.unpackbits(parts["idx_hi"].numpy(), bitorder="little")
    last = int(np.flatnonzero(bits)[-1])
    forged = np.concatenate([bits[:last], np.zeros(4096 >> int(parts["rice"][0]), np.uint8), [1]])
    refused = assert_same({**parts, "idx_hi": torch.from_numpy(np.packbits(forged, bitorder="little"))}, c)
    assert refused[:2] == ("refused", "index_range")
