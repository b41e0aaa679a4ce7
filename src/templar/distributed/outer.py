"""The outer step on a sharded model, bit-identical to `templar.runtime.consensus.outer.outer_step`.

Every rank receives the same peers' coefficients (rank 0 downloaded and validated the payloads;
it broadcasts them a bucket of parameters at a time) and runs `templar.compress.aggregate` one parameter at a time: the same deterministic
fixed-point code on the same inputs, so the same sign(Δ) bit for bit. Each rank then applies its
own rows through the one rule, `templar.runtime.consensus.outer.apply_update` (θ ← θ·(1 − α·wd) − α·sign,
element-wise, hence the same bits as the 1-process update), at the step `update_step` gives.
Only one parameter's dense sign tensor exists at a time.

The aggregation is repeated on every rank (not split): it is a few percent of a window, it needs
no extra collective, and it keeps the consensus-critical path the one 1-process code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from templar.compress import ChunkPlan, Compressed, plan_chunks, topk_per_chunk
from templar.compress.methods import rule_of
from templar.core.config import HParams
from templar.core.schedule import learning_rate
from templar.distributed.fsdp import local, local_rows
from templar.distributed.group import Group
from templar.runtime.consensus.fingerprint import fingerprint_positions
from templar.runtime.consensus.outer import OuterStep, aggregation_weights, apply_update, update_step
from templar.runtime.state import NodeState
from templar.wire import Gradient, probe_positions

__all__ = ["collect_probes_sharded", "fingerprint_sharded", "outer_step_sharded"]


def _matches(c: Compressed | None, plan: ChunkPlan, k: int) -> bool:
    return c is not None and c.plan == plan and tuple(c.indices.shape) == (plan.n_chunks, k) \
        and tuple(c.values.shape) == (plan.n_chunks, k)


BUCKET_COEFFICIENTS = 1 << 22
"""Coefficients (all peers together) per broadcast of the outer step: 48 MB of indices and values."""


def _buckets(params: list[tuple[str, torch.Tensor]], plans: dict[str, ChunkPlan], ks: dict[str, int],
             peers: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive parameters grouped so one broadcast carries about BUCKET_COEFFICIENTS (fewer
    round trips than one per parameter, bounded memory unlike one for the whole model)."""
    out: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, p in params:
        n = plans[name].n_chunks * ks[name] * peers
        if out[-1] and size + n > BUCKET_COEFFICIENTS:
            out.append([])
            size = 0
        out[-1].append((name, p))
        size += n
    return out


