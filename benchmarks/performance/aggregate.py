"""What the exact norms of SparseLoCo's aggregate (`templar.compress.sparseloco.aggregate_clipped_mean`)
cost over whole payloads: one call of `payload_norm_squared` over a payload's tensors (one pass per
group of them), against the same function called tensor by tensor (the baseline, as the aggregate
computed them before; interleaved in the same process).

    python -m benchmarks.performance.aggregate [--peers 8] [--reps 30] [--out FILE]

Every node aggregates the window's G payloads (the outer step) and a validator one payload per
evaluated peer (its trial step), and each aggregate computes each payload's exact norm. On a small
model the per-tensor overhead of that norm (about 17 small torch operations per tensor) was most of
the aggregate. Cases:
- `micro` (the test suite's model: 21 tensors) and `tiny` (`hparams/tiny.json`): payloads compressed
  from random tensors with the preset's compressor; also the whole aggregate of G of them;
- `production` (`hparams.json`'s 1.2B shapes, 147 tensors): one payload whose values are random chunks
  quantised to the 2-bit grid (building 1.2B-parameter payloads' indices would take minutes; the
  norms are what changed).
Both sides must give the same norm, which the script checks (exit 1 otherwise). Two torch threads,
CPU; prints one JSON line per case and writes benchmarks/results/aggregate.json.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from pathlib import Path

import torch

from benchmarks._common import emit, median, setup_torch, timed, write_result
from benchmarks.performance.compress import paired_ms
from templar.compress import Compressed
from templar.compress.methods import rule_of
from templar.compress.sparseloco import aggregate_clipped_mean, payload_norm_squared
from templar.compress.sparseloco.grid import quantise
from templar.core.config import REPO_ROOT, HParams, load_hparams
from templar.core.model import build_model

PRESETS = {"micro": str(REPO_ROOT / "tests" / "presets" / "micro-gauntlet-1k.json"), "tiny": "tiny", "production": None}


def payloads_of(hp: HParams, peers: int, grid_only: bool) -> tuple[list[dict[str, Compressed]], dict[str, torch.Size]]:
    """`peers` payloads of the preset's compressor, or with `grid_only` one payload of grid values in
    its layout (placeholder indices: the norms read only the values)."""
    compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
    shapes = {name: p.shape for name, p in build_model(hp, "meta").named_parameters()}
    gen = torch.Generator().manual_seed(0)
    if not grid_only:
        return [{n: compressor.compress(torch.randn(s, generator=gen) * 2.0 ** -i) for n, s in shapes.items()}
                for i in range(peers)], shapes
    payload = {}
    for name, shape in shapes.items():
        plan = compressor.plan(shape)
        values = quantise(torch.randn(plan.n_chunks, compressor.k_for(plan), generator=gen))
        payload[name] = Compressed(indices=torch.zeros(values.shape, dtype=torch.int64), values=values, shape=shape,
                                   chunk=plan.chunk)
    return [payload], shapes


def measure(hp: HParams, peers: int, reps: int, grid_only: bool) -> dict:
    payloads, shapes = payloads_of(hp, peers, grid_only)
    names = list(shapes)
    payload = payloads[0]

    def grouped():
        return payload_norm_squared(payload, names)

    def tensor_by_tensor():
        return sum((payload_norm_squared(payload, [name]) for name in names), Fraction(0))

    ours_ms, baseline_ms = paired_ms(grouped, tensor_by_tensor, reps)
    figures = {"tensors": len(names), "values_per_payload": sum(c.values.numel() for c in payload.values()),
               "norms_ms": ours_ms, "norms_tensor_by_tensor_ms": baseline_ms, "ratio": ours_ms / baseline_ms,
               "same_norm": grouped() == tensor_by_tensor()}
    if len(payloads) > 1:
        weights = [1.0 / len(payloads)] * len(payloads)
        figures["peers"] = len(payloads)
        figures["aggregate_ms"] = 1000 * median([timed(lambda: aggregate_clipped_mean(payloads, weights, shapes))[1]
                                                for _ in range(reps)])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=8, help="payloads aggregated (G) in the micro and tiny cases")
    parser.add_argument("--reps", type=int, default=30, help="interleaved timed runs of each side")
    parser.add_argument("--cases", default="micro,tiny,production", help="comma-separated: micro, tiny, production")
    parser.add_argument("--out", default=None, help="where to write the JSON (default benchmarks/results/aggregate.json)")
    args = parser.parse_args(argv)
    setup_torch()
    results = {}
    for case in args.cases.split(","):
        hp = load_hparams(PRESETS[case])
        at_scale = case == "production"
        results[case] = {"case": case, "preset": hp.name,
                         **measure(hp, args.peers, max(3, args.reps // 10) if at_scale else args.reps, at_scale)}
        emit(results[case])
    out = Path(args.out) if args.out else None
    write_result(out.name if out else "aggregate.json", results, *([out.parent] if out else []))
    return 0 if all(r["same_norm"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
