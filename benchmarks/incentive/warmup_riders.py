"""Miners that train one window in `cycle` and post warm-ups between: what they are paid per unit of compute,
with the warm-up budget (`gauntlet.warmup_overdue_horizon`, production's) and without it (the rule before).

    python -m benchmarks.incentive.warmup_riders [--seeds 0 1 2] [--cycles 11 4 2]

A warm-up upload passes fast evaluation, is never rated and leaves μ as it was; any other verdict ends a
warm-up episode. So a miner that trained until its score was good, then posted ten warm-ups and one trained
upload, and again, never overran one episode's allowance (`warmup_overdue_windows`). It is drawn for primary
evaluation only in its trained windows, so its μ and rating see honest work only. Its hotkeys sort first, so
that where identical honest scores tie exactly the top-G (in every validator's F_t every window) takes them.

One validator's book under production's rules (`hparams.json`), the real draws and scoring
(`gauntlet.draw_window`, `score_window`), honest evaluations resampled from production's fit (as
`benchmarks/incentive/subnet_sim.py` draws them): 256 uids, 8 riders, honest work for everyone until window
300, then the riders ride until window 900. Per run: each rider's pay over windows 400-900 against the honest
median, and per unit of compute (times `cycle`). The baseline is the same run with the budget off
(`warmup_overdue_horizon` 0). Writes benchmarks/results/warmup_riders.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks.incentive.subnet_sim import CHOSEN, SimConfig
from benchmarks.incentive.subnet_sim_fit import UNITS_FIT_FILE, draw, fit
from templar.core.config import GauntletConfig, load_hparams
from templar.gauntlet import FastVerdict, ScoreBook, Status, draw_window, score_window

RESULTS = Path(__file__).resolve().parents[1] / "results" / "warmup_riders.json"
UIDS, RIDERS, RIDE, MEASURE, END = 256, 8, 300, 400, 900


def run(rules: GauntletConfig, cycle: int, seed: int) -> dict:
    """One validator's windows with `RIDERS` miners training one window in `cycle` from `RIDE` on."""
    cfg = replace(SimConfig(), **CHOSEN, fit_file=str(UNITS_FIT_FILE), seed=seed)
    source, rng = fit(Path(cfg.fit_file)), random.Random(seed)
    every = load_hparams().windows.peer_replacement_frequency
    riders = [f"a-rider{i}" for i in range(RIDERS)]  # sort before the honest hotkeys: first in exact ties
    honest = [f"h{i:03d}" for i in range(UIDS - RIDERS)]
    registry = {hk: uid for uid, hk in enumerate([*riders, *honest])}
    book, secret, peer_list = ScoreBook(), rng.getrandbits(64), []
    pay = dict.fromkeys(registry, 0.0)

    def trains(hotkey: str, window: int) -> bool:
        return hotkey not in riders or window < RIDE or (window + riders.index(hotkey)) % cycle == 0

    for window in range(END):
        drawn = draw_window(book, rules, secret ^ window, window, registry, peer_list)
        verdicts = {hk: FastVerdict(Status.OK if trains(hk, window) else Status.WARMUP) for hk in drawn.fast}
        losses = {hk: draw("honest", rng, cfg.noise, 0.0, 3.66, source, cfg.eval_size) for hk in drawn.primary(verdicts)}
        scores = score_window(book, rules, window, registry, verdicts, losses, seed=secret ^ window)
        if window % every == 0:
            peer_list = scores.top_g
        if window >= MEASURE:
            for hk in pay:
                pay[hk] += scores.weights.get(hk, 0.0)
    median = statistics.median(pay[hk] for hk in honest)
    paid = [pay[hk] / median for hk in riders]
    return {"rider_pay_over_honest_median": statistics.mean(paid), "rider_pay_per_compute": statistics.mean(paid) * cycle,
            "riders_failed_fast_evaluations": statistics.mean(book.peers[hk].fast_eval_fails for hk in riders)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cycles", type=int, nargs="+", default=[11, 4, 2])
    args = parser.parse_args(argv)
    production = replace(SimConfig(), **CHOSEN).gauntlet()
    variants = {"production": production,
                "before (no budget)": production.model_copy(update={"warmup_overdue_horizon": 0})}
    out: dict[str, dict] = {}
    for cycle in args.cycles:
        for name, rules in variants.items():
            runs = [run(rules, cycle, seed) for seed in args.seeds]
            row = out[f"cycle {cycle}, {name}"] = {key: [round(r[key], 3) for r in runs] for key in runs[0]}
            print(f"cycle {cycle:2d} (trains 1/{cycle}), {name:18s} pay / honest median {row['rider_pay_over_honest_median']}"
                  f" | per unit of compute {row['rider_pay_per_compute']} | failed fast evaluations "
                  f"{row['riders_failed_fast_evaluations']}")
        now, before = (statistics.mean(out[f"cycle {cycle}, {name}"]["rider_pay_per_compute"]) for name in variants)
        print(f"cycle {cycle:2d}: per unit of compute, production / before = {now / max(before, 1e-12):.3f}")
    RESULTS.write_text(json.dumps({"seeds": args.seeds, "runs": out}, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
