"""Which payloads make a window's outer step: one rule for every node kind (`templar.runtime.consensus.peers`)."""

from __future__ import annotations

import random

import torch

from templar.comms import GatherResult, GatherStatus
from templar.core.model import build_model
from templar.runtime.consensus.outer import aggregation_weights, outer_step
from templar.runtime.state import NodeState
from templar.wire import Gradient


def _gradient(hotkey: str, tensors, *, warmup: bool = False) -> Gradient:
    return Gradient(window=3, global_step=0, hotkey=hotkey, warmup=warmup, tensors=tensors, probes={},
                    digest=hotkey.encode(), nbytes=0)


def test_the_lead_chooses_the_inputs_and_every_node_follows_them(hp, real_peers):
    """The lead chooses a window's inputs from its gather with the one rule (the peers in effect that
    arrived valid, warm-ups at weight 0); miners and validators take the window's published inputs
    through the same two functions (`window_inputs`, then `apply_inputs`: a miner's `follow_step`).
    The same list and results in any order give the same inputs, the same weights and a bit-identical
    model."""
    import templar.miner.loop as miner_loop
    import templar.runtime.consensus.follow as follow
    import templar.validator.loop as validator_loop
    import templar.validator.roles as validator_roles
    from templar.runtime.consensus.peers import aggregate_payloads

    assert validator_loop.aggregate_payloads is aggregate_payloads
    assert miner_loop.follow_step is follow.follow_step
    assert validator_loop.window_inputs is follow.window_inputs and validator_roles.apply_inputs is follow.apply_inputs
    _, tensors = real_peers
    peer_list = ["a", "b", "c", "d", "e"]
    results = {
        "a": GatherResult(GatherStatus.OK, _gradient("a", tensors[0])),
        "b": GatherResult(GatherStatus.OK, _gradient("b", tensors[1], warmup=True)),  # weighs 0
        "c": GatherResult(GatherStatus.LATE),
        "d": GatherResult(GatherStatus.OK, _gradient("d", tensors[2])),
        "x": GatherResult(GatherStatus.OK, _gradient("x", tensors[3])),  # gathered for scoring, not in the list
    }
    chosen = aggregate_payloads(peer_list, results)
    assert [g.hotkey for g in chosen] == ["a", "b", "d"]
    eligible, weights = aggregation_weights(chosen, hp)
    assert [g.hotkey for g in eligible] == ["a", "d"] and weights == [1 / hp.gauntlet.top_g] * 2

    shuffled = dict(random.Random(1).sample(sorted(results.items()), len(results)))
    models = [build_model(hp), build_model(hp)]
    for model, (order, res) in zip(models, ((peer_list, results), (peer_list[::-1], shuffled)), strict=True):
        outer_step(model, aggregate_payloads(order, res), NodeState(window=2, global_step=0), hp)
    assert all(torch.equal(p, q) for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(models[0].parameters(), build_model(hp).parameters(),
                                                      strict=True))
