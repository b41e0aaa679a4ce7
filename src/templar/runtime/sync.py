"""Joining a running subnet (docs/design.md §4), shared by miners and validators.

Phases, each announced by one `[SYNC]` line:
  1. registration check (in `templar.runtime.node.start_node`)
  2. state download (`templar.runtime.restore`)
  3. catch-up: replay each window's published update, from the validator that led it
     (`templar.runtime.consensus.succession`), up to the current window, no uploads
  4. warm-up and 5. active are the roles' business.

And, for as long as a node runs, proof that it still holds the run's model (`SyncCheck`): its own
fingerprint after a window against the one the window's lead published with its progress; on a
mismatch, one `[SYNC]` line and a re-sync by itself (`resync`: a checkpoint, then replay).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from templar.chain import verify_signature
from templar.comms import (
    RecordError,
    get_aggregate,
)
from templar.comms.keys import aggregate_key, progress_key
from templar.comms.progress import Progress, decode_fingerprint, get_progress
from templar.compress.methods import rule_of
from templar.core.log import context
from templar.core.schedule import learning_rate
from templar.runtime.consensus.fingerprint import model_in_sync, off_positions
from templar.runtime.consensus.follow import FollowError, apply_inputs
from templar.runtime.consensus.outer import OuterStep, peer_weight, update_step
from templar.runtime.consensus.succession import POLL_SECONDS, Decision, decide_window
from templar.runtime.consensus.windows import apply_span
from templar.runtime.node import Lead, Node
from templar.runtime.restore import Phase, ResyncError, restore
from templar.runtime.state import NodeState
from templar.storage import StorageError
from templar.wire import (
    Gradient,
    PayloadError,
    max_aggregate_bytes,
    max_bundle_bytes,
    read_aggregate,
    read_bundle,
)

PROGRESS_READ_SECONDS = 10.0
"""The longest one read of a lead's progress record may take."""
RETRY_SECONDS = 2.0
"""Pause before catch-up retries a window whose update it could not establish."""


@dataclass(frozen=True)
class Published:
    """The lead's update of one window, as published: what to apply and the step it was applied at."""

    update: dict[str, torch.Tensor]
    global_step: int


def read_published(node: Node, data: bytes, lead_hotkey: str, window: int) -> Published:
    """The lead's published update of `window` in the run's own form (`PayloadError` if it is not):
    a signed run's bit-packed signs, a SparseLoCo run's bundle of the aggregated payloads put through
    the method's own aggregate (a pure function of them: the live step's update, bit for bit)."""
    hp, shapes = node.hp, node.shapes
    if hp.optimizer.method == "signed":
        agg = read_aggregate(data, shapes, run=node.run, verify=verify_signature, expected_hotkey=lead_hotkey,
                             expected_window=window)
        return Published(agg.signs, agg.global_step)
    bundle = read_bundle(data, shapes, hp, run=node.run, verify=verify_signature, expected_hotkey=lead_hotkey,
                         expected_window=window)
    # the bundle holds the payloads the lead's step aggregated (`aggregation_weights`' eligible ones)
    weights = [peer_weight(hp)] * len(bundle.peers)
    try:
        update = rule_of(hp.optimizer.method).aggregate(bundle.peers, weights, shapes, ceiling=bundle.clip_norm)
    except ValueError as exc:  # off the method's grid: a lead's bundle that no honest step produced
        raise PayloadError("bad_encoding", str(exc)[:120]) from exc
    return Published(update, bundle.global_step)


def published_cap(node: Node) -> int:
    """Byte cap of the lead's published update of a window in this run's form."""
    return max_aggregate_bytes(node.shapes) if node.hp.optimizer.method == "signed" \
        else max_bundle_bytes(node.shapes, node.hp)


