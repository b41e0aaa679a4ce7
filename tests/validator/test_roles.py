"""The lead's and a follower's outer step (`templar.validator.roles`) as `Validator.step` takes them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from templar.core.clock import loop_time, run_virtual
from templar.core.config import load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.runtime.compute import LocalCompute
from templar.runtime.consensus.succession import Decision
from templar.runtime.consensus.windows import Clock
from templar.runtime.state import NodeState
from templar.storage import LocalBucket
from templar.validator import loop as validator_loop
from templar.validator.roles import FollowerRole, LeadRole
from templar.wire import Run, StepInputs

GENESIS = 1_700_000_000.0
RUN = Run(netuid=7, digest="ab" * 32)
WINDOW = 14
MINER = "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty"


def test_our_own_inputs_that_cannot_be_applied_now_are_caught_up_on_not_a_crash(tmp_path: Path, monkeypatch):
    """A lead killed after publishing its inputs of a window and before its aggregate, restarted: the window is
    ours, but a payload its inputs name is gone from its owner's bucket (withheld, deleted). `apply_inputs`
    raised `FollowError` out of `LeadRole.step`, which nothing caught, and the process exited 1, again after
    every restart (a review). Now the validator takes the follower's way: it catches up on the window (here it
    is stopped while waiting) and publishes nothing of it."""
    hp = load_hparams("tiny-signed")
    lead = SimpleNamespace(hotkey="lead")  # this validator: the window is ours

    async def scenario() -> tuple[bool, object]:
        time = loop_time()
        windows = hp.windows.model_copy(update={"blocks_per_window": 10, "block_time": 1.0, "gather_seconds": 4.0,
                                                "lead_slots": 1})
        clock = Clock(windows, lambda: int(time.now() - GENESIS), lambda block: GENESIS + block, time)
        model = build_model(hp)
        withheld = LocalBucket(tmp_path / "miner", now=time.now)  # no payload for the window any more

        async def peer_buckets(hotkeys):
            return {hk: withheld for hk in hotkeys if hk == MINER}

        node = SimpleNamespace(hp=hp, clock=clock, run=RUN, shapes=parameter_shapes(model),
                               compute=LocalCompute(model, hp), peer_buckets=peer_buckets, stop=asyncio.Event(),
                               hotkey="lead", shadow=False)
        inputs = StepInputs(window=WINDOW, global_step=3, peers=((MINER, b"\x11" * 32),))

        async def ours(node_, window, *, deadline):
            return Decision(window, True, slot=0, lead=lead, inputs=inputs)

        async def caught_up(node_, state, window, **kwargs):  # the update is not published: wait, then stop
            node.stop.set()
            return state

        monkeypatch.setattr(validator_loop, "window_inputs", ours)
        monkeypatch.setattr("templar.validator.roles.catch_up", caught_up)
        v = SimpleNamespace(node=node, hp=hp, state=NodeState(window=WINDOW - 1, global_step=3),
                            bases=SimpleNamespace(before_step=lambda *a: None, after_step=lambda *a: None),
                            republish=None)
        v.leading, v.following = LeadRole(v), FollowerRole(v)
        v.role = v.following
        work = SimpleNamespace(window=WINDOW, decision=None, results={}, times=clock.times(WINDOW))
        held = await validator_loop.Validator.step(v, work)
        return held, v.role

    held, role = run_virtual(scenario(), start=GENESIS + 158)
    assert held is False  # stopped while catching up: the window is not held, and nothing was raised
    assert isinstance(role, FollowerRole)  # no lead publications for a window whose step it did not take


