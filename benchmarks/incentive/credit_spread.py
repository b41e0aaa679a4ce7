"""Where the spread of the proof's credit comes from, read off localnets' recorded evaluations.

    python -m benchmarks.incentive.credit_spread --runs fair-pay/seed0 fair-pay/seed1 fair-pay/seed2
    python -m benchmarks.incentive.credit_spread --runs DIR --hparams PRESET --full-gap 0.2 0.4 1 2

A localnet's validators record every unit of every primary evaluation (`evaluations.jsonl`). This
replays, window by window, what the validator made of them: the window's typical gap and each
evaluation's credit by size on its assigned units (`templar.gauntlet.scores`: `window_gap`,
`typical_gap`, `size_credit`, under the preset's `proof_full_gap`, floor and history; a peer that
declared extra pages is judged on its declared units apart, `gauntlet.extra_work`, which this leaves
out), and checks the replay against the μ each honest peer's book moved to (`scores.jsonl`). Then,
per strategy, the mean credit, and for the honest peers how the credit of one evaluation spreads:

- the sampling of the sequences read: the variance of a mean over the evaluation's sequences (a
  sequence's position ranges as one draw), averaged over the evaluations, against the variance
  across them (its share);
- the window: the between-window share of a one-way analysis of variance over the windows that
  evaluated two honest peers or more;
- where an evaluation read several sequences of each page: the variance of a unit's credit between
  pages, between the sequences of a page and between the ranges of a sequence, and what a mean over
  P pages of S sequences of R ranges keeps of them (the sampling at another size: production reads
  16 sequences of one page).

`--full-gap` replays the runs with other values of `proof_full_gap`. Writes
`benchmarks/results/credit_spread.json` (`--results` for another file).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from benchmarks.incentive.localnet_consensus import PRESET
from benchmarks.incentive.subnet_sim_fit import pooled_within_variance, sampling_variance
from templar.core.config import GauntletConfig, load_hparams
from templar.gauntlet.book import window_loss_scale
from templar.gauntlet.scores import proof_gap, size_credit, typical_gap, window_gap

RESULTS = Path(__file__).resolve().parents[1] / "results" / "credit_spread.json"
DESIGNS = {"the crowded localnet (8 pages, 1 sequence each)": (8, 1), "production (1 page, 16 sequences)": (1, 16),
           "4 pages, 4 sequences each": (4, 4), "every sequence of the crowded localnet's 8 pages": (8, 4)}
"""(pages, sequences of each) whose sampling `components` predicts from the measured variances."""


@dataclass(frozen=True)
class Evaluation:
    """One replayed primary evaluation: where it was made, whose, and the credit of each unit."""

    window: tuple[str, str, int]
    """(run, validator, window)"""
    hotkey: str
    strategy: str
    pages: int
    units: tuple[float, ...]
    """each assigned unit's clipped credit, page after page, sequence after sequence, range after range"""

    @property
    def credit(self) -> float:
        return math.fsum(self.units) / len(self.units)


@dataclass(frozen=True)
class _Result:  # what `window_loss_scale` reads of an evaluation
    delta_assigned: float
    delta_rand: float


def _records(run: Path) -> dict[str, list[tuple[str, dict]]]:
    """Each validator's recorded evaluations (strategy, record), in window order."""
    nodes = {n["hotkey"]: n for n in json.loads((run / "nodes.json").read_text())}
    out = {}
    for validator in (n for n in nodes.values() if n["role"] == "validator"):
        path = run / "nodes" / validator["name"] / "evaluations.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        out[validator["name"]] = sorted(((nodes[r["hotkey"]]["strategy"], r) for r in records
                                         if r["hotkey"] in nodes and math.isfinite(r["delta_rand"])),
                                        key=lambda item: item[1]["window"])
    return out


