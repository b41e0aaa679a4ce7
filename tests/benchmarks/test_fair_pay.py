"""`benchmarks/incentive/fair_pay.py` reads a localnet's report as the issue's targets are stated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.incentive import fair_pay
from benchmarks.incentive.fair_pay import summarise, verdict


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


def _crowded(tmp_path: Path, **changed: tuple[str, list[float], int]) -> Path:
    """A crowded run's report in which every target holds, but for what `changed` replaces."""
    tmp_path.mkdir(exist_ok=True)
    miners = {f"miner{i}": ("honest", [0.0, 0.0, 0.10, 0.10], 100) for i in range(4)}
    miners |= {"moredata0": ("moredata", [0.0, 0.0, 0.14, 0.14], 200),
               "overfit0": ("overfit", [0.0, 0.0, 0.09, 0.09], 100),
               "short0": ("short", [0.0, 0.0, 0.01, 0.01], 25),
               "pooled0-0": ("pooled", [0.0, 0.0, 0.001, 0.001], 100),
               "pooled0-1": ("pooled", [0.0, 0.0, 0.001, 0.001], 100)}
    return _report(tmp_path, miners | changed)


@pytest.mark.parametrize(("changed", "missed"), [
    ({}, []),
    ({"miner3": ("honest", [0.0, 0.0, 0.16, 0.16], 100)}, ["honest max/min 1.60 > 1.5"]),
    ({"moredata0": ("moredata", [0.0, 0.0, 0.12, 0.12], 200)}, ["moredata 1.20x the honest median, outside [1.3, 2.0)"]),
    ({"moredata0": ("moredata", [0.0, 0.0, 0.20, 0.20], 200)}, ["moredata 2.00x the honest median, outside [1.3, 2.0)"]),
    ({"overfit0": ("overfit", [0.0, 0.0, 0.11, 0.11], 100)},
     ["overfit0 1.10x the honest median, above the best honest miner's 1.00x"]),
    ({"short0": ("short", [0.0, 0.0, 0.02, 0.02], 25)}, ["short0 0.80x the weakest honest miner per token > 0.5"]),
    # a pool is judged on its total pay over one member's work: two members at 0.03 are 0.6x one honest miner
    ({"pooled0-0": ("pooled", [0.0, 0.0, 0.03, 0.03], 100), "pooled0-1": ("pooled", [0.0, 0.0, 0.03, 0.03], 100)},
     ["pooled0 0.60x the weakest honest miner per token > 0.5"]),
], ids=["every-target-holds", "honest-spread", "moredata-low", "moredata-twice", "overfit-above-best", "short", "pool"])
def test_each_target_a_seed_misses_is_named_with_its_figure(tmp_path: Path, changed: dict, missed: list[str]) -> None:
    assert verdict(summarise(_crowded(tmp_path, **changed))) == missed


def test_the_command_exits_1_when_a_seed_misses_a_target(tmp_path: Path, monkeypatch, capsys) -> None:
    _crowded(tmp_path / "seed0")
    _crowded(tmp_path / "seed1", short0=("short", [0.0, 0.0, 0.02, 0.02], 25))

    def command(*seeds: int) -> int:
        monkeypatch.setattr("sys.argv", ["fair_pay", "--reuse", "--out-root", str(tmp_path), "--results",
                                         str(tmp_path / "results.json"), "--seeds", *map(str, seeds)])
        return fair_pay.main()

    assert command(0) == 0 and "seed 0: every target holds" in capsys.readouterr().out
    assert command(0, 1) == 1
    assert "seed 1: MISSES short0 0.80x the weakest honest miner per token > 0.5" in capsys.readouterr().out
