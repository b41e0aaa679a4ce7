"""`benchmarks/performance/gpu.py`'s noise phase: how much an honest peer's LossScore moves from page
to page and from peer to peer at the run's size, and what the proof of computation credits it under
each baseline (δ_rand, the groups' common steps, the other peers' own steps)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.performance.gpu_bench import COMMON_GROUPS, Bench, free_memory, gradient_scale, peak_lr
from benchmarks.performance.gpu_report import noise_summary, proof_credit_summary
from templar.compress import Compressed
from templar.gauntlet.selection import select_eval_sequences
from templar.runtime.train import accumulate_gradients, gradients, inner_lr, inner_steps, make_inner_optimizer
from templar.validator.evaluate import Evaluator, page_deltas, range_weights, sequence_deltas


def _pretrain(b: Bench, pages: Sequence[int], steps: int) -> dict[str, Any]:
    """AdamW micro-batch steps on `pages`, so the noise is measured past θ_0's first drop in loss
    (the run's own windows would need hours to get there)."""
    model, hp = b.model(), b.hp
    batch = b.pages(pages)
    mb = hp.optimizer.micro_batch_size
    lr = gradient_scale(hp)  # the run's own step size for AdamW: the signed rule's α, else the inner rate
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=hp.optimizer.weight_decay,
                                  **({"fused": True} if b.device.type == "cuda" else {}))
    losses = []
    for step in range(steps):
        start = (step * mb) % batch.size(0)
        stats = accumulate_gradients(model, batch[start:start + mb], mb, hp.optimizer.grad_clip)
        optimizer.step()
        losses.append(stats.loss)
    model.zero_grad(set_to_none=True)
    del optimizer
    free_memory()
    return {"pages": list(pages), "steps": steps, "lr": lr, "first_loss": losses[0],
            "last_loss": losses[-1]}


