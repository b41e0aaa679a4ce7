"""A localnet's roster: which node is which (`nodes.json` in its `--out` directory).

`templar localnet` writes it once; its report, the report's consensus table and the dashboard
read it. It lives here, below the tools, next to the records the same tools read, so that the
localnet and the dashboard both use this one model without importing each other. Stdlib only, but
for the chain's rule for the lead (`templar.chain.lead_of`), imported when it is asked for.

A roster is read as untrusted input (a directory on disk may have been edited or torn): every
entry is checked field by field, and a name must be safe as a directory name, because each
node's state dir is `<out>/nodes/<name>`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from templar.core.atomic import atomic_write

NODES_FILE = "nodes.json"
CHAIN_FILE = "chain.sqlite"
NETUID = 1
"""The subnet a localnet registers on its embedded chain."""
ROLES = ("miner", "validator")
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_ROSTER_BYTES = 4 * 1024 * 1024


class RosterError(ValueError):
    """nodes.json is missing, unreadable or holds no valid node."""


@dataclass(frozen=True)
class NodeInfo:
    """One neuron of a localnet."""

    name: str
    hotkey: str
    uid: int
    role: str        # miner | validator
    strategy: str    # honest or an adversary's name; validators: "lead" or "validator"
    stake: float = 0.0

    def directory(self, out: Path) -> Path:
        """Its `--state.dir`."""
        return out / "nodes" / self.name

    @property
    def validator_permit(self) -> bool:
        """A localnet registers its validators with stake and a permit, its miners with neither."""
        return self.role == "validator"

    @property
    def validates(self) -> bool:
        """A localnet's validators declare themselves in their commitment, its miners do not."""
        return self.role == "validator"

    @property
    def commitment(self) -> str | None:
        """Whether it committed a bucket, as the chain's succession rule asks: a localnet's
        validators commit theirs when they start, its miners too, so every node has one."""
        return self.name


def write_nodes(out: Path, nodes: Iterable[NodeInfo]) -> None:
    """Write the roster whole (a temporary file renamed over it): the localnet rewrites it as a newcomer
    joins, while its live table and the dashboard read it."""
    atomic_write(out / NODES_FILE, json.dumps([asdict(n) for n in nodes], indent=2).encode())


def parse_node(item: object) -> NodeInfo | None:
    """One roster entry, or None if any field is missing, mistyped or unsafe."""
    if not isinstance(item, dict):
        return None
    name, hotkey, uid, role = item.get("name"), item.get("hotkey"), item.get("uid"), item.get("role")
    strategy, stake = item.get("strategy"), item.get("stake", 0.0)
    if not (isinstance(name, str) and NAME_RE.fullmatch(name) and name not in {".", ".."}):
        return None
    if not (isinstance(hotkey, str) and 0 < len(hotkey) <= 64 and isinstance(strategy, str) and len(strategy) <= 64):
        return None
    if type(uid) is not int or uid < 0 or role not in ROLES:
        return None
    if type(stake) not in (int, float) or not math.isfinite(stake):
        return None
    return NodeInfo(name=name, hotkey=hotkey, uid=uid, role=role, strategy=strategy, stake=float(stake))


def read_nodes(out: Path) -> list[NodeInfo]:
    """The valid entries of `out`'s roster (invalid ones are left out); `RosterError` if there is
    no roster to read or it names no valid node."""
    path = out / NODES_FILE
    try:
        if path.stat().st_size > MAX_ROSTER_BYTES:
            raise RosterError(f"{NODES_FILE}: over {MAX_ROSTER_BYTES} bytes; not read")
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise RosterError(f"{NODES_FILE}: not written yet (the localnet is starting?)") from exc
    except (OSError, ValueError) as exc:
        raise RosterError(f"{NODES_FILE}: unreadable ({exc})") from exc
    nodes = [n for n in map(parse_node, raw if isinstance(raw, list) else []) if n is not None]
    if not nodes:
        raise RosterError(f"{NODES_FILE}: no valid node entries")
    return nodes


def lead_validator(nodes: Iterable[NodeInfo]) -> NodeInfo | None:
    """The validator whose view a localnet follows: the chain's rule for the lead
    (`templar.chain.lead_of`) on the roster's declarations, permits and stakes."""
    from templar.chain import lead_of

    return lead_of(nodes)

