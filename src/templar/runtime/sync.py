"""Joining a running subnet (DESIGN §8, seeds 000 and 002), shared by miners and validators.

Phases, each announced by one `[SYNC]` line:
  1. registration check (in `templar.runtime.node.start_node`)
  2. state download: own local state if recent, else the lead validator's latest checkpoint
     (sha256-verified, resumable, progress bar), else θ_0 of the run
  3. catch-up: replay the lead's published aggregates up to the current window, no uploads
  4. warm-up and 5. active are the roles' business.
"""

from __future__ import annotations

import asyncio
import time
from enum import StrEnum
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from templar.chain import verify_signature
from templar.comms import (
    CheckpointError,
    RecordError,
    download_latest_checkpoint,
    get_aggregate,
    get_start_window,
)
from templar.comms.progress import get_progress
from templar.core.log import context
from templar.runtime.compute import compute_of
from templar.runtime.node import Node
from templar.runtime.outer import update_step
from templar.runtime.state import NodeState
from templar.storage import StorageError
from templar.wire import PayloadError, max_aggregate_bytes, read_aggregate

STATE_FILE = "state.safetensors"
MODEL_FILE = "model.safetensors"
CHECKPOINT_DOWNLOAD_SECONDS = 1800.0
RETRY_SECONDS = 2.0
"""Pause before catch-up retries a window whose update it could not establish."""


class Phase(StrEnum):
    STARTUP = "startup"      # registration, bucket commitment, model build
    DOWNLOAD = "download"    # fetching the lead's checkpoint
    CATCHUP = "catchup"      # replaying published aggregates; no uploads
    WARMUP = "warmup"        # training to fill the error-feedback buffer; uploads carry weight 0
    ACTIVE = "active"        # full participation


def load_model_file(model: torch.nn.Module, path: Path) -> None:
    """Load weights from a checkpoint file after checking every name, shape, dtype and value."""
    expected = model.state_dict()
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            if names != set(expected):
                raise CheckpointError(f"{path.name}: tensor names differ from the model "
                                      f"({len(names ^ set(expected))} mismatched)")
            loaded = {}
            for name in names:
                t = f.get_tensor(name)
                ref = expected[name]
                if t.shape != ref.shape or t.dtype != ref.dtype:
                    raise CheckpointError(f"{path.name}: {name} is {t.dtype}{tuple(t.shape)}, "
                                          f"expected {ref.dtype}{tuple(ref.shape)}")
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    raise CheckpointError(f"{path.name}: {name} holds non-finite values")
                loaded[name] = t
    except SafetensorError as exc:
        raise CheckpointError(f"{path.name}: not a valid safetensors file: {exc}") from exc
    device = next(model.parameters()).device
    model.load_state_dict({k: v.to(device) for k, v in loaded.items()})


async def restore(node: Node) -> tuple[NodeState, bool]:
    """Phase 2. Returns the state and whether it is this node's own (so its error feedback, if
    the node keeps one, was restored with θ and warm-up may be skipped)."""
    hp, current = node.hp, node.clock.current_window()
    log = context(window=current, phase=Phase.DOWNLOAD)
    compute = compute_of(node)
    local = None
    try:
        local, source = await asyncio.to_thread(compute.load_state, node.state_dir / STATE_FILE)
    except ValueError as exc:
        log.warning(f"[SYNC] ignoring unreadable local state: {exc}")
        local, source = None, "nothing"
    if local is not None:
        if current - local.window - 1 <= hp.windows.max_allowed_stale:
            log.info(f"[SYNC] Resuming from local state at window {local.window} (global_step {local.global_step}); "
                     f"restored from the {source}")
            return local, True
        log.info(f"[SYNC] Local state is {current - local.window - 1} windows old; looking for a newer checkpoint")

    lead = await node.lead()
    if lead is None:
        log.warning("[SYNC] No lead validator with a readable bucket yet")
    else:
        log.info(f"[SYNC] Downloading the latest checkpoint from lead validator uid {lead[0].uid}")
        ckpt = None
        try:
            ckpt = await download_latest_checkpoint(
                lead[1], node.state_dir / "download", run=node.run, max_bytes=_checkpoint_cap(node.model),
                deadline=node.clock.now() + CHECKPOINT_DOWNLOAD_SECONDS, progress=True,
                now=node.clock.now,
            )
        except (CheckpointError, StorageError) as exc:
            log.warning(f"[SYNC] Checkpoint download failed: {exc}")
        if ckpt is not None and (local is None or ckpt.window > local.window):
            try:
                await asyncio.to_thread(compute.load_model_file, ckpt.files[MODEL_FILE])
            except (CheckpointError, KeyError) as exc:
                log.warning(f"[SYNC] Checkpoint unusable: {exc}")
            else:
                log.info(f"[SYNC] Loaded checkpoint of window {ckpt.window} (global_step {ckpt.global_step})")
                return NodeState(window=ckpt.window, global_step=ckpt.global_step), False
    if local is not None:
        return local, True
    start = None
    if lead is not None:
        try:
            start = await get_start_window(lead[1], run=node.run)
        except (StorageError, ValueError) as exc:
            log.warning(f"[SYNC] Could not read the start window: {exc}")
    start = current if start is None else start
    log.info(f"[SYNC] No checkpoint yet: starting from the run's initial weights (start window {start})")
    return NodeState(window=start - 1, global_step=0), False


