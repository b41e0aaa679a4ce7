"""Published aggregates (bit-packed signs) and probe positions."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from templar.compress import aggregate
from templar.wire import (
    PayloadError,
    Run,
    max_aggregate_bytes,
    probe_positions,
    read_aggregate,
    take_probes,
    write_aggregate,
)
from templar.wire.aggregate import _DOMAIN
from templar.wire.container import signed_digest

RUN = Run(netuid=7, digest="ab" * 32)


def _signs(shapes: dict[str, torch.Size], seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {n: torch.sign(torch.randn(s, generator=gen)) for n, s in shapes.items()}
    out["norm"][5:9] = 0.0  # one tensor carries zeros, the others do not
    return out


@pytest.fixture(scope="module")
def published(small_shapes, keypair) -> tuple[dict[str, torch.Tensor], bytes]:
    signs = _signs(small_shapes)
    data = write_aggregate(signs, window=9, global_step=4, learning_rate=3e-3, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    return signs, data


def _reason(data: bytes, shapes, **kwargs) -> str:
    kwargs.setdefault("verify", None)
    with pytest.raises(PayloadError) as info:
        read_aggregate(data, shapes, **{"run": RUN, **kwargs})
    return info.value.reason


def _forge(tensors, doc, signer) -> bytes:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    signature = signer.sign(signed_digest(_DOMAIN, text.encode(), tensors)).hex()
    return st_save(tensors, metadata={"templar": text, "signature": signature})


def _doc(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    return json.loads(json.loads(data[8 : 8 + n])["__metadata__"]["templar"])


def test_round_trip_is_exact_and_about_one_bit_per_value(published, small_shapes, keypair, verify) -> None:
    signs, data = published
    agg = read_aggregate(data, small_shapes, run=RUN, verify=verify, expected_hotkey=keypair.ss58_address, expected_window=9)
    assert (agg.window, agg.global_step, agg.learning_rate) == (9, 4, 3e-3)
    for name in small_shapes:
        assert torch.equal(agg.signs[name], signs[name])
    numel = sum(s.numel() for s in small_shapes.values())
    tensors = st_load(data)
    assert sum(t.numel() for t in tensors.values()) <= numel / 8 + 2 * len(small_shapes) + 128 / 8 + 1
    assert len(data) <= max_aggregate_bytes(small_shapes)


def test_round_trips_a_real_aggregate(real_peers, keypair, verify) -> None:
    shapes, peers = real_peers
    signs = aggregate(peers, [0.25] * 4, shapes)
    data = write_aggregate(signs, window=1, global_step=1, learning_rate=1e-3, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    agg = read_aggregate(data, shapes, run=RUN, verify=verify, expected_hotkey=keypair.ss58_address)
    assert all(torch.equal(agg.signs[n], signs[n]) for n in shapes)
    with_zeros = [n for n in shapes if bool((signs[n] == 0).any())]
    assert with_zeros == ["model.embed_tokens.weight"]  # rows of tokens no peer saw
    bits = 8 * sum(t.numel() for t in st_load(data).values())
    numel = sum(s.numel() for s in shapes.values())
    assert bits == numel + shapes["model.embed_tokens.weight"].numel()


def test_rejections(published, small_shapes, keypair, verify) -> None:
    from bittensor.sp_core import Keypair

    _, data = published
    tensors, doc = st_load(data), _doc(data)
    assert _reason(data + b"\0" * max_aggregate_bytes(small_shapes), small_shapes) == "oversize"
    assert _reason(data, small_shapes, expected_hotkey="someone-else") == "wrong_hotkey"
    assert _reason(data, small_shapes, expected_window=10) == "wrong_window"
    bob = Keypair.create_from_uri("//Bob")
    assert _reason(_forge(tensors, doc, bob), small_shapes, verify=verify) == "bad_signature"
    assert _reason(_forge(tensors, {**doc, "learning_rate": "0.003"}, keypair), small_shapes) == "bad_metadata"
    assert _reason(_forge(tensors, {**doc, "learning_rate": -1.0}, keypair), small_shapes) == "bad_metadata"
    assert _reason(_forge(tensors, {**doc, "kind": "gradient"}, keypair), small_shapes) == "bad_metadata"
    assert _reason(_forge(tensors, {**doc, "protocol": 9}, keypair), small_shapes) == "wrong_protocol"
    overlap = tensors["norm/sign"].clone()
    overlap[0] |= 0x20  # value 5 is zero in the mask; marking it negative too is non-canonical
    assert _reason(_forge({**tensors, "norm/sign": overlap}, doc, keypair), small_shapes) == "bad_encoding"
    empty_mask = torch.zeros_like(tensors["proj/sign"])
    assert _reason(_forge({**tensors, "proj/zero": empty_mask}, doc, keypair), small_shapes) == "bad_encoding"
    padded = tensors["odd/sign"].clone()
    padded[-1] |= 0x80  # 15 values use 15 of 16 bits; the 16th is padding
    assert _reason(_forge({**tensors, "odd/sign": padded}, doc, keypair), small_shapes) == "bad_encoding"
    assert _reason(_forge({**tensors, "odd/zero": torch.zeros(5, dtype=torch.uint8)}, doc, keypair), small_shapes) == "bad_shape"
    assert _reason(_forge({k: v for k, v in tensors.items() if k != "odd/zero"}, doc, keypair), small_shapes) == "missing_tensor"
    with pytest.raises(ValueError):
        write_aggregate({"x": torch.tensor([0.5])}, window=1, global_step=1, learning_rate=1e-3, hotkey="hk", run=RUN, sign=keypair.sign)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), min_size=1, max_size=6))
def test_mutated_aggregates_only_ever_raise_payload_error(published, small_shapes, edits) -> None:
    _, data = published
    blob = bytearray(data)
    for position, value in edits:
        blob[position % len(blob)] = value
    with contextlib.suppress(PayloadError):
        read_aggregate(bytes(blob), small_shapes, run=RUN, verify=None)


def test_probe_positions_are_pure_and_pinned() -> None:
    a = probe_positions(1234, 56, "model.layers.0.mlp.up_proj.weight", 65536, 4)
    assert a.dtype == torch.int64 and a.shape == (4,)
    assert torch.equal(a, probe_positions(1234, 56, "model.layers.0.mlp.up_proj.weight", 65536, 4))
    assert a.tolist() == PINNED  # identical on every machine and every release of this protocol
    assert not torch.equal(a, probe_positions(1234, 57, "model.layers.0.mlp.up_proj.weight", 65536, 4))
    assert not torch.equal(a, probe_positions(1235, 56, "model.layers.0.mlp.up_proj.weight", 65536, 4))
    assert not torch.equal(a, probe_positions(1234, 56, "model.layers.1.mlp.up_proj.weight", 65536, 4))
    small = probe_positions(1, 2, "norm", 4, 4)
    assert sorted(small.tolist()) == [0, 1, 2, 3]  # distinct whenever numel allows
    assert probe_positions(1, 2, "scalar", 1, 3).tolist() == [0, 0, 0]
    params = {"w": torch.arange(100.0).view(10, 10)}
    probes = take_probes(params, seed=1234, window=56, count=4)
    assert torch.equal(probes["w"], probe_positions(1234, 56, "w", 100, 4).float())


PINNED = [26529, 47121, 36817, 57479]


def test_one_window_end_to_end(real_peers, hp, keypair, verify) -> None:
    """Miners write payloads, a validator reads them, aggregates, publishes; a late joiner replays
    the published aggregate and holds exactly the validator's parameters."""
    from templar.compress import apply_signed_update
    from templar.wire import read_gradient, write_gradient

    shapes, peers = real_peers
    probes = {n: torch.zeros(hp.gauntlet.probe_count) for n in shapes}
    payloads = [
        write_gradient(p, probes, window=3, global_step=2, hotkey=keypair.ss58_address, hp=hp, run=RUN, sign=keypair.sign)
        for p in peers
    ]
    received = [read_gradient(b, shapes, hp, run=RUN, verify=verify, expected_window=3) for b in payloads]
    assert len({g.digest for g in received}) == len(peers)
    signs = aggregate([g.tensors for g in received], [1 / len(received)] * len(received), shapes)
    blob = write_aggregate(signs, window=3, global_step=2, learning_rate=1e-2, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    replay = read_aggregate(blob, shapes, run=RUN, verify=verify, expected_hotkey=keypair.ss58_address)
    gen = torch.Generator().manual_seed(0)
    validator = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    joiner = {n: t.clone() for n, t in validator.items()}
    before = {n: t.clone() for n, t in validator.items()}
    apply_signed_update(validator, signs, lr=replay.learning_rate, weight_decay=0.1)
    apply_signed_update(joiner, replay.signs, lr=replay.learning_rate, weight_decay=0.1)
    for name in shapes:
        assert torch.equal(validator[name], joiner[name])
        step = before[name] * (1 - 1e-3) - validator[name]
        assert torch.allclose(step.abs()[signs[name] != 0], torch.tensor(1e-2), atol=1e-6)


def test_an_aggregate_of_another_run_is_wrong_run(published, small_shapes, verify) -> None:
    _, data = published
    assert _reason(data, small_shapes, run=Run(netuid=8, digest="ab" * 32), verify=verify) == "wrong_run"
    assert _reason(data, small_shapes, run=Run(netuid=7, digest="00" * 32), verify=verify) == "wrong_run"
