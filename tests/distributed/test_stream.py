"""The streamed state file: a plain safetensors file, written atomically, one tensor at a time."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from templar.distributed.checkpoint import stream_safetensors


def _entries(tensors: dict[str, torch.Tensor]) -> list:
    return [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]


def test_streamed_file_is_plain_safetensors(tmp_path) -> None:
    tensors = {"model.w": torch.randn(5, 3), "model.b": torch.arange(4, dtype=torch.int64),
               "ef.w": torch.randn(5, 3).to(torch.bfloat16), "empty": torch.zeros(0, 7)}
    path = tmp_path / "state.safetensors"
    stream_safetensors(path, _entries(tensors), {"window": "3"}, iter(tensors.values()))
    loaded = load_file(str(path))
    assert set(loaded) == set(tensors) and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"window": "3"}


def test_a_bad_tensor_leaves_the_old_file_and_drains_the_stream(tmp_path) -> None:
    path = tmp_path / "state.safetensors"
    path.write_bytes(b"old")
    consumed = []

    def tensors():
        for t in (torch.zeros(2), torch.zeros(3), torch.zeros(1)):  # the second has the wrong shape
            consumed.append(t)
            yield t

    entries = [("a", torch.float32, (2,)), ("b", torch.float32, (2,)), ("c", torch.float32, (1,))]
    with pytest.raises(ValueError, match="b: got"):
        stream_safetensors(path, entries, {}, tensors())
    assert len(consumed) == 3  # every rank's collective inside the stream still ran
    assert path.read_bytes() == b"old" and not path.with_name(path.name + ".tmp").exists()
