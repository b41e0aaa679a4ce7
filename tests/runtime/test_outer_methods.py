"""The outer step is the run's choice (`templar.compress.methods`), and every node kind takes it alike:
the live step in any peer order, the catch-up replay of the lead's published update, the sharded
node's per-parameter split, and the validator's trial step."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from bittensor.sp_core import Keypair

from templar.chain import verify_signature
from templar.compress import DeMo
from templar.compress.methods import rule_of
from templar.core.config import HParams, InnerConfig, load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.runtime.consensus.outer import apply_update, outer_step
from templar.runtime.state import NodeState
from templar.wire import (
    Gradient,
    PayloadError,
    Run,
    read_gradient,
    write_aggregate,
    write_bundle,
    write_gradient,
)

RUN = Run(netuid=7, digest="ef" * 32)


def _hparams(method: str) -> HParams:
    if method == "signed":
        return load_hparams("tiny-paper")
    return load_hparams("tiny-sparseloco")


def _payloads(hp: HParams, n: int = 4) -> list[Gradient]:
    """n peers' real compressed updates under the run's method (random pseudo-gradients through the
    method's compressor and error feedback), as read back from the wire."""
    model = build_model(hp)
    shapes = parameter_shapes(model)
    rule = rule_of(hp.optimizer.method)
    out = []
    for i in range(n):
        demo = DeMo(model, compressor=rule.compressor(hp.demo.target_chunk, hp.demo.topk), decay=hp.demo.momentum_decay)
        gen = torch.Generator().manual_seed(10 + i)
        grads = {name: torch.randn(shape, generator=gen) * 1e-3 for name, shape in shapes.items()}
        compressed = demo.step(grads, 1.0)
        key = Keypair.create_from_uri(f"//Peer{i}")
        probes = {name: torch.zeros(hp.gauntlet.probe_count) for name in shapes}
        data = write_gradient(compressed, probes, window=3, global_step=0, hotkey=key.ss58_address, hp=hp, run=RUN,
                              sign=key.sign)
        out.append(read_gradient(data, shapes, hp, run=RUN, verify=verify_signature, expected_window=3))
    return out


def _theta(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("method", ["signed", "sparseloco"])
def test_the_step_is_bit_identical_for_any_peer_order_and_in_catch_up(method):
    hp = _hparams(method)
    payloads = _payloads(hp)
    reference = build_model(hp)
    step = outer_step(reference, payloads, NodeState(window=2, global_step=5), hp)
    assert step is not None and step.peers == len(payloads)
    for order in list(itertools.permutations(payloads))[1:24:7]:
        other = build_model(hp)
        outer_step(other, list(order), NodeState(window=2, global_step=5), hp)
        assert all(torch.equal(a, b) for a, b in zip(_theta(reference), _theta(other), strict=True))

    # catch-up: the lead's published update of the window, in the run's own form, applied by another node
    from templar.runtime.sync import read_published

    lead = Keypair.create_from_uri("//Lead")
    if method == "signed":
        data = write_aggregate(step.signs, window=3, global_step=step.global_step, learning_rate=step.learning_rate,
                               hotkey=lead.ss58_address, run=RUN, sign=lead.sign)
    else:
        data = write_bundle([(g.hotkey, g.tensors) for g in payloads], window=3, global_step=step.global_step,
                            learning_rate=step.learning_rate, hotkey=lead.ss58_address, hp=hp, run=RUN, sign=lead.sign)

    class _Node:
        def __init__(self) -> None:
            self.hp, self.run, self.shapes = hp, RUN, parameter_shapes(build_model(hp))

    published = read_published(_Node(), data, lead.ss58_address, 3)
    replayed = build_model(hp)
    apply_update(replayed, published.update, published.global_step, hp)
    assert published.global_step == 5
    assert all(torch.equal(a, b) for a, b in zip(_theta(reference), _theta(replayed), strict=True))


def test_the_leads_ceiling_holds_the_step_alike_live_split_and_in_catch_up():
    """A SparseLoCo step under the lead's ceiling on its clip level (`StepInputs.clip_norm`): the live
    step, a torchrun node's per-parameter split and the catch-up replay of the lead's bundle, which
    carries the ceiling, give the same θ, bit for bit; the step is smaller than without it."""
    from templar.compress.sparseloco import payload_norm_squared
    from templar.runtime.sync import read_published

    hp = _hparams("sparseloco")
    payloads = _payloads(hp)
    shapes = parameter_shapes(build_model(hp))
    ceiling = 0.5 * min(float(payload_norm_squared(g.tensors, sorted(g.tensors))) ** 0.5 for g in payloads)
    held, plain, start = build_model(hp), build_model(hp), _theta(build_model(hp))
    step = outer_step(held, payloads, NodeState(window=2, global_step=5), hp, clip_norm=ceiling)
    outer_step(plain, payloads, NodeState(window=2, global_step=5), hp)
    assert step is not None and step.clip_norm == ceiling
    moved = lambda model: sum(float((a - b).double().square().sum()) for a, b in zip(_theta(model), start, strict=True))  # noqa: E731
    assert 0 < moved(held) < 0.5 * moved(plain)

    rule = rule_of("sparseloco")
    weights = [1.0 / hp.gauntlet.top_g] * len(payloads)
    factors = rule.peer_factors([g.tensors for g in payloads], weights, ceiling=ceiling)
    whole = rule.aggregate([g.tensors for g in payloads], weights, shapes, ceiling=ceiling)
    for name, shape in shapes.items():
        assert torch.equal(rule.aggregate_param(name, [g.tensors[name] for g in payloads], factors, shape), whole[name])

    lead = Keypair.create_from_uri("//Lead")
    data = write_bundle([(g.hotkey, g.tensors) for g in payloads], window=3, global_step=step.global_step,
                        learning_rate=step.learning_rate, hotkey=lead.ss58_address, hp=hp, run=RUN, sign=lead.sign,
                        clip_norm=step.clip_norm)

    class _Node:
        def __init__(self) -> None:
            self.hp, self.run, self.shapes = hp, RUN, shapes

    published = read_published(_Node(), data, lead.ss58_address, 3)
    replayed = build_model(hp)
    apply_update(replayed, published.update, published.global_step, hp)
    assert all(torch.equal(a, b) for a, b in zip(_theta(held), _theta(replayed), strict=True))


@pytest.mark.parametrize("method", ["signed", "sparseloco"])
def test_split_by_parameter_is_the_whole_step(method):
    """What a torchrun node does: each peer's factor from its whole payload once, then each parameter
    alone (SparseLoCo clips by the whole payload's norm, not by one tensor's)."""
    hp = _hparams(method)
    payloads = _payloads(hp)
    rule = rule_of(hp.optimizer.method)
    shapes = parameter_shapes(build_model(hp))
    weights = [1.0 / hp.gauntlet.top_g] * len(payloads)
    whole = rule.aggregate([g.tensors for g in payloads], weights, shapes)
    factors = rule.peer_factors([g.tensors for g in payloads], weights)
    for name, shape in shapes.items():
        split = rule.aggregate_param(name, [g.tensors[name] for g in payloads], factors, shape)
        assert torch.equal(split, whole[name]), name


@pytest.mark.parametrize("method", ["signed", "sparseloco"])
def test_the_trial_step_is_the_peers_update_as_the_outer_step_applies_it(method):
    hp = _hparams(method)
    payload = _payloads(hp, 1)[0]
    rule = rule_of(hp.optimizer.method)
    shapes = parameter_shapes(build_model(hp))
    trial = rule.trial(payload.tensors, shapes)
    alone = rule.aggregate([payload.tensors], [1.0], shapes)
    assert all(torch.equal(trial[n], alone[n]) for n in shapes)
    if method == "signed":
        assert all(bool(((t == -1) | (t == 0) | (t == 1)).all()) for t in trial.values())


def _norm(update: dict[str, torch.Tensor]) -> float:
    return float(sum((t.double() ** 2).sum() for t in update.values())) ** 0.5


def test_a_sparseloco_trial_step_is_tried_at_the_windows_typical_norm():
    """The validator's trial step under SparseLoCo is the peer's update at the window's typical payload
    norm: clipped to it when larger, as the aggregate clips it (values scaled up, or a higher inner rate,
    buy no larger step), and lifted to it by at most `max_lift` when smaller (values scaled down buy no
    smaller one), so LossScore pays the direction. With `max_lift` 1 a smaller payload is its own update;
    a payload further below than `max_lift` stays that much smaller (near-zero values stay a near-zero
    step). The signed rule's sign step has one size whatever the payload, so it has no reference."""
    hp = _hparams("sparseloco")
    rule = rule_of("sparseloco")
    shapes = parameter_shapes(build_model(hp))
    peers = [g.tensors for g in _payloads(hp, 4)]
    reference = rule.trial_reference(peers)
    assert reference is not None and reference > 0
    typical = float(reference) ** 0.5

    def scaled(peer, factor: float):  # a power of two: the values stay on the 2-bit grid
        return {n: dataclasses.replace(c, values=c.values * factor) for n, c in peer.items()}

    largest = max(peers, key=lambda p: _norm(rule.trial(p, shapes)))
    smallest = min(peers, key=lambda p: _norm(rule.trial(p, shapes)))
    assert _norm(rule.trial(smallest, shapes)) < typical < _norm(rule.trial(largest, shapes))
    for peer in (largest, smallest):
        lifted = rule.trial(peer, shapes, reference=reference, max_lift=1000.0)
        assert _norm(lifted) == pytest.approx(typical, rel=1e-5)
        for factor in (4.0, 0.25, 2.0**-6):  # louder or quieter, the same step
            other = rule.trial(scaled(peer, factor), shapes, reference=reference, max_lift=1000.0)
            assert all(torch.allclose(other[n], lifted[n], rtol=1e-5, atol=1e-12 * typical) for n in shapes)
    # held only (max_lift 1): the louder one is clipped, the quieter one is its own update
    assert _norm(rule.trial(scaled(largest, 4.0), shapes, reference=reference)) == pytest.approx(typical, rel=1e-5)
    assert _norm(rule.trial(scaled(largest, 4.0), shapes)) == pytest.approx(4 * _norm(rule.trial(largest, shapes)),
                                                                              rel=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(rule.trial(smallest, shapes, reference=reference).values(),
                                                 rule.trial(smallest, shapes).values(), strict=True))
    # far below: lifted by max_lift and no further
    faint = scaled(smallest, 2.0**-20)
    own = _norm(rule.trial(faint, shapes))
    assert _norm(rule.trial(faint, shapes, reference=reference, max_lift=1000.0)) == pytest.approx(1000 * own, rel=1e-5)
    assert 1000 * own < typical / 1000
    signed = _hparams("signed")
    assert rule_of("signed").trial_reference([g.tensors for g in _payloads(signed, 2)]) is None


def test_each_run_refuses_the_other_methods_payload():
    signed, sparse = _hparams("signed"), _hparams("sparseloco")
    shapes = parameter_shapes(build_model(signed))
    key = Keypair.create_from_uri("//Peer0")
    compressed = DeMo(build_model(sparse), compressor=rule_of("sparseloco").compressor(64, 64), decay=0.95).step(
        {n: torch.randn(s) for n, s in shapes.items()}, 1.0)
    probes = {n: torch.zeros(sparse.gauntlet.probe_count) for n in shapes}
    data = write_gradient(compressed, probes, window=1, global_step=0, hotkey=key.ss58_address, hp=sparse, run=RUN,
                          sign=key.sign)
    with pytest.raises(PayloadError) as info:
        read_gradient(data, shapes, signed, run=RUN, verify=None)
    assert info.value.reason in ("bad_metadata", "missing_tensor", "unexpected_tensor", "oversize")


def test_sparseloco_needs_adamw_inner_steps():
    hp = load_hparams("tiny-sparseloco")
    with pytest.raises(ValueError, match=r"needs inner\.optimizer adamw"):
        HParams.model_validate({**hp.model_dump(), "inner": InnerConfig().model_dump()})
