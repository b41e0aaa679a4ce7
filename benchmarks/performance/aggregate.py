"""What SparseLoCo's aggregate (`templar.compress.sparseloco.aggregate_clipped_mean`) costs over whole
payloads, with each payload's exact norm computed in one pass per group of tensors, against the same
norms computed tensor by tensor (the baseline, run interleaved in the same process).

    python -m benchmarks.performance.aggregate [--peers 8] [--reps 30] [--out FILE]

Every node aggregates the window's G payloads (the outer step) and a validator one payload per
evaluated peer (its trial step), so on a small model the per-tensor overhead of the exact norm (about
17 small torch operations per tensor) was most of the aggregate. Cases:
- `micro` (the test suite's model: 21 tensors) and `tiny` (`hparams/tiny.json`): the whole aggregate
  of G payloads compressed from random tensors with the preset's compressor;
- `production` (`hparams.json`'s 1.2B shapes, 147 tensors): the norms of one payload, whose values are
  random chunks quantised to the 2-bit grid (building 1.2B-parameter payloads' indices would take
  minutes; the norms are what changed).
Both sides give the same norms, which the script checks. Two torch threads, CPU; prints one JSON
line per case and writes benchmarks/results/aggregate.json.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from unittest import mock

import torch

from benchmarks._common import emit, setup_torch, write_result
from benchmarks.performance.compress import paired_ms
from templar.compress.methods import rule_of
from templar.compress.sparseloco import aggregate
from templar.compress.sparseloco.grid import quantise
from templar.core.config import REPO_ROOT, HParams, load_hparams
from templar.core.model import build_model

PRESETS = {"micro": str(REPO_ROOT / "tests" / "presets" / "micro-gauntlet-1k.json"), "tiny": "tiny", "production": None}


def tensor_by_tensor(named_values: list[tuple[str, torch.Tensor]]) -> list:
    """The baseline: every tensor's norm on its own, as before (`_norm_terms` per tensor)."""
    return [aggregate._norm_terms(values, name) for name, values in named_values]


def shapes_of(hp: HParams) -> dict[str, torch.Size]:
    return {name: p.shape for name, p in build_model(hp, "meta").named_parameters()}


def whole_aggregate(hp: HParams, peers: int, reps: int) -> dict:
    """G payloads of the preset's compressor; the aggregate timed both ways."""
    compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
    shapes = shapes_of(hp)
    gen = torch.Generator().manual_seed(0)
    payloads = [{n: compressor.compress(torch.randn(s, generator=gen) * 2.0 ** -i) for n, s in shapes.items()}
                for i in range(peers)]
    weights = [1.0 / peers] * peers

    def ours():
        return aggregate.aggregate_clipped_mean(payloads, weights, shapes)

    def baseline():
        with mock.patch.object(aggregate, "_payload_norm_terms", tensor_by_tensor):
            return aggregate.aggregate_clipped_mean(payloads, weights, shapes)

    first, second = ours(), baseline()
    same = all(torch.equal(first[n], second[n]) for n in shapes)
    ours_ms, baseline_ms = paired_ms(ours, baseline, reps)
    return {"tensors": len(shapes), "peers": peers, "values_per_payload": sum(c.values.numel() for c in payloads[0].values()),
            "aggregate_ms": ours_ms, "baseline_ms": baseline_ms, "ratio": ours_ms / baseline_ms, "bit_identical": same}


def production_norms(hp: HParams, reps: int) -> dict:
    """One payload's norms on the 1.2B shapes: grid values of the production compressor's layout."""
    compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
    gen = torch.Generator().manual_seed(0)
    named = []
    for name, shape in shapes_of(hp).items():
        plan = compressor.plan(shape)
        named.append((name, quantise(torch.randn(plan.n_chunks, compressor.k_for(plan), generator=gen))))
    same = aggregate._payload_norm_terms(named) == tensor_by_tensor(named)
    ours_ms, baseline_ms = paired_ms(functools.partial(aggregate._payload_norm_terms, named),
                                     functools.partial(tensor_by_tensor, named), reps)
    return {"tensors": len(named), "values_per_payload": sum(v.numel() for _, v in named), "norms_ms": ours_ms,
            "baseline_ms": baseline_ms, "ratio": ours_ms / baseline_ms, "bit_identical": same}


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
        figures = production_norms(hp, max(3, args.reps // 10)) if case == "production" else \
            whole_aggregate(hp, args.peers, args.reps)
        results[case] = {"case": case, "preset": hp.name, **figures}
        emit(results[case])
    out = Path(args.out) if args.out else None
    write_result(out.name if out else "aggregate.json", results, *([out.parent] if out else []))
    return 0 if all(r["bit_identical"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
