"""The measured LossScores `subnet_sim.py` resamples: fitted once from a localnet's score records.

    python -m benchmarks.incentive.subnet_sim --fit LOCALNET_OUT     # rewrites results/subnet_sim_fit.json
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from templar.gauntlet import PrimaryResult

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
FIT_FILE = RESULTS_DIR / "subnet_sim_fit.json"
"""The measured LossScores the draws resample (written by `--fit RUN_DIR`): per strategy, pairs of
(δ_rand, δ_assigned − δ_rand), each relative to the mean δ_rand of the honest peers in the same
validator's window, plus where they came from."""
FIT_RUN = ("localnet 2026-11-23 15:47 UTC, tiny preset (eval_pages 2, proof_margin 0.3 there), `templar "
           "localnet --validators 3 --miners 4 --adversary moredata --adversary lazy --adversary copycat "
           "--adversary noise --windows 12`")

def fit_from_scores(run_dir: Path) -> dict:
    """Fit `FIT_FILE` from a localnet's scores.jsonl files (every validator's).

    Each LossScore is divided by the mean δ_rand of the honest peers in the same validator's
    window: the loss scale falls as the model trains, and only the spread *within* a window
    matters to the OpenSkill ranking (and to the sign in μ). Returns mean and sd of the relative
    δ_rand and of the relative gap δ_assigned − δ_rand per strategy.
    """
    nodes = {n["hotkey"]: n for n in json.loads((run_dir / "nodes.json").read_text())}
    validators = [n["name"] for n in nodes.values() if n["role"] == "validator"]
    records = []
    for name in validators:
        for text in (run_dir / "nodes" / name / "scores.jsonl").read_text().splitlines():
            rec = json.loads(text)
            if rec.get("evaluated") and rec.get("delta_rand") is not None and rec["hotkey"] in nodes:
                records.append((name, rec["window"], nodes[rec["hotkey"]]["strategy"],
                                rec["delta_assigned"], rec["delta_rand"]))
    honest: dict[tuple[str, int], list[float]] = {}
    for name, window, strategy, _, rand in records:
        if strategy == "honest":
            honest.setdefault((name, window), []).append(rand)
    scale = {key: statistics.fmean(values) for key, values in honest.items()}
    relative: dict[str, list[tuple[float, float]]] = {}
    for name, window, strategy, assigned, rand in records:
        if scale.get((name, window), 0) > 0:
            m = scale[(name, window)]
            relative.setdefault(strategy, []).append((rand / m, (assigned - rand) / m))
    summary = {}
    for strategy, pairs in sorted(relative.items()):
        rand, gap = [r for r, _ in pairs], [g for _, g in pairs]
        summary[strategy] = {"n": len(pairs),
                             "rand_mean_sd": [round(statistics.fmean(rand), 3), _sd(rand)],
                             "gap_mean_sd": [round(statistics.fmean(gap), 3), _sd(gap)],
                             "gap_negative": round(sum(g < 0 for g in gap) / len(gap), 3)}
    return {"source": f"{FIT_RUN}: {len(validators)} validators' scores.jsonl, {len(records)} primary evaluations "
                      "(copycat was caught as `copy` in every window and has none: it is drawn as `lazy`)",
            "summary": summary,
            "samples": {k: [[round(r, 4), round(g, 4)] for r, g in v] for k, v in sorted(relative.items())}}


PRODUCTION_FIT_TAG = "crowded_first_window_6"
"""The fit of production's crowded localnet on today's scoring: `micro_gauntlet_8pages` (production's
Gauntlet and inner loop on `micro`) at six seeds, 720 primary evaluations with every unit, 220 of them
honest (benchmarks/LOG.md §68, §72). It follows §30's `sparseloco_others_quarter`, which predates the
trial step held to and lifted to the window's typical size (§62-§66) and the first scored window at
S_t's median (§67); that fit and the others stay committed beside it, each named by its tag."""
UNITS_FIT_FILE = RESULTS_DIR / f"subnet_sim_fit_units_{PRODUCTION_FIT_TAG}.json"
"""Whole evaluations, every unit of each (written by `fit_from_evaluations`): what production's
validator hands its score book (`PrimaryResult`: the pages, the position-range units of assigned and
declared pages, the random pages' units, the declared work), so the simulator's μ runs the proof by
size, the extra-work classes and the dilution on measured units instead of one (δ_rand, gap) pair.
The default is production's fit (`PRODUCTION_FIT_TAG`); `subnet_sim_fit_units_signed.json` is the
first refit, on the signed outer rule and δ_rand (§17), and each other tag one rule's localnets."""

