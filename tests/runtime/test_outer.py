"""The outer step and the rules it is made of: step authority, the one apply function, and the
one gather every node uses (on-time, size, strict reading)."""

from __future__ import annotations

import copy

import pytest
import torch

from templar.comms import GatherStatus, put_gradient
from templar.compress import aggregate, apply_signed_update
from templar.core.clock import LoopTime, run_virtual
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.runtime.consensus.outer import apply_update, gather_gradients, outer_step, update_step
from templar.runtime.consensus.windows import Clock
from templar.runtime.state import NodeState
from templar.storage import LocalBucket
from templar.wire import Gradient, PayloadError, Run, write_gradient


def test_the_step_is_our_own_count_unless_the_lead_re_anchors_it():
    assert update_step(5) == 5
    assert update_step(5, published=7) == 7  # replaying the lead's signed aggregate
    assert update_step(5, published=4) == 4


def _gradients(hp, real_peers, *, warmup=False, steps=(3, 3, 3, 3)) -> list[Gradient]:
    _, peers = real_peers
    return [Gradient(window=7, global_step=s, hotkey=f"hk{i}", warmup=warmup, tensors=t, probes={},
                     digest=bytes([i]), nbytes=0) for i, (t, s) in enumerate(zip(peers, steps, strict=True))]


def test_outer_step_is_identical_for_any_peer_order(hp, real_peers):
    grads = _gradients(hp, real_peers)
    models = [build_model(hp), build_model(hp)]
    states = [NodeState(window=6, global_step=3), NodeState(window=6, global_step=3)]
    a = outer_step(models[0], grads, states[0], hp)
    b = outer_step(models[1], list(reversed(grads)), states[1], hp)
    assert a is not None and b is not None and a.peers == b.peers == 4
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert states[0].global_step == states[1].global_step == 4
    assert a.learning_rate == learning_rate(3, hp.optimizer)


def test_outer_step_matches_the_paper_formula(hp, real_peers):
    shapes, _ = real_peers
    grads = _gradients(hp, real_peers)
    model, reference = build_model(hp), build_model(hp)
    outer_step(model, grads, NodeState(window=6, global_step=3), hp)
    signs = aggregate([g.tensors for g in grads], [1.0 / hp.gauntlet.top_g] * len(grads), shapes)
    apply_signed_update(reference, signs, learning_rate(3, hp.optimizer), hp.optimizer.weight_decay)
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_warmup_payloads_are_never_aggregated(hp, real_peers):
    model = build_model(hp)
    before = copy.deepcopy(model.state_dict())
    state = NodeState(window=6, global_step=3)
    assert outer_step(model, _gradients(hp, real_peers, warmup=True), state, hp) is None
    assert state.global_step == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("claims", [(3, 3, 3, 3 + 4), (13, 13, 13, 13), (0, 1, 2, 10**6)])
def test_no_claim_moves_the_schedule(hp, real_peers, claims):
    state = NodeState(window=6, global_step=3)
    pumped = outer_step(build_model(hp), _gradients(hp, real_peers, steps=claims), state, hp)
    assert pumped is not None and pumped.global_step == 3 and state.global_step == 4
    assert pumped.learning_rate == learning_rate(3, hp.optimizer)


def test_apply_update_is_what_replay_and_live_steps_share(hp, real_peers):
    shapes, peers = real_peers
    signs = aggregate(peers, [0.5] * len(peers), shapes)
    a, b = build_model(hp), build_model(hp)
    lr = apply_update(a, signs, 5, hp)
    apply_signed_update(b, signs, learning_rate(5, hp.optimizer), hp.optimizer.weight_decay)
    assert lr == learning_rate(5, hp.optimizer)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


GENESIS = 1_700_000_000.0
RUN = Run(netuid=7, digest="ab" * 32)


@pytest.fixture
def window_clock(hp):
    """Windows of 10 × 1 s blocks from a fixed genesis, on the running virtual loop's time."""

    def make(loop_time: LoopTime) -> Clock:
        cfg = hp.windows.model_copy(update={"blocks_per_window": 10, "block_time": 1.0})
        genesis = GENESIS
        return Clock(cfg, lambda: int((loop_time.now() - genesis) // 1.0),
                     lambda block: genesis + block * 1.0, loop_time)

    return make


def test_gather_gradients_judges_timing_size_and_bytes_alike_for_every_node(hp, real_peers, keypair,
                                                                              tmp_path, window_clock):
    shapes, peers = real_peers
    hp = hp.model_copy(update={"windows": hp.windows.model_copy(update={
        "put_window_seconds": 3.0, "clock_skew_seconds": 0.5, "gather_seconds": 4.0})})
    signed = write_gradient(peers[0], {n: torch.zeros(hp.gauntlet.probe_count) for n in shapes}, window=3,
                            global_step=1, hotkey=keypair.ss58_address, hp=hp, run=RUN, sign=keypair.sign)

    async def scenario():
        from templar.core.clock import loop_time

        clock = window_clock(loop_time())
        buckets = {name: LocalBucket(tmp_path / name, now=clock.now) for name in ("on_time", "early", "late",
                                                                                  "garbage", "missing")}
        times = clock.times(3)
        await clock.sleep_until(times.end - 5)
        await put_gradient(buckets["early"], 3, signed)
        await clock.sleep_until(times.end + 0.5)
        await put_gradient(buckets["on_time"], 3, signed)
        await put_gradient(buckets["garbage"], 3, b"\x00" * 64)
        await clock.sleep_until(times.put_close + 1.0)
        await put_gradient(buckets["late"], 3, signed)
        await clock.sleep_until(times.gather_start)
        # the on-time payload is Alice's, so her address keys its bucket (the reader checks the signer)
        owners = {"on_time": keypair.ss58_address}
        results = await gather_gradients({owners.get(k, k): b for k, b in buckets.items()},
                                         3, clock=clock, hp=hp, shapes=shapes, run=RUN)
        return {next((k for k, v in owners.items() if v == hk), hk): r for hk, r in results.items()}

    results = run_virtual(scenario(), start=GENESIS + 20)
    assert results["on_time"].status == GatherStatus.OK and results["on_time"].value.global_step == 1
    assert results["early"].status == GatherStatus.EARLY
    assert results["late"].status == GatherStatus.LATE
    assert results["missing"].status == GatherStatus.MISSING
    garbage = results["garbage"]
    assert garbage.status == GatherStatus.MALFORMED
    assert isinstance(garbage.error, PayloadError) and garbage.error.reason == "not_safetensors"

