"""Strict safetensors container: bounded header parsing, typed metadata, digests and signatures.

Layout of every payload: safetensors tensors plus two `__metadata__` strings: `templar`, a JSON
document checked against a strict pydantic model (3.0 or "3" is not an int), and `signature`, the
hex signature by the writer's hotkey of `signed_digest(...)`: sha256 over a domain tag, the exact
`templar` document bytes, and every tensor's key, dtype, shape and bytes in key order. The header
length is capped before anything is parsed, JSON with duplicate keys or NaN constants is refused,
and offsets must tile the data exactly (as safetensors itself requires).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from templar.core.config import PROTOCOL_VERSION
from templar.wire.errors import PayloadError

__all__ = [
    "DTYPE_NAMES",
    "Container",
    "Signer",
    "TensorEntry",
    "Verifier",
    "header_bound",
    "parse_container",
    "parse_document",
    "serialize",
    "signed_digest",
    "tensor_digest",
]

Signer = Callable[[bytes], bytes]
"""Signs a 32-byte digest with the node's hotkey (injected: only templar.chain imports bittensor)."""
Verifier = Callable[[str, bytes, bytes], bool]
"""verify(hotkey_ss58, message, signature) -> bool; may raise ValueError for a malformed address."""

DTYPE_NAMES: dict[torch.dtype, str] = {torch.uint8: "U8", torch.int8: "I8", torch.float32: "F32"}
_ITEMSIZE = {"U8": 1, "I8": 1, "F32": 4}
_MAX_DOC_BYTES = 2048
_MAX_SIGNATURE_HEX = 256
_META_KEYS = frozenset({"templar", "signature"})


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offsets into the payload
    end: int


@dataclass(frozen=True)
class Container:
    """A parsed payload whose header passed every structural check."""

    data: bytes
    document: bytes  # the exact `templar` metadata string, UTF-8
    signature: bytes
    entries: dict[str, TensorEntry]

    def tensors(self) -> dict[str, torch.Tensor]:
        """Materialise the tensors through the safetensors library (copies, aligned)."""
        try:
            return st_load(self.data)
        except SafetensorError as exc:
            raise PayloadError("not_safetensors", str(exc)[:200]) from exc


def header_bound(keys: Iterable[str]) -> int:
    """Largest header an honest writer produces for these tensor keys (plus generous slack)."""
    return 4096 + _MAX_DOC_BYTES + _MAX_SIGNATURE_HEX + sum(len(k.encode()) + 128 for k in keys)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


def _strict_json(text: str | bytes) -> Any:
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def _utf8(document: str) -> bytes:
    """The metadata document's UTF-8 bytes. JSON's `\\ud800` escape decodes to a lone surrogate,
    which UTF-8 cannot encode: refused as `bad_metadata`, since a bare `UnicodeEncodeError` would
    escape every reader that catches only `PayloadError` (and make `gather` raise)."""
    try:
        return document.encode()
    except UnicodeEncodeError as exc:
        raise PayloadError("bad_metadata", "metadata document is not valid Unicode (lone surrogate)") from exc


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry(key: str, raw: Any, base: int) -> TensorEntry:
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data_offsets"}:
        raise PayloadError("not_safetensors", f"{key}: malformed tensor entry")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
        raise PayloadError("bad_dtype", f"{key}: dtype {str(dtype)[:16]!r} not accepted")
    if not isinstance(shape, list) or len(shape) > 4 or not all(_is_int(s) and s >= 0 for s in shape):
        raise PayloadError("bad_shape", f"{key}: malformed shape")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) and o >= 0 for o in offsets):
        raise PayloadError("not_safetensors", f"{key}: malformed data_offsets")
    start, end = offsets
    if end - start != math.prod(shape) * _ITEMSIZE[dtype]:
        raise PayloadError("not_safetensors", f"{key}: data_offsets do not match shape and dtype")
    return TensorEntry(dtype=dtype, shape=tuple(shape), start=base + start, end=base + end)


