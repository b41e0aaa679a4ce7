"""The byte encodings of one `Compressed` parameter, one per outer-step method, chosen by name.

`rice-mxint8` (DeMo's DCT coefficients, about 2 bytes per coefficient) is described first;
`rice-q2` (SparseLoCo's 2-bit values, about 1.2) at the end. Both code the indices alike.

Indices: within every chunk the k kept indices are ascending, so they are sent as gaps
`g = idx[j] - idx[j-1] - 1` (the first gap is `idx[0]`), Rice-coded with one parameter `b` per
tensor chosen by the writer to minimise the size. The low `b` bits of every gap go to `idx_lo`
(fixed width), the high part `g >> b` in unary to `idx_hi` (that many 0 bits, then a 1). Keeping
the two streams apart makes decoding vectorised: the 1 bits of `idx_hi` are found with one
`flatnonzero`, their spacing gives the high parts. A gap is never negative, so duplicate indices
cannot be expressed at all. For 32 of 4096 this costs about 8.5 bits per index (the entropy bound
is 8.3) where int16 costs 16 and 12-bit packing 12; gradients with low-frequency structure cost less.

Values: OCP-microscaling style MXINT8: each chunk's k values share a power-of-two scale (an
int8 exponent `e`) and are rounded to int8, `value = q * 2**e` with `|q| <= 127`, `e` the smallest
exponent that fits the chunk's largest |value|. The top-k values of a chunk span a narrow range,
so linear int8 keeps more precision than fp8 e4m3 at the same size: on gradients of the tiny
model the aggregated sign agrees with full precision on 99.8% of parameters (e4m3: 99.1%).

All bit streams are little-endian within a byte (stream bit i is `byte[i // 8] >> (i % 8) & 1`);
padding bits are zero, `idx_hi` has no trailing all-zero byte, `b` is the cheapest for the gaps
and `e` the smallest that fits, and the reader checks each: so an encoding is canonical, and one
update has one content digest (the validators' replay memory compares them).

`rice-q2` (SparseLoCo's values, `templar.compress.sparseloco.grid`): the same three index parts,
then `q`, uint8 `[ceil(n / 4)]`, one 2-bit code per value, four per byte, value i in bits
`2*(i % 4)` and up of byte `i // 4` (0: 0, 1: +1, 3: -1; 2, a negative zero, is invalid), and the
chunk's scale `m * 2**e` as `mant` (uint8 `[n_chunks]`, 128..255) and `exp` (int8 `[n_chunks]`,
-128..120). A chunk whose codes are all 0 has `mant = exp = 0`, and only such a chunk; padding
codes are 0. So every decodable encoding is canonical and every decoded value a finite float32.
At 64 of 4096 per chunk that is about 7.4 bits per index, 2 per value and 16 per chunk: about
1.2 bytes per kept value.

`codec_for(name)` gives a codec by name; the module-level functions are `rice-mxint8`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from templar.compress import ChunkPlan, Compressed, native
from templar.compress.sparseloco import grid
from templar.wire.errors import PayloadError

__all__ = [
    "CODEC",
    "CODECS",
    "PART_DTYPES",
    "Q2_CODEC",
    "Codec",
    "codec_for",
    "decode",
    "encode",
    "fixed_part_shapes",
    "max_encoded_bytes",
]

CODEC = "rice-mxint8"
Q2_CODEC = "rice-q2"
_QMAX = 127
_EXP_MIN, _EXP_MAX = -127, 121  # 127 * 2^121 is the largest float32 a chunk can hold; at 2^122 a full q overflows

_POPCOUNT = np.array([bin(byte).count("1") for byte in range(256)], dtype=np.uint8)

PART_DTYPES: dict[str, torch.dtype] = {
    "idx_lo": torch.uint8,
    "idx_hi": torch.uint8,
    "rice": torch.uint8,
    "val": torch.int8,
    "exp": torch.int8,
}


def _index_bits(plan: ChunkPlan) -> int:
    """Bits of a within-chunk index, the largest useful Rice parameter."""
    return max(plan.chunk_numel - 1, 1).bit_length()


def fixed_part_shapes(plan: ChunkPlan, k: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the parts whose size does not depend on the data."""
    return {"rice": (1,), "val": (plan.n_chunks * k,), "exp": (plan.n_chunks,)}


