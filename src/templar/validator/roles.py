"""What differs between the validator that led a window and one that followed it
(`templar.runtime.consensus.succession` decides which): how it takes the window's step and what it
publishes. `Validator.step` picks the role once the window's decision is known."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from templar.core.log import context
from templar.runtime.consensus.follow import FollowError, apply_inputs
from templar.runtime.consensus.outer import OuterStep
from templar.runtime.restore import ResyncError, a_joiner_can_start
from templar.runtime.sync import RETRY_SECONDS, catch_up, resync
from templar.validator.window import ValidatorWindow
from templar.wire import Gradient

if TYPE_CHECKING:
    from templar.validator.loop import Validator

PUBLISH_MIN_SECONDS = 5.0
"""A lead already behind still gets this long to publish a window before it moves on."""


class Role:
    """What differs between the validator that led a window and one that followed it: how it takes
    the window's step and what it publishes. The window's phases (`Validator.run_window`) call the
    role in force, chosen once the window's decision is known (`Validator.step`)."""

    is_lead = False

    def __init__(self, validator: Validator) -> None:
        self.v = validator

    async def step(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]] | None:
        """The window's outer step (None when it had none) and the payloads it aggregated; None when
        the node was stopped before its model held the window (nothing of the window may be kept)."""
        raise NotImplementedError

    async def publish(self, work: ValidatorWindow) -> None:
        """Publications right after the step."""

    async def checkpoint(self, work: ValidatorWindow) -> None:
        """Publications once the window's weights are set."""


class LeadRole(Role):
    """The validator whose inputs a window applies: it steps with them (keeping the signs it
    publishes) and publishes the window's records (aggregate, progress, the next peer list,
    checkpoints), each create-only in its own bucket."""

    is_lead = True

    async def step(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]] | None:
        """Our inputs, applied. Published before a restart, they can name a payload no longer to be had
        (its miner withheld or deleted it since): then the window is caught up on as a follower does, and
        the follower's role publishes nothing of it. The FollowError ended the process (exit 1), again
        after every restart (a review)."""
        v, clock = self.v, self.v.node.clock
        assert work.decision is not None and work.decision.inputs is not None
        try:
            return await apply_inputs(v.node, work.window, work.decision.inputs, v.state, work.results,
                                      keep_signs=True,
                                      deadline=max(work.times.apply_deadline, clock.now() + PUBLISH_MIN_SECONDS))
        except FollowError as exc:
            context(window=work.window, phase="sync").warning(
                f"[SYNC] {exc}: our inputs of window {work.window} cannot be applied now; catching up on its "
                "published update instead, and publishing nothing of the window")
            v.role = v.following
            return await v.following.catch_up(work)

    async def publish(self, work: ValidatorWindow) -> None:
        """The window's aggregate, progress and the peer list in effect from the next window: the
        top-G when a replacement is due (or none is in effect), else the list in effect named again,
        so every reader finds its window's list with one GET, never a LIST. Reaching the window late,
        the lead never names peers for a window whose gather has begun: the miners gathered it with
        the list in effect then."""
        v, window, peer_list = self.v, work.window, work.peer_list
        clock, hp = v.node.clock, v.hp
        assert work.scores is not None
        in_time = clock.now() < clock.times(window + 1).gather_start
        due = in_time and (window % hp.windows.peer_replacement_frequency == 0 or not peer_list)
        again = peer_list if in_time and peer_list else None
        early = work.early_aggregate is not None and await work.early_aggregate  # out already: not sent twice
        await v.publisher.publish(window, None if early else work.step, work.scores.top_g if due else again,
                                  v.state.global_step,
                                  applied=work.applied,
                                  deadline=max(clock.times(window + 1).gather_start, clock.now() + PUBLISH_MIN_SECONDS))
        await v.ensure_start_window(window)  # after: its reads of the other candidates never delay the window's records

    async def checkpoint(self, work: ValidatorWindow) -> None:
        """Every `checkpoint_frequency` windows, and at a boundary of the cadence where a node that joined
        now would find none to start from (`joiners_lack_a_checkpoint`)."""
        v = self.v
        if work.window % v.hp.windows.checkpoint_frequency == 0 or await joiners_lack_a_checkpoint(v, work):
            await v.checkpoints.publish(work.window, v.state.global_step)


async def joiners_lack_a_checkpoint(v: Validator, work: ValidatorWindow) -> bool:
    """At a boundary of the succession's cadence (where the chain's order resumes) that we lead: whether a
    node that joined now would find no checkpoint to start from (`templar.runtime.restore.a_joiner_can_start`).

    A joiner replays by the succession as the chain orders it now, and takes a checkpoint only from the
    validator that order says led its window. Once another validator heads that order (stake moved, the
    lead deregistered or moved its bucket, a validator that led from a lower slot while the first was dead
    comes to head it), the checkpoints of windows led under the old order read as led by nobody: a joiner
    found none it could use and waited for the new lead's first regular one, up to `checkpoint_frequency`
    windows (about 2.3 h in production). Ours at this boundary is one the order of now accepts (no keeper
    rule reaches back past a boundary), and the windows after it are ours. Where a checkpoint still passes,
    none is published (a lead that missed one boundary slot costs no checkpoint); where the check cannot
    finish by the next window's gather, one is (uploads run in the background, one at a time)."""
    window, clock = work.window, v.node.clock
    if window % v.hp.windows.lead_cadence:
        return False
    budget = max(clock.times(window + 1).gather_start, clock.now() + PUBLISH_MIN_SECONDS) - clock.now()
    try:
        async with asyncio.timeout(budget):
            return not await a_joiner_can_start(v.node)
    except TimeoutError:
        return True


class FollowerRole(Role):
    """A window another validator led (or nobody did): take its step, publish nothing (only its
    weights, like every validator), and at a checkpoint's window clear what our own bucket may still
    hold of windows we led before (`CheckpointPublisher.clean_history`)."""

    async def checkpoint(self, work: ValidatorWindow) -> None:
        v = self.v
        if work.window % v.hp.windows.checkpoint_frequency == 0:
            v.checkpoints.clean_history(work.window)

    async def step(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]] | None:
        """The window's inputs, applied. When they cannot be had in time the validator does not
        guess: it waits for the window's published update (catch-up), re-syncing from a checkpoint
        once it is `max_allowed_stale` windows behind, so the model it saves always holds this
        window's update. Stopped while waiting, it returns None: the window is not held."""
        v, node, window = self.v, self.v.node, work.window
        decision = work.decision
        if decision is not None:
            if decision.inputs is None:
                return None, []
            try:
                step, _ = await apply_inputs(node, window, decision.inputs, v.state, work.results,
                                             deadline=max(work.times.apply_deadline, node.clock.now() + PUBLISH_MIN_SECONDS))
                return step, []
            except FollowError as exc:
                context(window=window, phase="sync").warning(
                    f"[SYNC] {exc}: not guessing the window's step; catching up on its published update")
        return await self.catch_up(work)

    async def catch_up(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]] | None:
        """The window's published update, or a re-sync once the window is `max_allowed_stale` behind; None
        when stopped first."""
        v, node, window = self.v, self.v.node, work.window
        while v.state.window < window and not node.stop.is_set():
            if node.clock.current_window() - window > v.hp.windows.max_allowed_stale:
                try:
                    v.state = await resync(node)
                except ResyncError as exc:
                    context(window=window, phase="sync").warning(f"[SYNC] Re-sync not possible now ({exc}); retrying")
                    await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
                continue
            v.state = await catch_up(node, v.state, window, republish=v.republish)
        return (None, []) if v.state.window >= window else None
