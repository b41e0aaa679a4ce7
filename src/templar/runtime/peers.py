"""Which peers' payloads make a window's outer step, for every node kind.

Two rules, each once: the top-G list in effect for a window (the lead's newest published list at
or before it) and, of what a gather returned, the payloads that enter the aggregate. Miners and
validators call the same functions, so two nodes handed the same list and the same gather
results choose the same aggregate inputs (`tests/runtime/test_peers.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from templar.comms import GatherResult, RecordError, get_peers
from templar.core.log import context
from templar.runtime.node import Node
from templar.storage import StorageError
from templar.wire import Gradient

PEER_LIST_SECONDS = 5.0
"""How long a node waits for the lead's peer list before it counts the list as unavailable."""


async def peers_in_effect(node: Node, window: int) -> list[str]:
    """The lead's top-G in effect for `window` (its newest published list at or before it);
    [] when there is no lead, no list yet, or the list cannot be read in `PEER_LIST_SECONDS`
    (logged): the window then has no outer step."""
    lead = await node.lead()
    if lead is None:
        return []
    try:
        found = await get_peers(lead.bucket, window, run=node.run, timeout=PEER_LIST_SECONDS)
    except (StorageError, RecordError) as exc:
        context(window=window, phase="peers").warning(f"peer list unavailable: {exc}")
        return []
    return found[1] if found else []


def aggregate_payloads(peer_list: Sequence[str], results: Mapping[str, GatherResult[Gradient]]) -> list[Gradient]:
    """The payloads of a window's aggregate: those of the peers in effect that the gather returned
    valid, in the list's order (the aggregate itself does not depend on the order)."""
    return [r.value for hotkey in peer_list if (r := results.get(hotkey)) is not None and r.ok and r.value is not None]
