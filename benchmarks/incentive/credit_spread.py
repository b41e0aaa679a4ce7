"""Where the spread of the proof's credit comes from, read off localnets' recorded evaluations.

    python -m benchmarks.incentive.credit_spread --runs fair-pay/seed0 fair-pay/seed1 fair-pay/seed2
    python -m benchmarks.incentive.credit_spread --runs DIR --hparams PRESET --full-gap 0.2 0.4 1 2

A localnet's validators record every unit of every primary evaluation (`evaluations.jsonl`). This
replays, window by window, what the validator made of them: the window's typical gap and each
evaluation's credit by size on its assigned units (`templar.gauntlet.scores`: `window_gap`,
`typical_gap`, `size_credit`, under the preset's `proof_full_gap`, floor and history), and checks
the replay against the μ each honest peer's book moved to (`scores.jsonl`). Then, per strategy, the
mean credit, and for the honest peers how the credit of one evaluation spreads:

- the sampling of the sequences read: the variance of a mean over the evaluation's sequences (a
  sequence's position ranges as one draw), averaged over the evaluations, against the variance
  across them (its share);
- the window: the between-window share of a one-way analysis of variance over the windows that
  evaluated two honest peers or more;
- where an evaluation read several sequences of each page: the variance of a unit's credit between
  pages, between the sequences of a page and between the ranges of a sequence, and what a mean over
  P pages of S sequences of R ranges keeps of them (the sampling at another size: production reads
  16 sequences of one page).

Of the peers that declared extra pages (`templar.gauntlet.extra_work`): each class's credit (assigned,
declared) as the book's EMAs hold it (checked against `scorebook.json`) and the work `trained_multiple`
makes of it, one evaluation's spread of each class, and how many evaluations it takes to tell a
declared class that was trained (`moredata`) from one that was not (`overclaim`). And why an honest
miner's pay follows how often it was evaluated: the published top-G is always in F_t, so the best-paid
are always eligible for S_t (`evaluations_follow_the_peer_list`).

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
from templar.gauntlet.extra_work import ema_mean, trained_multiple, update_class, update_declared
from templar.gauntlet.rating import effective_evaluations
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
    declared: tuple[float, ...] = ()
    """each declared unit's clipped credit, laid out alike (none for a peer that declared no pages)"""
    work: float = 1.0
    """the work its payload declared (`extra_work.declared_work`: 2.0 for twice the assigned pages)"""

    @property
    def credit(self) -> float:
        return math.fsum(self.units) / len(self.units)

    @property
    def classes(self) -> tuple[float | None, float | None]:
        """(assigned, declared) class credits as `extra_work.class_credits` gives them (None: no unit)."""
        return (self.credit if self.units else None,
                math.fsum(self.declared) / len(self.declared) if self.declared else None)


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
                                          history=rules.proof_gap_history, resolution=rules.proof_gap_resolution)
                if own is not None:
                    history = [*history, own][-(rules.proof_gap_history - 1):] if rules.proof_gap_history > 1 else []
                for strategy, r in windows[window]:
                    split = len(r["units"]) - r["declared_units"]
                    units = [size_credit([u], r["delta_rand"], typical) for u in r["units"]]
                    evaluations.append(Evaluation((str(run), validator, window), r["hotkey"], strategy,
                                                  len(r["pages"]) - _declared_pages(r), tuple(units[:split]),
                                                  tuple(units[split:]), float(r["work"])))
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
        if e.units:  # an evaluation that drew declared pages only has no assigned credit
            credits[e.strategy].append(e.credit)
    honest = statistics.fmean(credits["honest"])
    return {s: statistics.fmean(c) / honest for s, c in sorted(credits.items())}


