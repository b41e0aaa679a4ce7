"""Does the sync check catch a miner that stops following the run's model, under each outer rule?

    nice python -m benchmarks.incentive.desync_rules          # two in-process localnets, a few minutes on 2 cores

Runs `templar localnet --in-process` (virtual time) on `tests/presets/micro-gauntlet.json`
(production's Gauntlet, H = 2 inner AdamW steps, the micro model) with 3 honest miners and the
`desync` adversary (it applies the aggregates of its first two windows, then never again), once
under the signed rule and once under SparseLoCo at the convergence benchmark's best settings
(`optimizer.outer_schedule` constant, α = 2, top-64, error feedback 0.95; benchmarks/LOG.md §9).
The sync score (docs/scoring.md §2) counted distances in units of α, which a signed step moves every
coordinate by; a SparseLoCo step moves a sparse set of coordinates by about α times a small value, so a
model many windows behind read as "in sync" (the first measurement: `desync` 7 windows `ok`, weight
0.242 against honest 0.21-0.28). The score now counts a sparse rule's own steps, measured at the probe
positions at each step the validator takes (`templar.validator.base`), and this benchmark is its check.
Prints each miner's statuses and final weight, and
writes `benchmarks/results/desync_rules.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from tempfile import TemporaryDirectory

from benchmarks._common import RESULTS_DIR, setup_torch, write_result

PRESET = Path(__file__).resolve().parents[2] / "tests" / "presets" / "micro-gauntlet.json"
RULES: dict[str, dict] = {
    "signed": {},
    "sparseloco": {"optimizer": {"method": "sparseloco", "learning_rate": 2.0, "weight_decay": 0.0,
                                 "outer_schedule": "constant"},
                   "demo": {"topk": 64, "momentum_decay": 0.95}},
}


def run(rule: str, folder: Path, windows: int, seed: int) -> list[dict]:
    from templar.localnet.runner import LocalnetConfig, run_localnet

    hparams = folder / f"{rule}.json"
    hparams.write_text(json.dumps({"base": str(PRESET), "name": f"micro-{rule}", **RULES[rule]}))
    report = run_localnet(LocalnetConfig(out=folder / rule, miners=3, windows=windows, hparams=str(hparams), seed=seed,
                                         live=False, in_process=True, adversaries=[("desync", 1)]))
    return [{"rule": rule, "name": p["name"], "strategy": p["strategy"], "final_weight": p["final_weight"],
             "statuses": p["statuses"]} for p in report["peers"] if p["role"] == "miner"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    setup_torch()
    rows = []
    with TemporaryDirectory() as tmp:
        for rule in RULES:
            rows += run(rule, Path(tmp), args.windows, args.seed)
    for row in rows:
        print(f"{row['rule']:<11} {row['name']:<9} {row['strategy']:<7} weight {row['final_weight']:.4f}  "
              f"{row['statuses']}")
    write_result("desync_rules.json", {"windows": args.windows, "seed": args.seed, "preset": PRESET.name,
                                       "rules": RULES, "miners": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
