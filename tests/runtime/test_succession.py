"""Who leads a window (`templar.runtime.consensus.succession`): the order from the chain, each candidate's slot, and
the one rule every reader applies to the inputs records it finds, on virtual time against real local
buckets and real signatures. The security cases: a candidate lower in the order cannot pre-empt a live
lead, late or far-ahead inputs count for nobody, and an unreadable candidate is never skipped."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bittensor.sp_core import Keypair
from tests.faults import Fault, FaultPlan

from templar.chain import Neuron, is_miner, succession_of
from templar.comms.keys import inputs_key
from templar.core.clock import loop_time, run_virtual
from templar.runtime.consensus.succession import (
    Decision,
    LeadHistory,
    Observation,
    Seen,
    decide,
    decide_window,
    in_slot,
    order_of,
)
from templar.runtime.consensus.windows import Clock
from templar.runtime.node import Lead
from templar.storage import LocalBucket
from templar.wire import Run, StepInputs, write_inputs

GENESIS = 1_700_000_000.0
RUN = Run(netuid=7, digest="ab" * 32)
WINDOW = 14
NAMES = ("lead", "v1", "v2")


def neuron(uid: int, hotkey: str, stake: float, *, permit: bool = True, commitment: str | None = "local:/b",
           validates: bool = True) -> Neuron:
    return Neuron(uid=uid, hotkey=hotkey, coldkey=hotkey, stake=stake, validator_permit=permit, last_update=0,
                  commitment=commitment, validates=validates)


def test_the_succession_is_the_validators_able_to_lead_by_stake_then_uid():
    neurons = [neuron(0, "owner", 0.0), neuron(1, "a", 50.0), neuron(2, "b", 100.0), neuron(3, "c", 50.0),
               neuron(4, "no-permit", 500.0, permit=False), neuron(5, "no-bucket", 400.0, commitment=None),
               neuron(6, "miner", 0.0, permit=False, validates=False),
               neuron(7, "staked-miner", 900.0, validates=False)]  # a permit and the most stake, but a miner
    assert [n.hotkey for n in succession_of(neurons)] == ["b", "a", "c"]
    assert [n.hotkey for n in neurons if is_miner(n)] == ["miner", "staked-miner"]


def test_who_led_a_window_keeps_the_first_slot_until_the_succession_resumes(hp):
    """Slots of a window: the succession's order, but the validator that led the window before first (a
    successor publishes as early as a lead, so a dead lead delays one window, not every one), until a
    multiple of `lead_cadence` (4 here), where the chain's order resumes and a returning lead takes its slot."""
    order = [Lead(neuron(i, name, 100.0 - i), None) for i, name in enumerate(NAMES)]
    led_by = {name: Decision(0, True, 1, lead) for name, lead in zip(NAMES, order, strict=True)}
    assert hp.windows.lead_cadence == 4

    def slots(window, before):
        return [lead.hotkey for lead in order_of(window, order, before, hp)]

    assert slots(13, led_by["v1"]) == ["v1", "lead", "v2"]
    assert slots(14, led_by["v2"]) == ["v2", "lead", "v1"]
    assert slots(16, led_by["v1"]) == ["lead", "v1", "v2"], "a boundary: the succession's own order"
    assert slots(13, Decision(12, True)) == ["lead", "v1", "v2"], "nobody led the window before"
    gone = Decision(12, True, 0, Lead(neuron(9, "unstaked", 0.0), None))
    assert slots(13, gone) == ["lead", "v1", "v2"], "a keeper no longer able to lead keeps nothing"
    few = hp.model_copy(update={"windows": hp.windows.model_copy(update={"lead_slots": 2})})
    assert [lead.hotkey for lead in order_of(13, order, led_by["v2"], few)] == ["v2", "lead"]