def declared_work(evaluations: list[Evaluation], rules: GauntletConfig, *, trained: str = "moredata",
                  untrained: str = "overclaim", z: float = 2.0) -> dict:
    """What the extra-work classes (`templar.gauntlet.extra_work`) showed of each peer that declared pages,
    replayed as its validator's book keeps them (each class's EMA under `mu_gamma`, the work proven by
    `trained_multiple`), per strategy the spread of one evaluation's class credit, and how many
    evaluations tell a declared class that was `trained` from one that was not (`untrained`): each
    class's bias-corrected EMA within half their difference at `z` standard errors, n_eff ≥ (2·z·sd /
    difference)², which the EMA reaches only while n_eff stays below its bound (1 + γ)/(1 − γ)."""
    gamma = rules.mu_gamma
    peers: dict[tuple[str, str, str], list[Evaluation]] = defaultdict(list)
    for e in evaluations:
        if e.work > 1.0:
            peers[(e.window[0], e.window[1], e.hotkey)].append(e)
    rows = []
    for (run, validator, hotkey), own in sorted(peers.items()):
        assigned, declared, work = (0.0, 0), (0.0, 0), 0.0
        for e in own:
            on_assigned, on_declared = e.classes
            assigned, declared = update_class(*assigned, on_assigned, gamma), update_class(*declared, on_declared, gamma)
            work = update_declared(work, e.work, gamma)
        book = Path(run) / "nodes" / validator / "scorebook.json"
        record = json.loads(book.read_text())["peers"].get(hotkey) if book.exists() else None
        mean_a, mean_d = (ema_mean(*assigned, gamma, math.nan) if assigned[1] else None,
                          ema_mean(*declared, gamma, math.nan) if declared[1] else None)
        rows.append({"run": run, "validator": validator, "hotkey": hotkey, "strategy": own[0].strategy,
                     "evaluations": len(own), "assigned": mean_a, "declared": mean_d,
                     "trained_multiple": trained_multiple(1.0 + ema_mean(work, len(own), gamma, 0.0), mean_a, mean_d,
                                                          rules.extra_work_tolerance, rules.extra_work_floor),
                     "book_difference": max(abs(record["assigned_credit"] - assigned[0]),
                                            abs(record["declared_credit"] - declared[0])) if record else None})
    strategies: dict[str, dict] = {}
    for strategy in sorted({row["strategy"] for row in rows}):
        credits = [e.classes for own in peers.values() for e in own if e.strategy == strategy]
        on_assigned = [a for a, _ in credits if a is not None]
        on_declared = [d for _, d in credits if d is not None]
        paired = [a - d for a, d in credits if a is not None and d is not None]
        strategies[strategy] = {
            "evaluations": len(credits),
            "assigned_mean": statistics.fmean(on_assigned), "assigned_sd": _sd(on_assigned),
            "declared_mean": statistics.fmean(on_declared), "declared_sd": _sd(on_declared),
            "paired": {"evaluations": len(paired), "assigned_minus_declared": statistics.fmean(paired),
                       "assigned_higher": sum(1 for x in paired if x > 0)} if paired else None}
    out = {"peers": rows, "strategies": strategies, "separation": None}
    if trained in strategies and untrained in strategies:
        a, b = strategies[trained], strategies[untrained]
        difference = a["declared_mean"] - b["declared_mean"]
        sd = math.sqrt((a["declared_sd"] ** 2 + b["declared_sd"] ** 2) / 2)
        needed = (2 * z * sd / difference) ** 2 if difference > 0 else math.inf
        bound = (1 + gamma) / (1 - gamma)
        out["separation"] = {
            "trained": trained, "untrained": untrained, "difference": difference, "sd": sd, "z": z,
            "n_eff_needed": needed, "n_eff_bound": bound,
            "evaluations_needed": next((n for n in range(1, 10_000) if effective_evaluations(n, gamma) >= needed),
                                       None) if needed < bound else None}
    return out


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else math.nan


def when_evaluated(evaluations: list[Evaluation], gamma: float) -> list[dict]:
    """Each honest miner's μ as its book reads it at the end (the bias-corrected EMA of its credits) and
    the same μ with each credit moved by its window's level (less the mean honest credit of the window,
    plus the mean over its validator's run): how much of the honest miners' difference in μ is which
    windows drew them."""
    honest = [e for e in evaluations if e.strategy == "honest"]
    windows: dict[tuple, list[float]] = defaultdict(list)
    books: dict[tuple[str, str], list[float]] = defaultdict(list)
    miners: dict[tuple[str, str, str], list[Evaluation]] = defaultdict(list)
    for e in honest:
        windows[e.window].append(e.credit)
        books[e.window[:2]].append(e.credit)
        miners[(e.window[0], e.window[1], e.hotkey)].append(e)
    level = {w: statistics.fmean(c) for w, c in windows.items()}
    overall = {book: statistics.fmean(c) for book, c in books.items()}

    def mu(credits: list[float]) -> float:  # the book's EMA step (`update_class`), read bias-corrected
        ema = (0.0, 0)
        for credit in credits:
            ema = update_class(*ema, credit, gamma)
        return ema_mean(*ema, gamma, math.nan)

    return [{"run": run, "validator": validator, "hotkey": hotkey, "evaluations": len(own),
             "mu": mu([e.credit for e in own]),
             "mu_window_levelled": mu([e.credit - level[e.window] + overall[e.window[:2]] for e in own])}
            for (run, validator, hotkey), own in sorted(miners.items())]