LOSS_SCALE = 0.04
"""Mean honest δ_rand of `FIT_FILE`'s run (nats): the draws' relative δ times this; only
`proof_margin` > 0 looks at absolute sizes."""

_FITS: dict[Path, dict] = {}


def _sd(values: list[float]) -> float:
    """The sample standard deviation, rounded; 0.0 for a strategy evaluated once (a copier or a scaled
    upload fails fast evaluation after its first window, so a crowded run may hold one of its evaluations)."""
    return round(statistics.stdev(values), 3) if len(values) > 1 else 0.0


def fit(path: Path | None = None) -> dict:
    """A fit file's contents (`FIT_FILE` by default), read once."""
    path = path or FIT_FILE
    if path not in _FITS:
        _FITS[path] = json.loads(path.read_text())
    return _FITS[path]


def _rounded(values: list[float], scale: float) -> list[float]:
    return [round(v / scale, 5) if math.isfinite(v) else v for v in values]


def fit_from_evaluations(run_dirs: list[Path], source: str) -> dict:
    """Whole evaluations from localnets' `evaluations.jsonl` (validators run with
    `--record-evaluations`; a localnet's do): every δ of each (the evaluation's pages and units, the
    random units, δ_assigned and δ_rand) divided by the mean δ_rand of the honest peers in the same
    validator's window, as `fit_from_scores` scales its pairs, keyed by the evaluated peer's strategy.

    Returns the summary `fit_from_scores` gives (mean and sd of the relative δ_rand and gap per
    strategy), `evaluations`: per strategy, [rand, gap, pages, units, random_units, work,
    declared_units] for each evaluation, relative, and `windows`: per strategy, where each was made
    ("run/validator/window", the run by its place in `run_dirs`), so that what a window shares can
    be told from what an evaluation has alone (`window_share`)."""
    records: list[tuple[tuple[str, str, int], str, dict]] = []
    for run in run_dirs:
        nodes = {n["hotkey"]: n for n in json.loads((run / "nodes.json").read_text())}
        for v in (n for n in nodes.values() if n["role"] == "validator"):
            path = run / "nodes" / v["name"] / "evaluations.jsonl"
            for line in path.read_text().splitlines() if path.exists() else []:
                rec = json.loads(line)
                if rec["hotkey"] in nodes and math.isfinite(rec["delta_rand"]):
                    records.append(((str(run), v["name"], rec["window"]), nodes[rec["hotkey"]]["strategy"], rec))
    honest: dict[tuple[str, str, int], list[float]] = {}
    for key, strategy, rec in records:
        if strategy == "honest":
            honest.setdefault(key, []).append(rec["delta_rand"])
    scale = {key: statistics.fmean(values) for key, values in honest.items()}
    evaluations: dict[str, list[list]] = {}
    windows: dict[str, list[str]] = {}
    runs = {str(run): i for i, run in enumerate(run_dirs)}
    for key, strategy, rec in records:
        m = scale.get(key, 0.0)
        if m > 0 and math.isfinite(rec["delta_assigned"]):
            windows.setdefault(strategy, []).append(f"{runs[key[0]]}/{key[1]}/{key[2]}")
            rand = rec["delta_rand"] / m
            evaluations.setdefault(strategy, []).append([
                round(rand, 5), round(rec["delta_assigned"] / m - rand, 5), _rounded(rec["pages"], m),
                _rounded(rec["units"], m), _rounded(rec["random_units"], m), rec["work"], rec["declared_units"]])
    summary = {}
    for strategy, evals in sorted(evaluations.items()):
        rand, gap = [e[0] for e in evals], [e[1] for e in evals]
        summary[strategy] = {"n": len(evals),
                             "rand_mean_sd": [round(statistics.fmean(rand), 3), _sd(rand)],
                             "gap_mean_sd": [round(statistics.fmean(gap), 3), _sd(gap)],
                             "gap_negative": round(sum(g < 0 for g in gap) / len(gap), 3)}
    return {"source": f"{source}: {len(records)} primary evaluations with every unit", "summary": summary,
            "evaluations": dict(sorted(evaluations.items())), "windows": dict(sorted(windows.items()))}


