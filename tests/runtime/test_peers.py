"""Which payloads make a window's outer step: one rule for every node kind (`templar.runtime.consensus.peers`)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest
import torch

from templar.chain import Neuron
from templar.comms import GatherResult, GatherStatus, put_peers
from templar.core.clock import loop_time, run_virtual
from templar.core.model import build_model
from templar.runtime.consensus.outer import aggregation_weights, outer_step
from templar.runtime.consensus.peers import peers_in_effect
from templar.runtime.consensus.succession import LeadHistory
from templar.runtime.consensus.windows import Clock
from templar.runtime.node import Lead
from templar.runtime.state import NodeState
from templar.storage import LocalBucket
from templar.wire import Gradient, Run

GENESIS = 1_700_000_000.0
RUN = Run(netuid=7, digest="ab" * 32)
NAMES = ("lead", "v1", "v2", "low")


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


@dataclass
class PeersNode:
    """What the peer-list rule reads of a node: hparams (3 slots), clock, run, and four validators able to
    lead, most stake first, each with its bucket."""

    hp: object
    clock: Clock
    buckets: dict
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    run: Run = RUN
    leads: LeadHistory = field(default_factory=LeadHistory)

    async def candidates(self) -> list[Lead]:
        return [Lead(Neuron(uid=i, hotkey=name, coldkey=name, stake=100.0 - i, validator_permit=True, last_update=0,
                            commitment="local:/b", validates=True), self.buckets[name]) for i, name in enumerate(NAMES)]


def _peers_node(hp, tmp_path) -> PeersNode:
    """Windows of 10 one-second blocks, 3 lead slots, a boundary every window; on the running loop's time."""
    time = loop_time()
    cfg = hp.windows.model_copy(update={"blocks_per_window": 10, "block_time": 1.0, "gather_seconds": 4.0,
                                        "lead_slots": 3, "lead_cadence": 1})
    clock = Clock(cfg, lambda: int(time.now() - GENESIS), lambda block: GENESIS + block, time)
    return PeersNode(hp.model_copy(update={"windows": cfg}), clock,
                     {name: LocalBucket(tmp_path / name, now=time.now) for name in NAMES})


def test_a_validator_that_cannot_lead_never_names_the_peers_in_effect(hp, tmp_path):
    """The lead takes the payloads of the list in effect into its inputs, so whoever names that list chooses
    whose work moves θ. With no list from the validator that led the window before (the run's first windows,
    or nobody led), only a candidate that can hold a slot may name it: a validator with a permit and a little
    stake below the slots (`lead_slots`) that planted a list in its bucket names nothing, and the lead then
    takes no payload rather than its choice (it publishes its own top-G for the next window)."""

    async def scenario():
        node = _peers_node(hp, tmp_path)
        await put_peers(node.buckets["low"], 0, ["mallory-1", "mallory-2"], run=RUN)
        planted = await peers_in_effect(node, 15)  # nobody led window 14: no inputs anywhere
        await put_peers(node.buckets["v2"], 10, ["honest-1"], run=RUN)
        slot_holder = await peers_in_effect(node, 15)
        return planted, slot_holder

    planted, slot_holder = run_virtual(scenario(), start=GENESIS + 165)
    assert planted == [], "a validator below the lead slots chose the payloads of the lead's step"
    assert slot_holder == ["honest-1"]


def test_a_validator_below_the_slots_cannot_hold_back_the_runs_start(hp, tmp_path):
    """Restore reads checkpoints and the start window from the succession's buckets. A validator below the
    slots that plants a checkpoint pointer of a window it did not lead (readable, torn, or of a window still
    to come) made it "a checkpoint that exists but cannot be used": every joiner, and the first slot's
    validator at the run's first start, stopped until a real checkpoint existed. A start window it planted
    ahead held every node back until that window. Now neither counts; a slot holder's pointer still does."""
    from templar.comms.checkpoint import Latest, latest_checkpoint_key
    from templar.comms.exchange import dump_record, put_start_window
    from templar.core.config import PROTOCOL_VERSION
    from templar.runtime.restore import _newest_intact_checkpoint, published_start

    async def scenario():
        node = _peers_node(hp, tmp_path)
        candidates, clock = await node.candidates(), node.clock
        low = node.buckets["low"]
        found = []
        for planted in (dump_record(Latest(protocol=PROTOCOL_VERSION, window=12)), b"torn",
                        dump_record(Latest(protocol=PROTOCOL_VERSION, window=10_000))):
            await low.put(latest_checkpoint_key(), planted)
            found.append(await _newest_intact_checkpoint(node, candidates, newer_than=-1))
        await node.buckets["v1"].put(latest_checkpoint_key(), b"torn")  # a slot holder's torn pointer still counts
        slot_holder = await _newest_intact_checkpoint(node, candidates, newer_than=-1)
        await put_start_window(low, clock.current_window() + 1000, run=RUN)
        ahead = await published_start(node, candidates)
        await put_start_window(node.buckets["v2"], 3, run=RUN)
        return found, slot_holder, ahead, await published_start(node, candidates)

    found, slot_holder, ahead, start = run_virtual(scenario(), start=GENESIS + 165)
    assert found == [None, None, None], found
    assert isinstance(slot_holder, str) and "latest.json" in slot_holder
    assert ahead is None and start == 3


