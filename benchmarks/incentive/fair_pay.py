"""Fair pay in a crowded localnet: identical miners' spread, and pay per unit of compute.

    python -m benchmarks.incentive.fair_pay                              # seeds 0-2, 16 windows, one at a time (~5 min each)
    python -m benchmarks.incentive.fair_pay --hparams PRESET --out-root DIR
    python -m benchmarks.incentive.fair_pay --reuse --out-root DIR       # summarise finished runs again

Runs `templar localnet --in-process` once per seed with one validator, 4 honest miners and the
project's adversaries (`ADVERSARIES`: 18 miners in all, a pool being 3 hotkeys, so a window evaluates 8 of them, as
production evaluates 8 of 256), on production's Gauntlet and inner loop on the `micro` model
(`benchmarks/presets/micro_gauntlet_8pages.json` by default). Reads the validator's weights per
window from the report and prints, per seed:

- the honest spread: max/min of the honest miners' mean weight over the second half of the run
  (what an operator sees over hours, not one window's draw);
- each other miner's pay per trained token over the weakest honest miner's (a `pooled` group's
  total pay over one member's tokens: the group's work is done once);
- `moredata` (twice the pages, declared) over the honest median, and every other miner's pay over it
  (`over_honest_median`; a group's total).

and checks each seed against the targets (`verdict`): identical honest miners within
`HONEST_SPREAD_MAX` of each other; `moredata` paid within `MOREDATA_OVER_MEDIAN`; `overfit` (honest
compute at a worse inner rate) never above the best honest miner; every other adversary at most
`CHEAT_PER_TOKEN_MAX` of the weakest honest miner's pay per trained token. A seed that misses one is
named with the figure, and the command exits 1.

Writes `benchmarks/results/fair_pay.json` (`--results` for another file).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.incentive.localnet_consensus import PRESET, run_localnet, run_seeds

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fair_pay.json"
ADVERSARIES = ("moredata", "overclaim", "thin", "short", "partial", "pooled", "overfit", "copycat", "lazy", "noise",
               "scaled", "freerider")


HONEST_SPREAD_MAX = 1.5
"""Identical honest miners: max/min of their mean weight over the second half."""
MOREDATA_OVER_MEDIAN = (1.3, 2.0)
"""Twice the pages, declared and trained: at least 1.3x the honest median, less than twice it (it is twice
the compute; more would pay a miner to declare pages whose gain no one could tell from noise)."""
CHEAT_PER_TOKEN_MAX = 0.5
"""Every adversary but the two honest-compute ones, per trained token over the weakest honest miner (a
pool's total over one member's tokens). Six seeds of the default preset (2026-12-04,
`benchmarks/results/fair_pay_first_window.json`): at most 0.37 (`short` at seed 3; `overclaim` 0.30 at
seed 1); the ceiling leaves that worst seed a 1.35x margin, and the property itself is < 1. The simulator at
this localnet's shape, on the fit of those six runs (200 seeds, benchmarks/LOG.md §72), puts some adversary
this ceiling judges above 0.5 in 16.5 % of seeds (`pooled` 14, `thin` 11, `short` 9, `overclaim` 3 of 200)
and above 1 in 4.5 %: the six seeds all within it were a 34 % draw, so a seed that misses it names a tail the
simulator expects about one seed in six, not by itself a regression."""
HONEST_COMPUTE = ("moredata", "overfit")
"""Honest work, paid as such: `moredata` by `MOREDATA_OVER_MEDIAN`; `overfit` (the same compute at 4x the
inner rate) trains the assigned pages harder for no larger held-out gain, so it is paid like an honest
miner (0.57-0.96x the honest median over the six seeds), never above the best one; per token it sits
inside the honest spread (1.04x the weakest honest miner at seed 2, where that one drew 0.93x the others)."""


def summarise(out: Path) -> dict:
    """The second half's mean weights, the honest spread and every miner's pay per trained token."""
    report = json.loads((out / "report.json").read_text())
    miners = [p for p in report["peers"] if p["role"] == "miner"]
    history = {p["name"]: dict(p["weight_history"]) for p in miners}  # window -> the validator's weight
    windows = sorted({w for h in history.values() for w in h})
    second_half = windows[len(windows) // 2:]
    mean = {name: statistics.fmean(h.get(w, 0.0) for w in second_half) for name, h in history.items()}
    tokens = {p["name"]: p["trained_tokens"] for p in miners}
    honest = sorted(p["name"] for p in miners if p["strategy"] == "honest")
    per_token = {n: mean[n] / tokens[n] for n in honest if tokens[n]}
    weakest = min(per_token.values())
    groups: dict[str, list[str]] = {}
    for p in miners:
        if p["strategy"] != "honest":
            key = p["name"].rpartition("-")[0] if p["strategy"] in ("pooled", "flood", "faint") else p["name"]
            groups.setdefault(key, []).append(p["name"])
    relative = {key: (sum(mean[n] for n in names) / max(1, tokens[names[0]])) / weakest
                for key, names in sorted(groups.items())}
    paid = [mean[n] for n in honest]
    median = statistics.median(paid)
    return {"out": str(out), "windows": len(windows), "honest_second_half": {n: mean[n] for n in honest},
            "honest_max_over_min": max(paid) / min(paid) if min(paid) > 0 else float("inf"),
            "moredata_over_honest": mean.get("moredata0", 0.0) / median,
            "per_token_over_weakest_honest": relative,
            "over_honest_median": {key: sum(mean[n] for n in names) / median for key, names in sorted(groups.items())}}


def verdict(s: dict) -> list[str]:
    """The targets a seed's summary misses, one line each with its figure; empty when every one holds."""
    misses = []
    if s["honest_max_over_min"] > HONEST_SPREAD_MAX:
        misses.append(f"honest max/min {s['honest_max_over_min']:.2f} > {HONEST_SPREAD_MAX}")
    low, high = MOREDATA_OVER_MEDIAN
    if "moredata0" in s["over_honest_median"] and not low <= s["moredata_over_honest"] < high:
        misses.append(f"moredata {s['moredata_over_honest']:.2f}x the honest median, outside [{low}, {high})")
    paid = list(s["honest_second_half"].values())
    best_honest = max(paid) / statistics.median(paid)
    for key, per_token in s["per_token_over_weakest_honest"].items():
        strategy = key.rstrip("0123456789")
        if strategy == "overfit" and s["over_honest_median"][key] > best_honest + 1e-9:
            misses.append(f"{key} {s['over_honest_median'][key]:.2f}x the honest median, above the best honest "
                          f"miner's {best_honest:.2f}x")
        elif strategy not in HONEST_COMPUTE and per_token > CHEAT_PER_TOKEN_MAX:
            misses.append(f"{key} {per_token:.2f}x the weakest honest miner per token > {CHEAT_PER_TOKEN_MAX}")
    return misses


