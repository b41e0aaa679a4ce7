"""Gradient payloads: real sr25519 signatures, every rejection reason, and byte-mutation fuzzing."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from templar.compress import DCTCompressor
from templar.wire import (
    PayloadError,
    Run,
    document_digest,
    gradient_digest,
    max_gradient_bytes,
    read_gradient,
    take_probes,
    write_gradient,
)
from templar.wire.container import signed_digest
from templar.wire.gradient import _DOMAIN

WINDOW, STEP = 7, 3
RUN = Run(netuid=7, digest="ab" * 32)


@pytest.fixture(scope="module")
def payload(hp, small_shapes, keypair) -> bytes:
    gen = torch.Generator().manual_seed(0)
    params = {n: torch.randn(s, generator=gen) for n, s in small_shapes.items()}
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    compressed = {n: compressor.compress(torch.randn(s, generator=gen)) for n, s in small_shapes.items()}
    probes = take_probes(params, seed=11, window=WINDOW, count=hp.gauntlet.probe_count)
    return write_gradient(
        compressed, probes, window=WINDOW, global_step=STEP, hotkey=keypair.ss58_address, hp=hp, run=RUN, sign=keypair.sign
    )


def _parts(data: bytes) -> tuple[dict[str, torch.Tensor], dict]:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return st_load(data), json.loads(header["__metadata__"]["templar"])


def _forge(tensors, doc, signer=None, *, raw_doc: str | None = None, signature: str | None = None) -> bytes:
    """Re-serialise with arbitrary content; signed properly by `signer` when given."""
    text = raw_doc if raw_doc is not None else json.dumps(doc, sort_keys=True, separators=(",", ":"))
    if signature is None:
        signature = signer.sign(signed_digest(_DOMAIN, text.encode(), tensors)).hex() if signer else "00"
    return st_save(tensors, metadata={"templar": text, "signature": signature})


def _reason(data: bytes, hp, shapes, **kwargs) -> str:
    kwargs.setdefault("verify", None)
    with pytest.raises(PayloadError) as info:
        read_gradient(data, shapes, hp, **{"run": RUN, **kwargs})
    return info.value.reason


def test_round_trip_with_a_real_signature(payload, hp, small_shapes, keypair, verify) -> None:
    g = read_gradient(
        payload, small_shapes, hp, run=RUN, verify=verify, expected_hotkey=keypair.ss58_address, expected_window=WINDOW
    )
    assert (g.window, g.global_step, g.hotkey, g.warmup, g.nbytes) == (WINDOW, STEP, keypair.ss58_address, False, len(payload))
    assert set(g.tensors) == set(small_shapes) == set(g.probes)
    assert all(p.shape == (hp.gauntlet.probe_count,) and p.dtype == torch.float32 for p in g.probes.values())
    assert len(g.digest) == 32
    assert len(payload) <= max_gradient_bytes(small_shapes, hp)
    tensors, doc = _parts(payload)
    resigned = _forge(tensors, {**doc, "global_step": STEP + 1}, keypair)
    again = read_gradient(resigned, small_shapes, hp, run=RUN, verify=verify)
    assert again.digest == g.digest and again.global_step == STEP + 1  # digest covers tensors only


def test_signature_binds_hotkey_metadata_and_tensors(payload, hp, small_shapes, keypair, verify) -> None:
    from bittensor.sp_core import Keypair

    bob = Keypair.create_from_uri("//Bob")
    tensors, doc = _parts(payload)
    assert _reason(_forge(tensors, doc, bob), hp, small_shapes, verify=verify) == "bad_signature"
    assert _reason(_forge(tensors, {**doc, "window": WINDOW + 1}, signature=_parts_sig(payload)), hp, small_shapes, verify=verify) == "bad_signature"
    tampered = dict(tensors)
    tampered["proj/val"] = tensors["proj/val"].clone()
    tampered["proj/val"][0] += 1
    assert _reason(_forge(tampered, doc, signature=_parts_sig(payload)), hp, small_shapes, verify=verify) == "bad_signature"
    assert _reason(_forge(tensors, doc, signature="zz"), hp, small_shapes, verify=verify) == "bad_signature"
    assert _reason(_forge(tensors, {**doc, "hotkey": "not-an-address"}, keypair), hp, small_shapes, verify=verify) == "bad_signature"
    claims_bob = _forge(tensors, {**doc, "hotkey": bob.ss58_address}, bob)
    assert read_gradient(claims_bob, small_shapes, hp, run=RUN, verify=verify).hotkey == bob.ss58_address
    assert _reason(claims_bob, hp, small_shapes, verify=verify, expected_hotkey=keypair.ss58_address) == "wrong_hotkey"


def test_declared_extra_pages_round_trip_within_the_runs_bound(payload, hp, small_shapes, keypair, verify) -> None:
    """The pages a miner declares beyond its assigned ones travel in the signed document (the
    commitment covers them); a count above the run's `data.max_extra_pages` is refused on both ends."""
    assert read_gradient(payload, small_shapes, hp, run=RUN, verify=verify).extra_pages == 0
    tensors, doc = _parts(payload)
    declared = _forge(tensors, {**doc, "extra_pages": hp.data.max_extra_pages}, keypair)
    assert read_gradient(declared, small_shapes, hp, run=RUN, verify=verify).extra_pages == hp.data.max_extra_pages
    over = _forge(tensors, {**doc, "extra_pages": hp.data.max_extra_pages + 1}, keypair)
    assert _reason(over, hp, small_shapes, verify=verify) == "bad_metadata"
    compressed = {n: DCTCompressor(hp.demo.target_chunk, hp.demo.topk).compress(torch.ones(s))
                  for n, s in small_shapes.items()}
    probes = take_probes({n: torch.ones(s) for n, s in small_shapes.items()}, seed=1, window=WINDOW,
                         count=hp.gauntlet.probe_count)
    with pytest.raises(ValueError, match="extra_pages"):
        write_gradient(compressed, probes, window=WINDOW, global_step=STEP, hotkey=keypair.ss58_address, hp=hp,
                       run=RUN, sign=keypair.sign, extra_pages=hp.data.max_extra_pages + 1)


