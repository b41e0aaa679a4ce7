"""DeMo compression benchmark: templar.compress against the reference implementation's approach.

    python -m benchmarks.performance.compress               # 1.2B shapes, 2-4 minutes on 2 CPU threads
    python -m benchmarks.performance.compress --quick       # small shapes, a few seconds
    python -m benchmarks.performance.compress --torch-only  # without the C kernels (templar.compress.native)

Prints one JSON line per parameter shape, then a summary line. Every case compares, in the same
process and on the same data:
- `roundtrip`: compress + decompress to a fresh dense tensor;
- `ef_step`: one error-feedback step (`e <- e - decompress(compress(e))`, what a miner runs);
- `aggregate`: sign of the normalised sum of G=15 peers (what every node runs each window);
with the baseline written the way the reference (tplr v0.2.x, after bloc97/DeMo) does it: the
chunked view `(y h)(x w) -> y x h w`, `torch.einsum` DCT per chunk, `topk` over `h*w`, int16
indices and fp32 values, decompression by scatter into dense chunks and an einsum inverse, and
aggregation by concatenating all peers' indices into one scatter. For the padded embedding (vocab
32003 is prime) the baseline runs on the same zero-padded 64x64 chunks (the reference's own rule
would pick 1x64 chunks there and send half of the embedding), so both select the same
coefficients; the
`same_indices` field checks it (chunks differing only by float-rounding near-ties are reported).
Bytes are the `rice-mxint8` wire codec against the reference's 6 bytes per coefficient, and
`sign_agreement` compares the aggregate of decoded payloads with full-precision values.
`kernels` says which path ran: `native` (the C forward DCT fused with top-k, sparse decode and
accumulation) or `torch`.

The `q2_*` fields measure SparseLoCo's path (`templar.compress.sparseloco`) on the same data, at
its own geometry (64 of every 64x64 chunk, no transform, 2-bit values): its error-feedback step
(with a new Δ folded in each time, `e <- 0.95 e + Δ`, on both paths), its `rice-q2` bytes, and the median-clipped mean of G=15 peers, each as a ratio against the DeMo
path above (`q2_*_vs_demo`: SparseLoCo's time over DeMo's, measured interleaved). Bytes per
parameter compare the two methods' payloads (DeMo: 32 of every chunk in `rice-mxint8`).
The full run also writes `benchmarks/results/compress.json` (`compress_torch.json` with --torch-only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from templar.compress import Compressed, DCTCompressor, aggregate, dct_basis, native, plan_chunks
from templar.compress.sparseloco import SparseLoCoCompressor, aggregate_clipped_mean
from templar.wire import Q2_CODEC, codec, codec_for

Q2_TOPK = 64  # SparseLoCo keeps 64 of every 64x64 chunk

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"

FULL_CASES = {
    "attn_2048x2048": (2048, 2048),
    "mlp_up_8192x2048": (8192, 2048),
    "mlp_down_2048x8192": (2048, 8192),
    "norm_2048": (2048,),
    "embed_32003x2048": (32003, 2048),
}
QUICK_CASES = {
    "attn_512x512": (512, 512),
    "mlp_1024x256": (1024, 256),
    "norm_512": (512,),
    "embed_8191x128": (8191, 128),
}


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm caches and scratch buffers
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def paired_ms(ours: Callable[[], object], baseline: Callable[[], object], reps: int) -> tuple[float, float]:
    """Medians of interleaved runs, so a noisy shared machine slows both sides alike."""
    ours()  # warms the scratch buffers; the baseline keeps none
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for fn, bucket in ((ours, times[0]), (baseline, times[1])):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[0]), 1000 * statistics.median(times[1])


class ReferenceDeMo:
    """The reference's approach on 2-D chunks `h x w` (1-D tensors are one row of chunks)."""

    def __init__(self, h: int, w: int, topk: int) -> None:
        self.h, self.w, self.topk = h, w, topk
        self.f_h, self.f_w = dct_basis(h).T.contiguous(), dct_basis(w).T.contiguous()
        self.b_h, self.b_w = dct_basis(h), dct_basis(w)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        rows, cols = x.shape
        chunked = x.view(rows // self.h, self.h, cols // self.w, self.w).permute(0, 2, 1, 3)
        return torch.einsum("...ijkl, kb, ld -> ...ijbd", chunked, self.f_h, self.f_w)

    def compress(self, coef: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Size]:
        flat = coef.reshape(coef.shape[0], coef.shape[1], -1)
        idx = torch.topk(flat.abs(), k=self.topk, dim=-1, largest=True, sorted=False).indices
        return idx.to(torch.int16), torch.gather(flat, -1, idx), coef.shape

    def decompress(self, idx: torch.Tensor, val: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        x = torch.zeros(shape[0], shape[1], shape[2] * shape[3])
        x.scatter_reduce_(-1, idx.long(), val, reduce="sum", include_self=False)
        return x.view(shape)

    def decode(self, coef: torch.Tensor) -> torch.Tensor:
        y, x = coef.shape[:2]
        out = torch.einsum("...ijbd, bk, dl -> ...ijkl", coef, self.b_h, self.b_w)
        return out.permute(0, 2, 1, 3).reshape(y * self.h, x * self.w)

    def aggregate(
        self, peers: list[tuple[torch.Tensor, torch.Tensor]], weights: list[float], shape
    ) -> torch.Tensor:
        idx = torch.cat([i.long() for i, _ in peers], dim=-1)
        val = torch.cat([w * v / v.norm() for (_, v), w in zip(peers, weights, strict=True)], dim=-1)
        return torch.sign(self.decode(self.decompress(idx, val, shape)))


def structured(shape: tuple[int, int], gen: torch.Generator, shared: torch.Tensor | None) -> torch.Tensor:
    """A shared smooth component (decaying spectrum) plus per-peer noise, like real pseudo-gradients."""
    noise = torch.randn(shape, generator=gen)
    return noise if shared is None else shared + 0.7 * noise


def smooth(shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen)
    x = torch.cumsum(x, dim=0) / shape[0] ** 0.5
    return torch.cumsum(x, dim=1) / shape[1] ** 0.5


def run_case(name: str, shape: tuple[int, ...], peers: int, reps: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(0)
    compressor = DCTCompressor(64, 32)
    plan = plan_chunks(shape, 64)
    rows, cols = plan.rows, plan.cols
    p_rows, p_cols = plan.padded
    ref = ReferenceDeMo(plan.h, plan.w, compressor.k_for(plan))
    shared = smooth((rows, cols), gen)
    x = structured((rows, cols), gen, shared).reshape(shape)

    def pad(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(p_rows, p_cols)
        out[:rows, :cols] = t.reshape(rows, cols)
        return out

    def ref_roundtrip(t: torch.Tensor) -> torch.Tensor:
        idx, val, coef_shape = ref.compress(ref.encode(pad(t)))
        return ref.decode(ref.decompress(idx, val, coef_shape))[:rows, :cols].reshape(shape)

    def ref_ef_step(e: torch.Tensor) -> None:
        e.sub_(ref_roundtrip(e))

    kernels = "native" if native.available() else "torch"
    out: dict[str, object] = {
        "case": name,
        "shape": list(shape),
        "chunk": [plan.h, plan.w],
        "kernels": kernels,
    }
    ours_rt, base_rt = paired_ms(
        lambda: compressor.decompress(compressor.compress(x)), lambda: ref_roundtrip(x), reps
    )
    e_ours, e_base = x.clone(), x.clone()
    ours_ef, base_ef = paired_ms(
        lambda: compressor.compress_residual_(e_ours), lambda: ref_ef_step(e_base), reps
    )

    ours_c = compressor.compress(x)
    ref_idx, _, coef_shape = ref.compress(ref.encode(pad(x)))
    ref_sorted = ref_idx.long().reshape(plan.n_chunks, -1).sort(dim=1).values
    differ = (ref_sorted != ours_c.indices).any(dim=1)
    near_tie = True
    if bool(differ.any()):  # the two transforms round differently: only k-th/k+1-th near-ties may swap
        coef = ref.encode(pad(x)).reshape(plan.n_chunks, -1).abs()
        kth = torch.topk(coef[differ], ours_c.k + 1, dim=1).values
        near_tie = bool(((kth[:, -2] - kth[:, -1]) <= 1e-5 * kth[:, -2]).all())
    out.update(
        roundtrip_ms=round(ours_rt, 2),
        baseline_roundtrip_ms=round(base_rt, 2),
        roundtrip_speedup=round(base_rt / ours_rt, 2),
        ef_step_ms=round(ours_ef, 2),
        baseline_ef_step_ms=round(base_ef, 2),
        ef_step_speedup=round(base_ef / ours_ef, 2),
        same_indices=round(1 - float(differ.float().mean()), 6),
        mismatches_are_near_ties=near_tie,
    )

    parts = codec.encode(ours_c)
    nbytes = sum(t.numel() * t.element_size() for t in parts.values())
    out.update(
        coefficients=ours_c.n_coefficients,
        payload_bytes=nbytes,
        bytes_per_coef=round(nbytes / ours_c.n_coefficients, 3),
        reference_bytes=6 * ours_c.n_coefficients,
        encode_ms=round(median_ms(lambda: codec.encode(ours_c), reps), 2),
        decode_ms=round(median_ms(lambda: codec.decode(parts, plan, ours_c.k, name), reps), 2),
    )

    peer_list: list[Compressed] = [
        compressor.compress(structured((rows, cols), gen, shared).reshape(shape)) for _ in range(peers)
    ]
    weights = [1.0 / peers] * peers
    shapes = {name: torch.Size(shape)}
    ref_peers = [
        (c.indices.view(*coef_shape[:2], -1).to(torch.int16), c.values.view(*coef_shape[:2], -1))
        for c in peer_list
    ]
    ours_agg, base_agg = paired_ms(
        lambda: aggregate([{name: c} for c in peer_list], weights, shapes),
        lambda: ref.aggregate(ref_peers, weights, coef_shape),
        reps,
    )
    exact = aggregate([{name: c} for c in peer_list], weights, shapes)[name]
    decoded = [{name: codec.decode(codec.encode(c), plan, c.k, name)} for c in peer_list]
    compact = aggregate(decoded, weights, shapes)[name]
    reference_sign = ref.aggregate(ref_peers, weights, coef_shape)[:rows, :cols].reshape(shape)
    out.update(
        aggregate_ms=round(ours_agg, 2),
        baseline_aggregate_ms=round(base_agg, 2),
        aggregate_speedup=round(base_agg / ours_agg, 2),
        sign_agreement=round(float((exact == compact).float().mean()), 5),
        baseline_sign_agreement=round(float((exact == reference_sign).float().mean()), 5),
    )
    out.update(bytes_per_param=round(nbytes / x.numel(), 4))
    out.update(run_sparseloco(name, shape, x, gen, shared, peer_list, weights, compressor, reps))
    return out


def run_sparseloco(
    name: str,
    shape: tuple[int, ...],
    x: torch.Tensor,
    gen: torch.Generator,
    shared: torch.Tensor,
    demo_peers: list[Compressed],
    weights: list[float],
    demo: DCTCompressor,
    reps: int,
) -> dict[str, object]:
    """SparseLoCo's error-feedback step, codec and aggregate, each paired with DeMo's."""
    q2 = SparseLoCoCompressor(64, Q2_TOPK)
    wire = codec_for(Q2_CODEC)
    plan = q2.plan(shape)
    # A miner's step, e <- 0.95·e + Δ then compress_residual_(e), on both paths: without new input
    # the value-domain buffer degenerates to quantisation residuals after a few repetitions.
    delta = structured((plan.rows, plan.cols), gen, shared).reshape(shape)
    e_q2, e_demo = x.clone(), x.clone()

    def step(e: torch.Tensor, compressor: SparseLoCoCompressor | DCTCompressor) -> None:
        e.mul_(0.95).add_(delta)
        compressor.compress_residual_(e)

    q2_ef, demo_ef = paired_ms(lambda: step(e_q2, q2), lambda: step(e_demo, demo), reps)
    c = q2.compress(x)
    parts = wire.encode(c)
    nbytes = sum(t.numel() * t.element_size() for t in parts.values())
    peers = [q2.compress(structured((plan.rows, plan.cols), gen, shared).reshape(shape)) for _ in demo_peers]
    decoded = [{name: wire.decode(wire.encode(p), plan, p.k, name)} for p in peers]
    shapes = {name: torch.Size(shape)}
    q2_agg, demo_agg = paired_ms(
        lambda: aggregate_clipped_mean(decoded, weights, shapes),
        lambda: aggregate([{name: c} for c in demo_peers], weights, shapes),
        reps,
    )
    return {
        "q2_ef_step_ms": round(q2_ef, 2),
        "q2_ef_step_vs_demo": round(q2_ef / demo_ef, 2),
        "q2_coefficients": c.n_coefficients,
        "q2_payload_bytes": nbytes,
        "q2_bytes_per_coef": round(nbytes / c.n_coefficients, 3),
        "q2_bytes_per_param": round(nbytes / x.numel(), 4),
        "q2_encode_ms": round(median_ms(lambda: wire.encode(c), reps), 2),
        "q2_decode_ms": round(median_ms(lambda: wire.decode(parts, plan, c.k, name), reps), 2),
        "q2_aggregate_ms": round(q2_agg, 2),
        "q2_aggregate_vs_demo": round(q2_agg / demo_agg, 2),
        "demo_ef_step_ms_paired": round(demo_ef, 2),
        "demo_aggregate_ms_paired": round(demo_agg, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds instead of minutes)")
    parser.add_argument("--peers", type=int, default=15, help="G, peers in the aggregate")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per measurement (median)")
    parser.add_argument("--case", action="append", default=None, help="run only these case names")
    parser.add_argument(
        "--torch-only", action="store_true", help="disable the C kernels (compare both paths)"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    started = time.perf_counter()
    rows = []
    cases = QUICK_CASES if args.quick else FULL_CASES
    unknown = sorted(set(args.case or ()) - set(cases))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {sorted(cases)}")
    with native.disabled() if args.torch_only else contextlib.nullcontext():
        for name, shape in cases.items():
            if args.case and name not in args.case:
                continue
            row = run_case(name, shape, args.peers, args.reps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    coefficients = sum(int(r["coefficients"]) for r in rows)
    summary = {
        "case": "total",
        "roundtrip_speedup": round(
            sum(r["baseline_roundtrip_ms"] for r in rows) / sum(r["roundtrip_ms"] for r in rows), 2
        ),
        "ef_step_speedup": round(
            sum(r["baseline_ef_step_ms"] for r in rows) / sum(r["ef_step_ms"] for r in rows), 2
        ),
        "aggregate_speedup": round(
            sum(r["baseline_aggregate_ms"] for r in rows) / sum(r["aggregate_ms"] for r in rows), 2
        ),
        "bytes_per_coef": round(sum(int(r["payload_bytes"]) for r in rows) / coefficients, 3),
        "bytes_per_param": round(
            sum(int(r["payload_bytes"]) for r in rows) / sum(math.prod(r["shape"]) for r in rows), 4
        ),
        "q2_bytes_per_param": round(
            sum(int(r["q2_payload_bytes"]) for r in rows) / sum(math.prod(r["shape"]) for r in rows), 4
        ),
        "q2_bytes_per_coef": round(
            sum(int(r["q2_payload_bytes"]) for r in rows) / sum(int(r["q2_coefficients"]) for r in rows), 3
        ),
        "q2_ef_step_vs_demo": round(
            sum(r["q2_ef_step_ms"] for r in rows) / sum(r["demo_ef_step_ms_paired"] for r in rows), 2
        ),
        "q2_aggregate_vs_demo": round(
            sum(r["q2_aggregate_ms"] for r in rows) / sum(r["demo_aggregate_ms_paired"] for r in rows), 2
        ),
        "min_sign_agreement": min(r["sign_agreement"] for r in rows),
        "kernels": rows[0]["kernels"],
        "threads": torch.get_num_threads(),
        "reps": args.reps,
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # other processes share the cores
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    if not args.quick and not args.case:
        path = RESULTS_DIR / ("compress_torch.json" if args.torch_only else "compress.json")
        path.write_text(json.dumps({"cases": rows, "total": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
