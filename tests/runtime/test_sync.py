"""Catch-up replays each window's published update, from the validator that led it (its inputs stored
in its slot: `templar.runtime.consensus.succession`), with the same rule and the same apply function as the
live outer step, waits for an aggregate that is late but still due, and never skips a malformed or
unreadable one. Driven on virtual time against a real local bucket and real signatures."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import torch
from tests.faults import Fault, FaultPlan

from templar.chain import Neuron
from templar.comms import put_aggregate
from templar.comms.keys import aggregate_key, inputs_key, progress_key
from templar.comms.progress import put_progress
from templar.compress import aggregate
from templar.core.clock import LoopTime, loop_time, run_virtual
from templar.core.config import PROTOCOL_VERSION
from templar.core.model import build_model, parameter_shapes
from templar.runtime.compute import LocalCompute
from templar.runtime.consensus.outer import apply_update
from templar.runtime.consensus.succession import LeadHistory
from templar.runtime.consensus.windows import Clock
from templar.runtime.node import Lead
from templar.runtime.state import NodeState
from templar.runtime.sync import catch_up
from templar.storage import Bucket, LocalBucket
from templar.wire import Run, StepInputs, write_aggregate, write_inputs

GENESIS = 1_700_000_000.0
RUN = Run(netuid=7, digest="ab" * 32)



def lead_neuron(hotkey: str) -> Neuron:
    """The lead validator as the chain would report it (only its hotkey and uid are read here)."""
    return Neuron(uid=0, hotkey=hotkey, coldkey=hotkey, stake=1.0, validator_permit=True, last_update=0,
                  commitment=None, validates=True)

@dataclass
class FollowerNode:
    """What catch-up reads of a node: its hparams, model, clock, stop flag and the lead's bucket."""

    hp: object
    model: torch.nn.Module
    clock: Clock
    lead_hotkey: str
    lead_bucket: Bucket
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    run: Run = RUN
    leads: LeadHistory = field(default_factory=LeadHistory)
    hotkey: str = "follower"

    def __post_init__(self) -> None:
        self.compute = LocalCompute(self.model, self.hp)

    @property
    def shapes(self):
        return parameter_shapes(self.model)

    async def candidates(self) -> list[Lead]:
        return [Lead(lead_neuron(self.lead_hotkey), self.lead_bucket)]

    async def peer_buckets(self, hotkeys):
        return {}  # no miner's payload is reachable: only the lead's aggregate can resolve a window


def _clock(hp, time: LoopTime) -> Clock:
    cfg = hp.windows.model_copy(update={"blocks_per_window": 10, "block_time": 1.0})
    return Clock(cfg, lambda: int(time.now() - GENESIS), lambda block: GENESIS + block, time)


async def lead_inputs(node: FollowerNode, root, window: int, step: int, keypair, peers=(("miner", b"d" * 32),)) -> None:
    """The lead's signed inputs of `window`, stored in its slot (at the window's gather deadline)."""
    at = node.clock.times(window).gather_deadline
    stamped = LocalBucket(root, now=lambda: at)
    await stamped.put(inputs_key(window), write_inputs(StepInputs(window, step, tuple(peers)), hotkey=node.lead_hotkey,
                                                       run=RUN, sign=keypair.sign))


@pytest.fixture
def published_signs(hp, real_peers):
    shapes, peers = real_peers
    return {w: aggregate(peers[i:i + 2], [0.5, 0.5], shapes) for i, w in enumerate((11, 12, 14))}