def _max_index_bytes(plan: ChunkPlan, k: int) -> int:
    """Upper bound of the three index parts: what the writer's optimal `b` can never exceed.

    At `b = index bits` every high part is 0, so that encoding costs `n * (b + 1)` bits; the
    writer picks the cheapest `b`, hence never more (plus one padding byte per stream, and `rice`).
    """
    return math.ceil(plan.n_chunks * k * (_index_bits(plan) + 1) / 8) + 2 + 1


def max_encoded_bytes(plan: ChunkPlan, k: int) -> int:
    """Upper bound of the encoded size (indices, then one int8 per value and per chunk)."""
    return _max_index_bytes(plan, k) + plan.n_chunks * k + plan.n_chunks


def _pack(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.packbits(bits.astype(np.uint8, copy=False), bitorder="little"))


def _checked(c: Compressed) -> tuple[torch.Tensor, torch.Tensor]:
    """`c`'s indices (int64) and values (float32) on the CPU; ValueError unless they fit its chunk
    grid and are finite."""
    plan = c.plan
    idx = c.indices.detach().to("cpu", torch.int64)
    values = c.values.detach().to("cpu", torch.float32)
    k = idx.shape[-1]
    if idx.shape != (plan.n_chunks, k) or values.shape != idx.shape:
        raise ValueError(f"indices {tuple(idx.shape)} / values {tuple(values.shape)} do not match the chunk grid")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("refusing to encode non-finite values")
    return idx, values


def _rice_bits(gaps: np.ndarray, b: int) -> int:
    """The bits `gaps` take Rice-coded under parameter `b`: b + 1 each, plus their high parts."""
    return gaps.size * (b + 1) + int((gaps >> b).sum())


def _rice_parameter(gaps: np.ndarray, max_bits: int) -> int:
    """The Rice parameter that codes `gaps` in the fewest bits (the smallest of equals): the writer's.
    The reader requires it (`_is_rice_parameter`), so one index set has one encoding: with any `b`
    accepted, a re-posted update re-coded under another `b` decoded to the same update under a new
    content digest, past the validators' replay memory."""
    return int(np.argmin([_rice_bits(gaps, b) for b in range(max_bits + 1)]))


def _is_rice_parameter(gaps: np.ndarray, b: int, max_bits: int) -> bool:
    """Whether `b` is `_rice_parameter(gaps, max_bits)`, from its two neighbours' costs only. The
    cost is convex in b (each step up saves sum(ceil((g >> b) / 2)) high bits for n low bits, and
    that saving never grows with b), so b is the first minimum exactly when it is cheaper than b - 1
    and no dearer than b + 1: 3 passes over the gaps instead of max_bits + 1."""
    cost = _rice_bits(gaps, b)
    return (b == 0 or cost < _rice_bits(gaps, b - 1)) and (b == max_bits or cost <= _rice_bits(gaps, b + 1))


def _shared_exponent(absmax: torch.Tensor) -> torch.Tensor:
    """Each chunk's exponent: the smallest that holds its largest magnitude in ±127 (0 for a chunk
    of zeros). The writer scales by it and the reader requires it, so a chunk's values have one
    encoding (not also half the integers at twice the scale, nor -128)."""
    mantissa, exponent = torch.frexp(absmax / _QMAX)
    exp = torch.where(absmax > 0, exponent - (mantissa == 0.5).to(exponent.dtype), 0)
    return exp.clamp(_EXP_MIN, _EXP_MAX)


def _encode_indices(idx: torch.Tensor, plan: ChunkPlan) -> dict[str, torch.Tensor]:
    """The Rice-coded gaps: `idx_lo`, `idx_hi`, `rice`. ValueError unless ascending and in range."""
    first = torch.full((plan.n_chunks, 1), -1, dtype=torch.int64)
    gaps = torch.diff(idx, dim=1, prepend=first) - 1
    if bool((gaps < 0).any()) or bool((idx[:, -1] >= plan.chunk_numel).any()):
        raise ValueError("indices must be strictly ascending within each chunk and inside it")
    g = gaps.reshape(-1).numpy()
    n = g.size
    b = _rice_parameter(g, _index_bits(plan))
    lo_bits = ((g[:, None] >> np.arange(b)) & 1).reshape(-1)
    high = g >> b
    hi_bits = np.zeros(int(high.sum()) + n, dtype=np.uint8)
    hi_bits[np.cumsum(high + 1) - 1] = 1
    return {"idx_lo": _pack(lo_bits), "idx_hi": _pack(hi_bits), "rice": torch.tensor([b], dtype=torch.uint8)}