@dataclass
class SlotNode:
    """What the rule reads of a node: hparams (3 slots), clock, run, the candidates and their buckets."""

    hp: object
    clock: Clock
    keys: dict[str, Keypair]
    buckets: dict
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    run: Run = RUN
    leads: LeadHistory = field(default_factory=LeadHistory)

    async def candidates(self) -> list[Lead]:
        return [Lead(neuron(i, self.keys[name].ss58_address, 100.0 - i), self.buckets[name])
                for i, name in enumerate(NAMES)]

    def publish(self, name: str, window: int, at: float, *, signer: str | None = None) -> asyncio.Future:
        """`name`'s inputs of `window`, stored at `at` (the storage server's clock), signed by `signer`."""
        key = self.keys[signer or name]
        data = write_inputs(StepInputs(window, 3, ((name, bytes([len(name)]) * 32),)), hotkey=key.ss58_address,
                            run=RUN, sign=key.sign)
        root = self.buckets[name].inner.root if hasattr(self.buckets[name], "inner") else self.buckets[name].root
        return LocalBucket(root, now=lambda: at).put(inputs_key(window), data)


def _node(hp, tmp_path, faults: FaultPlan | None = None) -> SlotNode:
    time = loop_time()
    cfg = hp.windows.model_copy(update={"blocks_per_window": 10, "block_time": 1.0, "gather_seconds": 4.0,
                                        "lead_slots": 3, "handover_seconds": 2.0, "handover_settle_seconds": 0.5,
                                        "lead_cadence": 1})  # every window in the succession's own order
    clock = Clock(cfg, lambda: int(time.now() - GENESIS), lambda block: GENESIS + block, time)
    buckets = {name: LocalBucket(tmp_path / name, now=time.now) for name in NAMES}
    if faults is not None:  # the lead's storage server misbehaves
        buckets["lead"] = faults.wrap(buckets["lead"])
    return SlotNode(hp.model_copy(update={"windows": cfg}), clock,
                    {name: Keypair.create_from_uri(f"//{name}") for name in NAMES}, buckets)


def test_each_slot_opens_when_the_one_before_closes_and_counts_only_what_is_stored_inside_it(hp, tmp_path):
    async def scenario():
        return _node(hp, tmp_path).clock.times(WINDOW)

    t = run_virtual(scenario(), start=GENESIS + 100)
    skew = t.skew  # 1 s: storage servers' clocks drift
    assert t.slot_deadline(0) == t.gather_deadline + 2.0
    assert t.slot_opens(1) == t.slot_deadline(0) and t.slot_settled(0) == t.slot_deadline(0) + skew + 0.5
    assert t.slot_deadline(1) == t.slot_settled(0) + 2.0  # a whole handover to publish after slot 0 settled
    assert in_slot(t.gather_deadline, t, 0) and in_slot(t.slot_deadline(0) + skew, t, 0)
    assert not in_slot(t.slot_deadline(0) + skew + 0.01, t, 0), "late inputs count for nobody"
    assert not in_slot(t.gather_start - skew - 0.01, t, 0), "inputs stored before the gather could start"
    # a lower candidate's inputs stored while the lead's slot is open count for nothing (no pre-emption)
    assert not in_slot(t.gather_deadline + 0.5, t, 1) and not in_slot(t.slot_deadline(0) - skew, t, 1)
    assert in_slot(t.slot_settled(0) + 0.5, t, 1)


def test_decide_takes_the_lowest_slot_present_and_never_skips_one_it_cannot_read():
    order = [Lead(neuron(i, name, 1.0), None) for i, name in enumerate(NAMES)]
    inputs = StepInputs(WINDOW, 3, ())
    present, absent = Observation(Seen.PRESENT, inputs), Observation(Seen.ABSENT, why="not published by its deadline")
    unknown = Observation(Seen.UNKNOWN, why="unreadable (connection reset)")
    assert decide(WINDOW, order, [present]).slot == 0
    got = decide(WINDOW, order, [absent, present])
    assert (got.settled, got.slot, got.lead.hotkey, got.absent) == (True, 1, "v1", (
        "uid 0 (slot 0): not published by its deadline",))
    stuck = decide(WINDOW, order, [unknown, present])
    assert not stuck.settled and "uid 0's v4/inputs/14.safetensors is unreadable" in stuck.problem
    nobody = decide(WINDOW, order, [absent, absent, absent])
    assert nobody.settled and nobody.lead is None and nobody.no_step
    assert not decide(WINDOW, order, [absent, Observation(Seen.PENDING, why="not published yet")]).settled


