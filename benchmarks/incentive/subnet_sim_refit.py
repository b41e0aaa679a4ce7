"""The subnet simulator on whole evaluations of production's inner loop: the refit, and the targets.

    python -m benchmarks.incentive.subnet_sim_refit --fit fair-pay/seed0 fair-pay/seed1 fair-pay/seed2
    python -m benchmarks.incentive.subnet_sim_refit                # the committed fit, 12 runs
    python -m benchmarks.incentive.subnet_sim_refit --quick        # 64 uids, 12 windows (tests)
    python -m benchmarks.incentive.subnet_sim_refit --tag sparseloco --fit DIR0 DIR1 DIR2   # another fit, beside
    python -m benchmarks.incentive.subnet_sim_refit --levers --tag T [--lever NAME ...]     # LEVERS on fit T
    python -m benchmarks.incentive.subnet_sim_refit --spread       # where the fit's spread comes from

`subnet_sim.py`'s `FIT_FILE` resamples (δ_rand, gap) pairs of a tiny localnet from before inner
steps, one pair per evaluation. `--fit` refits from localnets whose validators recorded every unit
of every primary evaluation (`--record-evaluations`, which a localnet passes): by default the
crowded localnets of `fair_pay.py` (production's Gauntlet and inner loop on `micro`, one validator,
4 honest miners and 12 adversaries, 16 windows), into `UNITS_FIT_FILE` (production's fit,
`PRODUCTION_FIT_TAG`: six seeds of this code's crowded localnet, benchmarks/LOG.md §72). The draws
then hand the score book what production's validator hands it, so μ runs the proof by size per unit,
the extra-work classes of `moredata` and the dilution on measured units.

Then it runs production's settings (`CHOSEN`, read from hparams.json, at the size production's
validator reads an evaluation: `subnet_sim_production.production_size`), on the simulator's cadence (every
window an epoch) and on finney's (an epoch every 51 windows, weights every 15), seeds 0-2, with each
fit, and prints the targets of docs/scoring.md §11: identical honest max/min over the last 12 windows,
agreement, the best-paid cheat's share, `moredata` over honest, and how long the median newcomer
takes to reach the honest median (the target: within 1 h at finney's cadence). Writes
`benchmarks/results/subnet_sim_refit.json`; with `--tag T`, the fit and the results are
`subnet_sim_fit_units_T.json` and `subnet_sim_refit_T.json` (e.g. the localnets of another outer rule),
leaving the committed ones as they are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.incentive.subnet_sim import CHOSEN, RESULTS_DIR, SimConfig, hours, line, run_jobs, worst_cheat
from benchmarks.incentive.subnet_sim_fit import (
    FIT_FILE,
    UNITS_FIT_FILE,
    EvalSize,
    fit,
    fit_from_evaluations,
    size_scales,
    spread_sources,
    window_share,
)

FIT_SOURCE = ("crowded localnets (`python -m benchmarks.incentive.fair_pay --seeds 0 1 2`: "
              "micro_gauntlet_8pages, one validator, 4 honest miners and 12 adversaries, 16 windows; "
              "production's Gauntlet: SparseLoCo, the proof against the other peers' own steps on 1 of 4 sequences)")
KEYS = ("honest_max_over_min", "honest_p90_over_p10", "agreement_mean", "worst_cheat_share", "moredata_over_honest",
        "newcomer_median_hours", "placebo_median_hours", "newcomer_within_spread_hours", "newcomer_last_hours",
        "newcomer_first_weight_hours", "newcomer_first_pay_over_median",
        "newcomers_at_median_first_epoch", "newcomers_at_median_first_pay", "incumbents_at_median_at_newcomers_first_pay")


def summary(m: dict) -> dict:
    cheat, share = worst_cheat(m)
    return {"honest_max_over_min": m["honest_max_over_min"], "honest_p90_over_p10": m["honest_p90_over_p10"],
            "agreement_mean": m["agreement_mean"],
            "worst_cheat": cheat, "worst_cheat_share": share, "moredata_over_honest": m["moredata_over_honest"],
            "newcomer_median_hours": hours(m["newcomer_honest_median_windows"]),
            "placebo_median_hours": hours(m["placebo_honest_median_windows"]),
            "newcomer_within_spread_hours": hours(m["newcomer_honest_spread_windows"]),
            "newcomer_last_hours": hours(m["newcomer_honest_median_windows_worst"]),
            "newcomer_first_weight_hours": hours(m["newcomer_first_weight_windows"]),
            "newcomer_first_pay_over_median": m["newcomer_first_pay_over_median"],
            "newcomers_at_median_first_epoch": m["newcomers_at_median_first_epoch"],
            "newcomers_at_median_first_pay": m["newcomers_at_median_first_pay"],
            "incumbents_at_median_at_newcomers_first_pay": m["incumbents_at_median_at_newcomers_first_pay"],
            "newcomer_first_epoch_readings": m["newcomer_first_epoch_readings"],
            "incumbent_first_epoch_readings": m["incumbent_first_epoch_readings"]}


LEVERS: dict[str, dict] = {
    "production": {},
    "the crowded localnet's size (8 sequences an evaluation, as fitted)": {"eval_size": None},
    "32 sequences an evaluation (twice production's)": {"eval_size": EvalSize(32, 64, 4)},
    "every sequence of the page (64, four times production's)": {"eval_size": EvalSize(64, 64, 4)},
    "mu_gamma 0.95 (a longer memory)": {"mu_gamma": 0.95},
    "mu_gamma 0.98": {"mu_gamma": 0.98},
    "proof_full_gap 0.2 (full credit at a smaller gap)": {"proof_full_gap": 0.2},
    "proof_full_gap 0.1": {"proof_full_gap": 0.1},
    "power 1.5": {"power": 1.5},
    "power 1": {"power": 1.0},
    "mu_gamma 0.98 + power 1": {"mu_gamma": 0.98, "power": 1.0},
    "rating tied (tie band 100: μ alone)": {"rating_tie_band": 100.0},
    "the rating's tie band above the median 4.5 standard errors": {"rating_tie_band": 4.5},
    "power 1 + rating tied": {"power": 1.0, "rating_tie_band": 100.0},
    "mu_gamma 0.98 + rating tied": {"mu_gamma": 0.98, "rating_tie_band": 100.0},
    "uids_per_window 16 (twice the evaluations)": {"uids_per_window": 16},
    "mu_gamma 0.95 + uids_per_window 16": {"mu_gamma": 0.95, "uids_per_window": 16},
    "no tie band under μ (the rule before LOG §38)": {"rules": (("mu_tie_band", 0.0),)},
    "μ's tie band 0.25, power 4": {"rules": (("mu_tie_band", 0.25), ("mu_exponent", 4.0))},
    "μ's tie band 0.2, power 2": {"rules": (("mu_tie_band", 0.2), ("mu_exponent", 2.0))},
    "μ's power below its band 6 (production 3)": {"rules": (("mu_exponent", 6.0),)},
    "μ's power below its band 8": {"rules": (("mu_exponent", 8.0),)},
    "no tie band below the rating's median (the rule before LOG §39)": {"rules": (("rating_tie_band_below", 0.0),)},
    "the rating's tie band below the median 1.5 standard errors": {"rules": (("rating_tie_band_below", 1.5),)},
    "the rating's tie band below the median 2 standard errors": {"rules": (("rating_tie_band_below", 2.0),)},
    "μ's tie band widening as a standard error for a peer of few evaluations": {"rules": (("mu_tie_band_widens", True),)},
    "μ's tie band widening and rated as the median below it until 5 evaluations":
        {"rules": (("mu_tie_band_widens", True), ("rating_below_after", 5))},
    "a newcomer drawn first until 3 evaluations": {"rules": (("newcomer_first_evals", 3),)},
    "a newcomer drawn first until 5 evaluations": {"rules": (("newcomer_first_evals", 5),)},  # production's since LOG §48
    "no newcomer drawn first beyond its first evaluation (the rule before LOG §48)": {"rules": (("newcomer_first_evals", 0),)},
    "a newcomer drawn first until 8 evaluations": {"rules": (("newcomer_first_evals", 8),)},
    "a newcomer drawn first until 5 evaluations and the rating's band below the median 2 standard errors":
        {"rules": (("newcomer_first_evals", 5), ("rating_tie_band_below", 2.0))},
    "rated as the median below it until 3 evaluations": {"rules": (("rating_below_after", 3),)},
    "rated as the median below it until 5 evaluations": {"rules": (("rating_below_after", 5),)},
    "weights every 15 windows from window 0 (the rule before LOG §40)": {"weights_at_epochs": False},
    "noise 0.5 (half of every evaluation's measured spread)": {"noise": 0.5},
    "mu_gamma 0.98 + noise 0.5": {"mu_gamma": 0.98, "noise": 0.5},
    "mu_gamma 0.98 + power 1 + rating tied": {"mu_gamma": 0.98, "power": 1.0, "rating_tie_band": 100.0},
    "mu_gamma 0.98 + power 1 + noise 0.5": {"mu_gamma": 0.98, "power": 1.0, "noise": 0.5},
}
"""Production's Gauntlet (at production's size of an evaluation, `subnet_sim_production.production_settings`)
with one knob changed, or two: the levers fair pay's noise names (how many units an evaluation reads,
μ's memory, how soon a unit earns the full credit, the power c, more evaluations, μ's tie band under
the paid level and the rating's below its median, `rules`: by their hparams names) and the rating
tied for every peer, which leaves μ alone to tell peers apart. `noise` scales every evaluation's
measured spread and its units' (0.5: half of it, whatever its cause), where more units shrink only
the part that is the sampling of units."""


def levers(processes: int, units_file: Path = UNITS_FIT_FILE, tag: str = "", only: list[str] | None = None,
           out: Path | None = None, seeds: tuple[int, ...] = (0, 1, 2)) -> int:
    """`LEVERS` (those named in `only`, when given) on the refit (`units_file`) at finney's cadence,
    at `seeds`: the targets of each, and its ranges, into `out` (by default `subnet_sim_refit_levers.json`,
    `..._levers_TAG.json` with a tag)."""
    unknown = sorted(set(only or ()) - set(LEVERS))
    if unknown:
        raise SystemExit(f"subnet_sim_refit: no lever {unknown}; the levers are {sorted(LEVERS)}")
    chosen = {name: change for name, change in LEVERS.items() if not only or name in only}
    base = replace(SimConfig(), **CHOSEN, fit_file=str(units_file), tempo_windows=51, weights_windows=15)
    jobs = [(f"{name} | seed={seed}", replace(base, seed=seed, **change), False)
            for name, change in chosen.items() for seed in seeds]
    outcomes = run_jobs(jobs, processes)
    runs = {label: summary(o.metrics) for label, o in outcomes.items()}
    ranges = {name: {k: [min(runs[f"{name} | seed={s}"][k] for s in seeds), max(runs[f"{name} | seed={s}"][k]
                                                                               for s in seeds)] for k in KEYS}
              for name in chosen}
    for name, r in ranges.items():
        print(f"  {name}: " + ", ".join(f"{k} {lo:.3g}–{hi:.3g}" for k, (lo, hi) in r.items()))
    out = out or RESULTS_DIR / ("subnet_sim_refit_levers" + (f"_{tag}" if tag else "") + ".json")
    out.write_text(json.dumps(
        {"fit": str(units_file.name), "cadence": "finney (tempo 51, weights every 15)", "levers": chosen,
         "runs": runs, "ranges_over_seeds": ranges}, indent=1, default=asdict) + "\n")
    print(f"wrote {out}")
    return 0


def spread(units_file: Path = UNITS_FIT_FILE) -> int:
    """Where each strategy's evaluation-to-evaluation spread in a fit comes from, and what
    production's size does to it: the gap's sd, the share of its variance that is the sampling of
    the sequences read (`subnet_sim_fit.spread_sources`), the share the evaluations of one window
    have in common (`window_share`), and the gap's and δ_rand's scale at production's size
    (`size_scales`). Writes `subnet_sim_refit_spread.json`."""
    source = fit(units_file)
    size = CHOSEN["eval_size"]
    rows = {}
    for kind in source["evaluations"]:
        if len(source["evaluations"][kind]) < 2:  # a strategy evaluated once (`scaled`) has no spread
            print(f"  {kind:<10} evaluations {len(source['evaluations'][kind])}: no spread to read")
            continue
        s = spread_sources(source, kind, size.ranges)
        gap_scale, rand_scale = size_scales(source, kind, size)
        rows[kind] = {"evaluations": len(source["evaluations"][kind]), "gap_sd": round(s["gap_variance"] ** 0.5, 4),
                      "gap_sampling_share": round(s["gap_sampling_variance"] / s["gap_variance"], 3),
                      "rand_sd": round(s["rand_variance"] ** 0.5, 4),
                      "rand_sampling_share": round(s["rand_sampling_variance"] / s["rand_variance"], 3),
                      "gap_window_share": window_share(source, kind),
                      "sequences_read": [s["assigned_sequences"], s["random_sequences"]],
                      "production_scale": [round(gap_scale, 3), round(rand_scale, 3)]}
        print(f"  {kind:<10} " + ", ".join(f"{k} {v}" for k, v in rows[kind].items()))
    out = RESULTS_DIR / "subnet_sim_refit_spread.json"
    out.write_text(json.dumps({"fit": units_file.name, "production_size": asdict(size), "strategies": rows},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=Path, nargs="+", default=None, help="localnet --out folders to refit from")
    parser.add_argument("--quick", action="store_true", help="64 uids, 12 windows, one seed")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tag", default="", help="fit and results files of their own (`..._TAG.json`)")
    parser.add_argument("--levers", action="store_true",
                        help="instead: production's settings with one lever changed (LEVERS), on the refit at "
                             "finney's cadence, seeds 0-2")
    parser.add_argument("--lever", action="append", default=None, metavar="NAME",
                        help="with --levers: only this lever (repeat for several; the names are LEVERS' keys)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --levers: the seeds (0 1 2)")
    parser.add_argument("--out", type=Path, default=None,
                        help="with --levers: the results file (default: subnet_sim_refit_levers[_TAG].json)")
    parser.add_argument("--spread", action="store_true",
                        help="instead: where the fit's spread comes from (sampling, the window) and its scale at "
                             "production's size")
    args = parser.parse_args(argv)
    units_file = RESULTS_DIR / f"subnet_sim_fit_units_{args.tag}.json" if args.tag else UNITS_FIT_FILE
    if args.spread:
        return spread(units_file)
    if args.levers:
        return levers(args.processes, units_file, args.tag, args.lever, args.out, tuple(args.seeds))
    if args.fit:
        fitted = fit_from_evaluations(args.fit, FIT_SOURCE + (f" ({args.tag})" if args.tag else ""))
        units_file.write_text(json.dumps(fitted, separators=(",", ":")) + "\n")
        print(json.dumps({"source": fitted["source"], "summary": fitted["summary"]}, indent=1))
        print(f"wrote {units_file}")
    base = replace(SimConfig(), **CHOSEN)
    if args.quick:
        base = replace(base, windows=12, join_window=4, uids=64, per_class=2, fast_eval_uids=16)
    seeds = (0,) if args.quick else (0, 1, 2)
    fits = {"pairs (tiny, before inner steps)": None, "whole evaluations (micro, inner steps)": str(units_file)}
    # Both at production's units an evaluation (`CHOSEN`); the pairs record none and are drawn as fitted.
    cadences = {"every window an epoch": {}, "finney (tempo 51, weights every 15)":
                {"tempo_windows": 51, "weights_windows": 15}}
    jobs = [(f"{f} | {c} | seed={seed}", replace(base, seed=seed, fit_file=path, **change), False)
            for f, path in fits.items() for c, change in cadences.items() for seed in seeds]
    outcomes = run_jobs(jobs, args.processes, say=False)
    runs = {label: summary(o.metrics) for label, o in outcomes.items()}
    for label, o in outcomes.items():
        print(line(label, o.metrics))
    ranges = {f"{f} | {c}": {k: [min(runs[f"{f} | {c} | seed={s}"][k] for s in seeds),
                                  max(runs[f"{f} | {c} | seed={s}"][k] for s in seeds)] for k in KEYS}
              for f in fits for c in cadences}
    for label, r in ranges.items():
        print(f"  {label}: " + ", ".join(f"{k} {lo:.3g}–{hi:.3g}" for k, (lo, hi) in r.items()))
    stem = ("subnet_sim_refit_quick" if args.quick else "subnet_sim_refit") + (f"_{args.tag}" if args.tag else "")
    (RESULTS_DIR / f"{stem}.json").write_text(json.dumps(
        {"fits": {"pairs": str(FIT_FILE.name), "units": str(units_file.name)}, "uids": base.uids,
         "windows": base.windows, "runs": runs, "ranges_over_seeds": ranges,
         "median": {label: {k: statistics.median([runs[f"{label} | seed={s}"][k] for s in seeds]) for k in KEYS}
                    for label in ranges}}, indent=1) + "\n")
    print(f"wrote {RESULTS_DIR / stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
