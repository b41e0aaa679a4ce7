"""The strict safetensors container under headers no honest writer produces: every reader of peer
bytes refuses them with a `PayloadError`, never another exception (gather and catch-up catch only
that one)."""

from __future__ import annotations

import json

import pytest
import torch

from templar.wire import PayloadError, Run, read_aggregate, read_bundle, read_gradient, read_inputs

RUN = Run(netuid=7, digest="ab" * 32)


def _raw_payload(document_json: str) -> bytes:
    """A one-tensor safetensors payload whose `templar` metadata is the JSON string literal
    `document_json`, written as is (escapes included), which `safetensors.save` cannot express."""
    header = {"__metadata__": {"templar": "@DOC@", "signature": "00"},
              "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    text = json.dumps(header).replace('"@DOC@"', document_json).encode()
    return len(text).to_bytes(8, "little") + text + bytes(8)


def _readers(hp, small_shapes):
    return {
        "gradient": lambda data: read_gradient(data, small_shapes, hp, run=RUN, verify=None),
        "aggregate": lambda data: read_aggregate(data, small_shapes, run=RUN, verify=None),
        "inputs": lambda data: read_inputs(data, run=RUN, verify=None),
        "bundle": lambda data: read_bundle(data, small_shapes, hp, run=RUN, verify=None),
    }


@pytest.mark.parametrize("reader", ["gradient", "aggregate", "inputs", "bundle"])
@pytest.mark.parametrize("document", [r'"\ud800"', r'"{\"protocol\": 2, \"x\": \"\udc80\"}"'])
def test_a_lone_surrogate_in_the_metadata_is_bad_metadata(hp, small_shapes, reader, document) -> None:
    """JSON may escape a lone UTF-16 surrogate, which no UTF-8 string holds: the document is refused
    with a reason, not a UnicodeEncodeError that escapes gather's `PayloadError` handler."""
    with pytest.raises(PayloadError) as info:
        _readers(hp, small_shapes)[reader](_raw_payload(document))
    assert info.value.reason == "bad_metadata"


def test_a_surrogate_escape_in_a_tensor_key_is_an_unexpected_tensor(hp, small_shapes) -> None:
    header = {"__metadata__": {"templar": "{}", "signature": "00"},
              "\udc80": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    text = json.dumps(header).encode()  # ensure_ascii writes the key as the escape \udc80
    data = len(text).to_bytes(8, "little") + text + torch.zeros(2).numpy().tobytes()
    with pytest.raises(PayloadError):
        read_gradient(data, small_shapes, hp, run=RUN, verify=None)
