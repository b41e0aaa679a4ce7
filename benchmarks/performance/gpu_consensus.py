"""`benchmarks/performance/gpu.py`'s consensus phase: the same window on the GPU and the CPU, bit for bit."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.performance.gpu_bench import NEAR_TIE, WINDOW, Bench, RecordingDCT, peak_lr
from templar.compress import (
    ChunkedDCT,
    ChunkPlan,
    aggregate,
    native,
)
from templar.compress.methods import rule_of
from templar.runtime.consensus.fingerprint import model_fingerprint, model_in_sync, off_positions
from templar.runtime.train import (
    accumulate_gradients,
    gradients,
)


def _chunked(x: torch.Tensor, plan: ChunkPlan, transform: bool) -> torch.Tensor:
    """What the compressor ranks, in the chunks' matrix layout (flat, padded size): the DCT's
    coefficients (DeMo), or the values themselves, zero-padded (SparseLoCo)."""
    x = x.detach().to("cpu", torch.float32).contiguous()
    if transform:
        return ChunkedDCT(reuse_buffers=False).forward(x, plan)
    padded = torch.zeros(plan.padded, dtype=torch.float32)
    padded[:plan.rows, :plan.cols] = x.reshape(plan.rows, plan.cols)
    return padded.view(-1)


def _near_tie_gap(x: torch.Tensor, plan: ChunkPlan, chunks: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  k: int, transform: bool = True) -> float:
    """Largest gap, over `chunks` (whose kept sets differ), between a swapped coefficient's magnitude
    and the chunk's k-th largest, relative to the chunk's largest: float32 rounding gives ~1e-6."""
    chunks = chunks[:4096]
    coef = _chunked(x, plan, transform)
    values = coef[plan.chunk_positions(chunks)].abs().double()                  # [m, chunk_numel]
    kth = values.sort(dim=1, descending=True).values[:, k - 1:k]
    kept_a = torch.zeros_like(values, dtype=torch.bool).scatter_(1, a[chunks], True)
    kept_b = torch.zeros_like(values, dtype=torch.bool).scatter_(1, b[chunks], True)
    gaps = (values - kth).abs() / values.amax(dim=1, keepdim=True).clamp_min(1e-300)
    return float(gaps[kept_a ^ kept_b].max())


def phase_consensus(b: Bench) -> dict[str, Any]:
    """The same inputs on two implementations: the GPU's torch paths against the CPU (C kernels where
    built), or, CPU only, the C kernels against torch. Consensus needs bit-identical accumulators;
    kept sets may differ only at float32 near-ties (compression is local to one miner)."""
    hp, model = b.hp, b.model()
    on_gpu = b.device.type != "cpu"
    ref_native = native.available()
    if not on_gpu and not ref_native:
        raise RuntimeError("nothing to compare on a CPU without the C kernels (build them with `pip install -e .`)")
    reference, candidate = f"cpu/{'native' if ref_native else 'torch'}", f"{b.device.type}/torch"
    out: dict[str, Any] = {"reference": reference, "candidate": candidate}

    def on_candidate(fn: Callable[[], Any]) -> Any:
        if on_gpu:
            return fn()
        with native.disabled():
            return fn()

    # 1. kept sets: a real gradient (one micro-batch), compressed by both
    accumulate_gradients(model, b.micro_batch(0), hp.optimizer.micro_batch_size)
    grads = gradients(model)
    rule = b.rule
    signed = rule.name == "signed"  # DeMo: a DCT, fixed-point accumulators and signs; else the rule's update
    compressor = rule.compressor(hp.demo.target_chunk, hp.demo.topk)
    chunks = same = 0
    worst = 0.0
    layers = b.scale.kept_sets_layers
    compared = [n for n in grads if layers is None or not (m := re.search(r"\.layers\.(\d+)\.", n))
                or int(m.group(1)) < layers]
    for g in (grads[n] for n in compared):
        ref = compressor.compress(g.to("cpu"))
        cand = on_candidate(lambda g=g: compressor.compress(g))
        differ = (ref.indices != cand.indices.to("cpu")).any(dim=1)
        chunks += differ.numel()
        same += int((~differ).sum())
        if bool(differ.any()):
            worst = max(worst, _near_tie_gap(g, ref.plan, differ.nonzero().flatten(), ref.indices,
                                             cand.indices.to("cpu"), ref.k, transform=signed))
    out["kept_sets"] = {"tensors": len(compared), "of_tensors": len(grads),
                        "parameters": sum(grads[n].numel() for n in compared), "chunks": chunks, "identical": same,
                        "share_identical": same / chunks, "worst_gap_over_chunk_max": worst,
                        "only_near_ties": worst < NEAR_TIE}
    model.zero_grad(set_to_none=True)
    del grads

    # 2. the 15 peers aggregated by both: accumulators bit for bit, then the signs (the signed rule), or
    # the rule's update, whose coordinates `signs` then counts
    peers = b.peers()
    b.release_demo()
    weights = [1.0 / hp.gauntlet.top_g] * len(peers)
    accumulators: list[torch.Tensor] = []
    equal: list[bool] = []

    def record(_: int, coef: torch.Tensor) -> None:
        accumulators.append(coef.clone())

    names = list(b.shapes)
    differing: list[dict[str, Any]] = []

    def compare(i: int, coef: torch.Tensor) -> None:
        cand, ref = coef.to("cpu"), accumulators[i]
        equal.append(torch.equal(cand.view(torch.int32), ref.view(torch.int32)))
        if not equal[-1]:  # how far: a float64 norm summed in another order moves a scale by an ulp
            gap = (cand.double() - ref.double()).abs()
            differing.append({"tensor": names[i], "coordinates": int((gap != 0).sum()), "of": gap.numel(),
                              "largest_gap_over_max": float(gap.max() / ref.abs().max().clamp_min(1e-300))})
        accumulators[i] = torch.empty(0)  # free as we go (1.2B float32 on the host)

    candidates = [{n: c.to(b.device) for n, c in p.items()} for p in peers] if on_gpu else peers
    if signed:  # the fixed-point sums before the inverse DCT, then their signs
        signs_ref = aggregate(peers, weights, b.shapes, dct=RecordingDCT(record))
        signs_cand = on_candidate(lambda c=candidates: aggregate(c, weights, b.shapes, dct=RecordingDCT(compare)))
    else:  # the rule's update is itself the fixed-point mean, decoded to float32: compared tensor by tensor
        signs_ref = rule.aggregate(peers, weights, b.shapes)
        signs_cand = on_candidate(lambda c=candidates: rule.aggregate(c, weights, b.shapes))
        for i, name in enumerate(names):
            record(i, signs_ref[name])
            compare(i, signs_cand[name])
    del candidates
    accumulators.clear()
    flipped = sum(int((signs_ref[n] != signs_cand[n].to("cpu")).sum()) for n in signs_ref)
    total = sum(s.numel() for s in signs_ref.values())
    out["accumulators"] = {"tensors": len(equal), "bit_identical": sum(equal), "all": all(equal) and bool(equal),
                           "differing": differing[:20]}
    out["signs"] = {"coordinates": total, "differing": flipped, "share": flipped / total}

    # 3. the window applied to θ on both; the fingerprint rule between them
    lr = peak_lr(hp)
    reference_model = copy.deepcopy(model).to("cpu")
    rule.apply(reference_model, signs_ref, lr, hp.optimizer.weight_decay)
    rule.apply(model, signs_cand, lr, hp.optimizer.weight_decay)
    del signs_ref, signs_cand
    differing, largest = 0, 0.0
    for p_ref, p in zip(reference_model.parameters(), model.parameters(), strict=True):
        diff = (p_ref.detach() - p.detach().to("cpu")).abs()
        differing += int((diff != 0).sum())
        largest = max(largest, float(diff.max()))
    positions = hp.sync.fingerprint_positions
    own = model_fingerprint(model, hp.data.data_seed, WINDOW, positions)
    published = model_fingerprint(reference_model, hp.data.data_seed, WINDOW, positions)
    del reference_model
    out["theta"] = {"coordinates_differing": differing, "largest_difference": largest, "lr": lr,
                    "largest_over_lr": largest / lr}
    every = rule_of(hp.optimizer.method).moves_every_coordinate  # the node's own check, as under the run's rule
    out["fingerprint"] = {"positions": positions,
                          "off": off_positions(own, published, lr, hp.sync, moves_every_coordinate=every),
                          "model_in_sync": model_in_sync(own, published, lr, hp.sync, moves_every_coordinate=every)}
    out["consistent"] = bool(out["accumulators"]["all"] and out["kept_sets"]["only_near_ties"]
                             and out["fingerprint"]["model_in_sync"])
    return out