def phase_noise(b: Bench) -> dict[str, Any]:
    """How much δ_rand and δ_assigned move from page to page and from peer to peer, for honest updates:
    the evaluation noise the relative LossRating's tie band (σ̂) and the simulator's `noise` stand for."""
    hp, model = b.hp, b.model()
    d = hp.data
    n_pages = b.corpus().num_pages
    s = b.scale
    # a production window's pages for each peer, or as many as the sample corpus holds for NOISE_PEERS
    per_peer = min(d.pages_per_window, s.noise_pages_per_peer)
    peers = min(s.noise_peers, max(2, (n_pages - s.noise_pretrain_pages - 2) // per_peer))
    random_n = min(s.noise_random_pages, n_pages - s.noise_pretrain_pages - peers * per_peer)
    if random_n < 2:
        raise RuntimeError(f"{n_pages} pages cannot hold {s.noise_pretrain_pages} + {peers}×{per_peer} + 2")
    pretrain = list(range(s.noise_pretrain_pages))
    assigned = {f"peer{i}": list(range(len(pretrain) + i * per_peer, len(pretrain) + (i + 1) * per_peer))
                for i in range(peers)}
    random_pages = list(range(len(pretrain) + peers * per_peer, len(pretrain) + peers * per_peer + random_n))
    out: dict[str, Any] = {
        "corpus_pages": n_pages, "random_pages": random_pages, "assigned": assigned,
        "allows": f"{n_pages} pages of {d.sequence_length * d.sequences_per_page:,} tokens: {len(pretrain)} to train "
                  f"away from θ_0, {len(assigned)} peers × {per_peer} assigned, {random_n} random; more peers or "
                  "random pages need a larger corpus"}
    out["pretrain"], out["pretrain_seconds"] = b.timed(lambda: _pretrain(b, pretrain, s.noise_pretrain_steps))
    lr = peak_lr(hp)
    beta = hp.gauntlet.eval_lr_factor * lr
    out.update(lr=lr, beta=beta)

    # honest updates: each peer trains on its own pages, one compression step from fresh error
    # feedback, decoded to its trial step as a validator decodes a payload
    signs: dict[str, dict[str, torch.Tensor]] = {}
    payloads: dict[str, dict[str, Compressed]] = {}
    started = time.monotonic()
    for peer, pages in assigned.items():
        if len(payloads) >= s.noise_min_peers:  # another only if it and the evaluation of all fit the cap
            train = (time.monotonic() - started) / len(payloads)
            page_forward = train / (3 * per_peer)  # forward+backward ≈ 3 forwards
            peers_then = len(payloads) + 1  # the plain evaluation, then the groups' and the others' passes over every unit
            evaluation = page_forward * (random_n + peers_then * (2 * per_peer + random_n)
                                         + (COMMON_GROUPS + peers_then) * (random_n + peers_then * per_peer))
            if b.left() < train + evaluation:
                break
        # the run's own window: its inner steps (fresh moments, as a newly joined miner), then DeMo
        stats = inner_steps(model, b.pages(pages), hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                            inner=hp.inner, optimizer=make_inner_optimizer(model, hp.inner),
                            lr=inner_lr(hp.inner, hp.optimizer.warmup_steps, hp.optimizer))
        compressed = b.demo().step(gradients(model), stats.scale)
        model.zero_grad(set_to_none=True)
        payloads[peer] = dict(compressed)
    reference = b.rule.trial_reference(list(payloads.values()))
    for peer, payload in payloads.items():  # each peer's trial step, as a validator sizes it among the window's:
        # signs as int8 where they are (the signed rule), a dense float32 step in host memory otherwise
        trial = b.rule.trial(payload, b.shapes, reference=reference, max_lift=hp.gauntlet.trial_max_lift)
        signs[peer] = {n: t.to(torch.int8) if b.rule.moves_every_coordinate else t.to("cpu") for n, t in trial.items()}
    del payloads
    out["train_seconds"] = time.monotonic() - started
    b.release_demo()

    evaluator = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=hp.gauntlet.position_ranges)
    evaluator.snapshot()
    spp = d.sequences_per_page
    random_batch = b.pages(random_pages)
    started = time.monotonic()
    before_rand = evaluator.losses(random_batch)
    ranges = hp.gauntlet.position_ranges  # the units the proof by size clips, as the validator measures them
    weights = range_weights(d.sequence_length - 1, ranges)
    before = {peer: evaluator.losses(b.pages(assigned[peer]), ranges) for peer in signs}
    rows = {}
    for peer, peer_signs in signs.items():
        with evaluator.stepped(peer_signs, beta):
            after_rand = evaluator.losses(random_batch)
            after = evaluator.losses(b.pages(assigned[peer]), ranges)
        rows[peer] = {"delta_rand_pages": list(page_deltas(before_rand, after_rand, spp)),
                      "delta_assigned_pages": list(page_deltas(before[peer] @ weights, after @ weights, spp)),
                      "delta_assigned_sequences": list(sequence_deltas(before[peer], after))}
    del evaluator
    out["eval_seconds"] = time.monotonic() - started
    out["loss_rand_before"] = float(before_rand.mean())
    out["peers"] = rows
    out.update(noise_summary(rows))
    out["proof_credit"] = proof_credit_summary(rows, hp.gauntlet.proof_full_gap)
    # the same honest peers judged against each unit's own baseline (`gauntlet.proof_baseline`, docs/scoring.md §4):
    # "common", the groups' mean steps (a pass over every unit each); "others", each peer's step over every unit
    for name, rules in (("common", {"baseline_groups": COMMON_GROUPS}), ("others", {"baseline": "others"})):
        if len(signs) < (need := 2 if name == "common" else 1 + hp.gauntlet.proof_baseline_min_others):
            out[f"proof_credit_{name}"] = {"skipped": f"{len(signs)} peers trained within the cap; it needs {need}"}
            continue
        started = time.monotonic()
        scored = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=ranges, **rules).score_peers(
            signs, {peer: b.pages(assigned[peer]) for peer in signs}, random_batch, beta, spp)
        out[f"{name}_eval_seconds"] = time.monotonic() - started
        baselined = {peer: {"delta_rand_pages": rows[peer]["delta_rand_pages"],
                            "delta_assigned_pages": list(score.page_deltas),
                            "delta_assigned_sequences": list(score.sequence_deltas)} for peer, score in scored.items()}
        out[f"proof_credit_{name}"] = proof_credit_summary(baselined, hp.gauntlet.proof_full_gap)
        quarter = max(1, spp // 4)  # a secret quarter of the sequences (proof_sequences): a subset of these units
        for i, (peer, row) in enumerate(baselined.items()):
            units = row["delta_assigned_sequences"]
            per_sequence = len(units) // (len(assigned[peer]) * spp)
            row["delta_assigned_sequences"] = [
                units[(page * spp + seq) * per_sequence + r] for page in range(len(assigned[peer]))
                for seq in select_eval_sequences(0, 0, i, page, spp, quarter) for r in range(per_sequence)]
        out[f"proof_credit_{name}_quarter"] = proof_credit_summary(baselined, hp.gauntlet.proof_full_gap)
    return out
