"""DeMo error feedback: conservation, state persistence, refusal of bad gradients."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from templar.compress import DCTCompressor, DeMo


def _params() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(131, 128), "b": torch.zeros(128), "tiny": torch.zeros(5, 3)}


def test_what_was_not_sent_stays_in_the_buffer() -> None:
    torch.manual_seed(0)
    compressor = DCTCompressor(64, 32)
    demo = DeMo(_params(), compressor=compressor, decay=0.9)
    for step in range(3):
        grads = {n: torch.randn(p.shape) for n, p in _params().items()}
        before = {n: e.clone() for n, e in demo.buffers.items()}
        sent = demo.step(grads, lr=0.5)
        assert set(sent) == set(grads)
        for name, e in demo.buffers.items():
            accumulated = 0.9 * before[name] + 0.5 * grads[name]
            reconstructed = compressor.decompress(sent[name])
            assert torch.allclose(e + reconstructed, accumulated, atol=1e-5), (step, name)
            assert torch.equal(sent[name].indices, compressor.compress(accumulated).indices)
            if name == "w":  # 32 of 4096 per chunk: most of the energy stays behind
                assert e.norm() > 0.5 * accumulated.norm()


def test_missing_gradient_still_decays_and_is_sent() -> None:
    demo = DeMo(_params(), compressor=DCTCompressor(64, 32), decay=0.5)
    demo.buffers["b"].fill_(1.0)
    before = demo.buffers["b"].clone()
    sent = demo.step({"w": torch.randn(131, 128)}, lr=1.0)
    assert set(sent) == {"w", "b", "tiny"}
    restored = demo.buffers["b"] + DCTCompressor(64, 32).decompress(sent["b"])
    assert torch.allclose(restored, 0.5 * before, atol=1e-6)


def test_bad_gradients_leave_state_untouched() -> None:
    demo = DeMo(_params(), compressor=DCTCompressor(64, 32), decay=0.9)
    demo.step({n: torch.randn(p.shape) for n, p in _params().items()}, lr=1.0)
    snapshot = demo.state_dict()
    bad = torch.randn(128)
    bad[3] = float("nan")
    for grads in ({"b": bad}, {"nope": torch.zeros(1)}, {"b": torch.zeros(64)}):
        with pytest.raises(ValueError):
            demo.step(grads, lr=1.0)
    for name, e in demo.buffers.items():
        assert torch.equal(e, snapshot[name])


def test_state_round_trips_through_safetensors() -> None:
    demo = DeMo(_params(), compressor=DCTCompressor(64, 32), decay=0.9)
    demo.step({n: torch.randn(p.shape) for n, p in _params().items()}, lr=1.0)
    blob = save(demo.state_dict())
    other = DeMo(_params(), compressor=DCTCompressor(64, 32), decay=0.9)
    other.load_state_dict(load(blob))
    grads = {n: torch.randn(p.shape) for n, p in _params().items()}
    a, b = demo.step(grads, lr=1.0), other.step(grads, lr=1.0)
    for name in a:
        assert torch.equal(a[name].indices, b[name].indices)
        assert torch.equal(a[name].values, b[name].values)
    with pytest.raises(ValueError):
        other.load_state_dict({"w": torch.zeros(131, 128)})


def test_buffers_follow_a_module() -> None:
    model = torch.nn.Linear(128, 64)
    demo = DeMo(model, compressor=DCTCompressor(64, 32), decay=0.9)
    assert {n: tuple(e.shape) for n, e in demo.buffers.items()} == {"weight": (64, 128), "bias": (64,)}
    assert all(e.dtype == torch.float32 for e in demo.buffers.values())


def test_residual_step_equals_compress_then_subtract() -> None:
    torch.manual_seed(4)
    compressor = DCTCompressor(64, 32)
    for shape in [(131, 128), (256, 192), (128,), (5, 3)]:
        e = torch.randn(shape)
        expected_q = compressor.compress(e)
        expected_e = e.clone()
        compressor.subtract_(expected_e, expected_q)
        q = compressor.compress_residual_(e)
        assert torch.equal(q.indices, expected_q.indices) and torch.equal(q.values, expected_q.values)
        assert torch.allclose(e, expected_e, atol=1e-5)
