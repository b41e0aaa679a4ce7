"""Every node takes exactly the step of the window's lead (`templar.runtime.consensus.follow`), on virtual time
against real local buckets, real signed payloads and a real signed inputs record stored in the lead's
slot (`templar.runtime.consensus.succession`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import torch
from bittensor.sp_core import Keypair

from templar.chain import Neuron
from templar.comms import GatherResult, GatherStatus, put_gradient
from templar.comms.keys import inputs_key
from templar.core.clock import loop_time, run_virtual
from templar.core.model import build_model, parameter_shapes
from templar.runtime.compute import LocalCompute
from templar.runtime.consensus.follow import FollowError, apply_inputs, follow_step, inputs_of, window_inputs
from templar.runtime.consensus.outer import outer_step, payload_reader
from templar.runtime.consensus.succession import LeadHistory
from templar.runtime.consensus.windows import Clock
from templar.runtime.node import Lead
from templar.runtime.state import NodeState
from templar.storage import LocalBucket
from templar.wire import Run, write_gradient, write_inputs

GENESIS = 1_700_000_000.0
RUN = Run(netuid=7, digest="ab" * 32)
WINDOW = 14
IN_SLOT = GENESIS + 158
"""Window 14 ends at GENESIS + 150; its gather runs from 155.25 to 159.25, and the lead's slot closes at
161.25 (+ 1 s of clock-skew allowance): the tests start inside it."""



def lead_neuron(hotkey: str) -> Neuron:
    """The lead validator as the chain would report it (only its hotkey and uid are read here)."""
    return Neuron(uid=0, hotkey=hotkey, coldkey=hotkey, stake=1.0, validator_permit=True, last_update=0,
                  commitment=None, validates=True)

@dataclass
class Follower:
    """What following reads of a node: hparams, model and compute, clock, the lead and peers' buckets."""

    hp: object
    model: torch.nn.Module
    clock: Clock
    lead_key: Keypair
    buckets: dict
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    run: Run = RUN
    leads: LeadHistory = field(default_factory=LeadHistory)

    def __post_init__(self) -> None:
        self.compute = LocalCompute(self.model, self.hp)

    @property
    def shapes(self):
        return parameter_shapes(self.model)

    async def candidates(self) -> list[Lead]:
        return [Lead(lead_neuron(self.lead_key.ss58_address), self.buckets["lead"])]

    async def peer_buckets(self, hotkeys):
        return {hk: self.buckets[hk] for hk in hotkeys if hk in self.buckets}


def _clock(hp, time) -> Clock:
    cfg = hp.windows.model_copy(update={"blocks_per_window": 10, "block_time": 1.0, "gather_seconds": 4.0,
                                        "lead_slots": 1})
    return Clock(cfg, lambda: int(time.now() - GENESIS), lambda block: GENESIS + block, time)


@pytest.fixture
def signed_payloads(hp, real_peers):
    """Four miners' signed payloads of WINDOW, as read back by the strict reader."""
    shapes, peers = real_peers
    keys = [Keypair.create_from_uri(f"//Miner{i}") for i in range(4)]
    probes = {n: torch.zeros(hp.gauntlet.probe_count) for n in shapes}
    raw = {k.ss58_address: write_gradient(t, probes, window=WINDOW, global_step=3, hotkey=k.ss58_address, hp=hp,
                                          run=RUN, sign=k.sign) for k, t in zip(keys, peers, strict=True)}
    read = payload_reader(dict(shapes), hp, WINDOW, RUN)
    return raw, {hk: read(hk, data) for hk, data in raw.items()}


def _scenario(hp, tmp_path, raw, *, lead_inputs=None, garbage_until=None):
    """Buckets of the lead and of every miner (payloads uploaded), and a follower node."""
    lead_key = Keypair.create_from_uri("//Lead")

    async def setup():
        time = loop_time()
        buckets = {"lead": LocalBucket(tmp_path / "lead", now=time.now)}
        for hotkey, data in raw.items():
            buckets[hotkey] = LocalBucket(tmp_path / hotkey[:8], now=time.now)
            await put_gradient(buckets[hotkey], WINDOW, data)
        node = Follower(hp, build_model(hp), _clock(hp, time), lead_key, buckets)
        if lead_inputs is not None:
            await buckets["lead"].put(inputs_key(WINDOW), write_inputs(lead_inputs, hotkey=lead_key.ss58_address,
                                                                       run=RUN, sign=lead_key.sign))
        return node

    return setup


