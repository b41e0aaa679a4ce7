"""Cadence: what a window's length costs the incentive at finney's epochs (docs/mining.md §6, "Window").

    nice -n 19 python -m benchmarks.incentive.subnet_sim_cadence     # 6 simulations, about two minutes on 2 cores

A miner's GPU reaches 90 % of wall-clock in one of two ways: the exchange (put window, gather, outer
step) overlaps the next window's inner steps (`inner.overlap`), and windows keep finney's 84 s; or the
exchange blocks, and windows grow until its 36 s is a tenth of them: 31 blocks, 372 s
(`tools.sizing.compute_span`: 335.7 s of 372 s for training). Each line runs the production Gauntlet
(`subnet_sim.CHOSEN`) at seeds 0-2 at finney's cadence (an epoch every 360 blocks, the validators'
weights about every 21 minutes, as 15 windows of 84 s), over the same 16.8 hours with newcomers
joining at the same hour, and converts windows to hours at its window's length. Reported: primary
evaluations per peer per hour, a newcomer's first weight and its time to the honest median (median
and last newcomer), how soon a copycat hears (its first failed fast evaluation: `uncommitted`),
identical honest peers' spread and the validators' agreement.

Writes `benchmarks/results/subnet_sim_cadence.json`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace

from benchmarks.incentive.subnet_sim import CHOSEN, RESULTS_DIR, SimConfig, simulate

SEEDS = (0, 1, 2)
BLOCK_SECONDS = 12.0
TEMPO_BLOCKS = 360
WEIGHTS_SECONDS = 15 * 84.0
"""Production sets weights every 15 windows of 84 s; a longer window keeps about the same interval."""
HORIZON_SECONDS = 720 * 84.0
JOIN_SECONDS = 420 * 84.0
CADENCES = {"overlapped, 7 blocks (84 s): production": 7, "blocking at 90 %, 31 blocks (372 s)": 31}


def config(blocks: int, seed: int) -> SimConfig:
    """`CHOSEN` at finney's cadence for windows of `blocks` blocks."""
    window = blocks * BLOCK_SECONDS
    return replace(SimConfig(), **CHOSEN, seed=seed, windows=round(HORIZON_SECONDS / window),
                   join_window=round(JOIN_SECONDS / window), tempo_windows=max(1, round(TEMPO_BLOCKS / blocks)),
                   weights_windows=max(1, round(WEIGHTS_SECONDS / window)))


def summary(blocks: int, runs: list[dict]) -> dict:
    """The seeds' medians, in hours where the simulator counts windows."""
    window = blocks * BLOCK_SECONDS
    cfg = config(blocks, 0)
    miners = cfg.uids - cfg.validators

    def hours(key: str) -> float:
        return statistics.median(r[key] for r in runs) * window / 3600

    return {
        "window_seconds": window, "windows": cfg.windows, "tempo_windows": cfg.tempo_windows,
        "weights_windows": cfg.weights_windows,
        "evaluations_per_peer_per_hour": cfg.validators * cfg.uids_per_window / miners * 3600 / window,
        "newcomer_first_weight_h": hours("newcomer_first_weight_windows"),
        "newcomer_honest_median_h": hours("newcomer_honest_median_windows"),
        "newcomer_honest_median_last_h": hours("newcomer_honest_median_windows_worst"),
        "copycat_first_penalty_h": hours("copycat_first_penalty_windows"),
        "copycat_first_penalty_last_h": hours("copycat_first_penalty_windows_worst"),
        "honest_max_over_min": statistics.median(r["honest_max_over_min"] for r in runs),
        "agreement": statistics.median(r["agreement_mean"] for r in runs),
    }


def line(label: str, s: dict) -> str:
    return (f"  {label:<40} {s['evaluations_per_peer_per_hour']:.2f} evaluations/peer/h | newcomer: weight "
            f"{s['newcomer_first_weight_h']:.2f} h, honest median {s['newcomer_honest_median_h']:.2f} h (last "
            f"{s['newcomer_honest_median_last_h']:.2f} h) | copycat told {s['copycat_first_penalty_h'] * 60:.1f} min "
            f"(last {s['copycat_first_penalty_last_h'] * 60:.1f}) | honest max/min {s['honest_max_over_min']:.2f} | "
            f"agreement {s['agreement']:.3f}")


def main() -> int:
    started = time.perf_counter()
    results = {}
    for label, blocks in CADENCES.items():
        runs = [simulate(config(blocks, seed)).metrics for seed in SEEDS]
        results[label] = {"summary": summary(blocks, runs), "runs": runs}
        print(line(label, results[label]["summary"]), flush=True)
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / "subnet_sim_cadence.json"
    path.write_text(json.dumps({"seeds": SEEDS, "chosen": CHOSEN, "results": results,
                                "wall_seconds": round(time.perf_counter() - started, 1)}, indent=1, default=str))
    print(f"wrote {path} in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
