"""The scoring rules confirmed in a localnet: several validators, Yuma, `moredata` next to honest miners.

    nice python -m benchmarks.incentive.localnet_consensus                      # seeds 0-2, 3 runs at once
    python -m benchmarks.incentive.localnet_consensus --reuse --out-root DIR    # summarise finished runs again

Runs `templar localnet --in-process` (virtual time: the outcome depends on the seed alone) once per
seed with 3 validators (stakes 10,000 / 500 / 333), 4 honest miners, `moredata` (the production
miner with `--extra-pages`, twice the work, declared), `overclaim` (declares the run's most extra
pages, trains only its assigned ones) and the `lazy`, `copycat` and `noise` cheats. The
default preset (`benchmarks/presets/micro_gauntlet_8pages.json`) is production's Gauntlet (the
relative LossRating, stale-first selection, μ ramp k = 0, the proof of computation by size) and
production's inner loop (H = 2 inner AdamW steps here) on the `micro` model with 8 pages per window
and evaluation, four times `tiny`'s tokens. 32 windows by default: with every peer evaluated each
window, 16 windows give each μ about 15 evaluations, too few to hold identical honest miners within
1.5× at every seed (benchmarks/LOG.md §8). `benchmarks/presets/micro_sgd_sign_proof_8pages.json`
is the same localnet before inner steps and the proof by size (one SGD step, the paper's sign;
benchmarks/LOG.md §6).
Each run is its own process with one torch thread, so `--jobs` runs share the cores; three
32-window runs take about 20 minutes on 2 cores.
Reads back what an operator reads (the report's consensus rows: each validator's weights and the
incentive after Yuma) and what explains it (each validator's score book: the window's spread σ̂
of relative LossScores and `moredata`'s relative δ_rand). Prints one line per seed and writes
`benchmarks/results/localnet_consensus_micro_gauntlet.json` (`--results` for another file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "localnet_consensus_micro_gauntlet.json"
PRESET = Path(__file__).resolve().parents[1] / "presets" / "micro_gauntlet_8pages.json"
ADVERSARIES = ("moredata", "overclaim", "lazy", "copycat", "noise")
PAID_CLASSES = ("honest", "moredata")
LAST = 6
"""Windows at the end of a run whose mean incentive is compared (one window alone is one draw)."""


def run_localnet(out: Path, *, seed: int, windows: int, hparams: str, validators: int, miners: int,
                 adversaries: tuple[str, ...] = ADVERSARIES) -> subprocess.Popen:
    """One in-process localnet in a process of its own (one torch thread); its log is `out`.log."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "templar.cli", "localnet", "--in-process", "--no-dashboard", "--no-live",
           "--validators", str(validators), "--miners", str(miners), "--windows", str(windows),
           "--hparams", hparams, "--seed", str(seed), "--out", str(out),
           *[flag for name in adversaries for flag in ("--adversary", name)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 - the child holds it until it exits
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def run_seeds(outs: dict[int, Path], jobs: int, start: Callable[[int, Path], subprocess.Popen]) -> bool:
    """One localnet per seed (`start(seed, out)`), `jobs` at a time, waited for in order; False (and
    the log's path) at the first that fails."""
    pending = list(outs.items())
    running: list[tuple[int, subprocess.Popen]] = []
    while pending or running:
        while pending and len(running) < jobs:
            seed, out = pending.pop(0)
            print(f"seed {seed}: running in {out}", flush=True)
            running.append((seed, start(seed, out)))
        seed, proc = running.pop(0)
        if proc.wait() != 0:
            print(f"seed {seed}: the localnet failed (exit {proc.returncode}); see {outs[seed].with_suffix('.log')}")
            return False
    return True


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def evaluation_noise(out: Path, nodes: list[dict]) -> dict[str, dict]:
    """Per validator: the median over windows of σ̂ (the robust spread of that window's relative
    LossScores, as the score book measures it under the run's rules) and the mean relative δ_rand
    of `moredata` and of the honest miners, from the validator's own score records."""
    from templar.core.config import load_hparams
    from templar.gauntlet.rating import relative_loss_scores, relative_spread

    own = out / "hparams.json"  # a seeded run's own file; else the rules' defaults, production's
    rules = load_hparams(str(own) if own.exists() else None).gauntlet
    relative_rule = {"clip": (rules.relative_clip_low, rules.relative_clip_high),
                     "min_players": rules.relative_min_players, "resolution": rules.proof_gap_resolution}

    strategy = {n["hotkey"]: n["strategy"] for n in nodes}
    found = {}
    for validator in (n for n in nodes if n["role"] == "validator"):
        by_window: dict[int, dict[str, float]] = {}
        for line in (out / "nodes" / validator["name"] / "scores.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("evaluated") and rec.get("delta_rand") is not None:
                by_window.setdefault(rec["window"], {})[rec["hotkey"]] = rec["delta_rand"]
        spreads, relative = [], {"honest": [], "moredata": []}
        for results in by_window.values():
            scores = relative_loss_scores(results, **relative_rule)
            if (spread := relative_spread(scores, results, min_players=rules.relative_min_players,
                                          resolution=rules.proof_gap_resolution)) is not None:
                spreads.append(spread)
            for hotkey, x in scores.items():
                if strategy.get(hotkey) in relative:
                    relative[strategy[hotkey]].append(x)
        found[validator["name"]] = {
            "median_spread": statistics.median(spreads) if spreads else None,
            "moredata_relative": statistics.fmean(relative["moredata"]) if relative["moredata"] else None,
            "honest_relative": statistics.fmean(relative["honest"]) if relative["honest"] else None,
            "evaluations_of_moredata": len(relative["moredata"]),
        }
    return found


def summarise(out: Path) -> dict:
    """The run's outcome after Yuma (final window and the mean of the last `LAST`), agreement,
    vtrust, what the cheats earned, the held-out loss, and the validators' evaluation noise."""
    report = json.loads((out / "report.json").read_text())
    nodes = json.loads((out / "nodes.json").read_text())
    rows = [r for r in report["consensus"] if r["window"] >= 1]
    kind = {p["name"]: p["strategy"] for p in report["peers"] if p["role"] == "miner"}
    honest = sorted(name for name, s in kind.items() if s == "honest")
    cheats = sorted(name for name, s in kind.items() if s not in PAID_CLASSES)
    final, tail = rows[-1], rows[-LAST:]
    mean_tail = {name: statistics.fmean(r["incentive"].get(name, 0.0) for r in tail) for name in kind}

    def outcome(incentive: dict[str, float]) -> dict:
        paid = [incentive[n] for n in honest]
        return {"honest_min": min(paid), "honest_max": max(paid), "honest_max_over_min": _ratio(max(paid), min(paid)),
                "moredata": incentive.get("moredata0", 0.0),
                "moredata_over_honest": _ratio(incentive.get("moredata0", 0.0), statistics.median(paid)),
                "overclaim_over_honest": _ratio(incentive.get("overclaim0", 0.0), statistics.median(paid)),
                "cheats_total": sum(incentive[n] for n in cheats)}

    windows = report["windows"]
    return {
        "out": str(out), "windows": len(rows),
        "final": outcome(final["incentive"]), f"last_{LAST}": outcome(mean_tail),
        "agreement_final": final["agreement"], "agreement_min_pair_final": final["agreement_min"],
        f"agreement_mean_last_{LAST}": statistics.fmean(r["agreement"] for r in tail),
        f"agreement_min_pair_last_{LAST}": min(r["agreement_min"] for r in tail),
        "agreement_mean": statistics.fmean(r["agreement"] for r in rows),
        "vtrust_final": final["vtrust"],
        "vtrust_min_last": min(min(r["vtrust"].values()) for r in tail),
        "holdout_loss": [windows[0]["loss"], windows[-1]["loss"]] if windows else None,
        "noise": evaluation_noise(out, nodes),
    }


def line(seed: int, s: dict) -> str:
    f, t = s["final"], s[f"last_{LAST}"]
    return (f"seed {seed}: moredata/honest {f['moredata_over_honest']:.2f} final, {t['moredata_over_honest']:.2f} "
            f"last {LAST} | overclaim/honest {f['overclaim_over_honest']:.2f} final, "
            f"{t['overclaim_over_honest']:.2f} last {LAST} | honest {f['honest_min']:.3f}-{f['honest_max']:.3f} (max/min {f['honest_max_over_min']:.2f} "
            f"final, {t['honest_max_over_min']:.2f} last {LAST}) | cheats {f['cheats_total']:.4f} | agreement "
            f"{s['agreement_final']:.3f} final (min pair {s['agreement_min_pair_final']:.3f}), "
            f"{s[f'agreement_mean_last_{LAST}']:.3f} last {LAST}, {s['agreement_mean']:.3f} all | vtrust "
            + "/".join(f"{v:.3f}" for v in s["vtrust_final"].values())
            + " | σ̂ " + "/".join(f"{n['median_spread']:.3f}" for n in s["noise"].values())
            + " | moredata rel. δ_rand " + "/".join(f"{n['moredata_relative']:.3f}" for n in s["noise"].values()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--hparams", default=str(PRESET))
    parser.add_argument("--validators", type=int, default=3)
    parser.add_argument("--miners", type=int, default=4, help="honest miners")
    parser.add_argument("--jobs", type=int, default=3, help="localnets at once (each one torch thread)")
    parser.add_argument("--out-root", type=Path, default=Path("localnet-consensus"))
    parser.add_argument("--reuse", action="store_true", help="summarise runs already in --out-root")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()

    outs = {seed: args.out_root / f"seed{seed}" for seed in args.seeds}
    if not args.reuse and not run_seeds(outs, args.jobs, lambda seed, out: run_localnet(
            out, seed=seed, windows=args.windows, hparams=args.hparams, validators=args.validators,
            miners=args.miners)):
        return 1
    summaries = {seed: summarise(out) for seed, out in outs.items()}
    for seed, s in summaries.items():
        print(line(seed, s))
    args.results.write_text(json.dumps({"hparams": args.hparams, "windows": args.windows,
                                        "validators": args.validators, "honest_miners": args.miners,
                                        "adversaries": ADVERSARIES, "seeds": summaries}, indent=1))
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