def _ok(g) -> GatherResult:
    return GatherResult(GatherStatus.OK, value=g, timestamp=0.0)


def _leads_step(hp, chosen: list) -> tuple:
    """The lead's inputs over `chosen` (window WINDOW, step 3) and the model after its step: the reference."""
    reference = build_model(hp)
    outer_step(reference, chosen, NodeState(window=WINDOW - 1, global_step=3), hp)
    return inputs_of(WINDOW, 3, chosen), reference


def test_a_follower_takes_the_leads_step_whatever_its_own_gather_saw(hp, tmp_path, signed_payloads):
    """The lead aggregated a, b and c; the follower's own gather returned b, c and d (d was late for
    the lead, a was late for the follower). It applies a, b and c: a fetched from a's bucket."""
    raw, payloads = signed_payloads
    a, b, c, d = payloads
    inputs, reference = _leads_step(hp, [payloads[a], payloads[b], payloads[c]])

    async def scenario():
        node = await _scenario(hp, tmp_path, raw, lead_inputs=inputs)()
        state = NodeState(window=WINDOW - 1, global_step=1)  # our count drifted: the lead's re-anchors it
        gathered = {hk: _ok(payloads[hk]) for hk in (b, c, d)}
        step = await follow_step(node, WINDOW, state, gathered)
        return node.model, state, step

    model, state, step = run_virtual(scenario(), start=IN_SLOT)
    assert step.peers == 3 and state.global_step == 4
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_a_payload_that_is_not_the_one_the_lead_aggregated_is_refused(hp, tmp_path, signed_payloads):
    """Same hotkey, another payload (the follower's gather got a later re-upload): the digest says so,
    and the follower stops instead of stepping with it."""
    raw, payloads = signed_payloads
    a, b, *_ = payloads
    wrong = inputs_of(WINDOW, 3, [payloads[a]])
    wrong = type(wrong)(WINDOW, 3, ((a, payloads[b].digest),))  # a's hotkey, b's digest

    async def scenario():
        node = await _scenario(hp, tmp_path, raw, lead_inputs=wrong)()
        before = {n: p.clone() for n, p in node.model.named_parameters()}
        with pytest.raises(FollowError, match="not the payload the lead aggregated"):
            await apply_inputs(node, WINDOW, wrong, NodeState(WINDOW - 1, 3), {a: _ok(payloads[a])},
                               deadline=node.clock.now() + 5)
        return before, node.model

    before, model = run_virtual(scenario(), start=IN_SLOT)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), "the model changed"


def test_inputs_that_are_malformed_or_not_yet_there_are_never_an_empty_step(hp, tmp_path, signed_payloads):
    """A torn inputs record is retried until the deadline and then named; inputs published late but
    before the deadline are taken."""
    raw, payloads = signed_payloads
    inputs = inputs_of(WINDOW, 3, list(payloads.values())[:2])

    async def scenario():
        node = await _scenario(hp, tmp_path, raw)()
        lead = node.buckets["lead"]
        await lead.put(inputs_key(WINDOW), b"\x00torn")
        with pytest.raises(FollowError, match=r"inputs/14\.safetensors is malformed \(not_safetensors"):
            await window_inputs(node, WINDOW, deadline=node.clock.now() + 1)
        await lead.delete(inputs_key(WINDOW))

        async def publish_late():
            await asyncio.sleep(1.5)
            await lead.put(inputs_key(WINDOW), write_inputs(inputs, hotkey=node.lead_key.ss58_address, run=RUN,
                                                            sign=node.lead_key.sign))

        started = node.clock.now()
        task = asyncio.create_task(publish_late())
        got = (await window_inputs(node, WINDOW, deadline=node.clock.now() + 3)).inputs
        await task
        waited = node.clock.now() - started
        with pytest.raises(FollowError, match="not published yet"):
            await window_inputs(node, WINDOW + 1, deadline=node.clock.now() + 1)
        return got, waited

    got, waited = run_virtual(scenario(), start=IN_SLOT)
    assert got == inputs and waited >= 1.5


