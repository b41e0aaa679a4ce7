"""The node's process group: who we are (rank / world size), which backend, how long to wait.

`init_group` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT or a
rendezvous); with none of it set, a node is a 1-rank group over an in-memory store, so
`python neurons/miner.py` runs exactly the code `torchrun --nproc_per_node N` runs, with N = 1.

Only rank 0 talks to the chain and the buckets. What the other ranks need from there (the pages'
token ids, the window, the peers' payloads) reaches them through `broadcast_object`, and every
collective carries the group's timeout: a dead or stuck rank raises `DistError` on the others
within `timeout` seconds instead of hanging past the window's deadlines. (torchrun's agent
normally notices a dead worker first and stops the whole node; the timeout is the backstop for a
rank that hangs without exiting.)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from loguru import logger

from templar.runtime.node import NodeError

__all__ = ["DEFAULT_TIMEOUT_S", "EXIT_RANK_LOST", "DistError", "Group", "collective_timeout_s", "init_group", "world_size"]

DEFAULT_TIMEOUT_S = 600.0
"""Longest a collective may wait (rank 0 pings idle followers at a quarter of it), unless the
environment's `TEMPLAR_DIST_TIMEOUT` says otherwise (`collective_timeout_s`)."""


EXIT_RANK_LOST = 5
"""A neuron's exit code when one of its ranks died or hung (torchrun restarts the node, or the operator)."""


class DistError(NodeError, RuntimeError):
    """A collective failed or timed out: a rank died or hangs; the node must stop. A `NodeError`,
    so the entry point logs it in one line and exits with `EXIT_RANK_LOST`."""

    exit_code = EXIT_RANK_LOST


