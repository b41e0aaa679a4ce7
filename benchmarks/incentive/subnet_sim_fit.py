"""The measured LossScores `subnet_sim.py` resamples: fitted once from a localnet's score records.

    python -m benchmarks.incentive.subnet_sim --fit LOCALNET_OUT     # rewrites results/subnet_sim_fit.json
"""

from __future__ import annotations

import json
import math
import random
import statistics
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
                             "rand_mean_sd": [round(statistics.fmean(rand), 3), round(statistics.stdev(rand), 3)],
                             "gap_mean_sd": [round(statistics.fmean(gap), 3), round(statistics.stdev(gap), 3)],
                             "gap_negative": round(sum(g < 0 for g in gap) / len(gap), 3)}
    return {"source": f"{FIT_RUN}: {len(validators)} validators' scores.jsonl, {len(records)} primary evaluations "
                      "(copycat was caught as `copy` in every window and has none: it is drawn as `lazy`)",
            "summary": summary,
            "samples": {k: [[round(r, 4), round(g, 4)] for r, g in v] for k, v in sorted(relative.items())}}


UNITS_FIT_FILE = RESULTS_DIR / "subnet_sim_fit_units.json"
"""Whole evaluations, every unit of each (written by `fit_from_evaluations`): what production's
validator hands its score book (`PrimaryResult`: the pages, the position-range units of assigned and
declared pages, the random pages' units, the declared work), so the simulator's μ runs the proof by
size, the extra-work classes and the dilution on measured units instead of one (δ_rand, gap) pair."""

LOSS_SCALE = 0.04
"""Mean honest δ_rand of `FIT_FILE`'s run (nats): the draws' relative δ times this; only
`proof_margin` > 0 looks at absolute sizes."""

_FITS: dict[Path, dict] = {}


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
    strategy) and `evaluations`: per strategy, [rand, gap, pages, units, random_units, work,
    declared_units] for each evaluation, relative."""
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
    for key, strategy, rec in records:
        m = scale.get(key, 0.0)
        if m > 0 and math.isfinite(rec["delta_assigned"]):
            rand = rec["delta_rand"] / m
            evaluations.setdefault(strategy, []).append([
                round(rand, 5), round(rec["delta_assigned"] / m - rand, 5), _rounded(rec["pages"], m),
                _rounded(rec["units"], m), _rounded(rec["random_units"], m), rec["work"], rec["declared_units"]])
    summary = {}
    for strategy, evals in sorted(evaluations.items()):
        rand, gap = [e[0] for e in evals], [e[1] for e in evals]
        summary[strategy] = {"n": len(evals),
                             "rand_mean_sd": [round(statistics.fmean(rand), 3), round(statistics.stdev(rand), 3)],
                             "gap_mean_sd": [round(statistics.fmean(gap), 3), round(statistics.stdev(gap), 3)],
                             "gap_negative": round(sum(g < 0 for g in gap) / len(gap), 3)}
    return {"source": f"{source}: {len(records)} primary evaluations with every unit", "summary": summary,
            "evaluations": dict(sorted(evaluations.items()))}


def draw(strategy: str, rng: random.Random, noise: float = 1.0, freak_rate: float = 0.0,
         freak_scale: float = 3.66, source: dict | None = None) -> PrimaryResult:
    """One evaluation resampled from the measured ones of the strategy (scaled to nats): a
    (δ_rand, gap) pair from `FIT_FILE`, or, from a fit of whole evaluations (`source` with
    `evaluations`, `subnet_sim_fit.fit_from_evaluations`), every unit of one, so the score book's
    proof by size and extra-work classes run on measured units. With probability `freak_rate` every
    δ is multiplied by `freak_scale` (a freak evaluation)."""
    source = source if source is not None else fit()
    kind = {"newcomer": "honest", "copycat": "lazy", "lazy_new": "lazy"}.get(strategy, strategy)
    (mr, _), (mg, _) = source["summary"][kind]["rand_mean_sd"], source["summary"][kind]["gap_mean_sd"]
    sample = rng.choice(source["evaluations"][kind] if "evaluations" in source else source["samples"][kind])
    freak = freak_scale if freak_rate > 0 and rng.random() < freak_rate else 1.0
    if "evaluations" in source:
        rand, gap, pages, units, random_units, work, declared = sample
        new_rand, new_gap = mr + (rand - mr) * noise, mg + (gap - mg) * noise

        def assigned(d: float) -> float:  # a unit's scatter around the evaluation's gap, × noise
            return LOSS_SCALE * freak * (new_rand + new_gap + (d - rand - gap) * noise)

        return PrimaryResult(LOSS_SCALE * freak * (new_rand + new_gap), LOSS_SCALE * freak * new_rand,
                             pages=tuple(assigned(d) for d in pages), sequences=tuple(assigned(d) for d in units),
                             work=float(work), declared_units=int(declared),
                             random_units=tuple(LOSS_SCALE * freak * (new_rand + (d - rand) * noise)
                                                for d in random_units))
    rand, gap = sample
    if noise != 1.0:  # fewer sequences per evaluation: the same means, wider spread
        rand, gap = mr + (rand - mr) * noise, mg + (gap - mg) * noise
    return PrimaryResult(LOSS_SCALE * freak * (rand + gap), LOSS_SCALE * freak * rand)
