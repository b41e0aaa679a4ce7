"""The run's start and what a node restores from, against what can go wrong around them: the first lead
started early in a window (before the window before's slots settled), what a validator below the lead
slots plants in its bucket (a start window naming an old window, a garbage one, a checkpoint pointer
naming a window whose lead cannot be told), and a running validator stuck behind a window whose update
can no longer be had. On virtual time, with the real validator and miner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from templar.comms.checkpoint import Latest
from templar.comms.exchange import StartWindow, dump_record
from templar.comms.keys import (
    aggregate_key,
    checkpoint_prefix,
    gradient_key,
    inputs_key,
    latest_checkpoint_key,
    start_window_key,
)
from templar.core.clock import run_virtual
from templar.core.config import PROTOCOL_VERSION
from templar.miner.loop import Miner
from templar.runtime.consensus.windows import retained_windows
from templar.runtime.state import STATE_FILE
from templar.validator.loop import Validator

from .harness import Subnet, parameters, same_parameters

pytestmark = [pytest.mark.slow(seconds=2), pytest.mark.timeout(240)]


async def _windows(roles: list, n: int) -> None:
    for _ in range(n):
        window = roles[0].state.window + 1
        await asyncio.gather(*(role.run_window(window) for role in roles))


def test_the_first_lead_started_early_in_a_window_starts_the_run_and_a_joiner_holds_its_model(tmp_path):
    """0.2 s into a window, who led the window before (and so who holds this one's first slot) cannot
    be told yet. The first validator waits for it instead of taking itself for no slot holder: before,
    it never published the run's start window, and a miner joining before the first checkpoint started
    from θ_0 at its own window, forked, and could not re-sync until a checkpoint appeared."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0}, checkpoint_frequency=100)

    async def scenario():
        m0 = Miner(await subnet.node("m0"))
        clock = m0.node.clock
        await clock.sleep_until(clock.times(clock.current_window() + 3).start + 0.2)
        v = Validator(await subnet.node("lead"))
        assert await v.check_slot(clock.current_window()) is None  # cannot be told yet
        await v.start()
        await m0.start()
        await _windows([v, m0], 3)
        assert v.state.global_step > 0
        m1 = Miner(await subnet.node("m1"))  # joins before any checkpoint: θ_0 and the run's start window
        await m1.start()
        joined = same_parameters(parameters(m1.node), parameters(v.node))
        await _windows([v, m0, m1], 2)
        after = same_parameters(parameters(m1.node), parameters(v.node)), m1.state.global_step, v.state.global_step
        for role in (v, m0, m1):
            await role.node.aclose()
        return joined, after

    joined, (same, joiner_step, lead_step) = run_virtual(scenario())
    assert (tmp_path / "buckets" / "lead" / start_window_key()).exists()
    assert joined and same and joiner_step == lead_step


def test_a_lead_restarted_early_in_a_window_still_leads_the_window_before(tmp_path):
    """Restarted on its own state 0.2 s into window W, before W−1's gather: the lead runs and leads W−1
    itself, as before. Waiting to know its slot (what a validator that may start a new run does) would have
    given W−1 away: to a stand-in, who keeps the first slot until the next boundary, or to nobody."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0})

    async def scenario():
        lead = Validator(await subnet.node("lead"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        first = asyncio.create_task(lead.run(3))
        await asyncio.sleep(0)
        running = [asyncio.create_task(m.run()) for m in miners]
        await first
        await lead.node.aclose()
        clock = miners[0].node.clock
        window = clock.current_window() + 1
        window += window % lead.hp.windows.lead_cadence == 0  # at a boundary the slots need no window before
        await clock.sleep_until(clock.times(window).start + 0.2)
        await Validator(await subnet.node("lead")).run(2)
        for m in miners:
            m.node.stop.set()
        await asyncio.gather(*running, return_exceptions=True)
        for m in miners:
            await m.node.aclose()
        return window

    window = run_virtual(scenario())
    assert (tmp_path / "buckets" / "lead" / inputs_key(window - 1)).exists()


def _plant_old_start(node, bucket: Path) -> None:
    bucket.joinpath(start_window_key()).parent.mkdir(parents=True, exist_ok=True)
    bucket.joinpath(start_window_key()).write_bytes(dump_record(StartWindow(
        protocol=PROTOCOL_VERSION, netuid=node.run.netuid, run=node.run.digest, start_window=5)))


def _plant_garbage_start(node, bucket: Path) -> None:
    bucket.joinpath(start_window_key()).parent.mkdir(parents=True, exist_ok=True)
    bucket.joinpath(start_window_key()).write_bytes(b"{not json")


def _plant_old_checkpoint_pointer(node, bucket: Path) -> None:
    bucket.joinpath(latest_checkpoint_key()).parent.mkdir(parents=True, exist_ok=True)
    bucket.joinpath(latest_checkpoint_key()).write_bytes(dump_record(Latest(protocol=PROTOCOL_VERSION, window=3)))


@pytest.mark.parametrize("plant", [_plant_old_start, _plant_garbage_start, _plant_old_checkpoint_pointer],
                         ids=["start-window-of-an-old-window", "garbage-start-window", "checkpoint-of-an-old-window"])
def test_what_a_validator_below_the_slots_plants_stops_no_run_from_starting(tmp_path, plant):
    """A validator with a permit and a little stake, fourth of the succession (no slot), plants objects
    of this run in its bucket before the run starts. Before: a start window naming an old window kept the
    first lead replaying windows whose history was gone, forever; a garbage one, or a checkpoint pointer
    naming a window whose lead cannot be told, stopped it (exit 8) and held every other node back."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "v2": 50.0, "v3": 40.0, "evil": 1.0, "m0": 0.0},
                           blocks_per_window=20)

    async def scenario():
        for name in ("v2", "v3"):
            await (await subnet.node(name)).aclose()  # registered, bucket committed: slot holders
        evil = await subnet.node("evil")
        await evil.clock.sleep_until(evil.clock.times(retained_windows(evil.hp) + 20).start + 9.0)
        plant(evil, tmp_path / "buckets" / "evil")
        lead = Validator(await subnet.node("lead"))
        miner = Miner(await subnet.node("m0"))
        await lead.start()
        await miner.start()
        await _windows([lead, miner], 3)
        ran = lead.state.window, lead.node.clock.current_window(), lead.state.global_step
        same = same_parameters(parameters(miner.node), parameters(lead.node))
        for node in (lead.node, miner.node, evil):
            await node.aclose()
        return ran, same

    (window, current, steps), same = run_virtual(scenario())
    assert window == current - 1 and steps > 0 and same
    assert (tmp_path / "buckets" / "lead" / start_window_key()).exists()


