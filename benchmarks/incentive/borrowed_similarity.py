"""How alike is an honest upload to earlier windows' public work, and how far do honest pairs stand
above their window's typical pair? The honest distributions that calibrate the borrowed-work check
(`templar.gauntlet.borrowed`) and the pool check's baseline (`templar.gauntlet.duplicates.PairBaseline`),
docs/scoring.md §8.

Reads every gradient a finished localnet left in its buckets (`templar localnet --out DIR`) and,
for every honest miner's upload in window w, measures what the validator measures (fingerprint
cosine, shared positions; first look: 4 tensors × 8 chunks, 8 salts; second look: 32 × 32, 1 salt)
against: its own upload of w − 1 (`own_prev`: never judged, shown for scale), each other miner's
upload of w − 1 and w − 2 (`other_prev`, `other_prev2`), the aggregate of w − 1 and w − 2 as the check
builds it (top-k of the mean of every miner's upload but its own: `agg_prev`, `agg_prev2`), and the
same with its own upload in (`agg_with_own`, which the check never uses). Every miner's upload is
taken as aggregated (a localnet has few more miners than top-G), which only adds references.
For same-window pairs it reports the window's typical pair (median over pairs, per salt:
`window_median`) and each pair's shared positions over that median (`shared_over_median`, first and
second look).

    python -m benchmarks.incentive.borrowed_similarity OUT_DIR [OUT_DIR ...] [--stem borrowed_similarity]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from benchmarks._common import RESULTS_DIR, setup_torch
from benchmarks.incentive.similarity import localnet_payloads, run_hparams
from templar.core.config import GauntletConfig
from templar.gauntlet.borrowed import top_of_mean
from templar.gauntlet.duplicates import fingerprint, shared_positions
from templar.validator.fast_eval import _layout, confirm_values, first_sample

SALTS = 8
HONEST = {"honest", "moredata"}


def load(out: Path, hparams: str | None) -> dict[int, dict]:
    """The honest miners' payloads of a localnet, by window."""
    return localnet_payloads(out, hparams, HONEST)


def _figures(a: tuple, b: tuple) -> tuple[float, float]:
    return float(a[1] @ b[1]), shared_positions(a[0], b[0])


def measure(payloads: dict[int, dict], rules: GauntletConfig) -> dict[str, dict[str, list[float]]]:
    """The figures on both of the validator's samples, under the run's `rules` (sample sizes, fingerprint size)."""
    rows: dict[str, dict[str, list[float]]] = {}

    def fingerprint_of(values: dict) -> object:
        return fingerprint(values, size=rules.fingerprint_size)

    def add(cls: str, look: str, figures: tuple[float, float]) -> None:
        entry = rows.setdefault(cls, {})
        entry.setdefault(f"cosine_{look}", []).append(figures[0])
        entry.setdefault(f"shared_{look}", []).append(figures[1])

    for window, found in sorted(payloads.items()):
        layout = _layout(found)
        for look, salts, draw in (("first", range(SALTS), first_sample), ("second", range(1), confirm_values)):
            for s in salts:
                salt = window * 1000 + s
                mine = {hk: (v := draw(g.tensors, salt, rules), fingerprint_of(v)) for hk, g in found.items()}
                pairs = list(itertools.combinations(sorted(mine), 2))
                if len(pairs) >= 3:
                    med = [statistics.median(_figures(mine[a], mine[b])[i] for a, b in pairs) for i in (0, 1)]
                    add("window_median", look, tuple(med))
                    for a, b in pairs:
                        c, sh = _figures(mine[a], mine[b])
                        add("same_window_pair", look, (c, sh))
                        rows.setdefault("shared_over_median", {}).setdefault(look, []).append(sh / max(med[1], 1e-9))
                for back, suffix in ((1, ""), (2, "2")):
                    earlier = payloads.get(window - back)
                    if not earlier:
                        continue
                    theirs = {hk: (v := draw(g.tensors, salt, rules), fingerprint_of(v)) for hk, g in earlier.items()}
                    for hk, upload in mine.items():
                        if back == 1 and hk in theirs:
                            add("own_prev", look, _figures(upload, theirs[hk]))
                        for other in theirs:
                            if other != hk:
                                add(f"other_prev{suffix}", look, _figures(upload, theirs[other]))
                        others = [theirs[o][0] for o in sorted(theirs) if o != hk]
                        if len(others) >= 2:
                            agg = top_of_mean(others, layout)
                            add(f"agg_prev{suffix}", look, _figures(upload, (agg, fingerprint_of(agg))))
                        if back == 1:
                            agg = top_of_mean([theirs[o][0] for o in sorted(theirs)], layout)
                            add("agg_with_own", look, _figures(upload, (agg, fingerprint_of(agg))))
    return rows


def summarise(rows: dict[str, dict[str, list[float]]]) -> dict:
    out = {}
    for cls, figures in sorted(rows.items()):
        out[cls] = {}
        for key, values in sorted(figures.items()):
            values = sorted(values)
            p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
            out[cls][key] = {"n": len(values), "p50": round(statistics.median(values), 3), "p99": round(p99, 3),
                             "max": round(values[-1], 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", nargs="+", type=Path)
    parser.add_argument("--stem", default="borrowed_similarity")
    parser.add_argument("--hparams", default=None)
    args = parser.parse_args()
    setup_torch()
    merged: dict[str, dict[str, list[float]]] = {}
    for out in args.outs:
        for cls, figures in measure(load(out, args.hparams), run_hparams(out, args.hparams).gauntlet).items():
            for key, values in figures.items():
                merged.setdefault(cls, {}).setdefault(key, []).extend(values)
    result = {"runs": [str(o) for o in args.outs], "salts_first_look": SALTS, "classes": summarise(merged)}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{args.stem}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["classes"], indent=1))


if __name__ == "__main__":
    main()