def encode(c: Compressed) -> dict[str, torch.Tensor]:
    """Pack `c` into the five parts (CPU uint8/int8 tensors). ValueError on invalid input."""
    idx, values = _checked(c)
    parts = _encode_indices(idx, c.plan)

    exp = _shared_exponent(values.abs().amax(dim=1))
    scaled = torch.ldexp(values, (-exp).to(torch.float32)[:, None])
    val = torch.round(scaled).clamp(-_QMAX, _QMAX).to(torch.int8)
    # a chunk whose values all round to 0 (every one under 2^-128, float32's subnormals) is a chunk of zeros,
    # and is written as one: the reader requires the exponent of the values it decodes
    exp = torch.where(val.abs().amax(dim=1) > 0, exp, 0)
    return {**parts, "val": val.reshape(-1), "exp": exp.to(torch.int8)}


def _bits(stream: torch.Tensor) -> np.ndarray:
    """The stream's bits, least significant first, as booleans: numpy finds the set ones of a boolean
    array about 9 times faster than of the same 0/1 bytes (the high parts' terminators of a 1.2B
    payload are 18.8 million of them)."""
    return np.unpackbits(stream.numpy(), bitorder="little").view(np.bool_)


def _fixed_width(stream: np.ndarray, n: int, b: int) -> np.ndarray:
    """The n consecutive b-bit little-endian fields of `stream`, read through byte windows."""
    if b == 0:
        return np.zeros(n, dtype=np.int64)
    span = (b + 7 + 7) // 8  # bytes a field can touch
    padded = np.concatenate([stream, np.zeros(span, dtype=np.uint8)]).astype(np.uint64)
    start = np.arange(n, dtype=np.uint64) * np.uint64(b)
    at = (start >> np.uint64(3)).astype(np.int64)
    window = padded[at]
    for i in range(1, span):
        window |= padded[at + i] << np.uint64(8 * i)
    return ((window >> (start & np.uint64(7))) & np.uint64((1 << b) - 1)).astype(np.int64)


