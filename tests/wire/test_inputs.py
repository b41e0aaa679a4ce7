"""The lead's inputs record (`templar.wire.inputs`): signed, bound to its run and window, strict."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from templar.core.config import PROTOCOL_VERSION
from templar.wire import PayloadError, Run, StepInputs, read_inputs, write_inputs
from templar.wire.container import serialize

RUN = Run(netuid=7, digest="cd" * 32)


@pytest.fixture
def inputs():
    return StepInputs(window=9, global_step=4, peers=(("5Alpha", b"a" * 32), ("5Beta", b"b" * 32)))


def test_round_trip_and_an_empty_step(keypair, verify, inputs):
    data = write_inputs(inputs, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    assert read_inputs(data, run=RUN, verify=verify, expected_hotkey=keypair.ss58_address, expected_window=9) == inputs
    empty = StepInputs(window=10, global_step=5, peers=())
    data = write_inputs(empty, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    assert read_inputs(data, run=RUN, verify=verify).peers == ()


def test_the_leads_ceiling_on_the_clip_level_round_trips_and_a_hostile_one_is_refused(keypair, verify, inputs):
    held = dataclasses.replace(inputs, clip_norm=0.1 + 2.0**-40)  # any float, exactly
    data = write_inputs(held, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    assert read_inputs(data, run=RUN, verify=verify) == held
    document = {"protocol": PROTOCOL_VERSION, "netuid": RUN.netuid, "run": RUN.digest, "kind": "inputs", "window": 9,
                "global_step": 4, "hotkey": keypair.ss58_address, "peers": ["5Alpha", "5Beta"]}
    digests = torch.tensor([[97] * 32, [98] * 32], dtype=torch.uint8)
    for hostile in (0.0, -1.0, -0.0, "1.0", True, [1.0]):
        data = serialize({"digests": digests}, {**document, "clip_norm": hostile}, domain=b"templar/inputs",
                         sign=keypair.sign, max_document=4096)
        with pytest.raises(PayloadError) as info:
            read_inputs(data, run=RUN, verify=verify)
        assert info.value.reason == "bad_metadata", hostile
    data = serialize({"digests": digests}, {**document, "clip_norm": 2}, domain=b"templar/inputs", sign=keypair.sign,
                     max_document=4096)
    assert read_inputs(data, run=RUN, verify=verify).clip_norm == 2.0


@pytest.mark.parametrize(("change", "reason"), [
    (lambda d: d[:-1], "not_safetensors"),
    (lambda d: d[:40], "not_safetensors"),
    (lambda d: d[:-5] + bytes(b ^ 1 for b in d[-5:]), "bad_signature"),
    (lambda d: b"\xff" * 64, "header_too_large"),
])
def test_damaged_records_are_refused_with_a_reason(keypair, verify, inputs, change, reason):
    data = write_inputs(inputs, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    with pytest.raises(PayloadError) as info:
        read_inputs(change(data), run=RUN, verify=verify)
    assert info.value.reason == reason


def test_another_run_window_or_signer_is_refused(keypair, verify, inputs):
    data = write_inputs(inputs, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    for kwargs, reason in (({"run": Run(7, "ee" * 32)}, "wrong_run"), ({"expected_window": 8}, "wrong_window"),
                           ({"expected_hotkey": "5Other"}, "wrong_hotkey")):
        with pytest.raises(PayloadError) as info:
            read_inputs(data, verify=verify, **{"run": RUN, **kwargs})
        assert info.value.reason == reason


def test_more_payloads_than_the_run_aggregates_are_refused(keypair, verify, inputs):
    data = write_inputs(inputs, hotkey=keypair.ss58_address, run=RUN, sign=keypair.sign)
    assert read_inputs(data, run=RUN, verify=verify, max_peers=2) == inputs
    with pytest.raises(PayloadError) as info:
        read_inputs(data, run=RUN, verify=verify, max_peers=1)
    assert info.value.reason == "bad_metadata" and "at most 1" in info.value.detail


def test_a_set_naming_a_hotkey_twice_cannot_be_written():
    with pytest.raises(ValueError, match="unique"):
        write_inputs(StepInputs(1, 0, (("5A", b"a" * 32), ("5A", b"b" * 32))), hotkey="5L", run=RUN,
                     sign=lambda d: b"s")