def test_catch_up_replays_skips_and_waits_like_the_live_step(hp, keypair, tmp_path, published_signs):
    lead = keypair.ss58_address

    def signed(window: int, step: int) -> bytes:
        return write_aggregate(published_signs[window], window=window, global_step=step, learning_rate=1e-3,
                               hotkey=lead, run=RUN, sign=keypair.sign)

    async def scenario():
        time = loop_time()
        bucket = LocalBucket(tmp_path / "lead", now=time.now)
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        for window, step in ((11, 2), (12, 3), (14, 4), (15, 5)):
            await lead_inputs(node, tmp_path / "lead", window, step, keypair)
        await put_aggregate(bucket, 11, signed(11, 2))
        await put_aggregate(bucket, 12, signed(12, 3))
        # window 13: the lead stepped nothing (its signed inputs name no payload)
        await lead_inputs(node, tmp_path / "lead", 13, 4, keypair, peers=())
        await bucket.put(aggregate_key(14), b"\x00garbage")  # a torn or hostile object: never skipped

        async def repair_14_then_publish_15_late():
            await asyncio.sleep(3)  # after catch-up reached it, before its publish deadline
            await bucket.delete(aggregate_key(14))
            await put_aggregate(bucket, 14, signed(14, 4))
            await put_aggregate(bucket, 15, write_aggregate(published_signs[14], window=15, global_step=5,
                                                            learning_rate=1e-3, hotkey=lead, run=RUN,
                                                            sign=keypair.sign))
            await put_progress(bucket, 15, 6, run=RUN)

        started = time.now()
        late = asyncio.create_task(repair_14_then_publish_15_late())
        state = await catch_up(node, NodeState(window=10, global_step=2), until=15)
        await late
        return node.model, state, time.now() - started

    model, state, waited = run_virtual(scenario(), start=GENESIS + 150)
    assert (state.window, state.global_step) == (15, 6)
    assert waited >= 3, "catch-up must wait for an aggregate still due (a malformed one included)"

    reference = build_model(hp)
    for signs, step in ((published_signs[11], 2), (published_signs[12], 3), (published_signs[14], 4),
                        (published_signs[14], 5)):
        apply_update(reference, signs, step, hp)
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_a_malformed_aggregate_stops_catch_up_before_its_window(hp, keypair, tmp_path, published_signs):
    """A malformed aggregate that stays bad past its publish deadline is never skipped: catch-up
    stops before it, and its [SYNC] line names the object."""
    from loguru import logger

    lead = keypair.ss58_address
    lines: list[str] = []

    async def scenario():
        time = loop_time()
        bucket = LocalBucket(tmp_path / "lead", now=time.now)
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        for window, step in ((11, 2), (12, 3)):
            await lead_inputs(node, tmp_path / "lead", window, step, keypair)
        await put_aggregate(bucket, 11, write_aggregate(published_signs[11], window=11, global_step=2,
                                                        learning_rate=1e-3, hotkey=lead, run=RUN, sign=keypair.sign))
        flipped = bytearray(write_aggregate(published_signs[12], window=12, global_step=3, learning_rate=1e-3,
                                            hotkey=lead, run=RUN, sign=keypair.sign))
        flipped[-64:] = bytes(b ^ 0xFF for b in flipped[-64:])
        await bucket.put(aggregate_key(12), bytes(flipped))
        await put_progress(bucket, 13, 5, run=RUN)
        return await catch_up(node, NodeState(window=10, global_step=2), until=13)

    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    try:
        state = run_virtual(scenario(), start=GENESIS + 150)
    finally:
        logger.remove(sink)
    assert (state.window, state.global_step) == (11, 3), "the malformed window was skipped"
    assert any("aggregate/12.safetensors is malformed (bad_signature)" in line for line in lines), lines


def test_catch_up_takes_the_step_the_lead_signed(hp, keypair, tmp_path, published_signs):
    lead = keypair.ss58_address

    async def scenario():
        time = loop_time()
        bucket = LocalBucket(tmp_path / "lead", now=time.now)
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        await lead_inputs(node, tmp_path / "lead", 11, 7, keypair)
        data = write_aggregate(published_signs[11], window=11, global_step=7, learning_rate=1e-3, hotkey=lead,
                               run=RUN, sign=keypair.sign)
        await put_aggregate(bucket, 11, data)
        await put_progress(bucket, 11, 3, run=RUN)
        return await catch_up(node, NodeState(window=10, global_step=2), until=11)

    state = run_virtual(scenario(), start=GENESIS + 150)
    assert state.global_step == 8  # the lead's record of the run re-anchors a replaying node's count