async def _window_update(node: Node, window: int, cap: int) -> tuple[Decision, Published | None, str]:
    """One look at window `window`: its decision (`templar.runtime.consensus.succession`), and when it has an
    update the lead's published one, or what is wrong. Resolved means the update is known: the
    window has none (no candidate published in time, or its inputs name no payload), or its lead's
    signed aggregate is read. Anything else (undecided, the aggregate absent, unreadable, malformed
    or not signed by the lead) is unresolved: never an empty window."""
    decision = await decide_window(node, window)
    if not decision.settled or decision.no_step:
        return decision, None, decision.problem
    lead = decision.lead
    assert lead is not None
    name = f"uid {lead.uid}'s {aggregate_key(window)}"
    if lead.bucket is None:  # its commitment left or turned unusable since it led (`LeadHistory.rebind`)
        return decision, None, f"{name} cannot be read: uid {lead.uid} has no usable bucket committed now"
    try:
        data = await get_aggregate(lead.bucket, window, max_bytes=cap, timeout=10.0)
    except (StorageError, RecordError) as exc:
        return decision, None, f"{name} is unreadable ({str(exc)[:160]})"
    if data is None:
        return decision, None, f"{name} is not published yet"
    try:
        return decision, await asyncio.to_thread(read_published, node, data, lead.hotkey, window), ""
    except PayloadError as exc:
        return decision, None, f"{name} is malformed ({exc.reason})"


Republish = Callable[[int, OuterStep | None, list[Gradient], int], Awaitable[None]]
"""A validator's hook for a window it led whose aggregate it never published: (window, the step its
inputs made, the payloads it aggregated, global_step after it)."""


async def catch_up(node: Node, state: NodeState, until: int, *, verify: bool = True,
                   republish: Republish | None = None) -> NodeState:
    """Phase 3: apply each window's published update for windows (state.window, until], read from
    the validator that led it.

    A window counts as one without an update only when the succession's rule says so: no candidate
    published inputs in its slot, or the lead's signed inputs name no payload. An update that cannot
    be had (not published yet, a stalled bucket, a malformed or unsigned object, a lead that could
    not be told) is waited for until one window after its own; a lead that stopped between its
    inputs and its aggregate leaves the payloads its inputs name, which are fetched and stepped like
    the live step did. Failing all that, catch-up stops *before* that window, never assuming it was
    empty (that would fork this node from the run for good), names the object in its `[SYNC]` line
    and returns: the caller retries, and past `max_allowed_stale` re-syncs from a newer checkpoint.

    A validator passes `republish`: a window it led itself and left without its aggregate (it stopped
    between the two) is stepped from its inputs' payloads, as above, and handed to `republish` while
    those payloads are still in the miners' buckets. Without it, every node replaying that window
    later would need them long after the miners deleted them.

    With `verify`, the replayed model is then compared with the fingerprint published by the lead
    of the window it ends at: a fork never heals by itself (the same later updates keep two models
    apart), so one check at the end proves every replayed window. On a mismatch (our starting state
    was not the run's) it re-syncs from a checkpoint (`resync`).
    """
    if state.window >= until:
        return state
    log = context(window=until, phase=Phase.CATCHUP)
    log.info(f"[SYNC] Synchronising weights with the run's published history. No uploads in this phase. "
             f"Replaying windows {state.window + 1}..{until}")
    started, applied, first = time.perf_counter(), 0, state.window
    cap = published_cap(node)
    for window in range(state.window + 1, until + 1):
        if node.stop.is_set():
            break
        # Due by the end of the next window (or once every slot settled, if later); a node that reaches
        # it later still looks for a while (a lead whose bucket was stalled publishes what it held back
        # as soon as it can).
        span = apply_span(node.hp.windows)
        times = node.clock.times(window)
        publish_by = max(node.clock.times(window + 1).end, times.apply_deadline, node.clock.now() + span)
        tries = 0  # looks at the payloads the inputs name (at once, and once more at the end)
        while True:
            decision, agg, problem = await _window_update(node, window, cap)
            resolved = decision.settled and (decision.no_step or agg is not None)
            late = node.clock.now() > publish_by or node.stop.is_set()
            if not resolved and decision.settled and tries < 1 + late:
                tries = 2 if late else 1
                ours = republish is not None and decision.lead is not None and decision.lead.hotkey == node.hotkey
                try:  # the lead's inputs without its aggregate (not out yet, or its lead stopped before it):
                    # the payloads they name, as the live step took them
                    step, payloads = await apply_inputs(node, window, decision.inputs, state, {}, keep_signs=ours,
                                                        deadline=node.clock.now() + span)
                    resolved, agg = True, None
                    applied += 1
                    if ours:
                        assert republish is not None
                        await republish(window, step, payloads, state.global_step)
                except FollowError as exc:
                    problem = f"{problem}, and the payloads its inputs name cannot be had ({exc})"
            if resolved or late:
                break
            await asyncio.sleep(0.5)
        if agg is not None:
            step = update_step(state.global_step, published=agg.global_step)
            await asyncio.to_thread(node.compute.apply_update, agg.update, step)
            state.global_step = step + 1
            applied += 1
        if not resolved:
            if not node.stop.is_set():
                log.warning(f"[SYNC] The update of window {window} cannot be established: {problem}; not "
                            f"assuming there was none: caught up to window {state.window}, retrying")
                await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
            break
        node.leads.applied(decision)
        state.window = window
    seconds = time.perf_counter() - started
    rate = (state.window - first) / seconds if seconds > 0 else 0.0
    log.info(f"[SYNC] Caught up to window {state.window}: {applied} updates applied in {seconds:.1f}s "
             f"({rate:.1f} windows/s), global_step {state.global_step}")
    if verify and state.window > first and not node.stop.is_set():
        problem = await fingerprint_problem(node, state)
        if problem is not None:
            context(window=state.window, phase=Phase.CATCHUP).warning(
                f"[SYNC] The replayed model differs from the run's at window {state.window} ({problem}): "
                "our starting state was not the run's; re-syncing from a checkpoint")
            try:
                return await resync(node)
            except ResyncError as exc:
                context(window=state.window, phase=Phase.CATCHUP).warning(
                    f"[SYNC] Re-sync not possible now ({exc}); the next check retries")
    return state


