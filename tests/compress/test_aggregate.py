"""Signed aggregation: determinism, rescale invariance, correctness, and the outer step."""

from __future__ import annotations

import itertools

import pytest
import torch

from templar.compress import Compressed, DCTCompressor, aggregate, apply_signed_update


def _peers(shapes: dict[str, torch.Size], g: int, seed: int = 0) -> list[dict[str, Compressed]]:
    gen = torch.Generator().manual_seed(seed)
    compressor = DCTCompressor(64, 32)
    return [{n: compressor.compress(torch.randn(s, generator=gen)) for n, s in shapes.items()} for _ in range(g)]


def _reference(peers, weights, shapes) -> dict[str, torch.Tensor]:
    """Dense float64 decode of Σ w_p q_p / ||q_p||, then sign: the definition, slowly."""
    compressor = DCTCompressor(64, 32)
    out = {}
    for name, shape in shapes.items():
        total = torch.zeros(shape, dtype=torch.float64)
        for peer, w in zip(peers, weights, strict=True):
            c = peer[name]
            scaled = Compressed(c.indices, c.values / c.values.norm(), c.shape, c.chunk)
            total += w * compressor.decompress(scaled).double()
        out[name] = torch.sign(total).float()
    return out


def test_matches_the_dense_definition(small_shapes) -> None:
    peers = _peers(small_shapes, 5)
    weights = [0.2, 0.3, 0.1, 0.25, 0.15]
    got = aggregate(peers, weights, small_shapes)
    want = _reference(peers, weights, small_shapes)
    for name, shape in small_shapes.items():
        assert got[name].shape == shape and got[name].dtype == torch.float32
        assert set(got[name].unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert (got[name] == want[name]).float().mean() > 0.999


def test_any_peer_order_gives_bit_identical_signs(small_shapes) -> None:
    peers = _peers(small_shapes, 4, seed=1)
    weights = [0.25, 0.25, 0.25, 0.25]
    first = aggregate(peers, weights, small_shapes)
    for order in itertools.permutations(range(4)):
        again = aggregate([peers[i] for i in order], [weights[i] for i in order], small_shapes)
        for name in small_shapes:
            assert torch.equal(first[name], again[name])


def test_exactly_cancelling_peers_give_zero_in_any_order(small_shapes) -> None:
    (peer,) = _peers(small_shapes, 1, seed=2)
    negated = {n: Compressed(c.indices, -c.values, c.shape, c.chunk) for n, c in peer.items()}
    for peers in ([peer, negated], [negated, peer]):
        signs = aggregate(peers, [0.5, 0.5], small_shapes)
        assert all(bool((s == 0).all()) for s in signs.values())


def test_rescaling_one_peer_changes_nothing(small_shapes) -> None:
    peers = _peers(small_shapes, 3, seed=3)
    base = aggregate(peers, [1 / 3] * 3, small_shapes)
    loud = dict(peers[1])
    loud = {n: Compressed(c.indices, c.values * 1e6, c.shape, c.chunk) for n, c in loud.items()}
    scaled = aggregate([peers[0], loud, peers[2]], [1 / 3] * 3, small_shapes)
    for name in small_shapes:
        assert torch.equal(base[name], scaled[name])


def test_single_peer_is_its_own_decoded_sign(small_shapes) -> None:
    (peer,) = _peers(small_shapes, 1, seed=4)
    signs = aggregate([peer], [1.0], small_shapes)
    compressor = DCTCompressor(64, 32)
    for name in small_shapes:
        decoded = compressor.decompress(peer[name])
        confident = decoded.abs() > 1e-5
        assert torch.equal(signs[name][confident], torch.sign(decoded)[confident])


def test_zero_weights_and_bad_inputs(small_shapes) -> None:
    peers = _peers(small_shapes, 2, seed=5)
    signs = aggregate(peers, [0.0, 0.0], small_shapes)
    assert all(bool((s == 0).all()) for s in signs.values())
    with pytest.raises(ValueError):
        aggregate(peers, [1.0], small_shapes)
    with pytest.raises(ValueError):
        aggregate(peers, [1.0, float("nan")], small_shapes)
    with pytest.raises(ValueError):
        aggregate([peers[0], {}], [0.5, 0.5], small_shapes)


def test_signed_update_applies_decay_and_step() -> None:
    model = torch.nn.Linear(4, 3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    signs = {"weight": torch.sign(torch.randn(3, 4)), "bias": torch.tensor([1.0, 0.0, -1.0])}
    apply_signed_update(model, signs, lr=0.1, weight_decay=0.5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.detach(), before[name] * (1 - 0.05) - 0.1 * signs[name])
    params = {"w": torch.ones(2)}
    apply_signed_update(params, {"w": torch.tensor([1.0, -1.0])}, lr=0.5, weight_decay=0.0)
    assert torch.equal(params["w"], torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError):
        apply_signed_update(params, {"missing": torch.ones(2)}, lr=0.5, weight_decay=0.0)
    with pytest.raises(ValueError):
        apply_signed_update(params, {"w": torch.ones(3)}, lr=0.5, weight_decay=0.0)


def _out_of_layout(c: Compressed) -> dict[str, tuple[dict[str, Compressed], str]]:
    """One peer's coefficients of `w` as a hostile or broken caller might pass them, and the refusal
    each must meet (`compress.check_peers`, which both aggregates apply)."""
    beyond = c.indices.clone()
    beyond[0, -1] = c.plan.chunk_numel
    negative = c.indices.clone()
    negative[0, 0] = -1
    infinite = c.values.clone()
    infinite[0, 0] = float("inf")
    return {
        "missing": ({}, "w: missing from peers"),
        "other chunk": ({"w": Compressed(c.indices, c.values, c.shape, (c.chunk[0], c.chunk[1] // 2))},
                        "disagree on chunking or k"),
        "other k": ({"w": Compressed(c.indices[:, :-1], c.values[:, :-1], c.shape, c.chunk)}, "disagree on chunking or k"),
        "float64 values": ({"w": Compressed(c.indices, c.values.double(), c.shape, c.chunk)}, "must be float32"),
        "int32 indices": ({"w": Compressed(c.indices.int(), c.values, c.shape, c.chunk)}, "indices int64"),
        "index past its chunk": ({"w": Compressed(beyond, c.values, c.shape, c.chunk)}, "index outside its chunk"),
        "negative index": ({"w": Compressed(negative, c.values, c.shape, c.chunk)}, "index outside its chunk"),
        "infinite value": ({"w": Compressed(c.indices, infinite, c.shape, c.chunk)}, "non-finite"),
    }


@pytest.mark.parametrize("rule", ["signed", "sparseloco"])
def test_either_aggregate_refuses_a_peer_out_of_layout(rule: str) -> None:
    """The signed aggregate and SparseLoCo's read peers' coefficients by index into one accumulator:
    each refuses, by name, a peer whose tensor is missing, chunked or typed otherwise, or indexes
    outside its chunk, whichever peer it is, and any tensor of another shape than the run's."""
    from templar.compress.sparseloco import SparseLoCoCompressor, aggregate_clipped_mean

    shapes = {"w": torch.Size([128, 64])}
    gen = torch.Generator().manual_seed(3)
    compressor = DCTCompressor(64, 16) if rule == "signed" else SparseLoCoCompressor(64, 16)
    run = aggregate if rule == "signed" else aggregate_clipped_mean
    honest = [{"w": compressor.compress(torch.randn(shapes["w"], generator=gen))} for _ in range(2)]
    run(honest, [0.5, 0.5], shapes)  # the honest pair is aggregated
    for case, (peer, refusal) in _out_of_layout(honest[1]["w"]).items():
        for peers in ([honest[0], peer], [peer, honest[0]]):
            with pytest.raises(ValueError, match=refusal):
                run(peers, [0.5, 0.5], shapes)
                pytest.fail(f"{rule} aggregated a peer with {case}")
    with pytest.raises(ValueError, match=r"w: compressed shape \(128, 64\) != expected \(64, 128\)"):
        run(honest, [0.5, 0.5], {"w": torch.Size([64, 128])})
