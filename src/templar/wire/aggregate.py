"""The lead validator's published update: `v{P}/aggregate/{window}.safetensors` (for catch-up).

Per parameter `name`, over the row-major flattened sign tensor of `numel` values:
- `name/sign`: uint8 `[ceil(numel / 8)]`, bit i set where value i is -1;
- `name/zero`: uint8, empty when no value is 0, else `[ceil(numel / 8)]` with bit i set where
  value i is 0 (its sign bit must then be clear).
Bits are little-endian within a byte; padding bits are zero. A sign is 0 only where a whole chunk
got no signal (in practice embedding rows of tokens no peer saw), so most tensors cost 1 bit per
value and none more than 2 (about 150 MB per window for the 1.2B model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from templar.core.config import PROTOCOL_VERSION
from templar.wire.container import (
    Container,
    Signer,
    Verifier,
    check_signature,
    header_bound,
    parse_container,
    parse_document,
    serialize,
    signed_digest,
)
from templar.wire.errors import PayloadError
from templar.wire.schema import AggregateDocument, Run

__all__ = ["Aggregate", "max_aggregate_bytes", "read_aggregate", "write_aggregate"]

_DOMAIN = b"templar/aggregate"
_PARTS = ("sign", "zero")


@dataclass(frozen=True, eq=False)
class Aggregate:
    """A validated published update: signs are float32 -1/0/+1 in each parameter's shape."""

    window: int
    global_step: int
    learning_rate: float
    signs: dict[str, torch.Tensor]


def _keys(expected: Mapping[str, torch.Size]) -> list[str]:
    return [f"{name}/{part}" for name in expected for part in _PARTS]


def max_aggregate_bytes(expected: Mapping[str, torch.Size]) -> int:
    """Byte cap of an aggregate payload for this schema."""
    body = sum(2 * math.ceil(math.prod(shape) / 8) for shape in expected.values())
    return 8 + header_bound(_keys(expected)) + body


def _pack(mask: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.packbits(mask.reshape(-1).numpy().astype(np.uint8), bitorder="little"))


def write_aggregate(
    signs: Mapping[str, torch.Tensor],
    *,
    window: int,
    global_step: int,
    learning_rate: float,
    hotkey: str,
    run: Run,
    sign: Signer,
) -> bytes:
    """Bit-pack, sign and serialise for `run`; ValueError if a tensor holds anything but -1/0/+1."""
    tensors: dict[str, torch.Tensor] = {}
    for name, s in signs.items():
        s = s.detach().cpu()
        if not bool(((s == -1) | (s == 0) | (s == 1)).all()):
            raise ValueError(f"{name}: signs must be -1, 0 or +1")
        zero = s == 0
        tensors[f"{name}/sign"] = _pack(s < 0)
        tensors[f"{name}/zero"] = _pack(zero) if bool(zero.any()) else torch.empty(0, dtype=torch.uint8)
    document = AggregateDocument(
        protocol=PROTOCOL_VERSION,
        netuid=run.netuid,
        run=run.digest,
        kind="aggregate",
        window=window,
        global_step=global_step,
        hotkey=hotkey,
        learning_rate=float(learning_rate),
    )
    return serialize(tensors, document.model_dump(), domain=_DOMAIN, sign=sign)


def _check_schema(container: Container, expected: Mapping[str, torch.Size]) -> None:
    wanted, present = set(_keys(expected)), set(container.entries)
    if wanted - present:
        raise PayloadError("missing_tensor", f"{sorted(wanted - present)[:3]}")
    if present - wanted:
        raise PayloadError("unexpected_tensor", f"{sorted(present - wanted)[:3]}")
    for name, shape in expected.items():
        nbytes = math.ceil(math.prod(shape) / 8)
        for part in _PARTS:
            entry = container.entries[f"{name}/{part}"]
            if entry.dtype != "U8":
                raise PayloadError("bad_dtype", f"{name}/{part}: {entry.dtype}, expected U8")
            allowed = [(nbytes,)] if part == "sign" else [(0,), (nbytes,)]
            if entry.shape not in allowed:
                raise PayloadError("bad_shape", f"{name}/{part}: shape {list(entry.shape)}")


def _unpack(name: str, stream: torch.Tensor, numel: int) -> np.ndarray:
    bits = np.unpackbits(stream.numpy(), bitorder="little")
    if bits[numel:].any():
        raise PayloadError("bad_encoding", f"{name}: non-zero padding bits")
    return bits[:numel].astype(bool)


def read_aggregate(
    data: bytes,
    expected: Mapping[str, torch.Size],
    *,
    run: Run,
    verify: Verifier | None,
    expected_hotkey: str | None = None,
    expected_window: int | None = None,
) -> Aggregate:
    """Validate and decode a published aggregate of `run`; raises `PayloadError` for anything
    malformed, unauthenticated or bound to another run."""
    data = bytes(data)
    cap = max_aggregate_bytes(expected)
    if len(data) > cap:
        raise PayloadError("oversize", f"{len(data)} > {cap} bytes")
    container = parse_container(data, max_header=header_bound(_keys(expected)))
    doc = parse_document(container, AggregateDocument)
    if (other := run.check(doc.netuid, doc.run)) is not None:
        raise PayloadError("wrong_run", other)
    if expected_hotkey is not None and doc.hotkey != expected_hotkey:
        raise PayloadError("wrong_hotkey", f"{doc.hotkey[:16]} != {expected_hotkey[:16]}")
    if expected_window is not None and doc.window != expected_window:
        raise PayloadError("wrong_window", f"{doc.window} != {expected_window}")
    _check_schema(container, expected)
    if verify is not None:
        check_signature(verify, doc.hotkey, signed_digest(_DOMAIN, container.document, container), container.signature)

    raw = container.tensors()
    signs: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        numel = math.prod(shape)
        negative = _unpack(f"{name}/sign", raw[f"{name}/sign"], numel)
        values = 1.0 - 2.0 * torch.from_numpy(negative).to(torch.float32)
        zero_stream = raw[f"{name}/zero"]
        if zero_stream.numel():
            zero = _unpack(f"{name}/zero", zero_stream, numel)
            if not zero.any() or (zero & negative).any():
                raise PayloadError("bad_encoding", f"{name}: zero mask empty or overlapping negative signs")
            values[torch.from_numpy(zero)] = 0.0
        signs[name] = values.reshape(shape)
    return Aggregate(window=doc.window, global_step=doc.global_step, learning_rate=doc.learning_rate, signs=signs)
