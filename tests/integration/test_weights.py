"""Weight setting that tells the truth: each refusal the chain can give, produced by the embedded
chain (the rate limit and a stale uid by its own rules, the rest injected into the chain file the
way a node reports them), is logged once with what comes next, retried with backoff inside the
weights window, and recorded for the dashboard and /metrics."""

from __future__ import annotations

import asyncio

import pytest
from loguru import logger

from templar.chain.embedded.store import ChainStore
from templar.core.clock import run_virtual
from templar.runtime.metrics import NeuronMetrics
from templar.runtime.records import WEIGHTS_FILE, WeightsRecord, read_records
from templar.validator.weights import WeightSetter

from .harness import Subnet

pytestmark = [pytest.mark.timeout(240)]

WEIGHTS = "set_mechanism_weights"


def test_every_refusal_is_told_once_retried_and_recorded(tmp_path):
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m1": 0.0, "m2": 0.0})
    hotkeys = {name: w.hotkey for name, w in subnet.wallets.items()}
    uids = {w.hotkey: w.uid for w in subnet.wallets.values()}
    weights = {hotkeys["m1"]: 0.7, hotkeys["m2"]: 0.3}
    warnings: list[str] = []
    sinks: list[int] = []

    async def scenario():
        node = await subnet.node("lead")  # sets up logging: our sink comes after
        sinks.append(logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING"))
        setter = WeightSetter(node)
        store = ChainStore(subnet.root / "chain.sqlite", now=node.clock.now)
        blocks = node.hp.windows.block_time

        async def round_of(window: int, faults: list[tuple[str, str, int]], *, uid_map=None) -> bool:
            for error, stage, times in faults:
                store.inject_fault(WEIGHTS, error, stage=stage, times=times)
            first = await setter.submit(window, weights, uid_map or uids)
            if setter.task is not None:
                await setter.task
            await asyncio.sleep(4 * blocks)  # past the subnet's 2-block rate limit before the next round
            return first

        w = node.clock.current_window() + 1
        outcomes = {
            # the SDK resubmits a pool rejection twice itself: 4 injected = our first attempt refused
            "priority": await round_of(w, [("PriorityTooLow", "pool", 4)]),
            "commit_reveal": await round_of(w + 2, [("CommittingWeightsTooFast", "dispatch", 1)]),
            "stake": await round_of(w + 4, [("NotEnoughStakeToSetWeights", "dispatch", 2)]),
            # a uid the subnet does not have (our metagraph read was stale): refused by the chain itself
            "stale": await round_of(w + 6, [], uid_map={**uids, hotkeys["m1"]: 99}),
        }
        # the rate limit, by the chain's own rule: a second round right after a successful one
        outcomes["clean"] = await setter.submit(w + 8, weights, uids)
        outcomes["rate"] = await setter.submit(w + 10, weights, uids)
        await setter.task
        await asyncio.sleep(4 * blocks)
        # a refusal that does not pass within the weights window: given up before the next one
        store.inject_fault(WEIGHTS, "StakeAmountTooLow", stage="pool", times=1000)
        outcomes["hopeless"] = await setter.submit(w + 12, weights, uids)
        await setter.task
        gave_up_at = node.clock.now()
        cadence = await setter.cadence()
        assert cadence.tempo == node.chain.weights_settings().tempo > 0, "the cadence aims at the subnet's epochs"
        deadline = node.clock.times(cadence.next_due(w + 12)).gather_start
        store.close()
        await node.aclose()
        node.chain.close()
        return outcomes, gave_up_at, deadline, node.state_dir

    try:
        outcomes, gave_up_at, deadline, state_dir = run_virtual(scenario())
    finally:
        for sink in sinks:
            logger.remove(sink)
    assert outcomes == {"priority": False, "commit_reveal": False, "stake": False, "stale": False, "clean": True,
                        "rate": False, "hopeless": False}
    records = [WeightsRecord(**r) for r in read_records(state_dir / WEIGHTS_FILE)]
    by_window: dict[int, list[WeightsRecord]] = {}
    for r in records:
        by_window.setdefault(r.window, []).append(r)
    first = min(by_window)
    expected = {first: ["priority_too_low"], first + 2: ["commit_reveal"], first + 4: ["stake", "stake"],
                first + 6: ["stale_metagraph"], first + 10: ["rate_limited"]}
    for window, reasons in expected.items():
        rounds = by_window[window]
        assert [r.reason for r in rounds if r.outcome == "refused"] == reasons, rounds
        assert rounds[-1].outcome == "set" and rounds[-1].attempt == len(reasons) + 1, rounds
        assert all(r.next for r in rounds if r.outcome == "refused"), rounds
    assert [r.outcome for r in by_window[first + 8]] == ["set"]
    hopeless = by_window[first + 12]
    assert hopeless[-1].outcome == "gave_up" and {r.reason for r in hopeless[:-1]} == {"stake"}, hopeless
    assert len(hopeless) >= 3, "backed off, then tried again, within the window"
    assert gave_up_at < deadline, "the round ends before the next weights window"

    # told once per round and reason: the stake round refused twice, one warning
    told = [m for m in warnings if m.startswith("weights refused")]
    assert sum("(stake)" in m for m in told) == 2, told  # one in the stake round, one in the hopeless round
    for reason in ("priority_too_low", "commit_reveal", "stale_metagraph", "rate_limited"):
        assert sum(f"({reason})" in m for m in told) == 1, (reason, told)
    assert any("stake more on this hotkey" in m for m in told)

    # /metrics counts the same records
    metrics = NeuronMetrics("validator", "hk", 0)
    for r in records:
        metrics.on_record(state_dir / WEIGHTS_FILE, r)
    assert metrics.weights_refusals.labels("stake")._value.get() == sum(r.reason == "stake" for r in records)
    assert metrics.weights_refusals.labels("priority_too_low")._value.get() == 1
    assert metrics.weights_last_set.collect()[0].samples[0].value == first + 10
    assert metrics.weights_pending.collect()[0].samples[0].value == 0


def test_a_shadow_validator_scores_as_usual_and_writes_nothing_on_chain(tmp_path):
    """`--shadow` (to try a validator on a new machine): its weights are computed, recorded and
    exported as a `shadow` outcome, and neither they nor its bucket locator reach the chain."""
    from templar.core.clock import loop_time
    from templar.runtime.node import start_node

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m1": 0.0, "m2": 0.0})
    uids = {w.hotkey: w.uid for w in subnet.wallets.values()}
    hotkeys = {name: w.hotkey for name, w in subnet.wallets.items()}
    lines: list[str] = []
    sinks: list[int] = []

    async def scenario():
        args = subnet.args("lead")
        args.shadow = True
        node = await start_node(args, "validator", time=loop_time(), open_bucket=subnet.open_bucket)
        sinks.append(logger.add(lambda m: lines.append(m.record["message"]), level="INFO"))
        landed = await WeightSetter(node).submit(node.clock.current_window() + 1,
                                                 {hotkeys["m1"]: 0.6, hotkeys["m2"]: 0.4}, uids)
        on_chain = node.chain.current_weights(), node.chain.bucket_locators()
        await node.aclose()
        node.chain.close()
        return landed, on_chain, node

    try:
        landed, (weights, locators), node = run_virtual(scenario())
    finally:
        for sink in sinks:
            logger.remove(sink)
    assert not landed and node.shadow
    assert not weights.get(uids[hotkeys["lead"]]), weights
    assert hotkeys["lead"] not in locators, locators
    records = [WeightsRecord(**r) for r in read_records(node.state_dir / WEIGHTS_FILE)]
    assert [(r.outcome, r.uids) for r in records] == [("shadow", 2)]
    assert any(line.startswith("shadow mode: weights for 2 uids computed, not set") for line in lines), lines
    metrics = NeuronMetrics("validator", "hk", 0, shadow=True)
    metrics.on_record(node.state_dir / WEIGHTS_FILE, records[0])
    assert metrics.shadow.collect()[0].samples[0].value == 1
    assert metrics.weights_pending.collect()[0].samples[0].value == 0


def test_a_shadow_on_the_leads_hotkey_follows_the_live_lead_and_publishes_nothing(tmp_path):
    """The docs say a shadow can run beside the validator that sets the weights, on the same hotkey. It
    took its own bucket (which the chain names for nobody) for its hotkey's: it held the live lead's
    slot, led windows from its own inputs and published them there, and followed itself. Now it reads
    its hotkey's committed bucket like any node, holds no slot, and takes the live lead's steps."""
    from templar.core.clock import loop_time
    from templar.miner.loop import Miner
    from templar.runtime.node import start_node
    from templar.validator.files import SECRET_FILE
    from templar.validator.loop import Validator

    from .harness import parameters, same_parameters

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0})
    own_bucket = subnet.root / "buckets" / "lead-shadow"

    async def scenario():
        lead = Validator(await subnet.node("lead"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        await lead.start()
        for m in miners:
            await m.start()
        args = subnet.args("lead")
        args.shadow, args.state_dir, args.bucket_locator = True, subnet.root / "nodes" / "lead-shadow", f"local:{own_bucket}"
        own_bucket.mkdir(parents=True)
        args.state_dir.mkdir(parents=True)
        (args.state_dir / SECRET_FILE).write_bytes(b"another machine's secret".ljust(32, b"."))
        shadow = Validator(await start_node(args, "validator", time=loop_time(), open_bucket=subnet.open_bucket))
        await shadow.start()
        for _ in range(4):
            w = max(lead.state.window, shadow.state.window) + 1
            await asyncio.gather(*(n.run_window(w) for n in (lead, shadow, *miners)))
            assert shadow.slot is None and not shadow.is_lead and lead.is_lead
            assert (shadow.state.window, shadow.state.global_step) == (lead.state.window, lead.state.global_step)
            assert same_parameters(parameters(shadow.node), parameters(lead.node)), w
        for node in (lead, shadow, *miners):
            await node.node.aclose()
        return lead.state.global_step

    assert run_virtual(scenario()) >= 2
    assert not any(own_bucket.rglob("*inputs*")) and not any(own_bucket.rglob("*progress*")), sorted(own_bucket.rglob("*"))