def _decide(node: SlotNode, **kw) -> Decision:
    return decide_window(node, WINDOW, **kw)


def test_every_reader_takes_the_lowest_slot_in_time_and_nothing_a_lower_candidate_stored_early(hp, tmp_path):
    """The lead is silent: readers wait until its slot settled, then take v1's. v2 stored inputs while the
    lead's slot was open (a pre-emption): they count for nothing, also once the lead's slot passed."""

    async def scenario():
        node = _node(hp, tmp_path)
        t = node.clock.times(WINDOW)
        await node.publish("v2", WINDOW, t.gather_deadline)  # early: in the lead's slot, not its own
        await node.publish("v1", WINDOW, t.slot_settled(0) + 0.2)
        got = await _decide(node, deadline=t.apply_deadline)
        return got, node.clock.now() - t.slot_settled(0)

    got, waited = run_virtual(scenario(), start=GENESIS + 150 + 5.25)  # window 14's gather starts
    assert (got.slot, got.lead.hotkey[:5]) == (1, Keypair.create_from_uri("//v1").ss58_address[:5])
    assert got.inputs.hotkeys == ["v1"] and waited >= 0, "slot 0 was skipped before it settled"


def test_a_live_lead_is_never_pre_empted_and_late_or_far_ahead_inputs_count_for_nobody(hp, tmp_path):
    async def scenario():
        node = _node(hp, tmp_path)
        t = node.clock.times(WINDOW)
        await node.publish("v1", WINDOW, t.slot_settled(0) + 0.2)  # in its own slot, but the lead was on time
        await node.publish("lead", WINDOW, t.gather_deadline + 0.1)
        on_time = await _decide(node)
        # window + 1: the lead stores its inputs after its slot closed (a partitioned old lead): v1's stand
        t1 = node.clock.times(WINDOW + 1)
        await node.publish("lead", WINDOW + 1, t1.slot_deadline(0) + t1.skew + 0.5)
        await node.publish("v1", WINDOW + 1, t1.slot_settled(0) + 0.2)
        # window + 50, published now by the lead (inputs of a window whose gather has not begun)
        await node.publish("lead", WINDOW + 50, node.clock.now())
        await node.clock.sleep_until(t1.apply_deadline)
        late = await decide_window(node, WINDOW + 1)
        await node.clock.sleep_until(node.clock.times(WINDOW + 50).apply_deadline)
        ahead = await decide_window(node, WINDOW + 50)
        return on_time, late, ahead

    on_time, late, ahead = run_virtual(scenario(), start=GENESIS + 160)
    assert on_time.slot == 0 and on_time.inputs.hotkeys == ["lead"]
    assert late.slot == 1 and "stored 0.5s after its slot closed" in late.absent[0], late
    assert ahead.settled and ahead.lead is None, "inputs stored before the window's gather counted"


def test_an_unreadable_or_forged_candidate_is_waited_for_never_skipped(hp, tmp_path, faults: FaultPlan):
    """The lead's storage answers with an error: readers cannot tell whether its inputs are there, so they
    never take v1's (a split would fork the run); they stop at their deadline. Inputs in the lead's bucket
    signed by another hotkey are no one's."""

    async def scenario():
        node = _node(hp, tmp_path, faults)
        t = node.clock.times(WINDOW)
        await node.publish("v1", WINDOW, t.slot_settled(0) + 0.2)
        reset = faults.add(Fault.ERROR, ops={"get"}, keys=inputs_key(WINDOW), message="connection reset")
        stuck = await _decide(node, deadline=t.slot_settled(1) + 1.0)
        faults.remove(reset)
        await node.publish("lead", WINDOW + 1, node.clock.times(WINDOW + 1).gather_deadline, signer="v2")
        await node.clock.sleep_until(node.clock.times(WINDOW + 1).apply_deadline)
        forged = await decide_window(node, WINDOW + 1)
        return stuck, forged

    stuck, forged = run_virtual(scenario(), start=GENESIS + 160)
    assert not stuck.settled and "unreadable" in stuck.problem, stuck
    assert not forged.settled and "malformed (wrong_hotkey" in forged.problem, forged


