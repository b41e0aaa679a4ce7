"""The subnet simulator on whole evaluations of production's inner loop: the refit, and the targets.

    python -m benchmarks.incentive.subnet_sim_refit --fit fair-pay/seed0 fair-pay/seed1 fair-pay/seed2
    python -m benchmarks.incentive.subnet_sim_refit                # the committed fit, 12 runs
    python -m benchmarks.incentive.subnet_sim_refit --quick        # 64 uids, 12 windows (tests)

`subnet_sim.py`'s `FIT_FILE` resamples (δ_rand, gap) pairs of a tiny localnet from before inner
steps, one pair per evaluation. `--fit` refits from localnets whose validators recorded every unit
of every primary evaluation (`--record-evaluations`, which a localnet passes): by default the
crowded localnets of `fair_pay.py` (production's Gauntlet and inner loop on `micro`, one validator,
4 honest miners and 12 adversaries, 16 windows, seeds 0-2), into `UNITS_FIT_FILE`. The draws then
hand the score book what production's validator hands it, so μ runs the proof by size per unit,
the extra-work classes of `moredata` and the dilution on measured units.

Then it runs production's settings (`CHOSEN`), on the simulator's cadence (every window an epoch)
and on finney's (an epoch every 51 windows, weights every 15), seeds 0-2, with each fit, and
prints the targets of docs/scoring.md §11: identical honest max/min over the last 12 windows,
agreement, the best-paid cheat's share, `moredata` over honest, and how long the median newcomer
takes to reach the honest median (the target: within 1 h at finney's cadence). Writes
`benchmarks/results/subnet_sim_refit.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from benchmarks.incentive.subnet_sim import CHOSEN, RESULTS_DIR, SimConfig, _run, hours, line, worst_cheat
from benchmarks.incentive.subnet_sim_fit import FIT_FILE, UNITS_FIT_FILE, fit_from_evaluations

FIT_SOURCE = ("crowded localnets (`python -m benchmarks.incentive.fair_pay --seeds 0 1 2`: "
              "micro_gauntlet_8pages, one validator, 4 honest miners and 12 adversaries, 16 windows)")
KEYS = ("honest_max_over_min", "agreement_mean", "worst_cheat_share", "moredata_over_honest",
        "newcomer_median_hours", "newcomer_first_weight_hours")


def summary(m: dict) -> dict:
    cheat, share = worst_cheat(m)
    return {"honest_max_over_min": m["honest_max_over_min"], "agreement_mean": m["agreement_mean"],
            "worst_cheat": cheat, "worst_cheat_share": share, "moredata_over_honest": m["moredata_over_honest"],
            "newcomer_median_hours": hours(m["newcomer_honest_median_windows"]),
            "newcomer_first_weight_hours": hours(m["newcomer_first_weight_windows"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=Path, nargs="+", default=None, help="localnet --out folders to refit from")
    parser.add_argument("--quick", action="store_true", help="64 uids, 12 windows, one seed")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    if args.fit:
        fitted = fit_from_evaluations(args.fit, FIT_SOURCE)
        UNITS_FIT_FILE.write_text(json.dumps(fitted, separators=(",", ":")) + "\n")
        print(json.dumps({"source": fitted["source"], "summary": fitted["summary"]}, indent=1))
        print(f"wrote {UNITS_FIT_FILE}")
    base = replace(SimConfig(), **CHOSEN)
    if args.quick:
        base = replace(base, windows=12, join_window=4, uids=64, per_class=2, fast_eval_uids=16)
    seeds = (0,) if args.quick else (0, 1, 2)
    fits = {"pairs (tiny, before inner steps)": None, "whole evaluations (micro, inner steps)": str(UNITS_FIT_FILE)}
    cadences = {"every window an epoch": {}, "finney (tempo 51, weights every 15)":
                {"tempo_windows": 51, "weights_windows": 15}}
    jobs = [(f"{f} | {c} | seed={seed}", replace(base, seed=seed, fit_file=path, **change), False)
            for f, path in fits.items() for c, change in cadences.items() for seed in seeds]
    if args.processes > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.processes) as pool:
            outcomes = dict(pool.imap(_run, jobs))
    else:
        outcomes = dict(map(_run, jobs))
    runs = {label: summary(o.metrics) for label, o in outcomes.items()}
    for label, o in outcomes.items():
        print(line(label, o.metrics))
    ranges = {f"{f} | {c}": {k: [min(runs[f"{f} | {c} | seed={s}"][k] for s in seeds),
                                  max(runs[f"{f} | {c} | seed={s}"][k] for s in seeds)] for k in KEYS}
              for f in fits for c in cadences}
    for label, r in ranges.items():
        print(f"  {label}: " + ", ".join(f"{k} {lo:.3g}–{hi:.3g}" for k, (lo, hi) in r.items()))
    stem = "subnet_sim_refit_quick" if args.quick else "subnet_sim_refit"
    (RESULTS_DIR / f"{stem}.json").write_text(json.dumps(
        {"fits": {"pairs": str(FIT_FILE.name), "units": str(UNITS_FIT_FILE.name)}, "uids": base.uids,
         "windows": base.windows, "runs": runs, "ranges_over_seeds": ranges,
         "median": {label: {k: statistics.median([runs[f"{label} | seed={s}"][k] for s in seeds]) for k in KEYS}
                    for label in ranges}}, indent=1) + "\n")
    print(f"wrote {RESULTS_DIR / stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
