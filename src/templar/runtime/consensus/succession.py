"""Who leads each window: the succession's slots (docs/design.md §5).

The lead is no single point of failure. The chain orders the validators able to lead
(`templar.chain.succession_of`: declared validators with a permit, stake and a committed bucket;
most stake first). The first
`lead_slots` of that order hold the slots of every window (`order_of`: the validator that led the
window before keeps the first slot until the next multiple of `lead_cadence`, where the chain's order
resumes). The candidate of slot k may publish the window's inputs only once every slot before its own
is confirmed absent, and its inputs count only if their **storage** timestamp lies in its slot
(`in_slot`, the landmarks of `templar.runtime.consensus.windows.WindowTimes.slot_deadline`). Every node then
applies the inputs of the lowest slot whose record exists within its slot (`decide`), so a window
has one set of applied inputs whoever published them; when no candidate published in time, the
window has no outer step, and every node agrees on that too.

A "not found" counts as absent only once the slot has settled (`WindowTimes.slot_settled`) by the
clock of the candidate's storage server, the one that stamps its objects, so a reader whose own clock
runs ahead cannot close a slot early. An error, a timeout or a malformed record is never absent: the
reader cannot decide, does not skip the candidate, and stops before the window at its apply deadline
like any follower that cannot have the inputs (then catches up). Late or early records are absent for
everyone, so a partitioned old lead that keeps publishing into its own bucket forks no one.

What remains (docs/design.md §5): a write stored within its slot but visible only after some reader
took the slot as settled (a PUT that straddles `slot_settled`). A reader that takes a higher slot
looks at the lower ones once more first; a decision other than the first slot's is taken again when
asked a window later (the sync check), compared with the fingerprint of the validator that led the
window then, and a node on the losing side re-syncs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from templar.chain import Neuron, verify_signature
from templar.comms.keys import inputs_key
from templar.core.log import context, short
from templar.runtime.consensus.windows import WindowTimes, retained_windows
from templar.storage import Bucket, ObjectNotFound, StorageError
from templar.wire import PayloadError, StepInputs, max_inputs_bytes, read_inputs

if TYPE_CHECKING:
    from templar.core.config import HParams
    from templar.runtime.node import Node  # (it imports `Lead` from here)

POLL_SECONDS = 0.5
"""Pause between two looks at a candidate's inputs while they may still appear."""
READ_SECONDS = 10.0
"""Cap on one read of a candidate's inputs record (a few hundred bytes)."""


def in_slot(stamp: float, times: WindowTimes, slot: int) -> bool:
    """THE timestamp rule of the slots: whether inputs stored at `stamp` (the storage server's
    clock, as the gather judges uploads, never the writer's) count in candidate `slot`'s slot of the
    window of `times`. Both ends are widened by the clock-skew allowance. Stored too early (before
    the window's gather could start, or while a lower slot was still open) or too late, they count
    for nothing: a lower candidate cannot pre-empt a live lead, and late inputs fork no one."""
    return times.slot_opens(slot) - times.skew < stamp <= times.slot_deadline(slot) + times.skew


@dataclass(frozen=True)
class Lead:
    """A validator of the succession order (`templar.chain.succession_of`) as this node reaches it:
    who it is on chain and the bucket it publishes the run's records in when it leads a window
    (inputs, aggregates, progress with the model's fingerprint, peer lists, checkpoints, the start
    window). `bucket` is None when its committed locator cannot be used: every node judges a locator
    alike, so such a candidate publishes nothing anyone reads."""

    validator: Neuron
    bucket: Bucket | None

    @property
    def hotkey(self) -> str:
        """The hotkey that signs every record the lead publishes."""
        return self.validator.hotkey

    @property
    def uid(self) -> int:
        return self.validator.uid


class Seen(Enum):
    PRESENT = "present"  # a valid record of the candidate, stored within its slot
    ABSENT = "absent"    # definitely none within the slot (not found once settled, or stored outside it)
    PENDING = "pending"  # not found, but the slot has not settled: it may still appear
    UNKNOWN = "unknown"  # cannot be told (unreadable, timed out, malformed): never taken for absent


@dataclass(frozen=True)
class Observation:
    """One look at one candidate's inputs of one window."""

    seen: Seen
    inputs: StepInputs | None = None
    why: str = ""


@dataclass(frozen=True)
class Decision:
    """The window's applied inputs as far as this node can tell. `settled`: the rule gave an answer;
    then `slot` is the slot whose inputs apply (None: no candidate published in time, so the window
    has no outer step). Not settled: `problem` names what could not be read."""

    window: int
    settled: bool
    slot: int | None = None
    lead: Lead | None = None
    inputs: StepInputs | None = None
    problem: str = ""
    absent: tuple[str, ...] = ()
    """Why each slot before `slot` was absent (for the lead-change line)."""
    boundary: bool = False
    """The window is a multiple of `lead_cadence`: its slots are the succession's own order."""

    @property
    def no_step(self) -> bool:
        """Settled without an update: no candidate published, or the inputs name no payload."""
        return self.settled and (self.inputs is None or not self.inputs.peers)


