"""What only the lead (highest-stake) validator publishes, so that everyone else can follow:
the start window, the top-G peer list, each window's aggregate (for catch-up) and checkpoints."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from safetensors.torch import save_file

from templar.atomic import atomic_write
from templar.comms import cleanup_checkpoints, put_aggregate, put_peers, put_start_window, save_checkpoint
from templar.comms.keys import aggregate_key, window_of
from templar.comms.progress import put_progress
from templar.log import context
from templar.node import Node
from templar.outer import OuterStep
from templar.storage import StorageError
from templar.sync import MODEL_FILE
from templar.wire import write_aggregate

KEEP_CHECKPOINTS = 3


async def publish_start_window(node: Node, window: int) -> None:
    try:
        await put_start_window(node.bucket, window, run=node.run)
        context(window=window, phase="lead").info(f"published the run's start window {window}")
    except StorageError as exc:
        context(window=window, phase="lead").warning(f"could not publish the start window: {exc}")


async def publish_window(node: Node, window: int, step: OuterStep | None, next_peers: list[str] | None,
                         global_step: int) -> None:
    """The aggregate applied at `window` and, when due, the peer list in effect from window+1.

    Failures are logged, never fatal: followers then fall back to gathering themselves.
    """
    log = context(window=window, phase="lead")
    try:
        if step is not None:
            data = write_aggregate(step.signs, window=window, global_step=step.global_step,
                                   learning_rate=step.learning_rate, hotkey=node.hotkey, run=node.run,
                                   sign=node.chain.sign)
            await put_aggregate(node.bucket, window, data)
        if next_peers is not None:
            await put_peers(node.bucket, window + 1, next_peers, run=node.run)
            log.info(f"published peer list for window {window + 1}: {len(next_peers)} peers")
        await put_progress(node.bucket, window, global_step, run=node.run)
    except StorageError as exc:
        log.warning(f"publishing failed: {exc}")


def _write_model(model: torch.nn.Module, path: Path) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))


async def publish_checkpoint(node: Node, window: int, global_step: int) -> None:
    """θ after applying `window`'s aggregate; written between windows, never mid-update."""
    log = context(window=window, phase="checkpoint")
    folder = node.state_dir / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    await asyncio.to_thread(_write_model, node.model, path)
    try:
        await save_checkpoint(node.bucket, window, {MODEL_FILE: path},
                              {"global_step": global_step, "hparams": node.hp.name}, run=node.run)
        await cleanup_checkpoints(node.bucket, keep=KEEP_CHECKPOINTS)
    except StorageError as exc:
        log.warning(f"checkpoint upload failed: {exc}")
        return
    await _delete_aggregates_before(node, window - KEEP_CHECKPOINTS * node.hp.windows.checkpoint_frequency)


async def _delete_aggregates_before(node: Node, oldest_needed: int) -> None:
    """Aggregates older than the oldest kept checkpoint can no longer be replayed by anyone."""
    prefix = aggregate_key(0).rsplit("/", 1)[0] + "/"
    try:
        for obj in await node.bucket.list(prefix):
            window = window_of(obj.key, prefix, ".safetensors")
            if window is not None and window < oldest_needed:
                await node.bucket.delete(obj.key)
    except StorageError as exc:
        context(phase="cleanup").debug(f"aggregate cleanup incomplete: {exc}")
