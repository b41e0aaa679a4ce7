"""What declaring extra pages and not training all of them pays, against declaring only what was trained,
in the score book under production's rules and two earlier ones.

    python -m benchmarks.incentive.over_declaring [--seeds 16] [--windows 150] [--noise 0.5 2.0]

A model of production's pages, not a localnet: A = `data.pages_per_window` assigned pages, one evaluated
(`data.eval_pages`), 16 units a page. A peer that trains its A assigned pages and T declared ones spreads
its bounded step over A + T pages, so each trained page shows a gap of GAP·A / (A + T); an untrained page
shows none. Which declared pages an evaluation reads is the real draw (`gauntlet.evaluated_pages`, by the
rule under test, keyed by a seed), whether a read declared page was trained is drawn at the trained share
t. Every unit, and each random page's, carries Gaussian noise of `--noise` times GAP. Each run: six
honest miners, one that declares K and trains a share t of them ("over"), one that declares
round(t·K) and trains them all ("truthful", the same work), one that declares none; `--windows`
evaluations each, then the book's weights against the honest median. Per (rule, noise, K, t): the mean
over `--seeds` runs of each peer's pay, the ratio over/truthful, and in how many runs over earned more.

Rules: production (`in_proportion_on_average` reading, `work` class weights), every declared page read
in proportion with work weights, and the rule before both (`in_proportion`, `units`). Writes
benchmarks/results/over_declaring.json.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from templar.core.config import GauntletConfig, load_hparams
from templar.gauntlet import PrimaryResult, ScoreBook, evaluated_pages

RESULTS = Path(__file__).resolve().parents[1] / "results" / "over_declaring.json"
UNITS, GAP, RAND = 16, 0.02, 0.05
RULES = {"production": ("in_proportion_on_average", "work"), "every evaluation, work": ("in_proportion", "work"),
         "before (every evaluation, units)": ("in_proportion", "units")}
CASES = [(6, 0.5), (14, 0.5), (14, 0.6), (22, 0.6), (29, 0.5), (29, 0.7), (29, 0.8), (29, 0.9)]


def evaluation(rng: random.Random, rule: str, uid: int, window: int, pages: int, declared: int, trained: float,
               noise: float, seed: int) -> PrimaryResult:
    gap = GAP * pages / (pages + trained * declared)
    read = evaluated_pages(seed, window, uid, list(range(pages)), list(range(10_000, 10_000 + declared)), 1, rule)
    gaps = [gap if page < 10_000 or rng.random() < trained else 0.0 for page in read]
    units = tuple(RAND + g + rng.gauss(0.0, noise) for g in gaps for _ in range(UNITS))
    mean = sum(units) / len(units)
    return PrimaryResult(mean, RAND, (mean,), units, work=(pages + declared) / pages,
                         declared_units=UNITS * sum(page >= 10_000 for page in read),
                         random_units=tuple(RAND + rng.gauss(0.0, noise) for _ in range(UNITS)))


def run(rules: GauntletConfig, pages: int, peers: dict[str, tuple[int, float]], noise: float, seed: int,
        windows: int) -> dict[str, float]:
    rng = random.Random(seed)
    everyone = {**{f"honest{i}": (0, 1.0) for i in range(6)}, **peers}
    book = ScoreBook()
    for uid, hotkey in enumerate(everyone):
        book.get_or_create(hotkey, uid, window=0)
    for window in range(windows):
        book.record_primary(rules, {hotkey: evaluation(rng, rules.declared_pages_evaluated, uid, window, pages,
                                                       declared, trained, noise, seed)
                                    for uid, (hotkey, (declared, trained)) in enumerate(everyone.items())},
                            window=window)
    weights = book.weights(rules)
    median = sorted(weights[f"honest{i}"] for i in range(6))[3]
    return {hotkey: weights[hotkey] / median for hotkey in peers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--windows", type=int, default=150)
    parser.add_argument("--noise", type=float, nargs="+", default=[0.5, 2.0], help="unit noise, in gaps")
    args = parser.parse_args(argv)
    hp = load_hparams("hparams.json")
    pages, rows = hp.data.pages_per_window, []
    for name, (reading, weights) in RULES.items():
        rules = hp.gauntlet.model_copy(update={"declared_pages_evaluated": reading, "class_credit_weights": weights})
        for noise in args.noise:
            for declared, trained in CASES:
                truthful = round(trained * declared)
                peers = {"over": (declared, trained), "truthful": (truthful, 1.0), "none": (0, 1.0)}
                runs = [run(rules, pages, peers, noise * GAP, seed, args.windows) for seed in range(args.seeds)]
                mean = {who: sum(r[who] for r in runs) / len(runs) for who in peers}
                row = {"rule": name, "noise": noise, "declared": declared, "trained_share": trained,
                       "truthful_declared": truthful, **{who: round(v, 3) for who, v in mean.items()},
                       "over_vs_truthful": round(mean["over"] / mean["truthful"], 3),
                       "over_earned_more": f"{sum(r['over'] > r['truthful'] for r in runs)}/{len(runs)}"}
                rows.append(row)
                print(json.dumps(row), flush=True)
    RESULTS.write_text(json.dumps({"seeds": args.seeds, "windows": args.windows, "rows": rows}, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