def _parts_sig(data: bytes) -> str:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n])["__metadata__"]["signature"]


def test_every_structural_reason(payload, hp, small_shapes) -> None:
    tensors, doc = _parts(payload)
    cap = max_gradient_bytes(small_shapes, hp)
    assert _reason(payload + b"\0" * cap, hp, small_shapes) == "oversize"
    assert _reason(b"short", hp, small_shapes) == "not_safetensors"
    assert _reason(b"\x80\x04\x95 pickle", hp, small_shapes) == "header_too_large"
    assert _reason(payload[:40], hp, small_shapes) == "not_safetensors"
    assert _reason(payload[:-1], hp, small_shapes) == "not_safetensors"
    assert _reason((10**9).to_bytes(8, "little") + payload[8:], hp, small_shapes) == "header_too_large"
    n = int.from_bytes(payload[:8], "little")
    assert _reason(payload[:8] + b"{" * n + payload[8 + n :], hp, small_shapes) == "not_safetensors"
    assert _reason(_forge({k: v for k, v in tensors.items() if k != "norm/val"}, doc), hp, small_shapes) == "missing_tensor"
    assert _reason(_forge({**tensors, "extra": torch.zeros(1)}, doc), hp, small_shapes) == "unexpected_tensor"
    assert _reason(_forge({**tensors, "proj/val": tensors["proj/val"].float()}, doc), hp, small_shapes) == "bad_dtype"
    assert _reason(_forge({**tensors, "proj/exp": tensors["proj/exp"][:-1]}, doc), hp, small_shapes) == "bad_shape"
    assert _reason(_forge({**tensors, "norm/probe": torch.zeros(5)}, doc), hp, small_shapes) == "bad_shape"
    nan_probe = tensors["norm/probe"].clone()
    nan_probe[1] = float("nan")
    assert _reason(_forge({**tensors, "norm/probe": nan_probe}, doc), hp, small_shapes) == "non_finite"
    assert _reason(_forge({**tensors, "proj/exp": torch.full_like(tensors["proj/exp"], 127)}, doc), hp, small_shapes) == "non_finite"
    hi = tensors["proj/idx_hi"]
    assert _reason(_forge({**tensors, "proj/idx_hi": torch.cat([hi, hi[:1] * 0])}, doc), hp, small_shapes) == "bad_encoding"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"window": 7.0}, "bad_metadata"),
        ({"window": "7"}, "bad_metadata"),
        ({"global_step": True}, "bad_metadata"),
        ({"global_step": -1}, "bad_metadata"),
        ({"warmup": 0}, "bad_metadata"),
        ({"extra": 1}, "bad_metadata"),
        ({"kind": "aggregate"}, "bad_metadata"),
        ({"topk": 16}, "bad_metadata"),
        ({"codec": "raw"}, "bad_metadata"),
        ({"protocol": 1}, "wrong_protocol"),
        ({"netuid": "7"}, "bad_metadata"),
        ({"run": "not-hex"}, "bad_metadata"),
        ({"protocol": "2"}, "bad_metadata"),
        ({"extra_pages": -1}, "bad_metadata"),
        ({"extra_pages": 1.0}, "bad_metadata"),
        ({"extra_pages": 3}, "bad_metadata"),  # tiny allows 2 (data.max_extra_pages)
        ({"extra_pages": 10**6}, "bad_metadata"),
    ],
)
def test_metadata_is_strictly_typed(payload, hp, small_shapes, change, reason) -> None:
    tensors, doc = _parts(payload)
    assert _reason(_forge(tensors, {**doc, **change}), hp, small_shapes) == reason


