"""Which peers' payloads make a window's outer step, for every node kind.

Two rules, each once: the top-G list in effect for a window (the newest list published at or
before it by the validator that led the window before, else by one that holds a slot) and, of
what a gather returned, the payloads that enter the aggregate. Miners and validators call the
same functions, so two nodes handed the same list and the same gather
results choose the same aggregate inputs (`tests/runtime/test_peers.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from templar.comms import GatherResult, RecordError, get_peers
from templar.core.log import context
from templar.runtime.consensus.succession import Lead, decide_window
from templar.runtime.node import Node
from templar.storage import StorageError
from templar.wire import Gradient

PEER_LIST_SECONDS = 5.0
"""How long a node waits for the lead's peer list before it counts the list as unavailable."""


async def peers_in_effect(node: Node, window: int) -> list[str]:
    """The top-G in effect for `window`: the newest list at or before it of the validator that led
    the window before (it names the next window's list with its publications), else of the first
    candidate holding one of the succession's `lead_slots` that has one. [] when there is none yet or
    it cannot be read in `PEER_LIST_SECONDS` (logged). Every node applies the lead's inputs, whatever
    it gathered, but the lead chooses those inputs from this list: so only a validator that can lead
    names it, never one below the slots (a permit and a little stake would otherwise choose whose
    payloads move θ wherever no slot holder has a list yet, the run's first windows among them)."""
    before = await decide_window(node, window - 1) if window > 0 else None
    first = before.lead if before is not None and before.lead is not None else None
    found, problem = await _list_of(node, [first] if first is not None else [], window)
    if found is None:  # the window before's lead named none: the first of the other slot holders that has one
        slots = (await node.candidates())[:node.hp.windows.lead_slots]
        others = [c for c in slots if first is None or c.hotkey != first.hotkey]
        found, more = await _list_of(node, others, window)
        problem = problem or more
    if found is None and problem:
        context(window=window, phase="peers").warning(f"peer list unavailable: {problem}")
    return found or []


async def _list_of(node: Node, leads: Sequence[Lead], window: int) -> tuple[list[str] | None, str]:
    """The list in effect at `window` of the first of `leads` that has one, and the last read error."""
    problem = ""
    for lead in leads:
        if lead.bucket is None:
            continue
        try:
            found = await get_peers(lead.bucket, window, run=node.run, timeout=PEER_LIST_SECONDS,
                                    max_peers=node.hp.gauntlet.top_g)
        except (StorageError, RecordError) as exc:
            problem = str(exc)
            continue
        if found:
            return found[1], problem
    return None, problem


def aggregate_payloads(peer_list: Sequence[str], results: Mapping[str, GatherResult[Gradient]]) -> list[Gradient]:
    """The payloads of a window's aggregate: those of the peers in effect that the gather returned
    valid, in the list's order (the aggregate itself does not depend on the order)."""
    return [r.value for hotkey in peer_list if (r := results.get(hotkey)) is not None and r.ok and r.value is not None]