def replay(runs: list[Path], rules: GauntletConfig, full_gap: float | None = None) -> list[Evaluation]:
    """Every recorded evaluation with the credit the validator gave each of its assigned units."""
    f = rules.proof_full_gap if full_gap is None else full_gap
    evaluations = []
    for run in runs:
        for validator, records in _records(run).items():
            windows: dict[int, list[tuple[str, dict]]] = defaultdict(list)
            for strategy, record in records:
                windows[record["window"]].append((strategy, record))
            history: list[float] = []
            for window in sorted(windows):
                batch = [r for _, r in windows[window]]
                own = window_gap([proof_gap(r["delta_assigned"], r["delta_rand"], r["pages"]) * max(1.0, r["work"])
                                  for r in batch])
                scale = window_loss_scale([_Result(r["delta_assigned"], r["delta_rand"]) for r in batch])
                typical = f * typical_gap(own, history, scale, floor=rules.proof_gap_floor,
                                          history=rules.proof_gap_history)
                if own is not None:
                    history = [*history, own][-(rules.proof_gap_history - 1):] if rules.proof_gap_history > 1 else []
                for strategy, r in windows[window]:
                    assigned = r["units"][:len(r["units"]) - r["declared_units"]]
                    if not assigned:
                        continue
                    units = tuple(size_credit([u], r["delta_rand"], typical) for u in assigned)
                    evaluations.append(Evaluation((str(run), validator, window), r["hotkey"], strategy,
                                                  len(r["pages"]) - _declared_pages(r), units))
    return evaluations


def _declared_pages(record: dict) -> int:
    per_page = len(record["units"]) // max(1, len(record["pages"]))
    return record["declared_units"] // per_page if per_page else 0


def replay_matches_the_book(runs: list[Path], evaluations: list[Evaluation], gamma: float) -> tuple[int, float]:
    """How many honest evaluations' credits the books' μ updates confirm, and the largest difference:
    μ after = γ·μ before + (1 − γ)·credit, read from each validator's `scores.jsonl`."""
    mus: dict[tuple[str, str, str, int], float] = {}
    for run in runs:
        for validator in _records(run):
            path = run / "nodes" / validator / "scores.jsonl"
            for line in path.read_text().splitlines() if path.exists() else []:
                r = json.loads(line)
                mus[(str(run), validator, r["hotkey"], r["window"])] = r["mu"]
    checked, worst = 0, 0.0
    for e in (e for e in evaluations if e.strategy == "honest"):
        run, validator, window = e.window
        after = mus.get((run, validator, e.hotkey, window))
        before = next((mus[k] for k in ((run, validator, e.hotkey, w) for w in range(window - 1, -1, -1)) if k in mus),
                      None)
        if after is not None and before is not None:
            checked += 1
            worst = max(worst, abs((after - gamma * before) / (1 - gamma) - e.credit))
    return checked, worst


def spread(evaluations: list[Evaluation], ranges: int) -> dict:
    """The honest credit's spread across evaluations, its sampling share and its window share."""
    honest = [e for e in evaluations if e.strategy == "honest"]
    credits = [e.credit for e in honest]
    variance = statistics.variance(credits)

    groups: dict[tuple, list[float]] = defaultdict(list)
    for e in honest:
        groups[e.window].append(e.credit)
    within = pooled_within_variance(list(groups.values()))
    mean_sampling = statistics.fmean(sampling_variance(list(e.units), ranges)[0] for e in honest)
    return {"evaluations": len(honest), "credit_mean": statistics.fmean(credits), "credit_sd": math.sqrt(variance),
            "sampling_sd": math.sqrt(mean_sampling), "sampling_share": mean_sampling / variance,
            "window_share": max(0.0, 1 - within / variance) if within is not None else None}


