"""A miner's pseudo-gradient payload: `v{P}/gradient/{window}.safetensors`.

Tensors, for every parameter `name`: the parts of the run's codec (`rice-mxint8`: `name/idx_lo`,
`name/idx_hi`, `name/rice`, `name/val`, `name/exp`; `rice-q2`: `name/idx_lo`, `name/idx_hi`,
`name/rice`, `name/q`, `name/mant`, `name/exp`; see `templar.wire.codec`) and `name/probe` (float32
`[probe_count]`, the miner's own θ at `probe_positions(...)`). Metadata: a `GradientDocument`
(which names the codec) and the signature. The codec is the run's (`run_codec`: the one its outer-step
method sends, `templar.compress.methods`; `codec_name` overrides it for tools); a reader refuses a
payload of any other codec. `read_gradient` is the single entry point for peer gradients: every failure is a
`PayloadError` with a stable reason, checked cheapest first (size, header, metadata, schema,
signature, then the vectorised decode).

Two digests name a payload, for two different questions:

- the **document digest** (`document_digest`, `Gradient.document_digest`): sha256 over the whole
  signed document, i.e. the metadata bytes (window, global_step, warm-up flag, run, hotkey, codec,
  compression settings) and every tensor, gradient parts and probes alike: exactly the digest the
  hotkey signs (`signed_digest`), so a reader gets it from the hash it already computes for the
  signature, with no second pass over the payload's bytes. It is what a miner
  commits to (`templar.comms.commit`) and what a validator compares with that commitment, so
  nothing in a payload can be changed after the commitment deadline (probes copied from another
  peer, another step, the warm-up flag) without failing as `uncommitted`.
- the **content digest** (`gradient_digest`, `Gradient.digest`): sha256 over the gradient tensors
  only. It names the *work*, whoever signed it for whichever window: equal content digests are
  byte-identical updates, which is how a copy under another hotkey (`templar.gauntlet.find_pools`),
  a re-post of an earlier window's upload (`templar.validator.replays`) and the lead's inputs
  record (`templar.wire.inputs`) recognise a payload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import torch

from templar.compress import ChunkPlan, Compressed, plan_chunks, topk_per_chunk
from templar.compress.methods import rule_of
from templar.core.config import PROTOCOL_VERSION, HParams
from templar.wire import codec
from templar.wire.container import (
    DTYPE_NAMES,
    Container,
    Signer,
    Verifier,
    check_signature,
    header_bound,
    parse_container,
    parse_document,
    serialize,
    signed_digest,
    tensor_digest,
)
from templar.wire.errors import PayloadError
from templar.wire.schema import GradientDocument, Run

__all__ = ["Gradient", "document_digest", "gradient_digest", "max_gradient_bytes", "read_gradient", "write_gradient"]

_DOMAIN = b"templar/gradient"
_CONTENT_DOMAIN = b"templar/gradient-content"
_PROBE = "probe"


@dataclass(frozen=True, eq=False)
class Gradient:
    """A validated peer gradient.

    `digest`: the content digest, sha256 of the encoded gradient tensors (not probes, not metadata),
    so a byte-identical re-upload under another hotkey or in another window is caught cheaply;
    re-encoded or rescaled copies are the gauntlet's similarity check (`duplicate_threshold`), not
    this digest's. `document_digest`: sha256 of the whole signed document (metadata and every
    tensor, probes included), what the miner committed to; b"" only for gradients built in memory
    (tests, tools), which no commitment can match.
    """

    window: int
    global_step: int
    hotkey: str
    warmup: bool
    tensors: dict[str, Compressed]
    probes: dict[str, torch.Tensor]
    digest: bytes
    nbytes: int
    document_digest: bytes = b""
    extra_pages: int = 0
    """Pages the miner declared it trained beyond its assigned ones (`PagePlan.declared_pages`)."""


def run_codec(hp: HParams) -> str:
    """The wire codec of the run's outer-step method (`optimizer.method`)."""
    return rule_of(hp.optimizer.method).codec


def _layout(shape: torch.Size, hp: HParams) -> tuple[ChunkPlan, int]:
    """The chunk plan and coefficients per chunk this run's compression gives `shape`."""
    return _layout_of(tuple(shape), hp.demo.target_chunk, hp.demo.topk)


@lru_cache(maxsize=4096)
def _layout_of(shape: tuple[int, ...], target_chunk: int, topk: int) -> tuple[ChunkPlan, int]:
    """Cached: a reader looks up every parameter's layout three times per payload (size cap, schema,
    decode), and a node reads every peer's payload each window; the plan is frozen and its inputs
    are this node's own shapes and hparams, never a peer's bytes."""
    plan = plan_chunks(shape, target_chunk)
    return plan, topk_per_chunk(plan, topk)


