"""Every node takes the outer step of the window's lead: exactly the payloads it aggregated.

The consensus rule (docs/design.md §3, §5): the validator that leads a window decides its aggregate
from its own gather and publishes its inputs (`templar.wire.inputs`: each payload's hotkey and
digest, and the global_step) the moment that gather ends. Who leads is the lowest slot of the
succession whose inputs are present in time (`templar.runtime.consensus.succession`). Every node, the lead
included, applies exactly those inputs (`apply_inputs`): the payloads its own gather returned when
their digests match, the others fetched from their owners' buckets (signed, and checked against the
lead's digest). A node's own gather decides only what it scores. So a node whose clock lags, whose
gather saw another set, or that reads the peer list late, still takes the run's step.

A follower that cannot establish the inputs by the window's `apply_deadline`, or cannot fetch a
payload they name, does not guess (`FollowError`): it stops before that window and catches up on
the published update (`templar.runtime.sync.catch_up`), which names what it waited for.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

from templar.comms import GatherResult
from templar.comms.keys import gradient_key
from templar.core.log import short
from templar.runtime.consensus.outer import OuterStep, payload_reader, update_step
from templar.runtime.consensus.succession import Decision, decide_window
from templar.runtime.consensus.windows import apply_span
from templar.runtime.node import Node
from templar.runtime.state import NodeState
from templar.storage import StorageError
from templar.wire import Gradient, PayloadError, StepInputs, max_gradient_bytes

APPLY_FETCH_SECONDS = 5.0
"""Inputs established in the last instant still leave this long to fetch the payloads they name."""


class FollowError(Exception):
    """The lead's step of a window could not be established in time: the message names the object
    at fault. The node stops before that window and catches up; it never assumes an empty step."""


def inputs_of(window: int, global_step: int, payloads: list[Gradient], clip_norm: float | None = None) -> StepInputs:
    """The inputs record of a step over `payloads` (a candidate's own, before it publishes them), with
    its ceiling on the clip level (`templar.validator.fast_eval.step_ceiling`)."""
    return StepInputs(window=window, global_step=global_step, peers=tuple((g.hotkey, g.digest) for g in payloads),
                      clip_norm=clip_norm)


async def window_inputs(node: Node, window: int, *, deadline: float) -> Decision:
    """The window's applied inputs (`templar.runtime.consensus.succession.decide_window`), waited for until
    `deadline` (the node's clock): a record that is absent before its slot settled, unreadable or
    malformed is retried until then, never taken for an empty step; `FollowError` names what could
    not be had at the deadline. The lead of the window is noted (one line when it changes)."""
    decision = await decide_window(node, window, deadline=deadline)
    if not decision.settled:
        raise FollowError(decision.problem)
    node.leads.applied(decision)
    return decision


async def collect_payloads(node: Node, window: int, inputs: StepInputs,
                           gathered: Mapping[str, GatherResult[Gradient]], *, deadline: float) -> list[Gradient]:
    """The payloads `inputs` name, in their order: from `gathered` when the digest matches, else
    fetched from the owner's bucket (strict reader, signature, the lead's digest). No put-window
    check here: the lead already judged the timing; the digest makes the bytes the same.
    `FollowError` when one cannot be had by `deadline`, or within the apply span (`apply_span`: 5 s in
    production). An owner's bucket may serve validators and stall everyone else: waited on to the apply
    deadline, it held every miner's step past its next commitment, window after window, while the lead's
    published aggregate, which holds that payload, was out within seconds. Past the span the step fails
    and the node takes it from that aggregate (`templar.runtime.sync.catch_up`)."""
    have = {hk: r.value for hk, r in gathered.items() if r.ok and r.value is not None}
    missing = [(hk, digest) for hk, digest in inputs.peers if not (hk in have and have[hk].digest == digest)]
    if missing:
        buckets = await node.peer_buckets([hk for hk, _ in missing])
        read = payload_reader(node.shapes, node.hp, window, node.run)
        cap = max_gradient_bytes(node.shapes, node.hp)
        fetch_budget = apply_span(node.hp.windows)

        async def fetch(hotkey: str, digest: bytes) -> Gradient:
            bucket = buckets.get(hotkey)
            if bucket is None:
                raise FollowError(f"{short(hotkey)}'s {gradient_key(window)}, aggregated by the lead, is unreachable "
                                  "(no usable bucket committed)")
            try:
                left = min(deadline - node.clock.now(), fetch_budget)
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    data = await bucket.get(gradient_key(window), max_bytes=cap, timeout=left)
                    g = await asyncio.to_thread(read, hotkey, data)
            except (StorageError, PayloadError, TimeoutError) as exc:
                raise FollowError(f"{short(hotkey)}'s {gradient_key(window)}, aggregated by the lead, could not be "
                                  f"read ({type(exc).__name__}: {str(exc)[:120]})") from exc
            if g.digest != digest:
                raise FollowError(f"{short(hotkey)}'s {gradient_key(window)} is not the payload the lead aggregated "
                                  "(digest differs)")
            return g

        fetched = await asyncio.gather(*(fetch(hk, d) for hk, d in missing))
        have.update({g.hotkey: g for g in fetched})
    return [as_aggregated(have[hk]) for hk, _ in inputs.peers]


def as_aggregated(payload: Gradient) -> Gradient:
    """A payload the lead's inputs name, as the lead aggregated it: never a warm-up one. The inputs name
    payloads by their content digest (the gradient tensors only), and the warm-up flag lies outside it: a
    miner can sign the same tensors again as warm-up and serve that copy to some readers (its own storage
    server, or a re-upload after the lead's gather). The lead only names payloads it weighed 1/G
    (`templar.runtime.consensus.outer.aggregation_weights`), so every node weighs them so, whichever copy
    it read; otherwise a reader of the warm-up copy would weigh it 0 and leave the run's θ."""
    return dataclasses.replace(payload, warmup=False) if payload.warmup else payload


async def apply_inputs(node: Node, window: int, inputs: StepInputs, state: NodeState,
                       gathered: Mapping[str, GatherResult[Gradient]], *, deadline: float,
                       keep_signs: bool = False) -> tuple[OuterStep | None, list[Gradient]]:
    """Take the step of `inputs`: collect its payloads, re-anchor global_step on the lead's
    (`update_step`), then the one outer step, under the lead's ceiling on its clip level (`clip_norm`).
    Returns the step (None for an empty one) and the payloads it aggregated (what the lead publishes
    for a SparseLoCo run's catch-up)."""
    payloads = await collect_payloads(node, window, inputs, gathered, deadline=deadline)
    state.global_step = update_step(state.global_step, published=inputs.global_step)
    step = await asyncio.to_thread(node.compute.outer_step, payloads, state, keep_signs=keep_signs,
                                   clip_norm=inputs.clip_norm)
    return step, payloads


async def follow_step(node: Node, window: int, state: NodeState,
                      gathered: Mapping[str, GatherResult[Gradient]]) -> OuterStep | None:
    """A follower's outer step of `window`: the inputs of the window's lead, applied; None when the
    window has none (no candidate published in time, or its inputs name no payload). `FollowError`
    if they cannot be had by the window's `apply_deadline`."""
    deadline = node.clock.times(window).apply_deadline
    decision = await window_inputs(node, window, deadline=deadline)
    if decision.inputs is None:
        return None
    step, _ = await apply_inputs(node, window, decision.inputs, state, gathered,
                                 deadline=max(deadline, node.clock.now() + APPLY_FETCH_SECONDS))
    return step