def components(evaluations: list[Evaluation], ranges: int) -> dict | None:
    """Variance of an honest unit's credit between pages, between a page's sequences and between a
    sequence's ranges (None unless the evaluations read two sequences of a page or more), and the
    sampling sd of a mean over each of `DESIGNS`."""
    honest = [e for e in evaluations if e.strategy == "honest" and e.pages]
    per_page = {len(e.units) // (e.pages * ranges) for e in honest}
    if len(per_page) != 1 or (sequences := per_page.pop()) < 2 or not honest:
        return None
    between_ranges, between_sequences, between_pages = [], [], []
    for e in honest:
        cube = [[e.units[(p * sequences + s) * ranges:(p * sequences + s + 1) * ranges] for s in range(sequences)]
                for p in range(e.pages)]
        between_ranges.append(statistics.fmean(statistics.variance(seq) for page in cube for seq in page))
        between_sequences.append(statistics.fmean(statistics.variance([statistics.fmean(seq) for seq in page])
                                                  for page in cube))
        if e.pages > 1:
            between_pages.append(statistics.variance([statistics.fmean([u for seq in page for u in seq])
                                                      for page in cube]))
    v_range = statistics.fmean(between_ranges)
    v_sequence = statistics.fmean(between_sequences) - v_range / ranges
    v_page = (statistics.fmean(between_pages) - (v_sequence + v_range / ranges) / sequences) if between_pages else 0.0

    def sampling_sd(pages: int, each: int) -> float:
        return math.sqrt(max(0.0, max(0.0, v_page) / pages + v_sequence / (pages * each)
                             + v_range / (pages * each * ranges)))

    return {"sequences_per_page_read": sequences, "page": v_page, "sequence": v_sequence, "range": v_range,
            "sampling_sd": {name: sampling_sd(*design) for name, design in DESIGNS.items()}}


def by_strategy(evaluations: list[Evaluation]) -> dict[str, float]:
    """Each strategy's mean credit on its assigned units over the honest mean."""
    credits: dict[str, list[float]] = defaultdict(list)
    for e in evaluations:
        credits[e.strategy].append(e.credit)
    honest = statistics.fmean(credits["honest"])
    return {s: statistics.fmean(c) / honest for s, c in sorted(credits.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="localnet --out folders")
    parser.add_argument("--hparams", default=str(PRESET), help="the preset the runs ran (default: the crowded one)")
    parser.add_argument("--full-gap", type=float, nargs="*", default=[], help="also replay with these proof_full_gap")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    hp = load_hparams(args.hparams)
    rules, ranges = hp.gauntlet, hp.gauntlet.position_ranges
    evaluations = replay(args.runs, rules)
    checked, worst = replay_matches_the_book(args.runs, evaluations, rules.mu_gamma)
    print(f"replayed {len(evaluations)} evaluations; {checked} honest μ updates confirm the replay "
          f"(largest difference {worst:.1e})")
    out = {"runs": [str(r) for r in args.runs], "hparams": args.hparams, "replay_checked": [checked, worst],
           "spread": spread(evaluations, ranges), "components": components(evaluations, ranges),
           "credit_over_honest": by_strategy(evaluations), "full_gap": {}}
    for f in args.full_gap:
        again = replay(args.runs, rules, full_gap=f)
        out["full_gap"][str(f)] = {"spread": spread(again, ranges), "credit_over_honest": by_strategy(again)}
    s = out["spread"]
    print(f"honest credit {s['credit_mean']:.3f} sd {s['credit_sd']:.3f} over {s['evaluations']} evaluations: "
          f"sampling sd {s['sampling_sd']:.3f} ({s['sampling_share']:.0%} of the variance), window share "
          f"{s['window_share'] if s['window_share'] is None else format(s['window_share'], '.0%')}")
    if out["components"]:
        c = out["components"]
        print(f"a unit's credit variance: page {c['page']:.4f}, sequence {c['sequence']:.4f}, range {c['range']:.4f}; "
              + "; ".join(f"{name} {sd:.3f}" for name, sd in c["sampling_sd"].items()))
    print("credit on assigned units over honest: " + " ".join(f"{k} {v:.2f}" for k, v in out["credit_over_honest"].items()))
    for f, row in out["full_gap"].items():
        print(f"proof_full_gap {f}: honest credit {row['spread']['credit_mean']:.3f} sd {row['spread']['credit_sd']:.3f}; "
              + " ".join(f"{k} {v:.2f}" for k, v in row["credit_over_honest"].items()))
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
