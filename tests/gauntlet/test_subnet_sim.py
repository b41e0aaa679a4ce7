"""`benchmarks/subnet_sim.py` stays runnable: a few windows of the real Gauntlet code through Yuma."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def subnet_sim():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import subnet_sim
    finally:
        sys.path.remove(str(BENCHMARKS))
    return subnet_sim


def test_quick_simulation_pays_honest_peers_and_reports_every_metric(subnet_sim) -> None:
    """64 uids, 2 validators, 16 windows: honest peers earn most of the incentive, cheats little."""
    base = replace(subnet_sim.SimConfig(), uids=64, per_class=2, fast_eval_uids=16, windows=16, join_window=6)
    for cfg in (base, replace(base, **subnet_sim.CHOSEN)):
        outcome = subnet_sim.simulate(cfg, keep_series=True)
        m = outcome.metrics
        share = m["share"]
        assert sum(share.values()) == pytest.approx(1.0, abs=1e-6)
        assert share["honest"] + share["moredata"] + share["newcomer"] > 0.8
        assert sum(share[c] for c in subnet_sim.CHEATS) < 0.2
        assert 0.0 <= m["agreement_mean"] <= 1.0 and 0.0 <= m["vtrust_min"] <= 1.0
        assert m["newcomer_first_weight_windows"] is not None
        assert len(outcome.series["agreement"]) == cfg.windows


def test_fit_file_holds_every_strategy_the_draws_need(subnet_sim) -> None:
    fit = subnet_sim.fit()
    assert {"honest", "moredata", "lazy", "noise"} <= set(fit["samples"])
    assert all(len(pairs) >= 20 for pairs in fit["samples"].values())
