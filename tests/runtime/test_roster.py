"""A localnet's roster (nodes.json): one model for the localnet, its report and the dashboard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from templar.runtime.roster import NODES_FILE, NodeInfo, RosterError, lead_validator, read_nodes, write_nodes

NODES = [
    NodeInfo("validator0", "hk-v0", 1, "validator", "lead", 10_000.0),
    NodeInfo("validator1", "hk-v1", 2, "validator", "validator", 500.0),
    NodeInfo("miner0", "hk-m0", 3, "miner", "honest"),
]


def test_round_trip_and_the_lead(tmp_path: Path) -> None:
    write_nodes(tmp_path, NODES)
    assert read_nodes(tmp_path) == NODES
    assert lead_validator(NODES) == NODES[0]
    tied = [NodeInfo("b", "hk-b", 5, "validator", "validator", 7.0), NodeInfo("a", "hk-a", 4, "validator", "lead", 7.0)]
    assert lead_validator(tied).name == "a"  # equal stake: the lower uid, as the chain decides
    assert lead_validator(NODES[2:]) is None


def test_hostile_entries_are_left_out(tmp_path: Path) -> None:
    """A node's state dir is `<out>/nodes/<name>`: a name that leaves it, a wrong type or role is
    never used; the valid entries still are."""
    good = {"name": "miner0", "hotkey": "hk-m0", "uid": 3, "role": "miner", "strategy": "honest"}
    bad = [{**good, "name": ".."}, {**good, "name": "../../etc"}, {**good, "name": "a/b"}, {**good, "uid": True},
           {**good, "uid": "3"}, {**good, "uid": -1}, {**good, "role": "owner"}, {**good, "stake": float("nan")},
           {**good, "hotkey": ""}, {k: v for k, v in good.items() if k != "strategy"}, "miner0", None]
    (tmp_path / NODES_FILE).write_text(json.dumps([*bad, good]))
    assert read_nodes(tmp_path) == [NodeInfo("miner0", "hk-m0", 3, "miner", "honest", 0.0)]


@pytest.mark.parametrize(("content", "reason"), [
    (None, "not written yet"), ("{not json", "unreadable"), ("{}", "no valid node"), ('[{"name": 1}]', "no valid node"),
])
def test_no_roster_is_one_clear_error(tmp_path: Path, content: str | None, reason: str) -> None:
    if content is not None:
        (tmp_path / NODES_FILE).write_text(content)
    with pytest.raises(RosterError, match=reason):
        read_nodes(tmp_path)
