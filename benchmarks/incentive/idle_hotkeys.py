"""Registered hotkeys that never pass a fast evaluation, among 256 uids: how much of F_t they take, and how
long newcomers joining among them wait for their first primary evaluation.

    python -m benchmarks.incentive.idle_hotkeys [--seeds 0 1 2] [--idle 0 48 96]

One validator's book under production's rules (`hparams.json`), the real draws (`gauntlet.draw_window`) and
scoring (`gauntlet.score_window`), honest evaluations resampled from production's fit (as
`benchmarks/incentive/subnet_sim.py` draws them). Of the 256 uids, `--idle` hotkeys never pass: "missing"
ones never upload (a registered node that never started, or stopped), "warmup" ones post warm-ups for ever
(the cheapest upload that passes until its allowance runs out), "stopped" ones work as honest miners until
window 150 (one to eight primary evaluations each) and then upload nothing. The rest are honest. At window 300 eight
hotkeys replace eight honest ones and join as an honest newcomer does (warm-ups for `windows.warmup_windows`,
then honest work). Per run, over windows 300-400: the idle hotkeys' share of F_t's places, the newcomers'
windows from joining to their first primary evaluation (median of the eight), and the honest miners' spread
of pay over the last 100 windows (max over median); for "stopped", the windows after it stopped until its
weight fell under 1 % of the honest median's (median of them). The baseline is the same run without idle hotkeys.
Writes benchmarks/results/idle_hotkeys.json.
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
from templar.core.config import load_hparams
from templar.gauntlet import FastVerdict, ScoreBook, Status, draw_window, score_window

RESULTS = Path(__file__).resolve().parents[1] / "results" / "idle_hotkeys.json"
UIDS, STOP, JOIN, END, NEWCOMERS = 256, 150, 300, 400, 8


def run(idle: int, mode: str, seed: int) -> dict:
    """One validator's 400 windows with `idle` never-passing hotkeys of kind `mode`."""
    cfg = replace(SimConfig(), **CHOSEN, fit_file=str(UNITS_FIT_FILE), seed=seed)
    rules, source, rng = cfg.gauntlet(), fit(Path(cfg.fit_file)), random.Random(seed)
    windows = load_hparams().windows
    warmup, every = windows.warmup_windows, windows.peer_replacement_frequency
    honest = [f"h{i:03d}" for i in range(UIDS - idle)]
    idlers = {f"idle{i:03d}" for i in range(idle)}
    registry = {hk: uid for uid, hk in enumerate([*honest, *sorted(idlers)])}
    joined: dict[str, int] = {}
    first_eval: dict[str, int] = {}
    book, secret, peer_list = ScoreBook(), rng.getrandbits(64), []
    shares, pay = [], {hk: 0.0 for hk in honest}
    unpaid: dict[str, int] = {}  # a stopped hotkey: the first window its weight was under 1 % of the honest median
    def silent(hk: str, window: int) -> bool:
        return hk in idlers and (mode != "stopped" or window >= STOP)
    for window in range(END):
        if window == JOIN:  # eight newcomers take eight honest miners' uids
            for i, old in enumerate(honest[-NEWCOMERS:]):
                new = f"new{i}"
                registry[new] = registry.pop(old)
                joined[new] = window
            book.sync_registry(registry)
        drawn = draw_window(book, rules, secret ^ window, window, registry, peer_list)
        verdicts = {}
        for hk in drawn.fast:
            if silent(hk, window):
                verdicts[hk] = FastVerdict(Status.WARMUP if mode == "warmup" else Status.MISSING)
            elif hk in joined and window - joined[hk] < warmup:
                verdicts[hk] = FastVerdict(Status.WARMUP)
            else:
                verdicts[hk] = FastVerdict(Status.OK)
        primary = drawn.primary(verdicts)
        for hk in primary:
            first_eval.setdefault(hk, window)
        losses = {hk: draw("honest", rng, cfg.noise, 0.0, 3.66, source, cfg.eval_size) for hk in primary}
        scores = score_window(book, rules, window, registry, verdicts, losses, seed=secret ^ window)
        if window % every == 0:  # the lead's peer list, replaced as production does
            peer_list = scores.top_g
        if window >= JOIN:
            shares.append(sum(hk in idlers for hk in drawn.fast) / len(drawn.fast))
        if mode == "stopped" and window >= STOP:
            typical = statistics.median(scores.weights.get(hk, 0.0) for hk in honest if hk in registry)
            for hk in idlers - unpaid.keys():
                if scores.weights.get(hk, 0.0) < 0.01 * typical:
                    unpaid[hk] = window
        if window >= END - 100:
            for hk in pay:
                pay[hk] += scores.weights.get(hk, 0.0)
    waits = [first_eval.get(hk, END) - joined[hk] for hk in joined]
    steady = [pay[hk] for hk in honest[:-NEWCOMERS]]
    out = {"idle_share_of_f_t": statistics.mean(shares), "newcomer_windows_to_first_evaluation": statistics.median(waits),
           "honest_max_over_median": max(steady) / statistics.median(steady)}
    if mode == "stopped":
        out["stopped_windows_to_unpaid"] = statistics.median(unpaid.get(hk, END) - STOP for hk in idlers)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--idle", type=int, nargs="+", default=[0, 48, 96])
    args = parser.parse_args(argv)
    out: dict[str, dict] = {}
    for idle in args.idle:
        for mode in ("missing", "warmup", "stopped") if idle else ("missing",):
            runs = [run(idle, mode, seed) for seed in args.seeds]
            name = "baseline (no idle hotkeys)" if not idle else f"{idle} {mode}"
            out[name] = {key: [round(r[key], 3) for r in runs] for key in runs[0]}
            row = out[name]
            print(f"{name:28s} idle share of F_t {row['idle_share_of_f_t']} | newcomer windows to its first "
                  f"evaluation {row['newcomer_windows_to_first_evaluation']} | honest max/median "
                  f"{row['honest_max_over_median']}"
                  + (f" | windows to unpaid after stopping {row['stopped_windows_to_unpaid']}" if idle and mode == "stopped"
                     else ""))
    base = out.get("baseline (no idle hotkeys)")
    if base:
        for name, row in out.items():
            ratio = statistics.mean(row["newcomer_windows_to_first_evaluation"]) / max(
                1e-9, statistics.mean(base["newcomer_windows_to_first_evaluation"]))
            print(f"{name:28s} newcomers' wait against the baseline: {ratio:.2f}x")
    RESULTS.write_text(json.dumps({"seeds": args.seeds, "runs": out}, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