@dataclass
class Group:
    """This process's place in the node. `comm_seconds` counts time spent inside collectives."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    timeout_s: float
    comm_seconds: float = field(default=0.0)
    pg: Any = None   # the process group (None: the default one); ranks are global ranks either way

    @property
    def is_leader(self) -> bool:
        """Rank 0: the one process that talks to the chain and writes to the bucket."""
        return self.rank == 0

    @property
    def comm_device(self) -> torch.device:
        """Where collective tensors must live (nccl: the GPU; gloo: the CPU)."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    # -------------------------------------------------------------- collectives, timed
    def _timed(self, what: str, fn, *args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, ValueError) as exc:  # gloo/nccl raise RuntimeError (DistBackendError)
            raise DistError(f"rank {self.rank}: {what} failed (a rank died or timed out): {exc}") from exc
        finally:
            self.comm_seconds += time.perf_counter() - started

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """`obj` from `src` on every rank (pickled; for small control data and payload bytes)."""
        box = [obj if self.rank == src else None]
        self._timed("broadcast_object", dist.broadcast_object_list, box, src=src, group=self.pg,
                    device=self.comm_device if self.backend == "nccl" else None)
        return box[0]

    def broadcast_(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """In place: `tensor` becomes `src`'s values on every rank (moved through comm_device)."""
        buf = tensor if tensor.device == self.comm_device else tensor.to(self.comm_device)
        self._timed("broadcast", dist.broadcast, buf, src=src, group=self.pg)
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def all_reduce_(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        buf = tensor if tensor.device == self.comm_device else tensor.to(self.comm_device)
        self._timed("all_reduce", dist.all_reduce, buf, op=op, group=self.pg)
        if buf is not tensor:
            tensor.copy_(buf)
        return tensor

    def gather_rows(self, local: torch.Tensor, total_rows: int, dst: int) -> torch.Tensor | None:
        """Concatenate every rank's `local` rows (FSDP's dim-0 layout of a `total_rows` tensor) on `dst`.

        Shards are padded to `ceil(total_rows / N)` rows for the collective; `dst` gets the
        `total_rows` real rows (None elsewhere). Every rank knows every shard's size from the layout.
        """
        per = -(-total_rows // self.world_size) if total_rows else 0
        sizes = [max(0, min(per, total_rows - r * per)) for r in range(self.world_size)]
        if local.shape[0] != sizes[self.rank]:
            raise ValueError(f"rank {self.rank} holds {local.shape[0]} rows, the layout says {sizes[self.rank]}")
        padded = torch.zeros((per, *local.shape[1:]), dtype=local.dtype, device=self.comm_device)
        padded[: local.shape[0]].copy_(local)
        parts = [torch.empty_like(padded) for _ in range(self.world_size)] if self.rank == dst else None
        self._timed("gather", dist.gather, padded, parts, dst=dst, group=self.pg)
        if parts is None:
            return None
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    def barrier(self) -> None:
        self._timed("barrier", dist.barrier, group=self.pg)

    def any_true(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any (to raise the same error everywhere)."""
        t = torch.tensor([1.0 if flag else 0.0], device=self.comm_device)
        self.all_reduce_(t, dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def world_size() -> int:
    """How many ranks torchrun started for this node (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def collective_timeout_s() -> float:
    """`TEMPLAR_DIST_TIMEOUT` seconds, else `DEFAULT_TIMEOUT_S`: read when a group is made, never at
    import (a neuron forked from a pre-loaded interpreter reads its own environment)."""
    return float(os.environ.get("TEMPLAR_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))


def init_group(device: str | torch.device | None = None, *, timeout_s: float | None = None) -> Group:
    """Join (or create) this node's process group; idempotent within a process.

    Under torchrun: env:// rendezvous, backend nccl when the device is CUDA (each rank on
    `cuda:LOCAL_RANK`), gloo otherwise. Without torchrun: a 1-rank group over an in-memory store.
    """
    timeout_s = collective_timeout_s() if timeout_s is None else timeout_s
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(device) if device is not None else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        dev = torch.device("cuda", local_rank if world > 1 else (dev.index or 0))
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if world > 1 or "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=timeout, device_id=dev if backend == "nccl" else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    group = Group(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, device=dev,
                  backend=dist.get_backend(), timeout_s=timeout_s)
    if group.world_size > 1:
        logger.bind(phase="startup").info(
            f"rank {group.rank}/{group.world_size} (local {local_rank}) on {dev}, {group.backend}, "
            f"collective timeout {timeout_s:.0f}s")
    return group


def _p2p(group: Group, what: str, fn, tensor: torch.Tensor, peer: int) -> None:
    group._timed(what, fn, tensor, peer, group=group.pg)


def send(group: Group, tensor: torch.Tensor, dst: int) -> None:
    """Point-to-point: `tensor` (on comm_device) to rank `dst`."""
    _p2p(group, "send", dist.send, tensor.to(group.comm_device).contiguous(), dst)


def recv(group: Group, like: torch.Tensor, src: int) -> torch.Tensor:
    """Point-to-point: a tensor shaped and typed like `like` from rank `src`, on comm_device."""
    buf = torch.empty(like.shape, dtype=like.dtype, device=group.comm_device)
    _p2p(group, "recv", dist.recv, buf, src)
    return buf


def scatter_rows(group: Group, full: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype,
                 src: int) -> torch.Tensor:
    """`src` holds `full` (shape `shape`); every rank gets its FSDP rows of it (see fsdp.local_rows)."""
    rows = shape[0]
    per = -(-rows // group.world_size) if rows else 0
    recv_buf = torch.zeros((per, *shape[1:]), dtype=dtype, device=group.comm_device)
    chunks = None
    if group.rank == src:
        assert full is not None
        padded = torch.zeros((per * group.world_size, *shape[1:]), dtype=dtype, device=group.comm_device)
        padded[:rows].copy_(full)
        chunks = list(padded.split(per)) if per else [recv_buf.clone() for _ in range(group.world_size)]
    group._timed("scatter", dist.scatter, recv_buf, chunks, src=src, group=group.pg)
    start = min(group.rank * per, rows)
    return recv_buf[: min(start + per, rows) - start]
