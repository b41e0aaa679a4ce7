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
    for seed, s in summaries.items():
        print(line(seed, s))
    args.results.write_text(json.dumps({"hparams": args.hparams, "windows": args.windows,
                                        "adversaries": ADVERSARIES, "seeds": summaries}, indent=1))
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