def line(seed: int, s: dict) -> str:
    worst = max((v, k) for k, v in s["per_token_over_weakest_honest"].items() if not k.startswith("moredata"))
    return (f"seed {seed}: honest max/min {s['honest_max_over_min']:.2f} (second half) | moredata/honest "
            f"{s['moredata_over_honest']:.2f} | best other per token {worst[0]:.2f} ({worst[1]}) | "
            + " ".join(f"{k} {v:.2f}" for k, v in s["per_token_over_weakest_honest"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--hparams", default=str(PRESET))
    parser.add_argument("--jobs", type=int, default=1, help="localnets at once (each one torch thread; on 2 cores "
                        "keep 1: the overlapped window waits on wall-clock time, and three at once left miners missing)")
    parser.add_argument("--out-root", type=Path, default=Path("fair-pay"))
    parser.add_argument("--reuse", action="store_true", help="summarise runs already in --out-root")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()

    outs = {seed: args.out_root / f"seed{seed}" for seed in args.seeds}
    if not args.reuse and not run_seeds(outs, args.jobs, lambda seed, out: run_localnet(
            out, seed=seed, windows=args.windows, hparams=args.hparams, validators=1, miners=4,
            adversaries=ADVERSARIES)):
        return 1
    summaries = {seed: summarise(out) for seed, out in outs.items()}
    misses = {seed: verdict(s) for seed, s in summaries.items()}
    for seed, s in summaries.items():
        print(line(seed, s))
        print(f"seed {seed}: " + ("every target holds" if not misses[seed] else "MISSES " + "; ".join(misses[seed])))
    args.results.write_text(json.dumps({"hparams": args.hparams, "windows": args.windows,
                                        "adversaries": ADVERSARIES, "seeds": summaries, "misses": misses}, indent=1))
    print(f"wrote {args.results}")
    return 1 if any(misses.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
