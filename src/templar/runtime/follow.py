"""Every node takes the outer step the lead took: exactly the payloads the lead aggregated.

The consensus rule (docs/design.md §3): the lead validator decides a window's aggregate from its
own gather and publishes its inputs (`templar.wire.inputs`: each payload's hotkey and digest, and
the global_step) the moment that gather ends. Every node, the lead included, applies exactly those
inputs (`apply_inputs`): the payloads its own gather returned when their digests match, the others
fetched from their owners' buckets (signed, and checked against the lead's digest). A node's own
gather decides only what it scores. So a node whose clock lags, whose gather saw another set, or
that reads the lead's peer list late, still takes the run's step.

A follower that cannot read the inputs by the window's `apply_deadline`, or cannot fetch a payload
they name, does not guess (`FollowError`): it stops before that window and catches up on the
lead's published aggregate (`templar.runtime.sync.catch_up`), which names what it waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from templar.chain import verify_signature
from templar.comms import GatherResult, RecordError, get_inputs
from templar.comms.keys import gradient_key, inputs_key
from templar.core.log import short
from templar.runtime.node import Node
from templar.runtime.outer import OuterStep, payload_reader, update_step
from templar.runtime.state import NodeState
from templar.storage import StorageError
from templar.wire import Gradient, PayloadError, StepInputs, max_gradient_bytes, max_inputs_bytes, read_inputs

POLL_SECONDS = 0.5
"""Pause between two reads of the lead's inputs while they are not there yet."""


class FollowError(Exception):
    """The lead's step of a window could not be established in time: the message names the object
    at fault. The node stops before that window and catches up; it never assumes an empty step."""


def inputs_of(window: int, global_step: int, payloads: list[Gradient]) -> StepInputs:
    """The inputs record of a step over `payloads` (the lead's own, before it publishes them)."""
    return StepInputs(window=window, global_step=global_step, peers=tuple((g.hotkey, g.digest) for g in payloads))


async def read_lead_inputs(node: Node, window: int, *, deadline: float) -> StepInputs:
    """The lead's inputs of `window`, read until `deadline` (the node's clock). A record that is
    absent, unreadable, malformed or not the lead's is retried until then, never taken for an
    empty step; `FollowError` names what was wrong at the deadline."""
    problem = "not readable: no lead validator with a readable bucket"
    while True:
        lead = await node.lead()
        if lead is not None:
            left = deadline - node.clock.now()
            try:
                data = await get_inputs(lead.bucket, window, max_bytes=max_inputs_bytes(), timeout=max(0.5, min(10.0, left)))
                if data is not None:
                    return read_inputs(data, run=node.run, verify=verify_signature, expected_hotkey=lead.hotkey,
                                       expected_window=window)
                problem = "not published yet"
            except PayloadError as exc:
                problem = f"malformed ({exc.reason}: {str(exc.detail)[:120]})"
            except (StorageError, RecordError) as exc:
                problem = f"unreadable ({str(exc)[:160]})"
        if node.clock.now() >= deadline:  # a stop request finishes the window: no early exit here
            raise FollowError(f"the lead's {inputs_key(window)} is {problem}")
        await asyncio.sleep(POLL_SECONDS)


async def collect_payloads(node: Node, window: int, inputs: StepInputs,
                           gathered: Mapping[str, GatherResult[Gradient]], *, deadline: float) -> list[Gradient]:
    """The payloads `inputs` name, in their order: from `gathered` when the digest matches, else
    fetched from the owner's bucket (strict reader, signature, the lead's digest). No put-window
    check here: the lead already judged the timing; the digest makes the bytes the same.
    `FollowError` when one cannot be had by `deadline`."""
    have = {hk: r.value for hk, r in gathered.items() if r.ok and r.value is not None}
    missing = [(hk, digest) for hk, digest in inputs.peers if not (hk in have and have[hk].digest == digest)]
    if missing:
        buckets = await node.peer_buckets([hk for hk, _ in missing])
        read = payload_reader(node.shapes, node.hp, window, node.run)
        cap = max_gradient_bytes(node.shapes, node.hp)

        async def fetch(hotkey: str, digest: bytes) -> Gradient:
            bucket = buckets.get(hotkey)
            if bucket is None:
                raise FollowError(f"{short(hotkey)}'s {gradient_key(window)}, aggregated by the lead, is unreachable "
                                  "(no usable bucket committed)")
            try:
                left = deadline - node.clock.now()
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
    return [have[hk] for hk, _ in inputs.peers]


async def apply_inputs(node: Node, window: int, inputs: StepInputs, state: NodeState,
                       gathered: Mapping[str, GatherResult[Gradient]], *, deadline: float,
                       keep_signs: bool = False) -> tuple[OuterStep | None, list[Gradient]]:
    """Take the step of `inputs`: collect its payloads, re-anchor global_step on the lead's
    (`update_step`), then the one outer step. Returns the step (None for an empty one) and the
    payloads it aggregated (what the lead publishes for a SparseLoCo run's catch-up)."""
    payloads = await collect_payloads(node, window, inputs, gathered, deadline=deadline)
    state.global_step = update_step(state.global_step, published=inputs.global_step)
    step = await asyncio.to_thread(node.compute.outer_step, payloads, state, keep_signs=keep_signs)
    return step, payloads


async def follow_step(node: Node, window: int, state: NodeState,
                      gathered: Mapping[str, GatherResult[Gradient]]) -> OuterStep | None:
    """A follower's outer step of `window`: the lead's inputs, applied (`FollowError` if they
    cannot be had by the window's `apply_deadline`)."""
    deadline = node.clock.times(window).apply_deadline
    inputs = await read_lead_inputs(node, window, deadline=deadline)
    step, _ = await apply_inputs(node, window, inputs, state, gathered, deadline=deadline)
    return step
