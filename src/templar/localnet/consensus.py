"""What Yuma consensus makes of the localnet's validators, window by window (for the report).

Each validator logs its weight vector x every window (`scores.jsonl`). This runs the embedded
chain's epoch (`templar.chain.embedded.yuma`) on those vectors, with the validators' stakes from
nodes.json, as if an epoch fell on every window: the incentive each miner would be paid after
consensus and clipping, each validator's vtrust, and how far the validators agree (1 − total
variation distance between their normalised weights, averaged over pairs). The chain's own
epochs run every tempo (360 blocks by default), which a short localnet may never reach.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from templar.chain.embedded import yuma
from templar.runtime.records import SCORES_FILE, read_records
from templar.runtime.roster import NodeInfo


def consensus_by_window(out: Path, nodes: list[NodeInfo]) -> list[dict]:
    """Per window seen by every validator: agreement, vtrust and incentive per node name."""
    validators = [n for n in nodes if n.role == "validator"]
    if not validators:
        return []
    by_hotkey = {n.hotkey: n for n in nodes}
    weights: dict[int, dict[str, dict[str, float]]] = defaultdict(dict)  # window -> validator -> name -> x
    for v in validators:
        for rec in read_records(v.directory(out) / SCORES_FILE):
            node = by_hotkey.get(rec.get("hotkey"))
            window, weight = rec.get("window"), rec.get("weight")
            if (node is not None and isinstance(window, int) and not isinstance(window, bool)
                    and isinstance(weight, int | float) and math.isfinite(weight) and weight >= 0):
                weights[window].setdefault(v.name, {})[node.name] = float(weight)
    size = max(n.uid for n in nodes) + 1
    stake = np.zeros(size)
    for v in validators:
        stake[v.uid] = max(v.stake, 0.0)
    bonds = None
    rows = []
    for window in sorted(weights):
        vectors = weights[window]
        if len(vectors) < len(validators):
            continue  # a validator had not reached this window (or stopped before it)
        matrix = np.zeros((size, size))
        for v in validators:
            for name, x in vectors[v.name].items():
                matrix[v.uid, next(n.uid for n in nodes if n.name == name)] = x
        result = yuma.epoch(yuma.EpochInputs(
            weights=matrix, stake=stake, permit=stake > 0, last_update=np.full(size, window + 1, dtype=np.int64),
            registered_at=np.zeros(size, dtype=np.int64), block=window + 1, bonds=bonds))
        bonds = result.bonds
        pairs = [yuma.agreement(vectors[a.name], vectors[b.name])
                 for i, a in enumerate(validators) for b in validators[:i]]
        rows.append({
            "window": window,
            "agreement": float(np.mean(pairs)) if pairs else 1.0,
            "agreement_min": float(min(pairs)) if pairs else 1.0,
            "vtrust": {v.name: float(result.validator_trust[v.uid]) for v in validators},
            "incentive": {n.name: float(result.incentive[n.uid]) for n in nodes if n.role == "miner"},
            "weights": {v.name: dict(vectors[v.name]) for v in validators},
        })
    return rows


def render_consensus(rows: list[dict], nodes: list[NodeInfo]) -> list[str]:
    """Markdown: the last window's weights per validator next to the incentive after Yuma, then agreement."""
    if not rows:
        return []
    last = rows[-1]
    validators = [n.name for n in nodes if n.role == "validator"]
    miners = sorted((n for n in nodes if n.role == "miner"), key=lambda n: -last["incentive"].get(n.name, 0.0))
    lines = ["", f"## Consensus (Yuma epoch on window {last['window']}'s weights)", "",
             "| miner | strategy | " + " | ".join(f"{v} weight" for v in validators) + " | incentive after Yuma |",
             "|---|---|" + "---|" * len(validators) + "---|"]
    for n in miners:
        cells = " | ".join(f"{last['weights'][v].get(n.name, 0.0):.3f}" for v in validators)
        lines.append(f"| {n.name} | {n.strategy} | {cells} | {last['incentive'].get(n.name, 0.0):.3f} |")
    lines += ["", "| window | validator agreement (mean 1 − TV) | min pair | "
              + " | ".join(f"{v} vtrust" for v in validators) + " |",
              "|---|---|---|" + "---|" * len(validators)]
    for row in rows:
        vt = " | ".join(f"{row['vtrust'][v]:.3f}" for v in validators)
        lines.append(f"| {row['window']} | {row['agreement']:.3f} | {row['agreement_min']:.3f} | {vt} |")
    return lines