def _keys(expected: Mapping[str, torch.Size], wire: codec.Codec) -> list[str]:
    return [f"{name}/{part}" for name in expected for part in (*wire.part_dtypes, _PROBE)]


def max_gradient_bytes(expected: Mapping[str, torch.Size], hp: HParams, *, codec_name: str | None = None) -> int:
    """Byte cap of an honest gradient payload for this schema (for transport limits too)."""
    wire = codec.codec_for(codec_name or run_codec(hp))
    total = 8 + header_bound(_keys(expected, wire))
    for shape in expected.values():
        plan, k = _layout(shape, hp)
        total += wire.max_encoded_bytes(plan, k) + 4 * hp.gauntlet.probe_count
    return total


def write_gradient(
    compressed: Mapping[str, Compressed],
    probes: Mapping[str, torch.Tensor],
    *,
    window: int,
    global_step: int,
    hotkey: str,
    hp: HParams,
    run: Run,
    sign: Signer,
    warmup: bool = False,
    codec_name: str | None = None,
    extra_pages: int = 0,
) -> bytes:
    """Encode, sign and serialise for `run`; ValueError when the caller's own data is inconsistent.
    `extra_pages`: the pages declared beyond the assigned ones (at most the run's `data.max_extra_pages`)."""
    wire = codec.codec_for(codec_name or run_codec(hp))
    if set(compressed) != set(probes):
        raise ValueError("compressed and probes must name the same parameters")
    if not 0 <= extra_pages <= hp.data.max_extra_pages:
        raise ValueError(f"extra_pages {extra_pages}: the run allows 0 to {hp.data.max_extra_pages}")
    tensors: dict[str, torch.Tensor] = {}
    for name, c in compressed.items():
        plan, k = _layout(c.shape, hp)
        if c.plan != plan or c.k != k:
            raise ValueError(f"{name}: compressed with settings other than hp.demo")
        for part, tensor in wire.encode(c).items():
            tensors[f"{name}/{part}"] = tensor
        probe = probes[name].detach().to("cpu", torch.float32).reshape(-1)
        if probe.numel() != hp.gauntlet.probe_count or not bool(torch.isfinite(probe).all()):
            raise ValueError(f"{name}: probes must be {hp.gauntlet.probe_count} finite values")
        tensors[f"{name}/{_PROBE}"] = probe
    document = GradientDocument(
        protocol=PROTOCOL_VERSION,
        netuid=run.netuid,
        run=run.digest,
        kind="gradient",
        window=window,
        global_step=global_step,
        hotkey=hotkey,
        warmup=warmup,
        target_chunk=hp.demo.target_chunk,
        topk=hp.demo.topk,
        codec=wire.name,
        extra_pages=extra_pages,
    )
    return serialize(tensors, document.model_dump(), domain=_DOMAIN, sign=sign)


def _check_schema(
    container: Container, expected: Mapping[str, torch.Size], hp: HParams, wire: codec.Codec
) -> None:
    wanted = set(_keys(expected, wire))
    present = set(container.entries)
    if wanted - present:
        raise PayloadError("missing_tensor", f"{sorted(wanted - present)[:3]}")
    if present - wanted:
        raise PayloadError("unexpected_tensor", f"{sorted(present - wanted)[:3]}")
    for name, shape in expected.items():
        plan, k = _layout(shape, hp)
        fixed = {**wire.fixed_part_shapes(plan, k), _PROBE: (hp.gauntlet.probe_count,)}
        dtypes = {**wire.part_dtypes, _PROBE: torch.float32}
        for part, dtype in dtypes.items():
            entry = container.entries[f"{name}/{part}"]
            if entry.dtype != DTYPE_NAMES[dtype]:
                raise PayloadError("bad_dtype", f"{name}/{part}: {entry.dtype}, expected {DTYPE_NAMES[dtype]}")
            want = fixed.get(part)
            if (want is not None and entry.shape != want) or (want is None and len(entry.shape) != 1):
                raise PayloadError("bad_shape", f"{name}/{part}: shape {list(entry.shape)}")


