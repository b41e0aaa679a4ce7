"""The subnet simulator at the evaluation noise measured on a GPU at 1.2B, beside its own noise.

    python -m benchmarks.incentive.subnet_sim_gpu_noise            # 3 seeds × 2 noises, 256 uids, 720 windows
    python -m benchmarks.incentive.subnet_sim_gpu_noise --quick    # 64 uids, 12 windows (tests)

`benchmarks/performance/gpu.py`'s noise phase measures, at production's size on a GPU, how far honest
peers' LossScores spread from peer to peer (`subnet_sim_noise`: that spread over the one the simulator
resamples, `subnet_sim_fit.json`'s tiny localnet) and how much a window's noise varies from page to
page (`window_noise`: the sd of log σ̂). This runs `subnet_sim`'s chosen settings (production's
Gauntlet) at the simulator's noise, the measured one, and the measured one scaled to a production
peer's 29 pages (`PRODUCTION_PAGES`) and prints the fairness targets of docs/scoring.md §11 for each: honest
max/min over the last 12 windows (≤ 1.5), the best-paid cheat's share, `moredata` over honest, and
how long a newcomer takes to reach the honest median.

What it does not carry over: the simulator resamples (δ_rand, δ_assigned − δ_rand) pairs of tiny's
localnet, where an honest peer's assigned pages gain 1.26× what random pages gain. The GPU measured
that gap at 1.2B too, 48 steps from θ_0, and it is about 1 % there (the JSON's `gap_over_rand`);
how the proof by size pays when the gap is that small is the GPU's own figure
(`proof_credit`), not this simulation's. Writes `benchmarks/results/subnet_sim_gpu_noise.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.incentive.subnet_sim import CHOSEN, RESULTS_DIR, SimConfig, hours, line, run_jobs, worst_cheat

GPU_RESULT = RESULTS_DIR / "gpu_nvidia_h200.json"
PRODUCTION_PAGES = 29
"""A production peer's pages a window (`data.pages_per_window`); the GPU's noise peers trained 3, all
the sample corpus holds. If the spread from peer to peer is the sampling of their pages, 29 pages
shrink it by √(29/3): the third noise this runs, a bracket on production's, not a measurement."""


def measured_noise(path: Path = GPU_RESULT) -> dict[str, float]:
    """The noise phase's figures: the simulator's `noise` and `window_noise`, and the honest gap."""
    noise = json.loads(path.read_text())["phases"]["noise"]
    rand = noise["mean_delta_rand"]
    pages = len(next(iter(noise["assigned"].values())))
    return {"noise": noise["subnet_sim_noise"], "window_noise": noise["window_noise"], "pages_per_peer": pages,
            "noise_at_production_pages": noise["subnet_sim_noise"] * math.sqrt(pages / PRODUCTION_PAGES),
            "gap_over_rand": (noise["mean_delta_assigned"] - rand) / rand,
            "proof_credit_mean": noise["proof_credit"]["credit_mean"], "source": str(path.name)}


def summary(m: dict) -> dict:
    cheat, share = worst_cheat(m)
    return {"honest_max_over_min": m["honest_max_over_min"], "honest_p90_over_p10": m["honest_p90_over_p10"],
            "worst_cheat": cheat, "worst_cheat_share": share, "moredata_over_honest": m["moredata_over_honest"],
            "newcomer_median_hours": hours(m["newcomer_honest_median_windows"]),
            "agreement_mean": m["agreement_mean"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 uids, 12 windows, one seed")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    gpu = measured_noise()
    base = replace(SimConfig(), **CHOSEN)
    if args.quick:
        base = replace(base, windows=12, join_window=4, uids=64, per_class=2, fast_eval_uids=16)
    seeds = (0,) if args.quick else (0, 1, 2)
    noises = {"simulator's (tiny localnet)": {},
              "measured on the GPU (1.2B)": {"noise": gpu["noise"], "window_noise": gpu["window_noise"]},
              f"measured, at {PRODUCTION_PAGES} pages a peer": {"noise": gpu["noise_at_production_pages"],
                                                             "window_noise": gpu["window_noise"]}}
    jobs = [(f"{name}, seed={seed}", replace(base, seed=seed, **change), False)
            for name, change in noises.items() for seed in seeds]
    outcomes = run_jobs(jobs, args.processes, say=False)
    results = {label: summary(o.metrics) for label, o in outcomes.items()}
    for label, o in outcomes.items():
        print(line(label, o.metrics))
    by_noise = {name: {key: statistics.median(results[f"{name}, seed={s}"][key] for s in seeds)
                       for key in ("honest_max_over_min", "worst_cheat_share", "moredata_over_honest",
                                   "newcomer_median_hours")} for name in noises}
    for name, figures in by_noise.items():
        print(f"  {name}: median over seeds " + ", ".join(f"{k} {v:.3g}" for k, v in figures.items()))
    stem = "subnet_sim_gpu_noise_quick" if args.quick else "subnet_sim_gpu_noise"
    (RESULTS_DIR / f"{stem}.json").write_text(json.dumps(
        {"measured": gpu, "uids": base.uids, "windows": base.windows, "runs": results, "median": by_noise},
        indent=1) + "\n")
    print(f"wrote {RESULTS_DIR / stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
