"""`benchmarks/incentive/localnet_consensus.py` reads what the localnet writes: its summary follows the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.incentive import localnet_consensus as benchmark
from templar.localnet.report import build_report
from templar.runtime.records import SCORES_FILE, PeerScoreRecord, append_record
from templar.runtime.roster import NodeInfo, write_nodes

NODES = [
    NodeInfo("validator0", "hk-v0", 0, "validator", "lead", 60.0),
    NodeInfo("validator1", "hk-v1", 1, "validator", "validator", 40.0),
    NodeInfo("miner0", "hk-m0", 2, "miner", "honest"),
    NodeInfo("miner1", "hk-m1", 3, "miner", "honest"),
    NodeInfo("moredata0", "hk-md", 4, "miner", "moredata"),
    NodeInfo("lazy0", "hk-lz", 5, "miner", "lazy"),
]
WEIGHTS = {"miner0": 0.25, "miner1": 0.25, "moredata0": 0.5, "lazy0": 0.0}
DELTA_RAND = {"miner0": 0.04, "miner1": 0.05, "moredata0": 0.06, "lazy0": 0.05}


def test_summary_of_a_run_where_both_validators_agree(tmp_path: Path) -> None:
    write_nodes(tmp_path, NODES)
    for validator in NODES[:2]:
        for window in range(1, 4):
            for miner in NODES[2:]:
                append_record(validator.directory(tmp_path) / SCORES_FILE, PeerScoreRecord(
                    window=window, hotkey=miner.hotkey, uid=miner.uid, status="ok", evaluated=True, sync_steps=0.0,
                    delta_assigned=0.1, delta_rand=DELTA_RAND[miner.name], mu=0.5, rating=25.0, score=1.0,
                    weight=WEIGHTS[miner.name], in_top_g=True))
    build_report(tmp_path)
    summary = benchmark.summarise(tmp_path)
    assert summary["windows"] == 3
    final = summary["final"]
    # both validators give the same vector: consensus is that vector, agreement 1, vtrust 1
    assert final["honest_min"] == pytest.approx(0.25) and final["honest_max_over_min"] == pytest.approx(1.0)
    assert final["moredata_over_honest"] == pytest.approx(2.0) and final["cheats_total"] == 0.0
    assert summary["agreement_final"] == pytest.approx(1.0) and summary["vtrust_min_last"] == pytest.approx(1.0)
    # relative δ_rand over the median 0.05: 0.8, 1.0, 1.2, 1.0 → spread 1.4826 × median |dev| (0.1) = 0.14826
    noise = summary["noise"]["validator1"]
    assert noise["median_spread"] == pytest.approx(0.14826)
    assert noise["moredata_relative"] == pytest.approx(1.2) and noise["honest_relative"] == pytest.approx(0.9)
    assert "moredata/honest 2.00 final" in benchmark.line(0, summary)
