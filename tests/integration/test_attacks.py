"""Attacks on consensus rules, run against a real lead validator and real miners on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from templar.comms import put_peers
from templar.core.clock import run_virtual
from templar.localnet.adversaries import StepPump
from templar.miner.loop import Miner
from templar.runtime.records import SCORES_FILE, read_records
from templar.validator.loop import Validator

from .harness import PRODUCTION_QUARTER, Subnet, parameters, same_parameters, untrained_windows

pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow(seconds=3)
def test_a_step_pumper_in_the_top_g_changes_nothing(tmp_path):
    """A miner claiming global_step + max_allowed_stale every window, kept in the top-G by force
    (the test rewrites the lead's peer list to name it every window; its work is honest, so it is
    aggregated): every node's step stays the count of outer steps applied, every node holds the
    same model, and the pumper fails fast evaluation with `wrong_step`."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "pump": 0.0})

    async def scenario():
        v = Validator(await subnet.node("lead"))
        m0 = Miner(await subnet.node("m0"))
        pump = Miner(await subnet.node("pump"), hooks=StepPump())
        await v.start()
        await m0.start()
        await pump.start()
        first = v.state.window + 1
        steps_applied = 0
        both = sorted([m0.node.hotkey, pump.node.hotkey])
        await put_peers(v.node.bucket, first, both, run=v.node.run)
        for w in range(first, first + 5 + untrained_windows(v.hp)):
            before = v.state.global_step
            await asyncio.gather(v.run_window(w), m0.run_window(w), pump.run_window(w))
            await put_peers(v.node.bucket, w + 1, both, run=v.node.run)
            steps_applied += v.state.global_step - before
            assert v.state.global_step - before in (0, 1), "one outer step per window at most"
            assert m0.state.global_step == v.state.global_step == pump.state.global_step, w
            assert same_parameters(parameters(m0.node), parameters(v.node)), w
        for node in (v.node, m0.node, pump.node):
            await node.aclose()
        return v, pump, steps_applied

    v, pump, steps_applied = run_virtual(scenario())
    assert steps_applied >= 3 and v.state.global_step == steps_applied  # started at 0: the count, nothing more
    statuses = {r["status"] for r in read_records(v.node.state_dir / SCORES_FILE) if r["hotkey"] == pump.node.hotkey}
    assert "wrong_step" in statuses, statuses


def test_work_borrowed_from_the_window_s_uploads_is_uncommitted(tmp_path):
    """Commitments (docs/scoring.md §8): a `partial` miner mixes the other miners' same-window uploads into
    its own after the put window opens; the lead read every commitment before any upload could count, so the
    borrowed payload is `uncommitted` while the honest miner's committed one passes."""
    from templar.localnet.adversaries import Partial

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "partial": 0.0})

    async def scenario():
        v = Validator(await subnet.node("lead"))
        m0 = Miner(await subnet.node("m0"))
        partial = Miner(await subnet.node("partial"), hooks=Partial())
        await v.start()
        await m0.start()
        await partial.start()
        watcher = asyncio.create_task(v.commits.run())
        first = v.state.window + 1
        for w in range(first, first + 3):
            await asyncio.gather(v.run_window(w), m0.run_window(w), partial.run_window(w))
        watcher.cancel()
        for node in (v.node, m0.node, partial.node):
            await node.aclose()
        return v, m0, partial, first

    v, m0, partial, first = run_virtual(scenario())
    records = list(read_records(v.node.state_dir / SCORES_FILE))
    skipped = untrained_windows(v.hp)  # a delayed run's first window after a start is not trained
    statuses = {hk: {r["status"] for r in records if r["hotkey"] == hk and r["window"] >= first + skipped}
                for hk in (m0.node.hotkey, partial.node.hotkey)}
    assert statuses[partial.node.hotkey] == {"uncommitted"}, statuses
    assert statuses[m0.node.hotkey] <= {"ok", "warmup"}, statuses


