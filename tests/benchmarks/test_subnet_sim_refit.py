"""`benchmarks/incentive/subnet_sim_refit.py --levers --lever NAME`: only the named levers run, each
at the three seeds, and a name that is no lever stops the run before anything is simulated."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.incentive import subnet_sim_refit


def test_only_the_named_levers_run_and_an_unknown_name_is_refused(tmp_path: Path, monkeypatch) -> None:
    ran: list[str] = []

    def run_jobs(jobs, processes):  # the simulation itself is subnet_sim's (tests/benchmarks elsewhere)
        ran.extend(label for label, _, _ in jobs)
        metrics = {"honest_max_over_min": 1.2, "honest_p90_over_p10": 1.05, "agreement_mean": 0.9,
                   "moredata_over_honest": 1.4, "newcomer_honest_median_windows": 60,
                   "newcomer_honest_median_windows_worst": 90, "newcomer_first_weight_windows": 40,
                   "newcomer_honest_spread_windows": 45, "placebo_honest_median_windows": 50,
                   "newcomer_first_pay_over_median": 1.0, "weight_by_strategy": {},
                   "newcomers_at_median_first_epoch": 5, "newcomers_with_first_epoch": 8,
                   "newcomers_at_median_first_pay": 0.625, "incumbents_at_median_at_newcomers_first_pay": 0.7,
                   "newcomer_first_epoch_readings": {"at the median": 12, "proof": 2, "rating": 2, "not evaluated": 0},
                   "incumbent_first_epoch_readings": {"at the median": 700, "proof": 4, "rating": 120,
                                                      "not evaluated": 0}}
        return {label: SimpleNamespace(metrics=metrics) for label, _, _ in jobs}

    monkeypatch.setattr(subnet_sim_refit, "run_jobs", run_jobs)
    monkeypatch.setattr(subnet_sim_refit, "worst_cheat", lambda m: ("copycat", 0.0))
    monkeypatch.setattr(subnet_sim_refit, "RESULTS_DIR", tmp_path)
    names = ["production", "32 sequences an evaluation (twice production's)", "mu_gamma 0.98"]  # LEVERS' order
    assert subnet_sim_refit.main(["--levers", "--tag", "t", *(a for n in names for a in ("--lever", n))]) == 0
    assert ran == [f"{n} | seed={s}" for n in names for s in (0, 1, 2)]
    written = json.loads((tmp_path / "subnet_sim_refit_levers_t.json").read_text())
    assert list(written["levers"]) == names and list(written["ranges_over_seeds"]) == names
    assert written["runs"]["production | seed=0"]["incumbent_first_epoch_readings"]["rating"] == 120
    run = written["runs"]["production | seed=0"]  # the placebo in hours beside the newcomer's (50 and 60 windows)
    assert run["placebo_median_hours"] == pytest.approx(run["newcomer_median_hours"] * 50 / 60)
    assert written["levers"][names[1]]["eval_size"] == {"assigned_sequences": 32, "random_sequences": 64, "ranges": 4}

    ran.clear()
    with pytest.raises(SystemExit, match="no lever"):
        subnet_sim_refit.main(["--levers", "--lever", "mu_gamma 0.97"])
    assert ran == []