def _read_indices(lo_bytes: np.ndarray, hi: torch.Tensor, b: int, plan: ChunkPlan, k: int, name: str,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The indices and their gaps from the Rice streams, in numpy; `PayloadError` naming the first
    thing wrong with the terminators or the indices' range (the C kernel's reference and fallback)."""
    n = plan.n_chunks * k
    low = _fixed_width(lo_bytes, n, b)
    terminators = int(_POPCOUNT[hi.numpy()].sum(dtype=np.int64))  # counted before one index is made per bit
    if terminators != n:
        raise PayloadError("bad_encoding", f"{name}/idx_hi: {terminators} terminators, expected {n}")
    ones = np.flatnonzero(_bits(hi))
    if ones[-1] // 8 != hi.numel() - 1:
        raise PayloadError("bad_encoding", f"{name}/idx_hi: trailing zero bytes")
    high = np.diff(ones, prepend=-1) - 1
    gaps = (high << b) | low
    indices = np.cumsum(gaps.reshape(plan.n_chunks, k) + 1, axis=1) - 1
    if indices[:, -1].max() >= plan.chunk_numel:
        bad = int(np.argmax(indices[:, -1] >= plan.chunk_numel))
        raise PayloadError("index_range", f"{name}: chunk {bad} has index {int(indices[bad, -1])} >= {plan.chunk_numel}")
    return indices, gaps


def _decode_indices(parts: Mapping[str, torch.Tensor], plan: ChunkPlan, k: int, name: str) -> np.ndarray:
    """The `[n_chunks, k]` indices of `idx_lo`, `idx_hi`, `rice`; `PayloadError` unless canonical."""
    n = plan.n_chunks * k
    b = int(parts["rice"][0])
    if b > _index_bits(plan):
        raise PayloadError("bad_encoding", f"{name}: rice parameter {b} > {_index_bits(plan)}")
    lo, hi = parts["idx_lo"], parts["idx_hi"]
    if lo.ndim != 1 or lo.numel() != math.ceil(n * b / 8):
        raise PayloadError("bad_shape", f"{name}/idx_lo: {lo.numel()} bytes, expected {math.ceil(n * b / 8)}")
    # The cheapest b (required below) leaves at most 2n high bits in all: were there more, b + 1 would
    # save a bit per gap's halved high part, ceil(h/2) each, more than the n bits it adds. So the
    # stream is at most 3n bits, and no idx_hi can ask for more memory than that before it is read.
    max_high = min(plan.n_chunks * ((plan.chunk_numel - k) >> b), 2 * n)
    if hi.ndim != 1 or not 0 < hi.numel() <= math.ceil((n + max_high) / 8):
        raise PayloadError("bad_shape", f"{name}/idx_hi: {hi.numel()} bytes outside (0, {math.ceil((n + max_high) / 8)}]")

    lo_bytes = lo.numpy()
    if (n * b) % 8 and lo_bytes[-1] >> ((n * b) % 8):
        raise PayloadError("bad_encoding", f"{name}/idx_lo: non-zero padding bits")
    read = native.rice_indices(lo_bytes, hi.numpy(), b, plan.n_chunks, k, plan.chunk_numel)
    # no kernels, or streams not well formed: the numpy reader decides, and names why
    indices, gaps = read if read is not None else _read_indices(lo_bytes, hi, b, plan, k, name)
    if not _is_rice_parameter(gaps, b, _index_bits(plan)):
        cheapest = _rice_parameter(gaps, _index_bits(plan))
        raise PayloadError("bad_encoding", f"{name}: rice parameter {b}, where these indices' is {cheapest}")
    return indices


def decode(parts: Mapping[str, torch.Tensor], plan: ChunkPlan, k: int, name: str) -> Compressed:
    """Validate and unpack one parameter; raises `PayloadError` for anything malformed.

    Part dtypes and the fixed shapes are the caller's check; this checks the streams' content.
    """
    indices = _decode_indices(parts, plan, k, name)
    quantised = parts["val"].to(torch.float32).view(plan.n_chunks, k)
    values = torch.ldexp(quantised, parts["exp"].to(torch.float32)[:, None])
    if not bool(torch.isfinite(values).all()):
        raise PayloadError("non_finite", f"{name}: NaN or Inf value")
    exp = _shared_exponent(values.abs().amax(dim=1)).to(torch.int8)
    if not torch.equal(exp, parts["exp"]):
        bad = int(torch.nonzero(exp != parts["exp"])[0, 0])
        raise PayloadError("bad_encoding", f"{name}: chunk {bad} scaled by 2^{int(parts['exp'][bad])}, "
                                           f"where its values' is 2^{int(exp[bad])}")
    return Compressed(indices=torch.from_numpy(indices), values=values, shape=plan.shape, chunk=plan.chunk)


# -- rice-q2 ------------------------------------------------------------------------------------

Q2_PART_DTYPES: dict[str, torch.dtype] = {
    "idx_lo": torch.uint8,
    "idx_hi": torch.uint8,
    "rice": torch.uint8,
    "q": torch.uint8,
    "mant": torch.uint8,
    "exp": torch.int8,
}
_LEVEL_OF_CODE = np.array([0, 1, 0, -1], dtype=np.int8)  # code 2 (negative zero) is refused first
_CODE_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)


def q2_fixed_part_shapes(plan: ChunkPlan, k: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the `rice-q2` parts whose size does not depend on the data."""
    return {"rice": (1,), "q": (math.ceil(plan.n_chunks * k / 4),), "mant": (plan.n_chunks,), "exp": (plan.n_chunks,)}


def q2_max_encoded_bytes(plan: ChunkPlan, k: int) -> int:
    """Upper bound of the `rice-q2` size: the indices' bound, 2 bits per value, 2 bytes per chunk."""
    return _max_index_bytes(plan, k) + math.ceil(plan.n_chunks * k / 4) + 2 * plan.n_chunks


