"""The subnet simulator against the localnets it was fitted on: the same shape through both, compared.

    python -m benchmarks.incentive.subnet_sim_residuals --runs fair-pay/seed0 fair-pay/seed1 fair-pay/seed2

The simulator resamples each strategy's evaluations independently, one per evaluated peer and
window. A localnet's evaluations are not independent: the peers evaluated in one window share its
level (three quarters of an honest gap's variance, `subnet_sim_fit.window_share`). Whether that
matters for pay is what this measures. Each localnet's own shape is simulated on the fit made from
those localnets (`UNITS_FIT_FILE`, drawn at the size they read): one validator, its miners by
strategy, its preset's rules and sizes, as many windows, every window scored, at `--sims` seeds.
The simulated lead's weights over the second half are read as `fair_pay.summarise` reads the
localnet's; the residual is the localnet's figure less the simulator's median, and where the
localnet falls among the simulator's seeds says whether one localnet is a likely draw of it. Each
strategy that trains is also paid per token (its trained tokens over an honest miner's, as the
localnet counted them) over the weakest honest miner, seed by seed: fair pay's third item at many
more draws than three localnets.

Miners the localnet never evaluated (its fast evaluation caught `copycat` and `partial` every time)
or evaluated once (`scaled`, tried in the first scored window, which has no typical size to check it
against, and caught by the scale check in every window after) are drawn as the simulator's copycat,
which fails fast evaluation whenever sampled; of a `pooled` operator's hotkeys one is rated and the
others are caught as `copy`, so one is drawn as `pooled` and the rest as copycats. Writes `benchmarks/results/subnet_sim_residuals.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

from benchmarks.incentive.fair_pay import CHEAT_PER_TOKEN_MAX, HONEST_COMPUTE, PRESET, summarise
from benchmarks.incentive.subnet_sim import RESULTS_DIR, SimConfig, build_peers, simulate
from benchmarks.incentive.subnet_sim_fit import UNITS_FIT_FILE, fit
from benchmarks.incentive.subnet_sim_production import production_settings
from templar.core.config import load_hparams

FAIR_TARGET = 1.5
"""Fair pay's target for identical honest miners' max/min (docs/scoring.md §11): the share of the
simulator's seeds within it is the chance that one localnet of that shape meets it."""
MOREDATA_TARGET = 1.3
"""Twice the pages, trained, earns at least this many times the honest median (docs/scoring.md §4)."""


def drawn_as_themselves(source: dict) -> set[str]:
    """The strategies a fit of whole evaluations can draw with their own spread: those it holds at
    least two evaluations of (a strategy evaluated once was caught in every window after it)."""
    return {strategy for strategy, evaluations in source["evaluations"].items() if len(evaluations) > 1}


def localnet_mix(run: Path, evaluated: set[str]) -> tuple[tuple[str, int], ...]:
    """A localnet's miners by strategy as the simulator draws them: the strategies the fit holds
    (`evaluated`) as they are, one hotkey of a pool as `pooled`, every other as a copycat."""
    nodes = json.loads((run / "nodes.json").read_text())
    counts = Counter(n["strategy"] for n in nodes if n["role"] == "miner")
    drawn: Counter[str] = Counter()
    for strategy, count in counts.items():
        rated = 1 if strategy == "pooled" else count if strategy in evaluated else 0
        drawn[strategy] += rated
        drawn["copycat"] += count - rated
    return tuple(sorted((s, n) for s, n in drawn.items() if n))


def work_shares(run: Path) -> dict[str, float]:
    """Each strategy's trained tokens over the honest miners' median, as the localnet counted them
    (`trained_tokens` in its report; a pool's is one member's): what the simulator's pay per token
    divides by."""
    miners = [p for p in json.loads((run / "report.json").read_text())["peers"] if p["role"] == "miner"]
    honest = statistics.median(p["trained_tokens"] for p in miners if p["strategy"] == "honest")
    shares: dict[str, float] = {}
    for p in miners:
        shares.setdefault(p["strategy"], p["trained_tokens"] / honest if honest else 0.0)
    return shares


def simulated(cfg: SimConfig, work: dict[str, float] | None = None) -> dict:
    """One simulation of a localnet's shape: the honest spread, `moredata` over the honest median and
    each other strategy that trains (`work`: its tokens over an honest miner's) per token over the
    weakest honest miner, from the lead's weights over the second half (as `fair_pay.summarise` reads
    a localnet; a strategy's best-paid hotkey)."""
    with warnings.catch_warnings():  # the default subnet's newcomer classes are absent: their means are empty
        warnings.simplefilter("ignore", RuntimeWarning)
        outcome = simulate(cfg, keep_series=True)
    peers = build_peers(cfg, random.Random(cfg.seed))
    weight = outcome.series["lead_weight_second_half"]
    honest = [weight[p.uid] for p in peers if p.strategy == "honest"]
    moredata = [weight[p.uid] for p in peers if p.strategy == "moredata"]
    per_token: dict[str, float] = {}
    for p in peers:
        share = (work or {}).get(p.strategy, 0.0)
        if p.strategy not in ("honest", "moredata") and share > 0 and min(honest) > 0:
            per_token[p.strategy] = max(per_token.get(p.strategy, 0.0), weight[p.uid] / share / min(honest))
    return {"honest_max_over_min": max(honest) / min(honest) if min(honest) > 0 else float("inf"),
            "moredata_over_honest": statistics.fmean(moredata) / statistics.median(honest) if moredata else None,
            "per_token_over_weakest_honest": per_token}