def _checkpoint_cap(model: torch.nn.Module) -> int:
    return int(sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 1.05) + (1 << 20)


async def catch_up(node: Node, state: NodeState, until: int) -> NodeState:
    """Phase 3: apply the lead's published aggregates for windows (state.window, until].

    A window counts as one without an update only when the lead's progress says it finished that
    window and no aggregate exists. An aggregate that cannot be read (a stalled bucket, a lead
    still replaying behind us) is waited for until one window after its own; then catch-up stops
    *before* that window, never assuming it was empty (that would fork this node from the run for
    good), and returns: the caller retries, and past `max_allowed_stale` re-syncs from the lead's
    newest checkpoint.
    """
    if state.window >= until:
        return state
    log = context(window=until, phase=Phase.CATCHUP)
    log.info(f"[SYNC] Synchronising weights with the lead validator. No uploads in this phase. "
             f"Replaying windows {state.window + 1}..{until}")
    started, applied, first = time.perf_counter(), 0, state.window
    shapes = node.shapes
    cap = max_aggregate_bytes(shapes)
    for window in range(state.window + 1, until + 1):
        if node.stop.is_set():
            break
        lead = await node.lead()
        data, resolved, problem = None, False, "no lead validator with a readable bucket"
        publish_by = node.clock.times(window + 1).end
        while lead is not None:
            try:
                data = await get_aggregate(lead[1], window, max_bytes=cap, timeout=10.0)
                if data is not None:
                    resolved = True
                    break
                progress = await get_progress(lead[1], run=node.run, timeout=10.0)
                if progress is not None and progress.window >= window:
                    resolved = True  # the lead finished this window without an update
                    break
                problem = "not published yet"
            except (StorageError, RecordError) as exc:
                problem = f"unreadable: {str(exc)[:160]}"
            if node.clock.now() > publish_by or node.stop.is_set():
                break
            await asyncio.sleep(0.5)
        if not resolved:
            if not node.stop.is_set():
                log.warning(f"[SYNC] The lead's update of window {window} is {problem}: not assuming there was "
                            f"none; caught up to window {state.window}, retrying")
                await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
            break
        if data is not None:
            try:
                agg = read_aggregate(data, shapes, run=node.run, verify=verify_signature,
                                     expected_hotkey=lead[0].hotkey)
            except PayloadError as exc:
                log.warning(f"aggregate {window} from the lead is malformed ({exc.reason}); skipping it")
            else:
                step = update_step(state.global_step, published=agg.global_step)
                await asyncio.to_thread(compute_of(node).apply_update, agg.signs, step)
                state.global_step = step + 1
                applied += 1
        state.window = window
    seconds = time.perf_counter() - started
    rate = (state.window - first) / seconds if seconds > 0 else 0.0
    log.info(f"[SYNC] Caught up to window {state.window}: {applied} aggregates applied in {seconds:.1f}s "
             f"({rate:.1f} windows/s), global_step {state.global_step}")
    return state