def test_a_validator_behind_a_window_that_cannot_be_had_re_syncs_past_it(tmp_path):
    """A running validator more than `max_allowed_stale` windows behind, whose next window's update can
    no longer be had (its lead's aggregate never went out and the payloads its inputs name are gone):
    before, it replayed that window forever; now a later checkpoint takes it past, as a miner would."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "v2": 50.0, "m0": 0.0, "m1": 0.0}, checkpoint_frequency=2)

    async def scenario():
        lead, v2 = Validator(await subnet.node("lead")), Validator(await subnet.node("v2"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        for role in (lead, v2, *miners):
            await role.start()
        await _windows([lead, v2, *miners], 2)
        stuck = v2.state.window + 1
        await _windows([lead, *miners], lead.hp.windows.max_allowed_stale + 4)  # v2 paused
        (tmp_path / "buckets" / "lead" / aggregate_key(stuck)).unlink()
        for name in ("m0", "m1"):
            (tmp_path / "buckets" / name / gradient_key(stuck)).unlink(missing_ok=True)
        checkpoints = [int(p.parent.name) for p in (tmp_path / "buckets" / "lead" / checkpoint_prefix()).glob(
            "*/manifest.json")]
        assert max(checkpoints) > stuck
        with pytest.raises(TimeoutError):  # it runs its windows until the deadline below
            await asyncio.wait_for(v2._validate(0), timeout=6 * lead.hp.windows.window_seconds)
        reached = v2.state.window, v2.node.clock.current_window()
        for role in (lead, v2, *miners):
            await role.node.aclose()
        return stuck, reached

    stuck, (window, current) = run_virtual(scenario())
    assert window > stuck and window >= current - 2, (stuck, window, current)
    kept = [p.name for p in (tmp_path / "nodes" / "v2" / "download").iterdir()]
    assert len(kept) == 1, kept  # the checkpoint it loaded, and no other copy of the model
    assert (tmp_path / "nodes" / "v2" / STATE_FILE).exists()