def test_an_unreadable_aggregate_is_never_taken_for_no_update(hp, keypair, tmp_path, published_signs,
                                                              faults: FaultPlan):
    """The silent fork: a follower that could not read window 12's aggregate used to move on as
    if the lead had stepped nothing. It must stop before that window and finish once it can read."""
    lead = keypair.ss58_address

    def signed(window: int, signs_of: int, step: int) -> bytes:
        return write_aggregate(published_signs[signs_of], window=window, global_step=step, learning_rate=1e-3,
                               hotkey=lead, run=RUN, sign=keypair.sign)

    async def scenario():
        time = loop_time()
        bucket = faults.wrap(LocalBucket(tmp_path / "lead", now=time.now))
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        for window, signs_of, step in ((11, 11, 2), (12, 12, 3), (13, 14, 4)):
            await lead_inputs(node, tmp_path / "lead", window, step, keypair)
            await put_aggregate(bucket, window, signed(window, signs_of, step))
        await put_progress(bucket, 13, 5, run=RUN)
        reset = faults.add(Fault.ERROR, ops={"get"}, keys=aggregate_key(12), message="connection reset")
        stuck = await catch_up(node, NodeState(window=10, global_step=2), until=13)
        assert (stuck.window, stuck.global_step) == (11, 3), "window 12 was assumed empty"
        faults.remove(reset)
        return node.model, await catch_up(node, stuck, until=13)

    model, state = run_virtual(scenario(), start=GENESIS + 150)
    assert (state.window, state.global_step) == (13, 5)
    reference = build_model(hp)
    for signs, step in ((published_signs[11], 2), (published_signs[12], 3), (published_signs[14], 4)):
        apply_update(reference, signs, step, hp)
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_an_unreadable_inputs_record_is_never_taken_for_no_update(hp, keypair, tmp_path, published_signs,
                                                                  faults: FaultPlan):
    """The lead's inputs of window 12 cannot be read (its server answers with an error): who led window 12,
    and whether it had a step, cannot be told. Catch-up stops before it instead of taking it for a window
    nobody led, and finishes once the record can be read."""
    lead = keypair.ss58_address

    async def scenario():
        time = loop_time()
        bucket = faults.wrap(LocalBucket(tmp_path / "lead", now=time.now))
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        for window, step in ((11, 2), (12, 3)):
            await lead_inputs(node, tmp_path / "lead", window, step, keypair)
            await put_aggregate(bucket, window, write_aggregate(published_signs[window], window=window,
                                                                global_step=step, learning_rate=1e-3, hotkey=lead,
                                                                run=RUN, sign=keypair.sign))
        reset = faults.add(Fault.ERROR, ops={"get"}, keys=inputs_key(12), message="connection reset")
        stuck = await catch_up(node, NodeState(window=10, global_step=2), until=12)
        assert (stuck.window, stuck.global_step) == (11, 3), "window 12 was taken for one nobody led"
        faults.remove(reset)
        return await catch_up(node, stuck, until=12)

    state = run_virtual(scenario(), start=GENESIS + 150)
    assert (state.window, state.global_step) == (12, 4)


def test_an_unreadable_progress_record_proves_nothing_and_is_named(hp, keypair, tmp_path, published_signs):
    """Catch-up ends with the fingerprint check against the progress record of the window it reached; that
    record is torn: the line names it, the replayed state stands (no re-sync on no evidence) and the next
    window's check compares again."""
    from loguru import logger


    lead = keypair.ss58_address
    lines: list[str] = []

    async def scenario():
        time = loop_time()
        bucket = LocalBucket(tmp_path / "lead", now=time.now)
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        await lead_inputs(node, tmp_path / "lead", 11, 2, keypair)
        await put_aggregate(bucket, 11, write_aggregate(published_signs[11], window=11, global_step=2,
                                                        learning_rate=1e-3, hotkey=lead, run=RUN, sign=keypair.sign))
        await bucket.put(progress_key(11), b'{"protocol": %d, "netuid"' % PROTOCOL_VERSION)  # torn
        return await catch_up(node, NodeState(window=10, global_step=2), until=11)

    sink = logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    try:
        state = run_virtual(scenario(), start=GENESIS + 150)
    finally:
        logger.remove(sink)
    assert (state.window, state.global_step) == (11, 3)
    named = [line for line in lines if "v4/progress/11.json is unreadable" in line]
    assert len(named) == 1 and "the next window's check compares again" in named[0], lines


