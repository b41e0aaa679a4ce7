"""The lead's published update of a SparseLoCo window: `v{P}/aggregate/{window}.safetensors`, as a bundle.

A signed run's update is one bit per parameter (`templar.wire.aggregate`). SparseLoCo's is a
dense mean that no compact exact form holds, so the lead publishes what makes it instead: the
compressed payloads it aggregated, re-encoded with the run's codec (which round-trips `Compressed`
bit for bit), in the order of its inputs, signed by the lead. A node catching up decodes them and
runs the method's own aggregate (`templar.compress.methods`), which is a pure function of the
payloads: the same update, bit for bit, as the window's live step. At 1.2B with 15 peers a bundle
is about 15 payloads (~20 MB each at 64 of 4,096 kept), against the signed aggregate's ~150 MB.

Layout: for peer i and parameter `name`, the codec's parts as `{i}/{name}/{part}`; the document
names the window, global_step, learning rate, the lead's hotkey, the codec, the peers' hotkeys and the
ceiling on the step's clip level the window's inputs named (`clip_norm`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from templar.compress import Compressed
from templar.core.config import PROTOCOL_VERSION, HParams
from templar.wire import codec as codecs
from templar.wire.container import (
    DTYPE_NAMES,
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
from templar.wire.gradient import _layout, run_codec
from templar.wire.schema import MAX_INPUTS, BundleDocument, Run

__all__ = ["Bundle", "max_bundle_bytes", "read_bundle", "write_bundle"]

_DOMAIN = b"templar/bundle"
_MAX_DOCUMENT = 1024 + MAX_INPUTS * 72


@dataclass(frozen=True, eq=False)
class Bundle:
    """A validated bundle: the aggregated peers' payloads, in the lead's order."""

    window: int
    global_step: int
    learning_rate: float
    hotkeys: list[str]
    peers: list[dict[str, Compressed]]
    clip_norm: float | None = None


def _keys(expected: Mapping[str, torch.Size], n: int, codec: codecs.Codec) -> list[str]:
    return [f"{i}/{name}/{part}" for i in range(n) for name in expected for part in codec.part_dtypes]


def max_bundle_bytes(expected: Mapping[str, torch.Size], hp: HParams) -> int:
    """Byte cap of a bundle of `top_g` payloads for this schema."""
    codec = codecs.codec_for(run_codec(hp))
    one = sum(codec.max_encoded_bytes(*_layout(shape, hp)) for shape in expected.values())
    n = hp.gauntlet.top_g
    return 8 + header_bound(_keys(expected, n, codec)) + _MAX_DOCUMENT + n * one


def write_bundle(peers: Sequence[tuple[str, Mapping[str, Compressed]]], *, window: int, global_step: int,
                 learning_rate: float, hotkey: str, hp: HParams, run: Run, sign: Signer,
                 clip_norm: float | None = None) -> bytes:
    """Encode, sign and serialise the aggregated payloads for `run` (ValueError: the caller's bug)."""
    codec = codecs.codec_for(run_codec(hp))
    tensors: dict[str, torch.Tensor] = {}
    for i, (_, tensors_of) in enumerate(peers):
        for name, c in tensors_of.items():
            for part, t in codec.encode(c).items():
                tensors[f"{i}/{name}/{part}"] = t
    document = BundleDocument(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, kind="bundle",
                              window=window, global_step=global_step, hotkey=hotkey,
                              learning_rate=float(learning_rate), codec=codec.name, peers=[hk for hk, _ in peers],
                              clip_norm=clip_norm)
    return serialize(tensors, document.model_dump(), domain=_DOMAIN, sign=sign, max_document=_MAX_DOCUMENT)


def read_bundle(data: bytes, expected: Mapping[str, torch.Size], hp: HParams, *, run: Run,
                verify: Verifier | None, expected_hotkey: str | None = None,
                expected_window: int | None = None) -> Bundle:
    """Validate and decode a bundle of `run`; `PayloadError` for anything malformed, unauthenticated,
    of another run, window, signer or codec, or with more peers than the run aggregates."""
    data = bytes(data)
    cap = max_bundle_bytes(expected, hp)
    if len(data) > cap:
        raise PayloadError("oversize", f"{len(data)} > {cap} bytes")
    codec = codecs.codec_for(run_codec(hp))
    container = parse_container(data, max_header=header_bound(_keys(expected, hp.gauntlet.top_g, codec))
                                + _MAX_DOCUMENT, max_document=_MAX_DOCUMENT)
    doc = parse_document(container, BundleDocument)
    if (other := run.check(doc.netuid, doc.run)) is not None:
        raise PayloadError("wrong_run", other)
    if doc.codec != codec.name:
        raise PayloadError("bad_metadata", f"codec {doc.codec}, the run's is {codec.name}")
    if len(doc.peers) > hp.gauntlet.top_g:
        raise PayloadError("bad_metadata", f"{len(doc.peers)} peers, the run aggregates at most {hp.gauntlet.top_g}")
    if expected_hotkey is not None and doc.hotkey != expected_hotkey:
        raise PayloadError("wrong_hotkey", f"{doc.hotkey[:16]} != {expected_hotkey[:16]}")
    if expected_window is not None and doc.window != expected_window:
        raise PayloadError("wrong_window", f"{doc.window} != {expected_window}")
    wanted = set(_keys(expected, len(doc.peers), codec))
    present = set(container.entries)
    if wanted != present:
        problem = sorted(wanted - present)[:2] or sorted(present - wanted)[:2]
        raise PayloadError("missing_tensor" if wanted - present else "unexpected_tensor", str(problem))
    for name, shape in expected.items():
        fixed = codec.fixed_part_shapes(*_layout(shape, hp))
        for i in range(len(doc.peers)):
            for part, dtype in codec.part_dtypes.items():
                entry = container.entries[f"{i}/{name}/{part}"]
                if entry.dtype != DTYPE_NAMES[dtype]:
                    raise PayloadError("bad_dtype", f"{i}/{name}/{part}: {entry.dtype}, expected {DTYPE_NAMES[dtype]}")
                want = fixed.get(part)
                if (want is not None and entry.shape != want) or (want is None and len(entry.shape) != 1):
                    raise PayloadError("bad_shape", f"{i}/{name}/{part}: shape {list(entry.shape)}")
    if verify is not None:
        check_signature(verify, doc.hotkey, signed_digest(_DOMAIN, container.document, container), container.signature)
    raw = container.tensors()
    peers: list[dict[str, Compressed]] = []
    for i in range(len(doc.peers)):
        decoded = {}
        for name, shape in expected.items():
            plan, k = _layout(shape, hp)
            parts = {part: raw[f"{i}/{name}/{part}"] for part in codec.part_dtypes}
            decoded[name] = codec.decode(parts, plan, k, f"{i}/{name}")
        peers.append(decoded)
    return Bundle(window=doc.window, global_step=doc.global_step, learning_rate=doc.learning_rate,
                  hotkeys=list(doc.peers), peers=peers, clip_norm=doc.clip_norm)
