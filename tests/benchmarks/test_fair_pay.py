"""`benchmarks/incentive/fair_pay.py` reads a localnet's report as the issue's targets are stated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.incentive.fair_pay import summarise


def _report(tmp_path: Path, miners: dict[str, tuple[str, list[float], int]]) -> Path:
    peers = [{"name": name, "role": "miner", "strategy": strategy, "trained_tokens": tokens,
              "weight_history": [[w, x] for w, x in enumerate(weights)]}
             for name, (strategy, weights, tokens) in miners.items()]
    peers.append({"name": "validator0", "role": "validator", "strategy": "lead"})
    (tmp_path / "report.json").write_text(json.dumps({"peers": peers}))
    return tmp_path


def test_second_half_spread_and_pay_per_token_against_the_weakest_honest(tmp_path: Path) -> None:
    out = _report(tmp_path, {
        "miner0": ("honest", [9.0, 9.0, 0.2, 0.2], 100),   # the first half does not count
        "miner1": ("honest", [0.0, 0.0, 0.1, 0.1], 100),
        "moredata0": ("moredata", [0.0, 0.0, 0.3, 0.3], 200),
        "short0": ("short", [0.0, 0.0, 0.05, 0.05], 25),
        "pooled0-0": ("pooled", [0.0, 0.0, 0.02, 0.02], 100),
        "pooled0-1": ("pooled", [0.0, 0.0, 0.02, 0.02], 100),
    })
    s = summarise(out)
    assert s["honest_max_over_min"] == pytest.approx(2.0)
    assert s["moredata_over_honest"] == pytest.approx(0.3 / 0.15)
    per_token = s["per_token_over_weakest_honest"]
    assert per_token["short0"] == pytest.approx((0.05 / 25) / (0.1 / 100))  # a quarter of the work, half the pay
    assert per_token["pooled0"] == pytest.approx((0.04 / 100) / (0.1 / 100))  # the group's pay over one member's work
    assert per_token["moredata0"] == pytest.approx((0.3 / 200) / (0.1 / 100))
    paid = s["over_honest_median"]
    assert paid["short0"] == pytest.approx(0.05 / 0.15) and paid["pooled0"] == pytest.approx(0.04 / 0.15)
    assert paid["moredata0"] == pytest.approx(s["moredata_over_honest"]) and "miner0" not in paid