def pooled_within_variance(groups: list[list[float]]) -> float | None:
    """The variance within groups, pooled over those of two values or more (a one-way analysis of
    variance's within part); None when no group holds two."""
    shared = [g for g in groups if len(g) > 1]
    if not shared:
        return None
    return sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in shared) / sum(len(g) - 1 for g in shared)


def window_share(source: dict, kind: str) -> float | None:
    """The share of a strategy's gap variance (across its evaluations) that the evaluations made in
    the same window have in common: the between-window component of a one-way analysis of variance
    over the windows holding two or more of them. None when the fit records no windows or none holds
    two. A window's share moves every peer evaluated in it alike; the proof's typical gap, a median
    over 16 windows, does not follow it."""
    keys = source.get("windows", {}).get(kind)
    if not keys:
        return None
    groups: dict[str, list[float]] = {}
    for key, evaluation in zip(keys, source["evaluations"][kind], strict=True):
        groups.setdefault(key, []).append(evaluation[1])
    shared = [g for g in groups.values() if len(g) > 1]
    within = pooled_within_variance(shared)
    if within is None:
        return None
    gaps = [x for g in shared for x in g]
    total = statistics.variance(gaps)
    return max(0.0, min(1.0, 1 - within / total)) if total > 0 else None


@dataclass(frozen=True)
class EvalSize:
    """What one primary evaluation reads: sequences of the evaluated (assigned and declared) pages
    and of the random pages, each cut into `ranges` position ranges, its units."""

    assigned_sequences: int
    random_sequences: int
    ranges: int


def sampling_variance(units: list[float], ranges: int) -> tuple[float, int]:
    """The variance of a mean over an evaluation's sequences from their sampling alone (a sequence's
    `ranges` units are one draw: they share its text), and how many sequences it read."""
    sequences = [statistics.fmean(units[i:i + ranges]) for i in range(0, len(units), ranges)]
    return (statistics.variance(sequences) / len(sequences) if len(sequences) > 1 else 0.0), len(sequences)


def spread_sources(source: dict, kind: str, ranges: int) -> dict:
    """How much of a strategy's evaluation-to-evaluation spread in a fit of whole evaluations is the
    sampling of the sequences read: the variance of the gap and of δ_rand across evaluations, the
    mean variance that sampling alone gives each (the assigned units' mean and the random units'
    mean; the gap's is both), and the sequences an evaluation read. The rest is the evaluation's own:
    which peer, which window, which pages it was assigned. Computed once per fit (kept in it: every
    draw at another size asks)."""
    spreads = source.setdefault("_spreads", {})
    key = f"{kind}/{ranges}"
    if key not in spreads:
        evaluations = source["evaluations"][kind]
        assigned = [sampling_variance(e[3], ranges) for e in evaluations]
        random_ = [sampling_variance(e[4], ranges) for e in evaluations]
        sampling_rand = statistics.fmean(v for v, _ in random_)
        spreads[key] = {
            "gap_variance": statistics.variance([e[1] for e in evaluations]),
            "rand_variance": statistics.variance([e[0] for e in evaluations]),
            "gap_sampling_variance": statistics.fmean(v for v, _ in assigned) + sampling_rand,
            "rand_sampling_variance": sampling_rand,
            "assigned_sequences": statistics.median_low(n for _, n in assigned),
            "random_sequences": statistics.median_low(n for _, n in random_)}
    return spreads[key]


