"""How `neurons/*.py` run one node: one process, or N ranks under torchrun (docs/mining.md §12).

    python neurons/miner.py --wallet.name W ...                            # one process
    torchrun --nproc_per_node 8 neurons/miner.py --wallet.name W ...       # one box, 8 GPUs
    torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29400 --rdzv_id templar-miner neurons/miner.py ...   # 4 boxes

Without torchrun (WORLD_SIZE unset or 1) nothing changes: no process group is created and the
role runs on `templar.runtime.compute.LocalCompute`, the plain 1-process functions.

Under torchrun, rank 0 starts the node as before (registration, bucket, data, the only rank that
talks to the chain and the buckets) and runs the role's loop; its θ is sharded and its ops run
on every rank through `NodeCompute`, which becomes the node's `compute` before the role starts. The other ranks only build
θ_0 from rank 0's hparams and follow its ops. A rank that dies fails the others' next collective
(or their keepalive ping, within a quarter of the collective timeout TEMPLAR_DIST_TIMEOUT,
default 600 s): each logs one `DistError` line and exits with `EXIT_RANK_LOST` (5), and torchrun
stops the rest of the node. torchrun's SIGTERM often reaches rank 0 first: it finishes its window
and saves, then fails to release the dead follower, and exits with that same line and code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn

from loguru import logger

from templar.core.log import setup_logging
from templar.core.memory import MemorySettings
from templar.distributed.compute import NodeCompute
from templar.distributed.group import EXIT_RANK_LOST, DistError, Group, init_group, world_size
from templar.runtime.flags import memory_settings, node_device
from templar.runtime.node import Node, NodeError
from templar.runtime.node import run_node as run_one_node

__all__ = ["run_node"]


def run_node(args: argparse.Namespace, role: str, run: Callable[[Node], Awaitable[None]]) -> int:
    """A neuron's `main`: this process's part of the node, until the role's loop returns. Returns
    the process exit code (see `templar.runtime.node.run_node`)."""
    if world_size() == 1:
        return run_one_node(args, role, run)
    group = init_group(node_device(args.device))
    if not group.is_leader:
        return _follow(args, group)
    memory = memory_settings(args)
    code = run_one_node(args, role, run, attach=lambda node: _lead(node, group, role, memory))
    if code != EXIT_RANK_LOST:
        _close(group)
    return code


def _close(group: Group) -> None:
    """Tear the process group down once the sharded model is gone: FSDP's device mesh holds the
    group, and a gloo group freed during the interpreter's own teardown aborts the process
    ("terminate called without an active exception", about one exit in two without this)."""
    gc.collect()
    group.close()


@contextlib.asynccontextmanager
async def _lead(node: Node, group: Group, role: str, memory: MemorySettings) -> AsyncIterator[None]:
    """Rank 0, around the role's loop: shard θ over the ranks (with rank 0's memory settings, which
    the followers receive), keep idle followers pinged, and release them at the end. A failed ping
    (a follower died while we waited on the network) interrupts the loop at once with that DistError."""
    compute = NodeCompute.lead(node.model, node.hp, group, role=role, memory=memory)
    node.compute = compute  # the role, built after this, computes over all ranks
    main = asyncio.current_task()
    failed: list[DistError] = []

    async def keepalive() -> None:
        try:
            await compute.keepalive()
        except DistError as exc:
            failed.append(exc)
            if main is not None:
                main.cancel()

    task = asyncio.create_task(keepalive(), name="keepalive")
    role_ended = False
    try:
        yield
        role_ended = True
    except asyncio.CancelledError:
        if failed:
            raise failed[0] from None
        raise
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lost = compute.stop()
    if role_ended and lost is not None:
        # The role finished its window and saved (a signal: torchrun sends one to every rank when
        # one dies), but a follower is gone: the node failed, and says so in its one DistError line.
        raise lost


def _follow(args: argparse.Namespace, group: Group) -> int:
    """Ranks > 0: build θ_0 and run rank 0's ops until it stops."""
    setup_logging(debug=args.logging_debug, json_lines=args.logging_json)  # rank 0 alone writes --logging.file
    # Rank 0 owns shutdown: on SIGINT/SIGTERM it finishes the window, saves, and releases the
    # followers. A follower that died at the signal would fail rank 0's last collectives.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    compute = NodeCompute.join(group)
    try:
        compute.follow()
    except NodeError as exc:
        logger.error(str(exc))
        return exc.exit_code
    del compute  # the sharded model and its device mesh, before the group (see `_close`)
    _close(group)
    _leave(0)


def _leave(code: int) -> NoReturn:
    """End a follower rank's process here, its logs flushed, without the interpreter's teardown: the rank
    holds nothing to save (rank 0 owns the node's state), and gloo's threads, freed during that teardown
    even after the group was destroyed, still aborted the process now and then ("terminate called without
    an active exception", SIGABRT after "rank 1 stopped"; torchrun then failed a node that had stopped
    cleanly: a suite run of the killed miner test, 2026-12-02)."""
    logger.complete()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