@torch.no_grad()
def outer_step_sharded(model: nn.Module, gradients: Sequence[Gradient] | None, state: NodeState, hp: HParams,
                       group: Group, *, apply: bool = True, keep_signs: bool = False,
                       clip_norm: float | None = None) -> OuterStep | None:
    """`templar.runtime.consensus.outer.outer_step` for a node of N ranks. `gradients`: rank 0's received payloads
    (ignored elsewhere). Rank 0 broadcasts the eligible peers' coefficients in buckets of
    parameters as flat tensors (no pickling of payloads; a rank holds one bucket at a time).
    `keep_signs` returns the full signs on this rank (the lead validator publishes them)."""
    eligible, weights = aggregation_weights(gradients or [], hp) if group.is_leader else ([], [])
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    plans = {n: plan_chunks(p.shape, hp.demo.target_chunk) for n, p in params}
    ks = {n: topk_per_chunk(plan, hp.demo.topk) for n, plan in plans.items()}
    rule = rule_of(hp.optimizer.method)
    header = None
    if group.is_leader:
        bad = [n for n, _ in params for g in eligible if not _matches(g.tensors.get(n), plans[n], ks[n])]
        # each peer's factor from its whole payload (SparseLoCo clips by the whole norm), once, on rank 0
        factors = (rule.peer_factors([g.tensors for g in eligible], weights, ceiling=clip_norm)
                   if eligible and not bad else weights)
        header = (factors, bad[:1])
    factors, bad = group.broadcast_object(header)
    if bad:
        raise ValueError(f"{bad[0]}: a peer's coefficients do not match hp.demo (read payloads with read_gradient)")
    if not factors:
        return None
    step = update_step(state.global_step)  # the one step rule: no peer's claim moves it
    lr = learning_rate(step, hp.optimizer)
    signs: dict[str, torch.Tensor] = {}
    for bucket in _buckets(params, plans, ks, len(factors)):
        sizes = [plans[n].n_chunks * ks[n] for n, _ in bucket]
        if group.is_leader:  # [peer, coefficient] for every parameter of the bucket, concatenated
            idx = torch.cat([torch.stack([g.tensors[n].indices.reshape(-1).to("cpu", torch.int64) for g in eligible])
                             for n, _ in bucket], dim=1)
            val = torch.cat([torch.stack([g.tensors[n].values.reshape(-1).to("cpu", torch.float32) for g in eligible])
                             for n, _ in bucket], dim=1)
        else:
            idx = torch.empty((len(factors), sum(sizes)), dtype=torch.int64)
            val = torch.empty((len(factors), sum(sizes)), dtype=torch.float32)
        group.broadcast_(idx, src=0)
        group.broadcast_(val, src=0)
        for (name, p), i, v in zip(bucket, idx.split(sizes, dim=1), val.split(sizes, dim=1), strict=True):
            plan = plans[name]
            items = [Compressed(i[j].reshape(plan.n_chunks, ks[name]), v[j].reshape(plan.n_chunks, ks[name]),
                                torch.Size(p.shape), plan.chunk) for j in range(len(factors))]
            sign = rule.aggregate_param(name, items, factors, torch.Size(p.shape))
            if keep_signs:
                signs[name] = sign.clone()
            if apply:  # the one θ-update rule, on this rank's rows
                start, end = local_rows(p.shape, group)
                apply_update({name: local(p)}, {name: sign[start:end]}, step, hp)
        del idx, val
    if apply:
        state.global_step = step + 1
    return OuterStep(signs=signs, global_step=step, learning_rate=lr, peers=len(factors), clip_norm=clip_norm)


@torch.no_grad()
def collect_probes_sharded(model: nn.Module, window: int, hp: HParams, group: Group) -> dict[str, torch.Tensor]:
    """`templar.runtime.consensus.outer.collect_probes` of the sharded θ, on every rank: each probe is read by the
    rank holding its row and summed as int32 bit patterns (exact, signed zeros included)."""
    names, parts = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        idx = probe_positions(hp.data.data_seed, window, name, p.numel(), hp.gauntlet.probe_count)
        start, end = local_rows(p.shape, group)
        row = p.numel() // p.shape[0] if p.dim() else 1
        lo, hi = start * row, end * row
        vals = torch.zeros(idx.numel(), dtype=torch.float32)
        mask = (idx >= lo) & (idx < hi)
        if bool(mask.any()):
            flat = local(p).detach().reshape(-1)
            vals[mask] = flat[(idx[mask] - lo).to(flat.device)].float().cpu()
        names.append(name)
        parts.append(vals)
    bits = torch.cat(parts).view(torch.int32).clone()
    group.all_reduce_(bits)
    values = bits.view(torch.float32).split([v.numel() for v in parts])
    return {n: v.clone() for n, v in zip(names, values, strict=True)}


@torch.no_grad()
def fingerprint_sharded(model: nn.Module, seed: int, window: int, group: Group, count: int) -> torch.Tensor:
    """`templar.runtime.consensus.fingerprint.model_fingerprint` of the sharded θ, on every rank: the same
    positions (`fingerprint_positions`), each read by the rank holding its row, summed as int32
    bit patterns (exact, as the probes)."""
    params = dict(model.named_parameters())
    out = torch.zeros(count, dtype=torch.float32)
    for name, picked, offsets in fingerprint_positions(model, seed, window, count):
        p = params[name]
        start, end = local_rows(p.shape, group)
        row = p.numel() // p.shape[0] if p.dim() else 1
        lo, hi = start * row, end * row
        mask = (offsets >= lo) & (offsets < hi)
        if bool(mask.any()):
            flat = local(p).detach().reshape(-1)
            out[picked[mask]] = flat[(offsets[mask] - lo).to(flat.device)].float().cpu()
    bits = out.view(torch.int32).clone()
    group.all_reduce_(bits)
    return bits.view(torch.float32).clone()