def size_scales(source: dict, kind: str, size: EvalSize) -> tuple[float, float]:
    """How far an evaluation reading `size` lies from the strategy's mean, relative to one the fit
    measured: (the gap's, δ_rand's). Reading n sequences where the fit read m changes the sampling
    part of the variance by m/n and leaves the rest: scale² = 1 − sampling share × (1 − m/n), above
    1 when fewer sequences are read. A strategy evaluated once has no spread to scale: (1, 1)."""
    if len(source["evaluations"][kind]) < 2:
        return 1.0, 1.0
    spread = spread_sources(source, kind, size.ranges)
    rand_extra = spread["rand_sampling_variance"] * (1 - spread["random_sequences"] / size.random_sequences)
    assigned_sampling = spread["gap_sampling_variance"] - spread["rand_sampling_variance"]
    gap_extra = assigned_sampling * (1 - spread["assigned_sequences"] / size.assigned_sequences) + rand_extra

    def scale(extra: float, variance: float) -> float:
        return math.sqrt(max(0.0, 1 - extra / variance)) if variance > 0 else 1.0

    return scale(gap_extra, spread["gap_variance"]), scale(rand_extra, spread["rand_variance"])


def draw(strategy: str, rng: random.Random, noise: float = 1.0, freak_rate: float = 0.0,
         freak_scale: float = 3.66, source: dict | None = None, size: EvalSize | None = None) -> PrimaryResult:
    """One evaluation resampled from the measured ones of the strategy (scaled to nats): a
    (δ_rand, gap) pair from `FIT_FILE`, or, from a fit of whole evaluations (`source` with
    `evaluations`, `subnet_sim_fit.fit_from_evaluations`), every unit of one, so the score book's
    proof by size and extra-work classes run on measured units. With probability `freak_rate` every
    δ is multiplied by `freak_scale` (a freak evaluation).

    `size`: what the simulated validator reads an evaluation, where it differs from the fit's
    localnet (production reads 16 sequences of one page, the crowded localnet 1 of each of 8 pages'
    4). The evaluation's gap and δ_rand then lie from the strategy's means as far as measured times
    `size_scales`, which changes only the part of their spread that is the sampling of sequences;
    each unit keeps its own scatter around them. A pair fit records no units and is drawn as it is."""
    source = source if source is not None else fit()
    kind = {"newcomer": "honest", "copycat": "lazy", "lazy_new": "lazy"}.get(strategy, strategy)
    (mr, _), (mg, _) = source["summary"][kind]["rand_mean_sd"], source["summary"][kind]["gap_mean_sd"]
    sample = rng.choice(source["evaluations"][kind] if "evaluations" in source else source["samples"][kind])
    freak = freak_scale if freak_rate > 0 and rng.random() < freak_rate else 1.0
    if "evaluations" in source:
        rand, gap, pages, units_measured, random_measured, work, declared = sample
        gap_scale, rand_scale = size_scales(source, kind, size) if size else (1.0, 1.0)
        gap_noise, rand_noise = noise * gap_scale, noise * rand_scale
        new_rand, new_gap = mr + (rand - mr) * rand_noise, mg + (gap - mg) * gap_noise

        def assigned(d: float) -> float:  # a unit's own scatter around the evaluation's gap
            return LOSS_SCALE * freak * (new_rand + new_gap + (d - rand - gap) * noise)

        return PrimaryResult(LOSS_SCALE * freak * (new_rand + new_gap), LOSS_SCALE * freak * new_rand,
                             pages=tuple(assigned(d) for d in pages),
                             sequences=tuple(assigned(d) for d in units_measured),
                             work=float(work), declared_units=int(declared),
                             random_units=tuple(LOSS_SCALE * freak * (new_rand + (d - rand) * noise)
                                                for d in random_measured))
    rand, gap = sample
    if noise != 1.0:  # fewer sequences per evaluation: the same means, wider spread
        rand, gap = mr + (rand - mr) * noise, mg + (gap - mg) * noise
    return PrimaryResult(LOSS_SCALE * freak * (rand + gap), LOSS_SCALE * freak * rand)
