"""What one window's scoring costs a validator's `ScoreBook` at 256 peers, with μ's tie band
(production: every score reads the paid level) against the rule before it (band 0), in one process.

    python -m benchmarks.performance.score_book [--peers 256] [--windows 20]

A book of `--peers` peers is filled by `--windows` windows of production-sized scoring (`fast_eval_uids`
fast evaluations, a tenth of them failed, and `uids_per_window` primary evaluations of 64 units each),
then one more window is timed, fast evaluations, primary evaluations and the weights, several times;
CPU, one thread. The band reads the book's paid level at every failed fast evaluation and every
rescoring, so its cost grows with the book; the forward passes of the evaluation itself (seconds on a
GPU, benchmarks/performance/gpu.py) do not change. Prints one JSON line and writes
benchmarks/results/score_book.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from templar.core.config import GauntletConfig, load_hparams
from templar.gauntlet import PrimaryResult, ScoreBook

RESULTS = Path(__file__).resolve().parents[1] / "results" / "score_book.json"
UNITS = 64


def _result(rng: random.Random, trained: float) -> PrimaryResult:
    units = tuple(0.05 + trained * 0.02 + rng.gauss(0.0, 0.02) for _ in range(UNITS))
    mean = sum(units) / UNITS
    return PrimaryResult(mean, 0.05 + rng.gauss(0.0, 0.004), (mean,), units)


def _window(book: ScoreBook, rules: GauntletConfig, rng: random.Random, hotkeys: list[str], window: int) -> None:
    for hotkey in rng.sample(hotkeys, rules.fast_eval_uids):
        book.record_fast_eval(rules, hotkey, passed=rng.random() > 0.1, status="ok")
    chosen = rng.sample(hotkeys, rules.uids_per_window)
    book.record_primary(rules, {h: _result(rng, 0.25 if h.startswith("thin") else 1.0) for h in chosen}, window=window)
    book.weights(rules)


def time_window(rules: GauntletConfig, peers: int, windows: int, repeats: int = 5) -> float:
    """Median seconds of one window's scoring after `windows` windows of history."""
    rng = random.Random(0)
    hotkeys = [f"{'thin' if i % 8 == 0 else 'honest'}{i:03d}" for i in range(peers)]
    book = ScoreBook()
    for uid, hotkey in enumerate(hotkeys):
        book.get_or_create(hotkey, uid, window=0)
    for window in range(windows):
        _window(book, rules, rng, hotkeys, window)
    seconds = []
    for repeat in range(repeats):
        copy = ScoreBook.from_json(book.to_json())
        started = time.perf_counter()
        _window(copy, rules, random.Random(repeat), hotkeys, windows)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=256)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    production = load_hparams().gauntlet.model_copy(update={"fast_eval_uids": min(64, args.peers),
                                                            "uids_per_window": min(8, args.peers)})
    before = production.model_copy(update={"mu_tie_band": 0.0})
    band, baseline = time_window(production, args.peers, args.windows), time_window(before, args.peers, args.windows)
    figures = {"peers": args.peers, "history_windows": args.windows, "band_seconds": round(band, 5),
               "no_band_seconds": round(baseline, 5), "ratio": round(band / baseline, 2)}
    print(json.dumps(figures))
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
