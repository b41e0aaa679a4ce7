"""How `neurons/*.py` will start one node over torchrun's ranks (not wired into them yet: see docs/mining.md §12).

    torchrun --nproc_per_node 8 neurons/miner.py --wallet.name W ...       # one box, 8 GPUs
    torchrun --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29400 --rdzv_id templar-miner neurons/miner.py ...   # 4 boxes

Rank 0 starts the node as before (registration, bucket, data) and runs the role's loop; the
other ranks only build θ_0 from rank 0's hparams and follow its computations
(`templar.distributed.compute`). The collective timeout comes from TEMPLAR_DIST_TIMEOUT
(seconds, default 600).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

from templar.distributed.compute import NodeCompute
from templar.distributed.group import init_group
from templar.runtime.node import Node, start_node

__all__ = ["run_node"]


async def run_node(args: argparse.Namespace, role: str, run: Callable[[Node], Awaitable[None]]) -> None:
    """Start this process's part of the node and run it until the role's loop returns."""
    group = init_group(args.device)
    if not group.is_leader:
        # Rank 0 owns shutdown: on SIGINT/SIGTERM it finishes the window, saves, and releases the
        # followers. A follower that died at the signal would fail rank 0's next collective.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        try:
            await asyncio.to_thread(NodeCompute.join(group).follow)
        finally:
            group.close()
        return
    node = await start_node(args, role)
    compute = NodeCompute.lead(node.model, node.hp, group, role=role)
    node.install_signal_handlers()
    keepalive = asyncio.create_task(compute.keepalive())
    try:
        await run(node)
    finally:
        keepalive.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keepalive
        compute.stop()
        await node.aclose()
        group.close()