def q2_encode(c: Compressed) -> dict[str, torch.Tensor]:
    """Pack `c` into the six `rice-q2` parts (CPU uint8/int8 tensors). ValueError on invalid input,
    values off the 2-bit grid included."""
    idx, values = _checked(c)
    parts = _encode_indices(idx, c.plan)
    levels, mantissa, exponent = grid.split(values)
    codes = ((levels != 0).to(torch.uint8) | ((levels < 0).to(torch.uint8) << 1)).reshape(-1).numpy()
    codes = np.concatenate([codes, np.zeros(-codes.size % 4, dtype=np.uint8)]).reshape(-1, 4)
    packed = np.bitwise_or.reduce(codes << _CODE_SHIFTS, axis=1).astype(np.uint8)
    return {**parts, "q": torch.from_numpy(packed), "mant": mantissa, "exp": exponent}


def _read_levels(q: np.ndarray, plan: ChunkPlan, k: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The levels `[n_chunks, k]` of the packed codes and whether each chunk has a non-zero one, in numpy;
    `PayloadError` for non-zero padding codes or a code 2 (the C kernel's reference and fallback)."""
    n = plan.n_chunks * k
    codes = ((q[:, None] >> _CODE_SHIFTS) & 3).reshape(-1)
    if codes[n:].any():
        raise PayloadError("bad_encoding", f"{name}/q: non-zero padding codes")
    codes = codes[:n]
    if (codes == 2).any():
        raise PayloadError("bad_encoding", f"{name}/q: code 2 (negative zero)")
    levels = _LEVEL_OF_CODE[codes].reshape(plan.n_chunks, k)
    return levels, (levels != 0).any(axis=1)


def q2_decode(parts: Mapping[str, torch.Tensor], plan: ChunkPlan, k: int, name: str) -> Compressed:
    """Validate and unpack one `rice-q2` parameter; raises `PayloadError` for anything malformed.

    Part dtypes and the fixed shapes are the caller's check; this checks the content.
    """
    indices = _decode_indices(parts, plan, k, name)
    read = native.q2_levels(parts["q"].numpy(), plan.n_chunks, k)
    # no kernels, or codes not well formed: the numpy reader decides, and names why
    levels, signal = read if read is not None else _read_levels(parts["q"].numpy(), plan, k, name)
    mantissa = parts["mant"].numpy().astype(np.int64)
    exponent = parts["exp"].numpy().astype(np.int64)
    scaled = (mantissa >= 128) & (exponent <= grid.EXP_MAX)
    empty = (mantissa == 0) & (exponent == 0)
    bad = np.flatnonzero(np.where(signal, ~scaled, ~empty))
    if bad.size:
        chunk = int(bad[0])
        raise PayloadError(
            "bad_encoding",
            f"{name}: chunk {chunk} scale {int(mantissa[chunk])}*2^{int(exponent[chunk])} "
            f"with {'non-zero' if signal[chunk] else 'only zero'} codes",
        )
    values = grid.join(torch.from_numpy(levels), parts["mant"], parts["exp"])
    return Compressed(indices=torch.from_numpy(indices), values=values, shape=plan.shape, chunk=plan.chunk)


@dataclass(frozen=True)
class Codec:
    """One wire encoding of `Compressed` parameters: its parts (name -> dtype), the shapes of those
    fixed by the layout, a size bound for honest payloads, and the two directions."""

    name: str
    part_dtypes: Mapping[str, torch.dtype]
    fixed_part_shapes: Callable[[ChunkPlan, int], dict[str, tuple[int, ...]]]
    max_encoded_bytes: Callable[[ChunkPlan, int], int]
    encode: Callable[[Compressed], dict[str, torch.Tensor]]
    decode: Callable[[Mapping[str, torch.Tensor], ChunkPlan, int, str], Compressed]


CODECS: dict[str, Codec] = {
    CODEC: Codec(CODEC, PART_DTYPES, fixed_part_shapes, max_encoded_bytes, encode, decode),
    Q2_CODEC: Codec(Q2_CODEC, Q2_PART_DTYPES, q2_fixed_part_shapes, q2_max_encoded_bytes, q2_encode, q2_decode),
}


def codec_for(name: str) -> Codec:
    """The codec called `name`; ValueError for a name no codec has."""
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {sorted(CODECS)}") from None
