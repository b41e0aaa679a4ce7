"""The validator's LossScore evaluation on a sharded model: shard the model.

Choice: the model is FSDP-sharded as for training and every batch's sequences are split across
ranks (each rank scores its share, losses are summed into one vector). Splitting peers across
ranks instead would need the whole model on every rank, which is what does not fit at 8B/70B;
and a peer's trial step θ' = θ_t − β·sign(Δ_p) touches every shard anyway. Scores are the
1-process scores up to float summation order (per-sequence losses of the same θ); the
selection, ratings, weights and lead duties downstream are unchanged code.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from templar.distributed.fsdp import local, local_rows, reshard
from templar.distributed.group import Group, scatter_rows
from templar.distributed.train import rank_share
from templar.runtime.train import _autocast, position_range_means
from templar.validator.evaluate import Evaluator

__all__ = ["ShardedEvaluator", "sequence_losses_sharded"]


@torch.no_grad()
def sequence_losses_sharded(model: nn.Module, batch: torch.Tensor, micro_batch_size: int,
                            group: Group, ranges: int = 1) -> torch.Tensor:
    """`templar.runtime.train.sequence_losses` with each rank scoring its share; float64 CPU on every rank."""
    was_training = model.training
    model.eval()
    n = batch.size(0)
    start, end = rank_share(n, group)
    mine = batch[start:end]
    out = torch.zeros((n,) if ranges == 1 else (n, ranges), dtype=torch.float64)
    steps = max(1, math.ceil(math.ceil(n / group.world_size) / micro_batch_size))
    for i in range(steps):  # the same number of forwards on every rank: FSDP's all-gathers pair up
        micro = mine[i * micro_batch_size:(i + 1) * micro_batch_size]
        real = micro.size(0)
        micro = (micro if real else batch[:1]).to(group.device, non_blocking=True)
        with _autocast(group.device):
            logits = model(input_ids=micro).logits[:, :-1]
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), micro[:, 1:].reshape(-1), reduction="none"
        ).view(micro.size(0), -1)
        if real:
            lo = start + i * micro_batch_size
            out[lo:lo + real] = position_range_means(per_token, ranges).double().cpu()
    model.train(was_training)
    reshard(model)
    return group.all_reduce_(out)  # one rank wrote each entry: the sum is exact


class ShardedEvaluator(Evaluator):
    """`Evaluator` whose θ_t snapshot, trial steps and losses work on this rank's shards.

    Every rank runs the inherited `score_peers` with the same peer names and batches; the dense
    trial steps live on rank 0 only and reach each rank as its own rows, one parameter at a time,
    in `step_dtype`: int8 for the signed rule's signs (a quarter of the bytes), float32 for a rule
    whose trial step carries magnitudes (SparseLoCo's) and for a mean of steps (`fractional`: the
    common steps of `gauntlet.proof_baseline` "groups"). Cast to int8, such a step is all zeros: the
    trial would leave θ_t as it is and every LossScore would read 0.
    """

    def __init__(self, model: nn.Module, micro_batch_size: int, group: Group, *, position_ranges: int,
                 step_dtype: torch.dtype = torch.float32, baseline_groups: int = 0, baseline: str | None = None,
                 baseline_min_others: int = 3, baseline_clip: float = 4.0, baseline_resolution: float = 0.0):
        super().__init__(model, micro_batch_size, position_ranges=position_ranges, baseline_groups=baseline_groups,
                         baseline=baseline, baseline_min_others=baseline_min_others, baseline_clip=baseline_clip,
                         baseline_resolution=baseline_resolution)
        self.group = group
        self.step_dtype = step_dtype

    def snapshot(self) -> None:
        self._saved = {n: local(p).detach().clone() for n, p in self._params.items()}

    @contextmanager
    def stepped(self, signs: dict[str, torch.Tensor], beta: float, *, fractional: bool = False) -> Iterator[None]:
        if not self._saved:
            raise RuntimeError("Evaluator.snapshot() must run before a trial step")
        dtype = torch.float32 if fractional else self.step_dtype  # every rank takes the same branch
        try:
            with torch.no_grad():
                for name, p in self._params.items():
                    full = None
                    if self.group.is_leader:
                        sign = signs.get(name)
                        full = (sign if sign is not None else torch.zeros(p.shape)).to(dtype)
                    rows = scatter_rows(self.group, full, p.shape, dtype, src=0)
                    start, end = local_rows(p.shape, self.group)
                    mine = local(p)
                    mine.sub_(rows[: end - start].to(mine.device, mine.dtype), alpha=beta)
            yield
        finally:
            with torch.no_grad():
                for name, p in self._params.items():
                    local(p).copy_(self._saved[name])

    def losses(self, batch: torch.Tensor, ranges: int = 1) -> torch.Tensor:
        return sequence_losses_sharded(self.model, batch, self.micro_batch_size, self.group, ranges)