def read_gradient(
    data: bytes,
    expected: Mapping[str, torch.Size],
    hp: HParams,
    *,
    run: Run,
    verify: Verifier | None,
    expected_hotkey: str | None = None,
    expected_window: int | None = None,
    codec_name: str | None = None,
) -> Gradient:
    """Validate and decode a peer's gradient payload of `run`, encoded with the run's codec
    `codec_name`; raises `PayloadError` for anything malformed, unauthenticated, bound to another
    run or encoded with another codec.

    `verify=None` skips the signature check (local tools only; every peer path must pass one).
    """
    wire = codec.codec_for(codec_name or run_codec(hp))
    data = bytes(data)
    cap = max_gradient_bytes(expected, hp, codec_name=codec_name or run_codec(hp))
    if len(data) > cap:
        raise PayloadError("oversize", f"{len(data)} > {cap} bytes")
    container = parse_container(data, max_header=header_bound(_keys(expected, wire)))
    doc = parse_document(container, GradientDocument)
    if (other := run.check(doc.netuid, doc.run)) is not None:
        raise PayloadError("wrong_run", other)
    if (doc.target_chunk, doc.topk, doc.codec) != (hp.demo.target_chunk, hp.demo.topk, wire.name):
        raise PayloadError("bad_metadata", f"compression settings {doc.target_chunk}/{doc.topk}/{doc.codec}")
    if doc.extra_pages > hp.data.max_extra_pages:
        raise PayloadError("bad_metadata", f"declares {doc.extra_pages} extra pages; the run allows "
                           f"{hp.data.max_extra_pages}")
    if expected_hotkey is not None and doc.hotkey != expected_hotkey:
        raise PayloadError("wrong_hotkey", f"{doc.hotkey[:16]} != {expected_hotkey[:16]}")
    if expected_window is not None and doc.window != expected_window:
        raise PayloadError("wrong_window", f"{doc.window} != {expected_window}")
    _check_schema(container, expected, hp, wire)
    signed = _document_digest(container)
    if verify is not None:
        check_signature(verify, doc.hotkey, signed, container.signature)

    raw = container.tensors()
    tensors: dict[str, Compressed] = {}
    probes: dict[str, torch.Tensor] = {}
    for name, shape in expected.items():
        plan, k = _layout(shape, hp)
        parts = {part: raw[f"{name}/{part}"] for part in wire.part_dtypes}
        tensors[name] = wire.decode(parts, plan, k, name)
        probe = raw[f"{name}/{_PROBE}"]
        if not bool(torch.isfinite(probe).all()):
            raise PayloadError("non_finite", f"{name}/{_PROBE}")
        probes[name] = probe
    gradient_keys = [f"{name}/{part}" for name in expected for part in wire.part_dtypes]
    return Gradient(
        window=doc.window,
        global_step=doc.global_step,
        hotkey=doc.hotkey,
        warmup=doc.warmup,
        tensors=tensors,
        probes=probes,
        digest=tensor_digest(_CONTENT_DOMAIN, container, gradient_keys),
        nbytes=len(data),
        document_digest=signed,
        extra_pages=doc.extra_pages,
    )


def _document_digest(container: Container) -> bytes:
    """What the hotkey signs: the domain tag, the exact document bytes and every tensor's key,
    dtype, shape and bytes (`templar.wire.container.signed_digest`)."""
    return signed_digest(_DOMAIN, container.document, container)


def document_digest(data: bytes, expected: Mapping[str, torch.Size], hp: HParams) -> bytes:
    """The document digest (`Gradient.document_digest`) of a payload this node wrote itself, without
    decoding it: what a miner commits to (`templar.comms.commit`). It is the digest the payload's
    signature signs, so it covers the exact metadata bytes and every tensor (gradient parts and
    probes): any change to a committed payload, however small, fails the validator's commitment
    check."""
    wire = codec.codec_for(run_codec(hp))
    return _document_digest(parse_container(bytes(data), max_header=header_bound(_keys(expected, wire))))


def gradient_digest(data: bytes, expected: Mapping[str, torch.Size], hp: HParams) -> bytes:
    """The content digest (`Gradient.digest`) of a payload this node wrote itself, without decoding
    it: the same sha256 over the gradient tensors only that `read_gradient` computes. Not the
    commitment (that is `document_digest`): it stays the same when probes or metadata change."""
    wire = codec.codec_for(run_codec(hp))
    container = parse_container(bytes(data), max_header=header_bound(_keys(expected, wire)))
    return tensor_digest(_CONTENT_DOMAIN, container, [f"{name}/{part}" for name in expected
                                                      for part in wire.part_dtypes])


def coefficient_count(expected: Mapping[str, torch.Size], hp: HParams) -> int:
    """Kept coefficients per payload for this schema (for bytes-per-coefficient figures)."""
    total = 0
    for shape in expected.values():
        plan, k = _layout(shape, hp)
        total += plan.n_chunks * k
    return total

