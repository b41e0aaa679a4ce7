"""How alike are two peers' same-window payloads? The honest distribution that calibrates the
shared-work check (`templar.gauntlet.duplicates.shares_work`, docs/scoring.md §8).

Reads every gradient a finished localnet left in its buckets (`templar localnet --out DIR`; each
miner keeps its last `max_allowed_stale` + 2 windows) and, for every pair of miners in every
window, measures what the validator's check measures: the cosine of the two fingerprints and the
share of top-k positions the two payloads have in common, both over the validator's sample (4
tensors × 8 chunks drawn by a private salt; 8 salts per pair here, each one sample), plus the same two figures
over the whole payload. Pairs are classed by the two miners' strategies: `honest` (honest and
`moredata` miners), `pooled` (two hotkeys of one `pooled` group), `partial` (a `partial` miner and
anyone), `other`.

    python -m benchmarks.incentive.similarity OUT_DIR [OUT_DIR ...] [--stem similarity]

Writes `benchmarks/results/<stem>.json`: per class, the number of pairs and the min / p50 / p99 /
max of each figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import RESULTS_DIR, setup_torch
from templar.core.config import HParams, load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.gauntlet.duplicates import fingerprint, shared_positions
from templar.validator.fast_eval import first_sample
from templar.wire import PayloadError, Run, read_gradient

SALTS = 8
HONEST = {"honest", "moredata"}


def _class(a: dict, b: dict) -> str:
    kinds = {a["strategy"], b["strategy"]}
    if kinds <= HONEST:
        return "honest"
    if kinds == {"pooled"} and a["name"].rpartition("-")[0] == b["name"].rpartition("-")[0]:
        return "pooled"
    if "partial" in kinds:
        return "partial"
    return "other"


def _whole(tensors) -> dict[str, torch.Tensor]:
    out = {}
    for name, c in tensors.items():
        dense = torch.zeros(c.indices.shape[0], c.plan.chunk_numel)
        dense.scatter_(1, c.indices, c.values.float())
        out[name] = dense.view(-1)
    return out


def _cosine(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Exact cosine of the per-tensor L2-normalised payloads (what the fingerprint estimates)."""
    def unit(v: dict[str, torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.double() / torch.linalg.vector_norm(t.double()).clamp_min(1e-300) for t in v.values()])
        return flat / torch.linalg.vector_norm(flat).clamp_min(1e-300)
    return float(unit(a) @ unit(b))


def run_hparams(out: Path, hparams: str | None = None) -> HParams:
    """A localnet's hparams: `hparams` if given, else the seeded run's own file, else `tiny` (the default)."""
    hp_path = out / "hparams.json"
    return load_hparams(hparams or (str(hp_path) if hp_path.exists() else "tiny"))


def localnet_payloads(out: Path, hparams: str | None = None, strategies: set[str] | None = None
                      ) -> dict[int, dict[str, Any]]:
    """Every non-warm-up payload a localnet's miners (of `strategies`; None: all) left in their
    buckets, by window and miner name, read under the run's hparams (unreadable ones skipped)."""
    hp = run_hparams(out, hparams)
    shapes = parameter_shapes(build_model(hp))
    run = Run(1, hp.digest())
    nodes = {n["name"]: n for n in json.loads((out / "nodes.json").read_text()) if n["role"] == "miner"}
    payloads: dict[int, dict[str, Any]] = {}
    for name, node in nodes.items():
        if strategies is not None and node["strategy"] not in strategies:
            continue
        for path in sorted((out / "buckets" / name).glob("v*/gradient/*.safetensors")):
            try:
                g = read_gradient(path.read_bytes(), shapes, hp, run=run, verify=None)
            except PayloadError:
                continue
            if not g.warmup:
                payloads.setdefault(g.window, {})[name] = g
    return payloads


def measure(out: Path, hparams: str | None = None) -> list[tuple[str, dict[str, list[float]]]]:
    payloads = localnet_payloads(out, hparams)
    rules = run_hparams(out, hparams).gauntlet  # the validator's samples and fingerprint size
    nodes = {n["name"]: n for n in json.loads((out / "nodes.json").read_text()) if n["role"] == "miner"}
    pairs = []
    for window, found in sorted(payloads.items()):
        whole = {name: _whole(g.tensors) for name, g in found.items()}
        sampled = {name: [first_sample(g.tensors, window * 1000 + salt, rules) for salt in range(SALTS)]
                   for name, g in found.items()}
        prints = {name: [fingerprint(v, size=rules.fingerprint_size) for v in values] for name, values in sampled.items()}
        for a, b in itertools.combinations(sorted(found), 2):
            figures = {"cosine_all": [_cosine(whole[a], whole[b])],
                       "shared_all": [shared_positions(whole[a], whole[b])],
                       "cosine": [float(prints[a][i] @ prints[b][i]) for i in range(SALTS)],
                       "shared": [shared_positions(sampled[a][i], sampled[b][i]) for i in range(SALTS)]}
            pairs.append((_class(nodes[a], nodes[b]), figures))
    return pairs


def summarise(pairs: list[tuple[str, dict[str, list[float]]]]) -> dict:
    out: dict[str, dict] = {}
    for cls in sorted({c for c, _ in pairs}):
        rows = [f for c, f in pairs if c == cls]
        out[cls] = {"pairs": len(rows)}
        for key in rows[0]:
            values = sorted(v for r in rows for v in r[key])
            p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
            out[cls][key] = {"min": round(values[0], 4), "p50": round(statistics.median(values), 4),
                             "p99": round(p99, 4), "max": round(values[-1], 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", nargs="+", type=Path)
    parser.add_argument("--stem", default="similarity")
    parser.add_argument("--hparams", default=None, help="the runs' preset (default: OUT/hparams.json, else tiny); "
                        "payloads of another run (hparams digest) are skipped")
    args = parser.parse_args()
    setup_torch()
    pairs = [p for out in args.outs for p in measure(out, args.hparams)]
    result = {"runs": [str(o) for o in args.outs], "salts_per_pair": SALTS,
              "note": "cosine/shared: the validator's sampled figures (one sample per pair and salt); "
                      "*_all: the whole payload",
              "classes": summarise(pairs)}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{args.stem}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["classes"], indent=1))


if __name__ == "__main__":
    main()