async def fingerprint_problem(node: Node, state: NodeState) -> str | None:
    """What differs between our model (holding `state.window`) and the fingerprint published by the
    validator that led that window; None when they agree or there is nothing to compare with (who led
    it cannot be told, nobody led it, or its progress record is not there or unreadable: then a
    line names the record, and the next window's check compares again)."""
    decision = await decide_window(node, state.window)
    if not decision.settled or decision.lead is None or decision.lead.bucket is None:
        return None
    progress = await _read_progress(node, decision.lead, state.window)
    if progress is None or progress.fingerprint is None:
        return None
    own = await asyncio.to_thread(node.compute.fingerprint, state.window)
    return compare_with_lead(node, progress, state.global_step, own)


async def resync(node: Node, *, newer_than: int = -1) -> NodeState:
    """Checkpoint + replay, never from our own state: the newest intact checkpoint of a candidate
    that led its window (or θ_0 and the run's start window when none was published), then the
    published updates up to the last finished window, then the fingerprint check. Error feedback (a miner's own residual, not part
    of the run's model) is kept. `ResyncError` when the lead or its checkpoint cannot be read now,
    or when the re-synced model still differs from the lead's fingerprint (the object at fault is
    named): the node stays out of sync and retries. `newer_than`: only a checkpoint of a later window
    will do (`restore`)."""
    state, _ = await restore(node, use_local=False, newer_than=newer_than)
    state = await catch_up(node, state, node.clock.current_window() - 1, verify=False)
    problem = await fingerprint_problem(node, state)
    if problem is not None:
        raise ResyncError(f"the checkpoint replayed to window {state.window} still differs from the fingerprint of "
                          f"that window's lead ({problem})")
    return state


async def _read_progress(node: Node, lead: Lead, window: int) -> Progress | None:
    """`lead`'s progress record of `window`; None when it has none or it cannot be read (a line names
    it: nothing can be checked against it, which is no evidence either way)."""
    try:
        return await get_progress(lead.bucket, window, run=node.run, timeout=PROGRESS_READ_SECONDS)
    except (StorageError, RecordError) as exc:
        _say_unreadable(lead, window, exc)
        return None


def _say_unreadable(lead: Lead, window: int, exc: Exception) -> None:
    context(window=window, phase="sync").warning(
        f"[SYNC] uid {lead.uid}'s {progress_key(window)} is unreadable ({str(exc)[:160]}): the model cannot be "
        "checked against it; the next window's check compares again")


def compare_with_lead(node: Node, progress: Progress, global_step: int, own: torch.Tensor) -> str | None:
    """None when our model after `progress.window` (global_step and fingerprint `own`) is the
    lead's, else what differs (for the `[SYNC]` line). A progress record without a fingerprint,
    or with a malformed one, proves nothing either way: None."""
    if progress.fingerprint is None:
        return None
    try:
        published = decode_fingerprint(progress.fingerprint, own.numel())
    except RecordError as exc:
        context(window=progress.window, phase="sync").debug(f"lead's fingerprint unusable: {exc}")
        return None
    if progress.global_step != global_step:
        return f"global_step {global_step}, the lead's {progress.global_step}"
    lr = learning_rate(max(global_step - 1, 0), node.hp.optimizer)
    every = rule_of(node.hp.optimizer.method).moves_every_coordinate
    if not model_in_sync(own, published, lr, node.hp.sync, moves_every_coordinate=every):
        off = off_positions(own, published, lr, node.hp.sync, moves_every_coordinate=every)
        return f"{off}/{own.numel()} fingerprint positions off by more than {'α/2' if every else 'rounding'}"
    return None


