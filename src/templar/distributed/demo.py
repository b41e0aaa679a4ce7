"""DeMo error feedback split across a node's ranks, by parameter.

Each parameter has one owner rank (greedy balance by element count, ties by name, the same on
every rank). Per window:

1. every rank sends its FSDP shard of each gradient to the parameter's owner (`gather`), so the
   owner holds the full gradient of its parameters only (about 1/N of the model);
2. each owner runs the ordinary `templar.compress.DeMo.step` over its parameters: the very code of
   the 1-process miner, on the very same full tensors, hence the same selected coefficients;
3. the compressed coefficients (about topk / chunk² of the model) are broadcast from each owner,
   so every rank ends with the node's complete `{name: Compressed}`: the same wire payload.

Why by parameter and not by chunk rows: a DCT chunk spans `h` rows, and FSDP's row split
(ceil(rows / N)) does not fall on chunk boundaries, so row-split compression would need a second
redistribution to whole chunk rows; the per-parameter split reuses the 1-process kernels
unchanged. Its cost: the owner of the largest tensor (the embedding) holds that whole tensor's
buffer; `templar.core.memory` counts it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from templar.compress import Compressed, DCTCompressor, DeMo
from templar.distributed.fsdp import local
from templar.distributed.group import Group, recv, send

__all__ = ["ShardedDeMo", "assign_owners"]


def assign_owners(shapes: Mapping[str, torch.Size], world_size: int) -> dict[str, int]:
    """name -> owner rank: largest tensors first onto the least-loaded rank (deterministic)."""
    loads = [0] * world_size
    owners: dict[str, int] = {}
    for name, shape in sorted(shapes.items(), key=lambda kv: (-torch.Size(kv[1]).numel(), kv[0])):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        owners[name] = rank
        loads[rank] += torch.Size(shape).numel()
    return owners


class ShardedDeMo:
    """The node's error feedback over N ranks; `step` returns the node's full compressed update."""

    def __init__(self, model: nn.Module, group: Group, *, compressor: DCTCompressor, decay: float,
                 offload: bool = False) -> None:
        self.group = group
        self.compressor = compressor
        self.shapes = {n: torch.Size(p.shape) for n, p in model.named_parameters() if p.requires_grad}
        self.owners = assign_owners(self.shapes, group.world_size)
        zero = torch.zeros((), device=group.device)
        # Only this rank's parameters get buffers (expand() allocates nothing; DeMo reads shape/device).
        mine = {n: zero.expand(s) for n, s in self.shapes.items() if self.owners[n] == group.rank}
        self.local = DeMo(mine, compressor=compressor, decay=decay, offload=offload)  # offload: in host memory

    @property
    def buffers(self) -> dict[str, torch.Tensor]:
        """This rank's error-feedback buffers (full tensors of the parameters it owns)."""
        return self.local.buffers

    def owned(self, rank: int) -> list[str]:
        return [n for n in self.shapes if self.owners[n] == rank]

    @torch.no_grad()
    def step(self, model: nn.Module, lr: float) -> dict[str, Compressed]:
        """Fold `lr * grad` into the owners' buffers and return the node's compressed update on
        every rank. Raises ValueError on every rank (buffers untouched) on a non-finite gradient."""
        group = self.group
        grads: dict[str, torch.Tensor] = {}
        for name, p in model.named_parameters():
            if name not in self.shapes:
                continue
            g = local(p.grad) if p.grad is not None else torch.zeros_like(local(p))
            owner = self.owners[name]
            full = group.gather_rows(g.detach().float(), p.shape[0], dst=owner)
            if full is not None:
                grads[name] = full.view(self.shapes[name])
        bad = any(not bool(torch.isfinite(g).all()) for g in grads.values())
        if group.any_true(bad):
            raise ValueError("non-finite gradient on this node: window skipped, error feedback untouched")
        mine = self.local.step(grads, lr)
        del grads
        return self._share(mine)

    def _share(self, mine: dict[str, Compressed]) -> dict[str, Compressed]:
        """Every owner's coefficients to every rank: one int64 and one float32 broadcast per rank."""
        out: dict[str, Compressed] = {}
        for rank in range(self.group.world_size):
            names = self.owned(rank)
            if not names:
                continue
            plans = {n: self.compressor.plan(self.shapes[n]) for n in names}
            ks = {n: self.compressor.k_for(plans[n]) for n in names}
            sizes = [plans[n].n_chunks * ks[n] for n in names]
            if rank == self.group.rank:
                idx = torch.cat([mine[n].indices.reshape(-1).to(torch.int64) for n in names])
                val = torch.cat([mine[n].values.reshape(-1).to(torch.float32) for n in names])
            else:
                idx = torch.empty(sum(sizes), dtype=torch.int64)
                val = torch.empty(sum(sizes), dtype=torch.float32)
            self.group.broadcast_(idx, src=rank)
            self.group.broadcast_(val, src=rank)
            for n, i, v in zip(names, idx.cpu().split(sizes), val.cpu().split(sizes), strict=True):
                shape = (plans[n].n_chunks, ks[n])
                out[n] = Compressed(indices=i.view(shape), values=v.view(shape), shape=self.shapes[n],
                                    chunk=plans[n].chunk)
        return {n: out[n] for n in self.shapes}

    # ---------------------------------------------------------------- state
    def gather_state(self, dst: int = 0) -> dict[str, torch.Tensor] | None:
        """Every buffer, full, on `dst` (CPU); None on the other ranks. One tensor in flight at a time."""
        out = {name: self.gather_one(name, dst) for name in self.shapes}
        return out if self.group.rank == dst else None

    def gather_one(self, name: str, dst: int = 0) -> torch.Tensor | None:
        """Collective: buffer `name`, full, on `dst` (a CPU copy); None elsewhere."""
        group, owner = self.group, self.owners[name]
        if owner == dst:
            return self.buffers[name].detach().cpu().clone() if group.rank == dst else None
        if group.rank == owner:
            send(group, self.buffers[name], dst)
        elif group.rank == dst:
            return recv(group, torch.empty(self.shapes[name], dtype=torch.float32), owner).cpu()
        return None

    def load_from(self, name: str, full: torch.Tensor | None, src: int = 0) -> None:
        """Collective over the node: `src` holds `full` (buffer `name`); its owner loads it."""
        group = self.group
        owner = self.owners[name]
        if owner == src:
            if group.rank == src:
                assert full is not None
                self.buffers[name].copy_(full.to(self.buffers[name].device, torch.float32))
        elif group.rank == src:
            assert full is not None
            send(group, full.to(torch.float32), owner)
        elif group.rank == owner:
            got = recv(group, torch.empty(self.shapes[name], dtype=torch.float32), src)
            self.buffers[name].copy_(got)