def adversaries_above(sim: list[dict]) -> dict[str, float]:
    """The share of simulated seeds in which some adversary that `fair_pay.verdict` holds to its ceiling
    (every one but the honest-compute two) is paid more per trained token than the ceiling, and than the
    weakest honest miner itself: how often one localnet seed would miss each by the draw alone."""
    def share(ceiling: float) -> float:
        return sum(any(v > ceiling for k, v in s["per_token_over_weakest_honest"].items() if k not in HONEST_COMPUTE)
                   for s in sim) / len(sim)
    return {"verdict_ceiling": share(CHEAT_PER_TOKEN_MAX), "weakest_honest": share(1.0)}


def residuals(runs: list[Path], preset: str, sims: int, rules: tuple[tuple[str, float], ...] = ()) -> dict:
    """Per localnet: its measured figures, where they fall among the simulator's at its shape
    (`sims` seeds: median, 10th and 90th percentiles, the share of seeds at or below the localnet),
    and the residual, the localnet's figure less the simulator's median. Localnets of one shape
    share one set of simulations. `rules`: Gauntlet rules by hparams name, in place of the preset's."""
    hp = load_hparams(preset)
    g = hp.gauntlet
    source = fit(UNITS_FIT_FILE)
    shapes: dict[tuple, list[dict]] = {}
    rows = {}
    for run in runs:
        measured = summarise(run)
        mix = localnet_mix(run, drawn_as_themselves(source))
        if (mix, measured["windows"]) not in shapes:
            base = replace(SimConfig(), **production_settings(hp), mix=mix, validators=1,
                           uids=1 + sum(n for _, n in mix), uids_per_window=g.uids_per_window,
                           fast_eval_uids=g.fast_eval_uids, top_g=g.top_g, windows=measured["windows"],
                           join_window=measured["windows"], fit_file=str(UNITS_FIT_FILE), rules=rules)
            work = work_shares(run)
            shapes[(mix, measured["windows"])] = [simulated(replace(base, seed=seed), work) for seed in range(sims)]
        sim = shapes[(mix, measured["windows"])]
        rows[run.name] = {"mix": dict(mix), "windows": measured["windows"]}
        for key in ("honest_max_over_min", "moredata_over_honest"):
            values = sorted(s[key] for s in sim)
            median = statistics.median(values)
            deciles = statistics.quantiles(values, n=10)
            rows[run.name][key] = {
                "localnet": measured[key], "simulator_median": median,
                "simulator_p10_p90": [deciles[0], deciles[-1]],
                "simulator_at_or_below_localnet": sum(v <= measured[key] for v in values) / len(values),
                "residual": measured[key] - median}
        rows[run.name]["moredata_over_honest"]["simulator_at_least_target"] = (
            sum(s["moredata_over_honest"] >= MOREDATA_TARGET for s in sim) / len(sim))
        rows[run.name]["per_token_over_weakest_honest"] = {
            strategy: {"simulator_median": statistics.median(values), "simulator_max": max(values),
                       "simulator_above_weakest_honest": sum(v > 1.0 for v in values) / len(values)}
            for strategy in sorted({k for s in sim for k in s["per_token_over_weakest_honest"]})
            for values in [[s["per_token_over_weakest_honest"].get(strategy, 0.0) for s in sim]]}
        rows[run.name]["any_adversary_above"] = adversaries_above(sim)
        h = rows[run.name]["honest_max_over_min"]
        h["simulator_within_target"] = sum(s["honest_max_over_min"] <= FAIR_TARGET for s in sim) / len(sim)
        print(f"  {run.name}: honest max/min localnet {h['localnet']:.2f}, simulator {h['simulator_median']:.2f} "
              f"(p10–p90 {h['simulator_p10_p90'][0]:.2f}–{h['simulator_p10_p90'][1]:.2f}, "
              f"{h['simulator_at_or_below_localnet']:.0%} of {sims} seeds at or below, "
              f"{h['simulator_within_target']:.0%} within {FAIR_TARGET}×) | moredata/honest localnet "
              f"{rows[run.name]['moredata_over_honest']['localnet']:.2f}, simulator "
              f"{rows[run.name]['moredata_over_honest']['simulator_median']:.2f} "
              f"({rows[run.name]['moredata_over_honest']['simulator_at_least_target']:.0%} of seeds at least "
              f"{MOREDATA_TARGET}×)", flush=True)
        print("    per token over the weakest honest miner (simulator median, max, share of seeds above 1): " + ", ".join(
            f"{k} {v['simulator_median']:.2f} {v['simulator_max']:.2f} {v['simulator_above_weakest_honest']:.0%}"
            for k, v in rows[run.name]["per_token_over_weakest_honest"].items()), flush=True)
        above = rows[run.name]["any_adversary_above"]
        print(f"    some adversary per token above the verdict's {CHEAT_PER_TOKEN_MAX}: {above['verdict_ceiling']:.1%} "
              f"of seeds; above the weakest honest miner: {above['weakest_honest']:.1%}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="the fit's localnet --out folders")
    parser.add_argument("--hparams", default=str(PRESET), help="the preset the localnets ran")
    parser.add_argument("--sims", type=int, default=200, help="simulator seeds per localnet shape")
    parser.add_argument("--rule", action="append", default=[], metavar="NAME=VALUE",
                        help="a Gauntlet rule in place of the preset's (e.g. mu_tie_band=0); repeat for several")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "subnet_sim_residuals.json")
    args = parser.parse_args(argv)
    rules = tuple((name, float(value)) for name, _, value in (r.partition("=") for r in args.rule))
    rows = residuals(args.runs, args.hparams, args.sims, rules)
    args.out.write_text(json.dumps({"fit": UNITS_FIT_FILE.name, "preset": Path(args.hparams).name,
                                    "rules": dict(rules), "sims": args.sims, "localnets": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