def test_the_sync_check_waits_for_the_leads_record_of_the_step_it_just_took(hp, keypair, tmp_path):
    """A node whose model changed after window 11 (a foreign update), that has just taken window 12's
    step, checks itself while the lead's progress record of 12 is not out yet (an overlapped miner
    encodes the moment the step lands, as the lead publishes). Without a wait the check compares the
    fingerprint it took after 11, before the change, and passes a forked model: the verdict would
    depend on which write came first. With one it waits for the record of 12, sees the fork, and waits
    no longer than it is told when no record comes."""
    from templar.runtime.sync import SyncCheck

    lead = keypair.ss58_address

    async def scenario():
        time = loop_time()
        bucket = LocalBucket(tmp_path / "lead", now=time.now)
        node = FollowerNode(hp, build_model(hp), _clock(hp, time), lead, bucket)
        for window, step in ((11, 2), (12, 3)):
            await lead_inputs(node, tmp_path / "lead", window, step, keypair)
        check = SyncCheck(node)
        await check.record(11, 3)
        await put_progress(bucket, 11, 3, run=RUN, fingerprint=node.compute.fingerprint(11))
        # the run's model after window 12 (as the lead holds it), then this node's, changed
        run_after_12 = node.compute.fingerprint(12)
        with torch.no_grad():
            for p in node.model.parameters():
                p.add_(1.0)
        state = NodeState(window=12, global_step=4)

        async def lead_publishes_12(after: float) -> None:
            await asyncio.sleep(after)
            await put_progress(bucket, 12, 4, run=RUN, fingerprint=run_after_12)

        raced = await check.check(13, state)  # the record of 12 is not out: the one of 11 is compared
        publish = asyncio.create_task(lead_publishes_12(2.0))
        started = time.now()
        seen = await check.check(13, state, wait_until=started + 5.0)
        waited = time.now() - started
        await publish

        (tmp_path / "lead" / progress_key(12)).unlink()  # a lead that never publishes it
        started = time.now()
        await check.check(13, state, wait_until=started + 3.0)
        gave_up_after = time.now() - started
        return raced, seen, waited, gave_up_after

    raced, seen, waited, gave_up_after = run_virtual(scenario(), start=GENESIS + 150)
    assert raced is True, "without a wait the check compares the fingerprint taken before the change"
    assert seen is False, "the lead's record of the step just taken shows the fork"
    assert 2.0 <= waited < 3.0, waited
    assert 2.5 <= gave_up_after <= 3.5, gave_up_after


def test_a_window_whose_lead_has_no_bucket_now_is_unresolved_not_a_crash(monkeypatch):
    """A remembered decision whose lead's commitment left or turned unusable since (`LeadHistory.rebind` sets
    its bucket to None): catch-up's look at the window asserted a bucket and would have stopped the node; it is
    an unresolved window with its reason, as an unreadable aggregate is."""
    from types import SimpleNamespace

    from templar.runtime import sync
    from templar.runtime.consensus.succession import Decision

    gone = Lead(Neuron(uid=5, hotkey="gone", coldkey="c", stake=1.0, validator_permit=True, last_update=0,
                       commitment=None, validates=True), None)
    decision = Decision(9, True, slot=0, lead=gone, inputs=StepInputs(9, 2, (("miner", b"\x01" * 32),)))

    async def decided(node, window):
        return decision

    monkeypatch.setattr(sync, "decide_window", decided)
    found, update, problem = asyncio.run(sync._window_update(SimpleNamespace(), 9, 1 << 20))
    assert found is decision and update is None and "uid 5 has no usable bucket committed now" in problem
