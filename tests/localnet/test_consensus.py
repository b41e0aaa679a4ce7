"""The localnet report's consensus section: Yuma on the validators' logged weights, window by window."""

from __future__ import annotations

from pathlib import Path

import pytest

from templar.localnet.consensus import consensus_by_window, render_consensus
from templar.localnet.report import build_report
from templar.runtime.records import (
    SCORES_FILE,
    VALIDATOR_WINDOWS_FILE,
    PeerScoreRecord,
    ValidatorWindowRecord,
    append_record,
)
from templar.runtime.roster import NodeInfo, write_nodes

NODES = [
    NodeInfo("validator0", "hk-v0", 0, "validator", "lead", 60.0),
    NodeInfo("validator1", "hk-v1", 1, "validator", "validator", 40.0),
    NodeInfo("miner0", "hk-m0", 2, "miner", "honest"),
    NodeInfo("moredata0", "hk-m1", 3, "miner", "moredata"),
]
WEIGHTS = {"validator0": (0.75, 0.25), "validator1": (0.25, 0.75)}


def _score(window: int, node: NodeInfo, weight: float) -> PeerScoreRecord:
    return PeerScoreRecord(window=window, hotkey=node.hotkey, uid=node.uid, status="ok", evaluated=True,
                           sync_steps=0.0, delta_assigned=0.1, delta_rand=0.05, mu=0.5, rating=25.0,
                           score=1.0, weight=weight, in_top_g=True)


def _write_run(out: Path, windows: range) -> None:
    write_nodes(out, NODES)
    for validator in NODES[:2]:
        directory = validator.directory(out)
        for window in windows:
            for miner, weight in zip(NODES[2:], WEIGHTS[validator.name], strict=True):
                append_record(directory / SCORES_FILE, _score(window, miner, weight))
            append_record(directory / VALIDATOR_WINDOWS_FILE, ValidatorWindowRecord(
                window=window, global_step=window, learning_rate=1e-3, holdout_loss=5.0, peers_aggregated=2,
                gathered=2, evaluated=2, wall_seconds=1.0, weights_set=True))


def test_yuma_incentive_agreement_and_vtrust_per_window(tmp_path: Path) -> None:
    """Stakes 60 / 40 and weights (0.75, 0.25) / (0.25, 0.75), as in tests/chain/test_yuma.py.

    Incentive after Yuma: (0.6875, 0.3125); vtrust (1, 0.5); agreement 1 − TV = 1 − (0.5 + 0.5)/2 = 0.5.
    A window that only one validator reached is left out (validator1 stops at window 3).
    """
    _write_run(tmp_path, range(1, 4))
    append_record(NODES[0].directory(tmp_path) / SCORES_FILE, _score(4, NODES[2], 1.0))
    rows = consensus_by_window(tmp_path, NODES)
    assert [r["window"] for r in rows] == [1, 2, 3]
    last = rows[-1]
    assert last["incentive"] == pytest.approx({"miner0": 0.6875, "moredata0": 0.3125})
    assert last["vtrust"] == pytest.approx({"validator0": 1.0, "validator1": 0.5})
    assert last["agreement"] == pytest.approx(0.5) and last["agreement_min"] == pytest.approx(0.5)
    text = "\n".join(render_consensus(rows, NODES))
    assert "| miner0 | honest | 0.750 | 0.250 | 0.688 |" in text
    assert "| 3 | 0.500 | 0.500 | 1.000 | 0.500 |" in text


def test_build_report_carries_the_consensus(tmp_path: Path) -> None:
    """... and lists the roster's nodes only: the subnet owner's uid 0, registered without a bucket
    and found `missing` in the validator's score log, is no peer of the report."""
    _write_run(tmp_path, range(1, 3))
    owner = NodeInfo("owner", "hk-owner", 4, "miner", "-")
    for window in (1, 2):
        append_record(NODES[0].directory(tmp_path) / SCORES_FILE, PeerScoreRecord(
            window=window, hotkey=owner.hotkey, uid=owner.uid, status="missing", evaluated=False, sync_steps=None,
            delta_assigned=None, delta_rand=None, mu=0.0, rating=25.0, score=0.0, weight=0.0, in_top_g=False))
    report = build_report(tmp_path)
    incentive = {p["name"]: p["final_incentive"] for p in report["peers"]}
    assert incentive["miner0"] == pytest.approx(0.6875)
    assert [p["name"] for p in report["peers"]] == [n.name for n in NODES]
    assert set(report["consensus"][-1]["incentive"]) == {"miner0", "moredata0"}
    markdown = (tmp_path / "report.md").read_text()
    assert "incentive after Yuma" in markdown and "missing" not in markdown


def test_no_validators_no_consensus(tmp_path: Path) -> None:
    write_nodes(tmp_path, NODES[2:])
    assert consensus_by_window(tmp_path, NODES[2:]) == []
    assert render_consensus([], NODES[2:]) == []


def test_malformed_records_are_skipped(tmp_path: Path) -> None:
    """A record without a window, or with a NaN or negative weight, never enters the epoch."""
    _write_run(tmp_path, range(1, 3))
    path = NODES[1].directory(tmp_path) / SCORES_FILE
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"hotkey": "hk-m0", "weight": 0.5}\n{"hotkey": "hk-m0", "window": 2, "weight": NaN}\n'
                '{"hotkey": "hk-m0", "window": "2", "weight": 0.5}\n{"hotkey": "hk-m1", "window": 2, "weight": -1}\n')
    rows = consensus_by_window(tmp_path, NODES)
    assert [r["window"] for r in rows] == [1, 2]
    assert rows[-1]["incentive"] == pytest.approx({"miner0": 0.6875, "moredata0": 0.3125})
