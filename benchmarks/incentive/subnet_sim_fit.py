"""The measured LossScores `subnet_sim.py` resamples: fitted once from a localnet's score records.

    python -m benchmarks.incentive.subnet_sim --fit LOCALNET_OUT     # rewrites results/subnet_sim_fit.json
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

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


_FIT: dict | None = None


def fit() -> dict:
    global _FIT
    if _FIT is None:
        _FIT = json.loads(FIT_FILE.read_text())
    return _FIT