class SyncCheck:
    """A node's own fingerprints of its last few windows, compared with the one published by the
    validator that led the window (its progress record of it). The newest window the node holds is
    compared first; its lead may not have published yet, so the one before it is the fallback."""

    KEEP = 8

    def __init__(self, node: Node) -> None:
        self.node = node
        self.own: dict[int, tuple[int, torch.Tensor]] = {}

    async def record(self, window: int, global_step: int) -> None:
        """Call after the model holds `window`'s update (live step, catch-up or re-sync). The fingerprint
        waits for the compute lock in a thread: an inner step of the next window may hold it, and the
        event loop (gathers, the commitment's deadline) must not wait behind it."""
        if window < 0:  # nothing applied yet (before the run's start window)
            return
        self.own[window] = (global_step, await asyncio.to_thread(self.node.compute.fingerprint, window))
        for old in [w for w in self.own if w <= window - self.KEEP or w > window]:
            del self.own[old]

    async def check(self, window: int, state: NodeState, *, wait_until: float | None = None) -> bool:
        """False only on evidence of a fork (logged in one `[SYNC]` line): the validator that led the
        window our model holds (`state`: then the model itself is fingerprinted now, so damage since
        that window's step shows too), or the one before, published a fingerprint of it, and ours
        differs. Who led is decided again here, a window after the live decision, so a node that took
        another slot's inputs than the run did (a write that became visible late) finds out. Nothing
        to compare (we led it, nobody did, an unreadable or late progress record) is not evidence:
        True. `window` is the one we are in (for the log).

        `wait_until` (the node's clock): how long the lead's record of the window our model holds
        is waited for before the one before it is compared instead. A node that took a step at
        the moment its lead did (an overlapped miner encoding as soon as the step lands) would
        otherwise race the lead's publication, and the window before's fingerprint was taken
        before anything that happened to the model since: the check's verdict would depend on
        which write came first."""
        node = self.node
        for held in (state.window, state.window - 1):
            if held < 0 or (held != state.window and held not in self.own):
                continue
            until = wait_until if held == state.window and wait_until is not None else node.clock.now()
            decision, progress = await self._lead_record(held, until)
            if decision is None:
                continue
            if decision.lead is not None and decision.lead.hotkey == node.hotkey and not node.shadow:
                return True  # we led it: we are the reference (a shadow's hotkey is the live validator's)
            if progress is None:
                continue
            if held == state.window:
                await self.record(state.window, state.global_step)
            global_step, own = self.own[held]
            problem = compare_with_lead(node, progress, global_step, own)
            if problem is None:
                return True
            context(window=window, phase="sync").warning(
                f"[SYNC] Our model differs from the run's after window {held} (uid {decision.lead.uid} led it; "
                f"{problem}): not uploading as active; re-syncing from a checkpoint")
            return False
        return True

    async def _lead_record(self, held: int, until: float) -> tuple[Decision | None, Progress | None]:
        """Who led `held` and that lead's progress record of it, looked for again every
        `POLL_SECONDS` until `until` while the record is not published yet (or who led cannot be
        told yet). (None, None): nobody led it or who did cannot be told; (decision, None): its lead
        has no readable record of it by then (an unreadable one is said once, not waited on)."""
        node = self.node
        while True:
            decision = await decide_window(node, held)
            lead = decision.lead if decision.settled else None
            if lead is None or lead.bucket is None:
                if decision.settled or node.clock.now() + POLL_SECONDS > until or node.stop.is_set():
                    return None, None
            elif lead.hotkey == node.hotkey and not node.shadow:
                return decision, None
            else:
                timeout = min(PROGRESS_READ_SECONDS, max(until - node.clock.now(), POLL_SECONDS))
                try:
                    progress = await get_progress(lead.bucket, held, run=node.run, timeout=timeout)
                except (StorageError, RecordError) as exc:
                    _say_unreadable(lead, held, exc)
                    return decision, None
                if progress is not None or node.clock.now() + POLL_SECONDS > until or node.stop.is_set():
                    return decision, progress
            await asyncio.sleep(POLL_SECONDS)
