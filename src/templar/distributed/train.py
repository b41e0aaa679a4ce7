"""Each rank trains on its share of the node's pages; the reduced gradient is the node's.

The node's batch (all its pages' sequences, in order) is split into contiguous shares, one per
rank. Rank r's micro-batch losses are weighted `share_size / n * world_size`: FSDP averages the
reduce-scatter over ranks (gloo has no pre-scaled sum), so the result is exactly the 1-process
weighting `micro / n` summed over every sequence: the mean gradient of all the pages, up to float
summation order. Gradients are reduce-scattered after every micro-batch (FSDP's default): skipping
the sync would accumulate full, unsharded gradients on every rank. Every rank runs the same number of forward/backward passes (FSDP's collectives
must pair up); a rank whose share is short runs zero-weight passes on a copy of its first row.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from templar.core.model import causal_lm_loss
from templar.distributed.group import Group
from templar.runtime.train import TrainStats, _autocast

__all__ = ["accumulate_sharded", "rank_share"]


def rank_share(n: int, group: Group) -> tuple[int, int]:
    """[start, end) of the node's `n` sequences this rank trains on (contiguous, sizes differ by ≤1)."""
    base, extra = divmod(n, group.world_size)
    start = group.rank * base + min(group.rank, extra)
    return start, start + base + (1 if group.rank < extra else 0)


def accumulate_sharded(model: nn.Module, batch: torch.Tensor, micro_batch_size: int, group: Group,
                       grad_clip: float | None = None) -> TrainStats:
    """Leave the node's mean gradient of `batch` ([sequences, length], the same on every rank) in
    the sharded `p.grad`; return the node-wide stats (loss over all sequences)."""
    device = group.device
    model.train()
    model.zero_grad(set_to_none=True)
    n = batch.size(0)
    if n == 0:
        # No usable page this window (the data bucket down), as `runtime.train.accumulate_gradients`
        # says: a zero gradient and an unknown loss, never a division by the zero sequences. Every rank
        # holds the same batch (rank 0 broadcast it with the op), so every rank returns here: no
        # collective is left waiting for one that went on.
        return TrainStats(loss=float("nan"), tokens=0, seconds=0.0)
    start, end = rank_share(n, group)
    mine = batch[start:end]
    # Every rank makes as many passes as the largest share needs (rank 0's share is the largest).
    steps = max(1, math.ceil(math.ceil(n / group.world_size) / micro_batch_size))
    total = torch.zeros(1, dtype=torch.float64)
    started = time.perf_counter()
    for i in range(steps):
        micro = mine[i * micro_batch_size:(i + 1) * micro_batch_size]
        weight = micro.size(0) / n * group.world_size
        if micro.size(0) == 0:  # a short share: a zero-weight pass keeps the collectives paired
            micro, weight = batch[:1], 0.0
        micro = micro.to(device, non_blocking=True)
        with _autocast(device):
            loss = causal_lm_loss(model, micro)
        (loss * weight).backward()
        if weight:
            total += loss.detach().double().cpu() * micro.size(0)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    seconds = time.perf_counter() - started
    group.all_reduce_(total)
    return TrainStats(loss=float(total.item()) / n, tokens=int(batch.numel()), seconds=seconds)
