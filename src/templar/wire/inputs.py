"""The lead validator's record of a window's outer step: `v{P}/inputs/{window}.safetensors`.

It names the exact payloads the lead aggregated (hotkey and content digest, `Gradient.digest`)
and the global_step they were applied at, and it goes out as soon as the lead's gather ends,
ahead of the aggregate. Every other node applies exactly this set (the payloads it gathered
itself when their digests match, the others fetched from their owners' buckets) or, failing that,
the lead's aggregate itself; a node's own gather only decides what it scores. So a node whose
clock lags, or whose gather saw a different set, still applies the run's update, and a node that
cannot read this record does not guess (`templar.runtime.consensus.follow`).

Layout: one tensor `digests` (uint8 `[n, 32]`, row i the digest of `peers[i]`) and the signed
document (`InputsDocument`: window, global_step, the lead's hotkey, the peers' hotkeys in order, and
the lead's ceiling on the step's clip level, `clip_norm`, or null).
An empty set (n = 0) says the window had no outer step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from templar.core.config import PROTOCOL_VERSION
from templar.wire.container import (
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
from templar.wire.schema import MAX_INPUTS, InputsDocument, Run

__all__ = ["StepInputs", "max_inputs_bytes", "read_inputs", "write_inputs"]

_DOMAIN = b"templar/inputs"
_DIGESTS = "digests"
DIGEST_BYTES = 32
_MAX_DOCUMENT = 1024 + MAX_INPUTS * 72  # hotkeys of at most 64 characters, quoted, plus the fields


@dataclass(frozen=True)
class StepInputs:
    """What the lead aggregated at `window`: (hotkey, digest) of each payload, in its order, and
    `clip_norm`, the lead's ceiling on the size each is clipped to (None: the payloads' own median;
    `templar.validator.fast_eval.step_ceiling`)."""

    window: int
    global_step: int
    peers: tuple[tuple[str, bytes], ...]
    clip_norm: float | None = None

    @property
    def hotkeys(self) -> list[str]:
        return [hotkey for hotkey, _ in self.peers]


def max_inputs_bytes() -> int:
    """Byte cap of an inputs record (the largest set the schema allows)."""
    return 8 + header_bound([_DIGESTS]) + _MAX_DOCUMENT + MAX_INPUTS * DIGEST_BYTES


def write_inputs(inputs: StepInputs, *, hotkey: str, run: Run, sign: Signer) -> bytes:
    """Sign and serialise for `run`; ValueError when the set is inconsistent (the caller's bug)."""
    hotkeys = inputs.hotkeys
    if len(set(hotkeys)) != len(hotkeys) or any(len(d) != DIGEST_BYTES for _, d in inputs.peers):
        raise ValueError("inputs: hotkeys must be unique and digests 32 bytes")
    digests = torch.tensor([list(d) for _, d in inputs.peers], dtype=torch.uint8).reshape(len(hotkeys), DIGEST_BYTES)
    document = InputsDocument(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, kind="inputs",
                              window=inputs.window, global_step=inputs.global_step, hotkey=hotkey, peers=hotkeys,
                              clip_norm=inputs.clip_norm)
    return serialize({_DIGESTS: digests}, document.model_dump(), domain=_DOMAIN, sign=sign,
                     max_document=_MAX_DOCUMENT)


def read_inputs(data: bytes, *, run: Run, verify: Verifier | None, expected_hotkey: str | None = None,
                expected_window: int | None = None, max_peers: int | None = None) -> StepInputs:
    """Validate and decode the lead's inputs record of `run`; raises `PayloadError` for anything
    malformed, unauthenticated, of another run, of another window or not the lead's, and for more
    payloads than `max_peers` (the run's `gauntlet.top_g`): each is applied at weight 1/G, so a record
    naming 256 made every node fetch and decode 256 payloads in the apply span and take a step
    256/G times the run's, where catch-up's reader (`read_bundle`) refused it."""
    data = bytes(data)
    if len(data) > max_inputs_bytes():
        raise PayloadError("oversize", f"{len(data)} > {max_inputs_bytes()} bytes")
    container = parse_container(data, max_header=header_bound([_DIGESTS]) + _MAX_DOCUMENT,
                                max_document=_MAX_DOCUMENT)
    doc = parse_document(container, InputsDocument)
    if (other := run.check(doc.netuid, doc.run)) is not None:
        raise PayloadError("wrong_run", other)
    if expected_hotkey is not None and doc.hotkey != expected_hotkey:
        raise PayloadError("wrong_hotkey", f"{doc.hotkey[:16]} != {expected_hotkey[:16]}")
    if expected_window is not None and doc.window != expected_window:
        raise PayloadError("wrong_window", f"{doc.window} != {expected_window}")
    if max_peers is not None and len(doc.peers) > max_peers:
        raise PayloadError("bad_metadata", f"{len(doc.peers)} peers, the run aggregates at most {max_peers}")
    if set(container.entries) != {_DIGESTS}:
        raise PayloadError("unexpected_tensor", f"{sorted(container.entries)[:3]}")
    entry = container.entries[_DIGESTS]
    if entry.dtype != "U8":
        raise PayloadError("bad_dtype", f"{_DIGESTS}: {entry.dtype}, expected U8")
    if entry.shape != (len(doc.peers), DIGEST_BYTES):
        raise PayloadError("bad_shape", f"{_DIGESTS}: shape {list(entry.shape)} for {len(doc.peers)} peers")
    if verify is not None:
        check_signature(verify, doc.hotkey, signed_digest(_DOMAIN, container.document, container), container.signature)
    raw = bytes(container.data[entry.start:entry.end])
    digests = [raw[i * DIGEST_BYTES:(i + 1) * DIGEST_BYTES] for i in range(len(doc.peers))]
    return StepInputs(window=doc.window, global_step=doc.global_step, peers=tuple(zip(doc.peers, digests, strict=True)),
                      clip_norm=doc.clip_norm)