def parse_container(data: bytes, *, max_header: int, max_document: int = _MAX_DOC_BYTES) -> Container:
    """Parse the header and metadata of `data` (tensors stay unread). Raises PayloadError.
    `max_document`: the cap on the `templar` document (a kind whose document lists peers needs more)."""
    if len(data) < 8:
        raise PayloadError("not_safetensors", "shorter than the 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n > max_header:
        raise PayloadError("header_too_large", f"{n} > {max_header} bytes")
    if 8 + n > len(data):
        raise PayloadError("not_safetensors", "truncated header")
    try:
        header = _strict_json(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PayloadError("not_safetensors", f"header is not strict JSON: {str(exc)[:100]}") from exc
    if not isinstance(header, dict):
        raise PayloadError("not_safetensors", "header is not an object")
    meta = header.pop("__metadata__", None)
    if not isinstance(meta, dict) or set(meta) != _META_KEYS or not all(isinstance(v, str) for v in meta.values()):
        raise PayloadError("bad_metadata", f"metadata must hold exactly {sorted(_META_KEYS)} as strings")
    document, signature_hex = _utf8(meta["templar"]), meta["signature"]
    if len(document) > max_document:
        raise PayloadError("bad_metadata", "metadata document too large")
    if len(signature_hex) > _MAX_SIGNATURE_HEX or len(signature_hex) % 2:
        raise PayloadError("bad_signature", "signature is not short, even-length hex")
    try:
        signature = bytes.fromhex(signature_hex)
    except ValueError as exc:
        raise PayloadError("bad_signature", "signature is not hex") from exc
    base = 8 + n
    entries = {key: _entry(key, raw, base) for key, raw in header.items()}
    cursor = base
    for entry in sorted(entries.values(), key=lambda e: (e.start, e.end)):
        if entry.start != cursor:
            raise PayloadError("not_safetensors", "tensor data has gaps or overlaps")
        cursor = entry.end
    if cursor != len(data):
        raise PayloadError("not_safetensors", f"tensor data ends at {cursor}, payload has {len(data)} bytes")
    return Container(data=data, document=document, signature=signature, entries=entries)


M = TypeVar("M", bound=BaseModel)


def parse_document(container: Container, model: type[M]) -> M:
    """The `templar` metadata document, protocol checked first, then the strict `model`."""
    try:
        doc = _strict_json(container.document)
    except (ValueError, RecursionError) as exc:
        raise PayloadError("bad_metadata", f"document is not strict JSON: {str(exc)[:100]}") from exc
    if not isinstance(doc, dict):
        raise PayloadError("bad_metadata", "document is not an object")
    protocol = doc.get("protocol")
    if not _is_int(protocol):
        raise PayloadError("bad_metadata", "protocol is missing or not an integer")
    if protocol != PROTOCOL_VERSION:
        raise PayloadError("wrong_protocol", f"protocol {protocol} != {PROTOCOL_VERSION}")
    try:
        return model.model_validate(doc, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise PayloadError("bad_metadata", f"{where}: {first['msg']}") from exc


def _field(h: Any, payload: bytes | memoryview) -> None:
    h.update(len(payload).to_bytes(8, "little"))
    h.update(payload)


def _tensor_items(container: Container, keys: Iterable[str]) -> Iterable[tuple[str, str, tuple[int, ...], memoryview]]:
    view = memoryview(container.data)
    for key in keys:
        e = container.entries[key]
        yield key, e.dtype, e.shape, view[e.start : e.end]


def _digest(domain: bytes, document: bytes | None, items: Iterable[tuple[str, str, tuple[int, ...], Any]]) -> bytes:
    h = hashlib.sha256()
    _field(h, domain)
    if document is not None:
        _field(h, document)
    for key, dtype, shape, buf in sorted(items, key=lambda item: item[0]):
        _field(h, key.encode())
        _field(h, dtype.encode())
        _field(h, json.dumps(list(shape)).encode())
        _field(h, buf)
    return h.digest()


def _as_items(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, str, tuple[int, ...], memoryview]]:
    items = []
    for key, t in tensors.items():
        raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        items.append((key, DTYPE_NAMES[t.dtype], tuple(t.shape), memoryview(raw)))
    return items


def signed_digest(domain: bytes, document: bytes, source: Container | Mapping[str, torch.Tensor]) -> bytes:
    """What the hotkey signs: the document and every tensor (reader: Container; writer: tensors)."""
    if isinstance(source, Container):
        return _digest(domain, document, _tensor_items(source, source.entries))
    return _digest(domain, document, _as_items(source))


def check_signature(verify: Verifier, hotkey: str, message: bytes, signature: bytes) -> None:
    """`PayloadError("bad_signature")` unless `verify` accepts `signature` of `message` by `hotkey`
    (a verifier that raises ValueError on malformed input is a rejection too)."""
    try:
        ok = verify(hotkey, message, signature)
    except ValueError as exc:
        raise PayloadError("bad_signature", f"verifier rejected the input: {str(exc)[:100]}") from exc
    if not bool(ok):
        raise PayloadError("bad_signature", f"not signed by {hotkey}")


def tensor_digest(domain: bytes, source: Container | Mapping[str, torch.Tensor], keys: Iterable[str]) -> bytes:
    """sha256 of the named tensors only (duplicate detection across hotkeys)."""
    keys = list(keys)
    if isinstance(source, Container):
        return _digest(domain, None, _tensor_items(source, keys))
    return _digest(domain, None, _as_items({k: source[k] for k in keys}))


def serialize(
    tensors: Mapping[str, torch.Tensor], document: Mapping[str, Any], *, domain: bytes, sign: Signer,
    max_document: int = _MAX_DOC_BYTES,
) -> bytes:
    """safetensors bytes of `tensors` with the canonical document and its signature."""
    for key, t in tensors.items():
        if t.dtype not in DTYPE_NAMES:
            raise ValueError(f"{key}: dtype {t.dtype} is not part of the wire format")
    doc = json.dumps(dict(document), sort_keys=True, separators=(",", ":"), allow_nan=False)
    if len(doc.encode()) > max_document:
        raise ValueError("metadata document too large")
    signature = sign(signed_digest(domain, doc.encode(), tensors))
    if not isinstance(signature, bytes | bytearray) or 2 * len(signature) > _MAX_SIGNATURE_HEX:
        raise ValueError("sign() must return at most 128 bytes")
    cpu = {k: t.detach().contiguous().cpu() for k, t in tensors.items()}
    return st_save(cpu, metadata={"templar": doc, "signature": bytes(signature).hex()})