def test_a_start_window_below_the_slots_is_read_only_when_usable_and_only_when_no_slot_holder_may_have_one(
        hp, tmp_path):
    """Below the slots, a garbage start window is passed over (it stopped the first lead with exit 8) and so
    is one naming a window older than the history every candidate keeps (no node can replay from it: the first
    lead replayed forever). One naming a recent window is still read when every slot holder has none (a former
    lead's copy), but never when a slot holder's copy cannot be read: unreadable is not absent."""
    from templar.comms.exchange import put_start_window
    from templar.runtime.consensus.windows import retained_windows
    from templar.runtime.restore import ResyncError, published_start

    async def scenario():
        node = _peers_node(hp, tmp_path)
        candidates, current = await node.candidates(), node.clock.current_window()
        low = node.buckets["low"]
        seen = []
        await low.put("v4/start_window.json", b"{not json")
        seen.append(await published_start(node, candidates))
        await low.delete("v4/start_window.json")
        await put_start_window(low, current - retained_windows(node.hp) - 1, run=RUN)
        seen.append(await published_start(node, candidates))
        await low.delete("v4/start_window.json")
        await put_start_window(low, current - 2, run=RUN)
        seen.append(await published_start(node, candidates))
        await node.buckets["v1"].put("v4/start_window.json", b"torn")
        try:
            seen.append(await published_start(node, candidates))
        except ResyncError as exc:
            seen.append(str(exc))
        return current, seen

    current, seen = run_virtual(scenario(), start=GENESIS + 1650)
    assert seen[:3] == [None, None, current - 2], seen
    assert isinstance(seen[3], str) and "uid 1's v4/start_window.json is unreadable" in seen[3]


def test_a_bucket_listing_thousands_of_checkpoints_costs_a_restore_a_few(hp, tmp_path, monkeypatch):
    """A slot holder whose pointer is unusable has its older checkpoints listed; a listing of thousands
    (planted, or a cleanup that never ran) is read for the newest few a candidate keeps, not each of them:
    each entry cost a sort of the whole queue and a look at who led its window (minutes at 100,000)."""
    import templar.runtime.restore as restore
    from templar.comms.checkpoint import checkpoint_manifest_key, latest_checkpoint_key

    looked: list[int] = []
    decide = restore.decide_window

    async def counted(node, window, **kwargs):
        looked.append(window)
        return await decide(node, window, **kwargs)

    monkeypatch.setattr(restore, "decide_window", counted)

    async def scenario():
        node = _peers_node(hp, tmp_path)
        v1 = node.buckets["v1"]
        await v1.put(latest_checkpoint_key(), b"torn")
        for window in range(1, 2001):
            await v1.put(checkpoint_manifest_key(window), b"{}")
        return await restore._newest_intact_checkpoint(node, await node.candidates(), newer_than=-1)

    found = run_virtual(scenario(), start=GENESIS + 1650)
    assert isinstance(found, str)  # the slot holder's torn pointer counts
    assert len(looked) <= hp.windows.retained_checkpoints + 1, len(looked)


def test_buckets_that_never_answer_cost_a_restore_one_timeout_not_one_each(hp, tmp_path):
    """Restore reads every candidate's checkpoint pointer (and lists a slot holder's checkpoints when its
    pointer fails) and, with no checkpoint yet, their start windows. One after another, each bucket that
    never answered cost its whole timeout: here 3 pointers and 2 listings of 60 s (300 s), then 2 start
    windows of 30 s; 5 silent buckets of hotkeys with a permit and a little stake held every join and
    re-sync 300 s, then 150 s more. Now each kind is read at once: one timeout each."""
    from tests.faults import Fault, FaultPlan

    from templar.runtime.restore import ResyncError, _newest_intact_checkpoint, published_start

    async def scenario():
        node = _peers_node(hp, tmp_path)
        silent = FaultPlan()
        silent.add(Fault.HANG, ops={"get", "list"})
        for name in NAMES[1:]:
            node.buckets[name] = silent.wrap(node.buckets[name])
        candidates, clock = await node.candidates(), node.clock
        started = clock.now()
        found = await _newest_intact_checkpoint(node, candidates, newer_than=-1)
        pointers, started = clock.now() - started, clock.now()
        with pytest.raises(ResyncError, match="start window cannot be read"):
            await published_start(node, candidates)
        return found, pointers, clock.now() - started

    found, pointers, starts = run_virtual(scenario(), start=GENESIS + 165)
    assert pointers <= 121.0 and starts <= 31.0, (pointers, starts)
    assert isinstance(found, str) and "uid 1's latest.json" in found and "uid 2's latest.json" in found  # slot holders