def test_malformed_metadata_documents(payload, hp, small_shapes) -> None:
    tensors, doc = _parts(payload)
    body = json.dumps(doc)
    assert _reason(_forge(tensors, doc, raw_doc=body[:-1]), hp, small_shapes) == "bad_metadata"
    assert _reason(_forge(tensors, doc, raw_doc=body[:-1] + ', "window": 8}'), hp, small_shapes) == "bad_metadata"
    assert _reason(_forge(tensors, doc, raw_doc=body.replace(f"\"window\": {WINDOW}", "\"window\": NaN")), hp, small_shapes) == "bad_metadata"
    assert _reason(_forge(tensors, doc, raw_doc=" " * 3000 + body), hp, small_shapes) == "bad_metadata"
    assert _reason(st_save(tensors, metadata={"templar": body}), hp, small_shapes) == "bad_metadata"
    assert _reason(st_save(tensors), hp, small_shapes) == "bad_metadata"


def test_window_and_hotkey_expectations(payload, hp, small_shapes, keypair) -> None:
    assert _reason(payload, hp, small_shapes, expected_window=WINDOW + 1) == "wrong_window"
    assert _reason(payload, hp, small_shapes, expected_hotkey="5F" + "x" * 46) == "wrong_hotkey"
    read_gradient(payload, small_shapes, hp, run=RUN, verify=None, expected_hotkey=keypair.ss58_address, expected_window=WINDOW)