def evaluations_follow_the_peer_list(runs: list[Path]) -> dict:
    """Why an honest miner's pay tracks how often it was evaluated: per honest miner of each run's
    validators, its primary evaluations, the windows it stood in the published top-G (always in F_t,
    so always eligible for S_t) and the windows F_t left it out (`not-sampled`: not eligible); and the
    correlation of evaluations with windows in the top-G over them all."""
    rows = []
    for run in runs:
        nodes = {n["hotkey"]: n for n in json.loads((run / "nodes.json").read_text())}
        for validator in (n["name"] for n in nodes.values() if n["role"] == "validator"):
            path = run / "nodes" / validator / "scores.jsonl"
            records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            for hotkey in sorted({r["hotkey"] for r in records}):
                if nodes.get(hotkey, {}).get("strategy") != "honest":
                    continue
                own = [r for r in records if r["hotkey"] == hotkey]
                rows.append({"run": str(run), "validator": validator, "name": nodes[hotkey]["name"],
                             "evaluations": sum(1 for r in own if r["evaluated"]),
                             "top_g_windows": sum(1 for r in own if r["in_top_g"]),
                             "not_sampled_windows": sum(1 for r in own if r["status"] == "not-sampled")})
    pairs = [(r["evaluations"], r["top_g_windows"]) for r in rows]
    correlation = (statistics.correlation(*zip(*pairs, strict=True))
                   if len(pairs) > 2 and len({p[0] for p in pairs}) > 1 and len({p[1] for p in pairs}) > 1 else None)
    return {"miners": rows, "evaluations_vs_top_g_windows": correlation}


def _print_declared_and_evaluations(out: dict, runs: list[Path]) -> None:
    """The declared classes, their separation, and what the honest miners' evaluations follow."""
    work = out["declared_work"]
    for strategy, row in work["strategies"].items():
        print(f"{strategy}: one evaluation's class credit, assigned {row['assigned_mean']:.2f} sd {row['assigned_sd']:.2f}, "
              f"declared {row['declared_mean']:.2f} sd {row['declared_sd']:.2f} ({row['evaluations']} evaluations"
              + (f"; assigned above declared in {row['paired']['assigned_higher']} of {row['paired']['evaluations']}, "
                 f"by {row['paired']['assigned_minus_declared']:.2f} on average" if row["paired"] else "") + "); "
              "books' ê assigned/declared → work proven: " + ", ".join(
                  f"{r['assigned']:.2f}/{r['declared']:.2f} → {r['trained_multiple']:.2f}"
                  for r in work["peers"] if r["strategy"] == strategy and r["declared"] is not None))
    if work["separation"]:
        w = work["separation"]
        print(f"{w['trained']} and {w['untrained']}'s declared classes differ by {w['difference']:.3f} (sd {w['sd']:.3f} "
              f"an evaluation): told apart at {w['z']:.0f} standard errors from n_eff {w['n_eff_needed']:.0f} "
              f"(the EMA's bound {w['n_eff_bound']:.0f}): "
              + (f"{w['evaluations_needed']} evaluations" if w["evaluations_needed"] else "never under this mu_gamma"))
    follow = out["evaluations_and_the_peer_list"]
    if follow["evaluations_vs_top_g_windows"] is not None:
        print(f"honest miners' evaluations against their windows in the top-G: correlation "
              f"{follow['evaluations_vs_top_g_windows']:.2f} over {len(follow['miners'])} miners")
    for run in runs:
        levelled = [r for r in out["when_evaluated"] if r["run"] == str(run)]
        if levelled:
            mus, flat = [r["mu"] for r in levelled], [r["mu_window_levelled"] for r in levelled]
            print(f"{run}: honest μ {min(mus):.3f}–{max(mus):.3f}, each credit levelled by its window "
                  f"{min(flat):.3f}–{max(flat):.3f}")


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
           "credit_over_honest": by_strategy(evaluations), "declared_work": declared_work(evaluations, rules),
           "evaluations_and_the_peer_list": evaluations_follow_the_peer_list(args.runs),
           "when_evaluated": when_evaluated(evaluations, rules.mu_gamma), "full_gap": {}}
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
    _print_declared_and_evaluations(out, args.runs)
    for f, row in out["full_gap"].items():
        print(f"proof_full_gap {f}: honest credit {row['spread']['credit_mean']:.3f} sd {row['spread']['credit_sd']:.3f}; "
              + " ".join(f"{k} {v:.2f}" for k, v in row["credit_over_honest"].items()))
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