@pytest.mark.slow(seconds=3)
def test_a_miner_re_posting_its_own_earlier_upload_is_replay_across_a_restart(tmp_path):
    """Replays (docs/scoring.md §8): a `replay` miner trains as usual but, from its third window on,
    sends its upload of two windows earlier, re-signed with this window, the current step and fresh
    probes, and committed to in time, so the commitment, step and sync checks all pass. The lead
    remembers every window's content digests: each re-post is `replay`, including those whose
    original the lead saw before it was restarted (the memory is in its state file), while the honest
    miner is never flagged."""
    from templar.localnet.adversaries import Replay

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "replay": 0.0})

    async def scenario():
        v = Validator(await subnet.node("lead"))
        m0 = Miner(await subnet.node("m0"))
        cheat = Miner(await subnet.node("replay"), hooks=Replay())
        for role in (v, m0, cheat):
            await role.start()
        first = v.state.window + 1
        for round_ in range(2):
            watcher = asyncio.create_task(v.commits.run())
            for w in range(first + 3 * round_, first + 3 * round_ + 3):
                await asyncio.gather(v.run_window(w), m0.run_window(w), cheat.run_window(w))
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await v.node.aclose()
            if round_ == 0:  # the lead restarts from its state file between the two rounds
                v = Validator(await subnet.node("lead"))
                await v.start()
        for node in (m0.node, cheat.node):
            await node.aclose()
        return v, m0, cheat, first

    v, m0, cheat, first = run_virtual(scenario())
    records = list(read_records(v.node.state_dir / SCORES_FILE))
    status = {(r["hotkey"], r["window"]): r["status"] for r in records}
    # A delayed run: the miners' first window is not trained, and a restarted lead scores its first window
    # only if it holds that window's base (θ before its last step: θ_0 while no step was taken).
    skipped = untrained_windows(v.hp)
    unscored = {w for w in range(first, first + 6) if status[(m0.node.hotkey, w)] == "not-sampled"}
    assert unscored <= ({first + 3} if skipped else set()), status
    scored = [w for w in range(first + skipped, first + 6) if w not in unscored]
    assert {status[(m0.node.hotkey, w)] for w in scored} <= {"ok", "warmup"}, status
    assert {status[(cheat.node.hotkey, w)] for w in scored[:2]} <= {"ok", "warmup"}, status
    assert [status[(cheat.node.hotkey, w)] for w in scored[2:]] == ["replay"] * len(scored[2:]), status
    assert first + 4 in scored[2:]  # re-posting its upload of first + 2, which the lead saw before its restart


@pytest.mark.slow(seconds=4)
@pytest.mark.parametrize("refusal", ["refuses", "stalls"])
def test_a_top_g_miner_that_serves_its_payload_to_validators_only_costs_the_other_miners_nothing(tmp_path, refusal):
    """A peer in the top-G answers validators (whose IPs it knows: they read every commitment) and refuses
    the miners. Every node takes the step from the payloads the lead's inputs name, so a miner that cannot
    fetch one waits for the lead's aggregate. Published after the lead's evaluation (in production about
    40 s of an 84 s window, modelled here by a slower evaluation), it came too late for the miner's next
    window: 'missing' every window, about 0.002 of the weight against the others' 0.5. Under SparseLoCo
    the aggregate is the payloads themselves, so the lead publishes it once its inputs are out, before
    it evaluates anyone, and the refused miner steps and uploads in time. A bucket that stalls the miners
    instead of refusing them held each one's fetch to the apply deadline, past its next commitment: every
    honest miner 'missing' every window, the hostile one 0.99 of the weight (a review's run). A payload is
    now fetched for at most the apply span, then the step is taken from that aggregate."""
    from tests.faults import Fault, FaultPlan

    from templar.runtime.records import MINER_WINDOWS_FILE
    from templar.storage import open_bucket

    from .harness import MICRO_GAUNTLET_1K_PRESET

    # A stalled read lasts to the gather's deadline: the stall is run on production's window geometry (a
    # quarter of its seconds), where the gather ends 32 s before the next commitment; the suite's 6.6-second
    # windows leave almost none (the gather ends 1.6 s before it, and no miner could step in time).
    geometry = {} if refusal == "refuses" else PRODUCTION_QUARTER
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "victim": 0.0, "hostile": 0.0},
                           base=MICRO_GAUNTLET_1K_PRESET, **geometry)
    hostile = str(tmp_path / "buckets" / "hostile")
    refuse = FaultPlan()
    refuse.add(Fault.ERROR if refusal == "refuses" else Fault.HANG, ops={"get", "head"},
               keys=lambda key: "/gradient/" in key, message="403: not for your IP")

    def victims_buckets(locator, *args, **kwargs):
        bucket = open_bucket(locator, *args, **kwargs)
        theirs = locator.kind == "local" and str(locator.path).rstrip("/") == hostile and not kwargs.get("own")
        return refuse.wrap(bucket) if theirs else bucket

    async def scenario():
        v = Validator(await subnet.node("lead"))
        evaluate = v.evaluate

        async def production_paced(work):
            await asyncio.sleep(0.5 * v.hp.windows.window_seconds)
            await evaluate(work)

        v.evaluate = production_paced
        miners = [Miner(await subnet.node(name)) for name in ("m0", "hostile")]
        subnet.open_bucket = victims_buckets
        victim = Miner(await subnet.node("victim"))
        lead = asyncio.create_task(v.run(6))
        await asyncio.sleep(0)
        runs = [asyncio.create_task(m.run()) for m in (*miners, victim)]
        try:
            await lead
        finally:
            for role in (v, *miners, victim):
                role.node.stop.set()
            await asyncio.gather(*runs, return_exceptions=True)
            for role in (v, *miners, victim):
                await role.node.aclose()
        return {role.node.hotkey: name for name, role in (("m0", miners[0]), ("hostile", miners[1]),
                                                            ("victim", victim))}

    names = run_virtual(scenario())
    verdicts = {name: [r["status"] for r in read_records(tmp_path / "nodes" / "lead" / SCORES_FILE)
                       if r["hotkey"] == hotkey] for hotkey, name in names.items()}
    assert "missing" not in verdicts["victim"] and verdicts["victim"].count("ok") >= 4, verdicts
    uploaded = [r["uploaded"] for r in read_records(tmp_path / "nodes" / "victim" / MINER_WINDOWS_FILE)]
    assert all(uploaded[:5]), uploaded