def test_a_write_stored_in_time_but_seen_late_is_taken_over_a_higher_slot(hp, tmp_path):
    """The straddling PUT: the lead's inputs were stamped inside its slot but became visible only after the
    slot settled. A reader that finds v1's looks at the lead's once more first, and takes the lead's."""

    async def scenario():
        node = _node(hp, tmp_path)
        t = node.clock.times(WINDOW)
        await node.publish("v1", WINDOW, t.slot_settled(0) + 0.2)
        original = node.buckets["v1"].fetch

        async def slow_fetch(key, **kw):  # v1's record is read while the lead's straddling write lands
            await node.publish("lead", WINDOW, t.slot_deadline(0))
            return await original(key, **kw)

        node.buckets["v1"].fetch = slow_fetch
        await node.clock.sleep_until(t.slot_settled(0) + 0.3)
        return await _decide(node, deadline=t.apply_deadline)

    got = run_virtual(scenario(), start=GENESIS + 160)
    assert got.slot == 0 and got.inputs.hotkeys == ["lead"]


def test_every_node_says_once_who_leads_when_it_changes():
    from loguru import logger

    order = [Lead(neuron(i, name, 1.0), None) for i, name in enumerate(NAMES)]
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    try:
        history = LeadHistory()
        history.applied(Decision(10, True, 0, order[0], StepInputs(10, 1, ())))
        history.applied(Decision(11, True, 1, order[1], StepInputs(11, 2, ()), absent=(
            "uid 0 (slot 0): not published by its deadline",)))
        history.applied(Decision(12, True, 1, order[1], StepInputs(12, 3, ())))
        history.applied(Decision(13, True, 0, order[0], StepInputs(13, 4, ())))
        history.applied(Decision(14, True))
    finally:
        logger.remove(sink)
    said = [line for line in lines if line.startswith("[LEAD]")]
    assert said == [
        "[LEAD] window 11 is led by uid 1 (v1, slot 1): uid 0 (slot 0): not published by its deadline",
        "[LEAD] window 13 is led by uid 0 (lead, slot 0): it keeps the first slot, and its inputs were on time",
        "[LEAD] no validator led window 14: no candidate published inputs in its slot (no validator can lead); the "
        "window has no outer step"], said


def test_a_reader_whose_clock_runs_ahead_never_closes_a_slot_early(hp, tmp_path):
    """Whether a slot has settled is read off the candidate's storage server (the clock that stamps its
    objects), not the reader's: a reader 5 s ahead still waits for the lead, and takes its inputs."""
    from templar.core.clock import LoopTime

    class Ahead(LoopTime):
        def now(self) -> float:
            return super().now() + 5.0

    async def scenario():
        node = _node(hp, tmp_path)
        true = node.clock
        node.clock = Clock(true.cfg, true._block, true._block_timestamp, Ahead(asyncio.get_running_loop()))
        t = true.times(WINDOW)
        await node.publish("v1", WINDOW, t.slot_settled(0) + 0.2)

        async def lead_on_time():
            await true.sleep_until(t.slot_deadline(0) - 0.2)
            await node.publish("lead", WINDOW, true.now())

        task = asyncio.create_task(lead_on_time())
        got = await _decide(node, deadline=t.apply_deadline + 5.0)
        await task
        return got

    got = run_virtual(scenario(), start=GENESIS + 159)
    assert got.slot == 0 and got.inputs.hotkeys == ["lead"], got