def decide(window: int, order: Sequence[Lead], observations: Sequence[Observation]) -> Decision:
    """THE rule of which inputs a window applies: those of the lowest slot whose record is present;
    a slot before it that is not definitely absent leaves the window undecided (never skipped);
    every slot absent means no candidate published, and the window has no outer step."""
    absent: list[str] = []
    for slot, (candidate, seen) in enumerate(zip(order, observations, strict=False)):
        if seen.seen is Seen.PRESENT:
            return Decision(window, True, slot, candidate, seen.inputs, absent=tuple(absent))
        if seen.seen is not Seen.ABSENT:
            name = f"uid {candidate.uid}'s {inputs_key(window)}"
            return Decision(window, False, problem=f"{name} is {seen.why or seen.seen.value}")
        absent.append(f"uid {candidate.uid} (slot {slot}): {seen.why}")
    if len(observations) < len(order):
        return Decision(window, False, problem="not every slot was looked at")
    return Decision(window, True, absent=tuple(absent))


async def observe(node: Node, candidate: Lead, window: int, slot: int, times: WindowTimes) -> Observation:
    """One look at `candidate`'s inputs of `window` in `slot` (at most one GET)."""
    if candidate.bucket is None:
        return Observation(Seen.ABSENT, why="no usable bucket committed")
    try:
        blob = await candidate.bucket.fetch(inputs_key(window), max_bytes=max_inputs_bytes(), timeout=READ_SECONDS)
    except ObjectNotFound as exc:
        if window < node.clock.current_window() - retained_windows(node.hp):
            return Observation(Seen.UNKNOWN, why="not found, older than the history candidates keep")
        # settled by the clock that stamps the candidate's objects (its server's, on the answer), so a
        # reader whose own clock runs ahead never takes a slot for closed early; ours when unknown
        told = exc.server_time if exc.server_time is not None else node.clock.now()
        if told < times.slot_settled(slot):
            return Observation(Seen.PENDING, why="not published yet")
        return Observation(Seen.ABSENT, why="not published by its deadline")
    except StorageError as exc:
        return Observation(Seen.UNKNOWN, why=f"unreadable ({str(exc)[:160]})")
    stamp = blob.info.timestamp
    if not in_slot(stamp, times, slot):
        late = stamp - (times.slot_deadline(slot) + times.skew)
        return Observation(Seen.ABSENT, why=f"stored {late:.1f}s after its slot closed" if late > 0
                           else "stored before its slot opened")
    try:
        inputs = read_inputs(blob.data, run=node.run, verify=verify_signature, expected_hotkey=candidate.hotkey,
                             expected_window=window, max_peers=node.hp.gauntlet.top_g)
    except PayloadError as exc:
        return Observation(Seen.UNKNOWN, why=f"malformed ({exc.reason}: {str(exc.detail)[:120]})")
    return Observation(Seen.PRESENT, inputs)


def order_of(window: int, succession: Sequence[Lead], before: Decision | None, hp: HParams) -> list[Lead]:
    """THE rule of a window's slots: the first `lead_slots` of the succession, except that the validator
    that led the window before keeps the first slot (so a successor, once it led, publishes as early as
    a lead does, and a dead lead costs its delay once, not every window), until a window that is a
    multiple of `lead_cadence`: there the succession's own order resumes, and a lead that came back
    takes its slot again. `before`: the settled decision of the window before (None at a boundary)."""
    slots, cadence = hp.windows.lead_slots, hp.windows.lead_cadence
    if window % cadence == 0 or before is None or before.lead is None:
        return list(succession[:slots])
    keeper = [c for c in succession if c.hotkey == before.lead.hotkey]
    return (keeper + [c for c in succession if c.hotkey != before.lead.hotkey])[:slots]


async def window_order(node: Node, window: int, history: LeadHistory | None = None) -> list[Lead] | str:
    """The slots of `window` (`order_of`), from the chain's succession and the decision of the window
    before; why they cannot be told (a string) when that decision cannot. `history`: as in `decide_window`."""
    succession = await node.candidates()
    if window % node.hp.windows.lead_cadence == 0 or window == 0:
        return order_of(window, succession, None, node.hp)
    before = await decide_window(node, window - 1, history=history)
    if not before.settled:
        return f"who led window {window - 1} (it keeps the first slot of {window}) cannot be told: {before.problem}"
    return order_of(window, succession, before, node.hp)