def test_inputs_signed_by_someone_else_are_refused(hp, tmp_path, signed_payloads):
    raw, payloads = signed_payloads
    inputs = inputs_of(WINDOW, 3, list(payloads.values())[:1])
    mallory = Keypair.create_from_uri("//Mallory")

    async def scenario():
        node = await _scenario(hp, tmp_path, raw)()
        await node.buckets["lead"].put(inputs_key(WINDOW), write_inputs(inputs, hotkey=mallory.ss58_address,
                                                                        run=RUN, sign=mallory.sign))
        with pytest.raises(FollowError, match="wrong_hotkey"):
            await window_inputs(node, WINDOW, deadline=node.clock.now() + 1)

    run_virtual(scenario(), start=IN_SLOT)


def test_inputs_naming_more_payloads_than_the_run_aggregates_are_refused(hp, tmp_path, signed_payloads):
    """Each payload of the lead's inputs enters at weight 1/G: a record naming more than `top_g` (up to the
    wire's 256) made every node fetch and decode them all in the apply span and take a step N/G times the
    run's, where catch-up's reader refused the same step (a review, with a lead slot's stake). Refused here
    as malformed, as a torn record is: the window goes to the next slot."""
    raw, payloads = signed_payloads
    narrow = hp.model_copy(update={"gauntlet": hp.gauntlet.model_copy(update={"top_g": len(payloads) - 1})})
    inputs = inputs_of(WINDOW, 3, list(payloads.values()))

    async def scenario():
        node = await _scenario(narrow, tmp_path, raw, lead_inputs=inputs)()
        with pytest.raises(FollowError, match=rf"malformed \(bad_metadata: {len(payloads)} peers, the run aggregates "
                                              rf"at most {len(payloads) - 1}"):
            await window_inputs(node, WINDOW, deadline=node.clock.now() + 1)
        assert (await window_inputs(Follower(hp, node.model, node.clock, node.lead_key, node.buckets), WINDOW,
                                    deadline=node.clock.now() + 1)).inputs == inputs  # G of them: taken

    run_virtual(scenario(), start=IN_SLOT)


@pytest.mark.parametrize("copy", ["gathered", "fetched"])
def test_a_payload_re_signed_as_warm_up_still_enters_at_the_leads_weight(hp, tmp_path, signed_payloads, real_peers,
                                                                         copy):
    """The inputs name payloads by their content digest (the gradient tensors only), so a miner can sign the
    same tensors again with its warm-up flag set and serve that copy to some readers (its own storage server,
    or a re-upload after the lead's gather). The lead weighed the payload 1/G; a follower that got the warm-up
    copy, from its own gather or fetched, must not weigh it 0 (its θ would leave the run's): the inputs, not
    the flag, say who enters."""
    raw, payloads = signed_payloads
    a, b, c, _ = payloads
    inputs, reference = _leads_step(hp, [payloads[a], payloads[b], payloads[c]])
    shapes, peers = real_peers
    key = Keypair.create_from_uri("//Miner0")
    probes = {n: torch.zeros(hp.gauntlet.probe_count) for n in shapes}
    warm = write_gradient(peers[0], probes, window=WINDOW, global_step=3, hotkey=key.ss58_address, hp=hp, run=RUN,
                          sign=key.sign, warmup=True)
    warm_read = payload_reader(dict(shapes), hp, WINDOW, RUN)(a, warm)
    assert key.ss58_address == a and warm_read.warmup and warm_read.digest == payloads[a].digest

    async def scenario():
        node = await _scenario(hp, tmp_path, {**raw, a: warm}, lead_inputs=inputs)()
        state = NodeState(window=WINDOW - 1, global_step=3)
        gathered = {hk: _ok(payloads[hk]) for hk in (b, c)}
        if copy == "gathered":
            gathered[a] = _ok(warm_read)
        step = await follow_step(node, WINDOW, state, gathered)
        return node.model, step

    model, step = run_virtual(scenario(), start=IN_SLOT)
    assert step.peers == 3
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(p, q), n