def test_writer_refuses_inconsistent_input(hp, small_shapes, keypair) -> None:
    compressor = DCTCompressor(hp.demo.target_chunk, 8)
    compressed = {n: compressor.compress(torch.randn(s)) for n, s in small_shapes.items()}
    probes = {n: torch.zeros(hp.gauntlet.probe_count) for n in small_shapes}
    with pytest.raises(ValueError):
        write_gradient(compressed, probes, window=1, global_step=0, hotkey="hk", hp=hp, run=RUN, sign=keypair.sign)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), max_size=8),
    cut=st.one_of(st.none(), st.integers(min_value=0)),
)
def test_mutated_payloads_only_ever_raise_payload_error(payload, hp, small_shapes, data, edits, cut) -> None:
    blob = bytearray(payload)
    header_end = 8 + int.from_bytes(payload[:8], "little")
    for position, value in edits:
        # half the edits land in the header, where the parser is most exposed
        where = position % header_end if data.draw(st.booleans()) else position % len(blob)
        blob[where] = value
    if cut is not None:
        blob = blob[: cut % (len(blob) + 1)]
    with contextlib.suppress(PayloadError):
        read_gradient(bytes(blob), small_shapes, hp, run=RUN, verify=None)


@pytest.mark.parametrize("other", [Run(netuid=8, digest="ab" * 32), Run(netuid=7, digest="cd" * 32)])
def test_a_payload_of_another_subnet_or_run_is_wrong_run(payload, hp, small_shapes, verify, other) -> None:
    """Same shapes, same codec, a valid signature: bound to another run all the same."""
    assert _reason(payload, hp, small_shapes, run=other, verify=verify) == "wrong_run"


# -- the two digests: the document digest (the commitment) and the content digest (the work)

def _variants(hp, small_shapes, keypair) -> dict[str, bytes]:
    """One update written as payloads that differ in exactly one signed field each."""
    gen = torch.Generator().manual_seed(5)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    compressed = {n: compressor.compress(torch.randn(s, generator=gen)) for n, s in small_shapes.items()}
    params = {n: torch.randn(s, generator=gen) for n, s in small_shapes.items()}
    probes = take_probes(params, seed=11, window=WINDOW, count=hp.gauntlet.probe_count)
    copied = {n: p + 0.5 for n, p in probes.items()}  # another peer's probes, say

    def write(**changes) -> bytes:
        kwargs = {"window": WINDOW, "global_step": STEP, "warmup": False, "run": RUN, "probes": probes, **changes}
        return write_gradient(compressed, kwargs.pop("probes"), hotkey=keypair.ss58_address, hp=hp,
                              sign=keypair.sign, **kwargs)

    return {"base": write(), "probes": write(probes=copied), "global_step": write(global_step=STEP + 1),
            "window": write(window=WINDOW + 1), "warmup": write(warmup=True),
            "run": write(run=Run(netuid=7, digest="cd" * 32))}


def test_the_document_digest_covers_probes_and_metadata_the_content_digest_only_tensors(hp, small_shapes, keypair):
    payloads = _variants(hp, small_shapes, keypair)
    documents = {name: document_digest(data, small_shapes, hp) for name, data in payloads.items()}
    contents = {name: gradient_digest(data, small_shapes, hp) for name, data in payloads.items()}
    assert len(set(documents.values())) == len(payloads), "every swapped field changes the commitment"
    assert len(set(contents.values())) == 1, "the work is the same: the content digest must not move"
    assert documents["base"] != contents["base"]  # two digests under two domains, never confused
    for name in ("base", "probes", "global_step", "warmup"):
        g = read_gradient(payloads[name], small_shapes, hp, run=RUN, verify=None)
        assert g.document_digest == documents[name] and g.digest == contents[name]


def test_a_re_signed_update_keeps_its_content_digest(hp, small_shapes, keypair, payload):
    """Decoding a payload and encoding its tensors again gives the same bytes (the codecs are
    canonical), so an update re-signed for another window (or by another hotkey) keeps its content
    digest: what replay and copy detection rely on."""
    g = read_gradient(payload, small_shapes, hp, run=RUN, verify=None)
    again = write_gradient(g.tensors, g.probes, window=WINDOW + 5, global_step=STEP + 5, hotkey=keypair.ss58_address,
                           hp=hp, run=RUN, sign=keypair.sign)
    assert gradient_digest(again, small_shapes, hp) == g.digest
    assert document_digest(again, small_shapes, hp) != g.document_digest