async def decide_window(node: Node, window: int, *, deadline: float | None = None, slots: int | None = None,
                        history: LeadHistory | None = None) -> Decision:
    """The window's applied inputs (`decide`) from the candidates' buckets. Waits while a slot may
    still fill or a candidate cannot be read, until `deadline` (the node's clock; None: one look at
    each, for a window long settled). `slots`: look only at the first `slots` (a candidate checking
    those before its own; "no candidate" then means all of them are absent). `history`: the decisions
    to read and keep (default the node's own, taken by the order of their time; an empty one decides
    afresh by today's order, as a node that joins now does).

    Having found inputs in a slot after 0, it looks at the slots before once more: a write stored in
    time but visible late (the straddling PUT) is taken if it has appeared meanwhile."""
    history = node.leads if history is None else history
    cached = history.decisions.get(window)
    if cached is not None and slots is None:
        return cached
    times = node.clock.times(window)
    order = await window_order(node, window, history)
    if isinstance(order, str):
        return Decision(window, False, problem=order)
    order = order if slots is None else order[:slots]
    seen: list[Observation] = []
    while len(seen) < len(order):
        slot = len(seen)
        look = await observe(node, order[slot], window, slot, times)
        if look.seen is Seen.PRESENT and slot > 0:
            for lower in range(slot):
                again = await observe(node, order[lower], window, lower, times)
                if again.seen is Seen.PRESENT:
                    seen, look = seen[:lower], again
                    context(window=window, phase="lead").warning(
                        f"uid {order[lower].uid}'s inputs of window {window} appeared after their slot settled "
                        f"(stored in time): taking them, not slot {slot}'s")
                    break
        if look.seen in (Seen.PRESENT, Seen.ABSENT):
            seen.append(look)
            if look.seen is Seen.PRESENT:
                break
            continue
        if deadline is None or node.clock.now() >= deadline:  # (a stop request finishes the window)
            seen.append(look)
            break
        await asyncio.sleep(POLL_SECONDS)
    decision = decide(window, order, seen)
    if window % node.hp.windows.lead_cadence == 0:
        decision = dataclasses.replace(decision, boundary=True)
    # What every reader sees for good: the first slot's inputs (no lower slot can appear), or anything
    # decided long after the window's slots settled. Another decision is taken again when asked later,
    # so a reader that took a higher slot than the run did (the straddling write) finds out.
    if decision.settled and slots is None and (decision.slot == 0 or
                                               node.clock.now() >= node.clock.times(window + 1).end):
        history.remember(decision)
    return decision


@dataclass
class LeadHistory:
    """What a node knows of who led which window: decisions long settled (so one window is never
    read twice), and the lead of the last window it applied, to say when that changes."""

    KEEP = 64

    decisions: dict[int, Decision] = field(default_factory=dict)
    last: tuple[int, str] | None = None
    """(window, hotkey of its lead or "" for none) of the newest window applied."""

    def remember(self, decision: Decision) -> None:
        self.decisions[decision.window] = decision
        for old in sorted(self.decisions)[: max(0, len(self.decisions) - self.KEEP)]:
            del self.decisions[old]

    def rebind(self, hotkey: str, bucket: Bucket | None) -> None:
        """`hotkey` committed another bucket (a rotated read key, a move): the decisions it led read its new
        one (None: its commitment left or turned unusable, and what it led is read nowhere, as a lead whose
        locator cannot be used). They kept the old, which the node closes as it opens the new, and every read through them (a
        catch-up's aggregates, the sync check's progress, the peer list before) failed with "bucket is
        closed" until the decision left the history, about 90 minutes of production's windows; a re-sync
        replayed into the same failure."""
        for window, decision in self.decisions.items():
            if decision.lead is not None and decision.lead.hotkey == hotkey:
                self.decisions[window] = dataclasses.replace(decision, lead=dataclasses.replace(decision.lead,
                                                                                               bucket=bucket))

    def applied(self, decision: Decision) -> None:
        """Note the lead of a window this node applied; one line whenever it differs from the lead of
        the window applied before (every node says it, with the reason)."""
        if not decision.settled:
            return
        hotkey = decision.lead.hotkey if decision.lead is not None else ""
        if self.last is not None and decision.window <= self.last[0]:
            return
        before = self.last[1] if self.last is not None else None
        self.last = (decision.window, hotkey)
        if before is None or before == hotkey:
            return
        log = context(window=decision.window, phase="lead")
        why = "; ".join(decision.absent) or "no validator can lead"
        if decision.lead is None:
            log.warning(f"[LEAD] no validator led window {decision.window}: no candidate published inputs in its "
                        f"slot ({why}); the window has no outer step")
        elif decision.slot == 0:
            why = ("the succession's own order resumes in this window (every lead_cadence windows)"
                   if decision.boundary else "it keeps the first slot, and its inputs were on time")
            log.info(f"[LEAD] window {decision.window} is led by uid {decision.lead.uid} "
                     f"({short(decision.lead.hotkey)}, slot 0): {why}")
        else:
            log.warning(f"[LEAD] window {decision.window} is led by uid {decision.lead.uid} "
                        f"({short(decision.lead.hotkey)}, slot {decision.slot}): {why}")
