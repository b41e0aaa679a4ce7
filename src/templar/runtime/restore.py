"""Phase 2 of joining a running subnet (docs/design.md §4): the state a node starts from, shared by
miners and validators (`templar.runtime.sync` replays the windows after it).

Its own local state if recent, else the newest intact checkpoint among the candidates of the
succession whose publisher led its window (sha256-verified, resumable, progress bar), else θ_0 of
the run from its start window if none was ever published. What validators below the lead slots
hold (a start window, a checkpoint pointer, a listing) never stops a node from starting: only slot
holders' objects can be the run's before anyone else's are read.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import shutil
from enum import StrEnum
from pathlib import Path

import torch

from templar.comms import (
    CheckpointError,
    RecordError,
    checkpoint_windows,
    download_latest_checkpoint,
    get_start_window,
    latest_checkpoint_window,
)
from templar.comms.keys import start_window_key
from templar.core.log import context
from templar.runtime.consensus.succession import LeadHistory, decide_window
from templar.runtime.consensus.windows import retained_windows
from templar.runtime.node import Lead, Node, StateDiskError
from templar.runtime.state import STATE_FILE, NodeState
from templar.storage import StorageError

MODEL_FILE = "model.safetensors"
CHECKPOINT_DOWNLOAD_SECONDS = 1800.0
DOWNLOAD_FOLDER = "download"
"""Under the state directory: a checkpoint being downloaded (a partial file resumes), and the newest one
loaded (the others are deleted then)."""


class ResyncError(Exception):
    """A re-sync could not be made now (no lead, or its checkpoint could not be read): the node
    stays out of sync and tries again later. `fix`: what an operator can do about it, when the
    cause is known (a validator that must not wait says it in its exit line)."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class Phase(StrEnum):
    STARTUP = "startup"      # registration, bucket commitment, model build
    DOWNLOAD = "download"    # fetching the lead's checkpoint
    CATCHUP = "catchup"      # replaying published aggregates; no uploads
    WARMUP = "warmup"        # training to fill the error-feedback buffer; uploads carry weight 0
    ACTIVE = "active"        # full participation


async def restore(node: Node, *, use_local: bool = True, newer_than: int = -1) -> tuple[NodeState, bool]:
    """Phase 2. Returns the state and whether it is this node's own (so its error feedback, if
    the node keeps one, was restored with θ and warm-up may be skipped). `use_local=False` (a
    re-sync: our own model is known to differ from the run's) takes only published checkpoints;
    with `newer_than` (a node stuck before a window whose update cannot be had) only one of a later
    window, else `ResyncError`.

    The newest intact checkpoint among the candidates of the succession is taken, if its publisher
    led its window (an unusable one is said to be unusable, and older ones are tried). θ_0 and the
    run's start window are taken only when no candidate ever published a checkpoint: a run whose
    checkpoints exist but cannot be used is never restarted from θ_0, because the history before
    the oldest kept checkpoint is gone and a replay from θ_0 would not be the run's history.
    `ResyncError` when nothing usable can be read now (the model is then untouched, and the message
    names the object at fault): the caller retries later."""
    hp, current = node.hp, node.clock.current_window()
    log = context(window=current, phase=Phase.DOWNLOAD)
    compute = node.compute
    local = None
    try:
        local, source = (await asyncio.to_thread(compute.load_state, node.state_dir / STATE_FILE) if use_local
                         else (None, "nothing"))
    except ValueError as exc:
        log.warning(f"[SYNC] ignoring unreadable local state: {exc}")
        local, source = None, "nothing"
    if local is not None:
        if current - local.window - 1 <= hp.windows.max_allowed_stale:
            log.info(f"[SYNC] Resuming from local state at window {local.window} (global_step {local.global_step}); "
                     f"restored from the {source}")
            return local, True
        log.info(f"[SYNC] Local state is {current - local.window - 1} windows old; looking for a newer checkpoint")

    candidates = [c for c in await node.candidates() if c.bucket is not None]
    if not candidates:
        log.warning("[SYNC] No validator able to lead has a readable bucket yet")
        if local is not None:
            return local, True
        if not use_local:
            raise ResyncError("no validator able to lead has a readable bucket")
        log.info(f"[SYNC] No checkpoint yet: starting from the run's initial weights (start window {current})")
        return NodeState(window=current - 1, global_step=0), False
    loaded = await _newest_intact_checkpoint(node, candidates,
                                             newer_than=local.window if local is not None else newer_than)
    if isinstance(loaded, NodeState):
        if local is not None:  # our own state, too old for its θ: what the role keeps beside θ is still
            loaded.extra = local.extra  # ours (a validator's book: nothing was scored after it was saved)
        return loaded, False
    if local is not None:
        return local, True
    if loaded is not None:  # checkpoints exist (or may), and none could be used
        raise ResyncError(loaded)
    if newer_than >= 0:
        raise ResyncError(f"no checkpoint of a window after {newer_than} is published yet")
    start = await published_start(node, candidates)
    if start is None and not use_local:
        raise ResyncError("no checkpoint yet and no start window published")
    if not use_local:  # the model in memory is not θ_0: rebuild it (deterministic from init_seed)
        await asyncio.to_thread(compute.reset_model)
    start = current if start is None else start
    log.info(f"[SYNC] No checkpoint published yet: starting from the run's initial weights (start window {start})")
    return NodeState(window=start - 1, global_step=0), False


async def _slot_holders(node: Node) -> set[str]:
    """The hotkeys of the first `lead_slots` of the succession: only they can have led a window by today's
    order (`succession.order_of`: the validator that led the window before keeps the first slot, and it
    was one of them)."""
    return {c.hotkey for c in (await node.candidates())[:node.hp.windows.lead_slots]}


async def a_joiner_can_start(node: Node) -> bool:
    """Whether a node that joined now would find a checkpoint to start from: a slot holder's newest one
    (its `latest.json`) whose window that holder led by the succession as the chain orders it now. Those
    windows are decided afresh (an empty `LeadHistory`), as the joiner decides them: this node's own
    decisions were taken by the order of their time, under which another validator may have led. The
    check `_newest_intact_checkpoint` makes before it downloads anything; a pointer that cannot be read
    counts as none."""
    fresh = LeadHistory()
    for lead in (await node.candidates())[:node.hp.windows.lead_slots]:
        if lead.bucket is None:
            continue
        try:
            window = await latest_checkpoint_window(lead.bucket)
        except (CheckpointError, StorageError):
            continue
        if window is None or window >= node.clock.current_window():
            continue
        decision = await decide_window(node, window, history=fresh)
        if decision.settled and decision.lead is not None and decision.lead.hotkey == lead.hotkey:
            return True
    return False


async def published_start(node: Node, candidates: list[Lead] | None = None) -> int | None:
    """The run's start window: the copy of the first candidate that has one. None only when every
    candidate's bucket says it has none. A copy naming a window that has not begun is not the run's
    and is passed over (one line).

    The slot holders' copies (the first `lead_slots` of the succession: only they can have led a
    window by today's order) come first, and one that cannot be read or parsed is never taken for
    "no run yet": with none of theirs readable, `ResyncError` names the object and what to do. Only
    when every slot holder says it has none is a copy below the slots read (a former lead's, kept
    after it left them), and such a copy is taken only when it can be used: one that cannot be read
    is passed over, and so is one naming a window older than the history every candidate keeps
    (`retained_windows`), which no node could replay from. Otherwise any validator with a permit and
    a little stake held back every node of a new run, the first lead included (a garbage copy
    stopped it, a copy naming an old window kept it replaying windows whose history is gone)."""
    candidates = candidates if candidates is not None else [c for c in await node.candidates() if c.bucket]
    slot_holders = await _slot_holders(node)
    problems: list[str] = []
    current = node.clock.current_window()
    log = context(window=current, phase=Phase.DOWNLOAD)
    ordered = ([c for c in candidates if c.hotkey in slot_holders]
               + [c for c in candidates if c.hotkey not in slot_holders])
    # every copy read at once: one after another, each bucket that never answers cost its timeout (30 s)
    copies = await asyncio.gather(*(get_start_window(lead.bucket, run=node.run) for lead in ordered),
                                  return_exceptions=True)
    for lead, start in zip(ordered, copies, strict=True):
        below = lead.hotkey not in slot_holders
        if below and problems:
            break  # a slot holder's copy may exist: never one below the slots instead
        where = f"uid {lead.uid}'s {start_window_key()}"
        try:
            if isinstance(start, BaseException):
                raise start
        except (StorageError, RecordError) as exc:
            if below:
                log.warning(f"[SYNC] {where} (below the lead slots) is unreadable ({str(exc)[:160]}): passed over")
                continue
            problems.append(f"{where} is unreadable ({str(exc)[:160]})")
            log.warning(f"[SYNC] {problems[-1]}; looking for the run's start window in another slot holder's bucket")
            continue
        if start is not None and start > current + 1:
            # never the run's: a run starts at the window its first lead is in, and copies copy that. Taken, a
            # copy planted far ahead (by any validator of the succession) held every node back until then.
            log.warning(f"[SYNC] {where} names window {start}, which has not begun: not the run's, ignored")
            continue
        if start is not None and below and start < current - retained_windows(node.hp):
            log.warning(f"[SYNC] {where} (below the lead slots) names window {start}, older than the history "
                        "every candidate keeps: no node could replay from it, ignored")
            continue
        if start is not None:
            return start
    if problems:
        raise ResyncError("; ".join(problems) + ": the run's start window cannot be read, and no checkpoint "
                          "was published to start from instead",
                          fix=f"restore {start_window_key()} in that bucket from a backup (it is never "
                          "rewritten, and a new run is never started over an existing one), then start again")
    return None


async def _newest_intact_checkpoint(node: Node, candidates: list[Lead], *, newer_than: int) -> NodeState | str | None:
    """Load the newest usable checkpoint newer than `newer_than` into the model: of any candidate,
    provided that candidate led the checkpoint's window (so a candidate that never led cannot make
    joiners load a model of its own). Returns its state; else why none could be used (a `[SYNC]`
    line for each unusable one); None when no candidate has published one (or none newer than
    `newer_than`), every candidate's `latest.json` having said so. A validator below the lead slots
    whose checkpoint is of a window it did not lead has published none of the run's."""
    log = context(window=node.clock.current_window(), phase=Phase.DOWNLOAD)
    problems: list[str] = []
    queue: list[tuple[int, int, int, Lead]] = []  # a heap of (-window, slot, order, publisher): newest first
    order = itertools.count()
    # Only these can have led a window by today's order (`succession.order_of`). What another one's bucket
    # holds of checkpoints of windows it did not lead (a pointer, unreadable or not, a listing, a window whose
    # lead cannot be told) is not "a checkpoint that exists but cannot be used": counted as one, a permit and
    # a little stake kept every joiner (and the first slot's validator) from starting a run that had no
    # checkpoint yet.
    slot_holders = await _slot_holders(node)
    listed_at_most = node.hp.windows.retained_checkpoints + 1  # a candidate keeps that many (one being written)

    def problem(lead: Lead, text: str) -> None:
        if lead.hotkey in slot_holders:
            problems.append(text)

    async def older_manifests(slot: int, lead: Lead, below: float) -> None:
        """The newest few checkpoints a slot holder's bucket lists below `below`: a bucket listing
        thousands (planted) costs no more than the few a candidate keeps."""
        if lead.hotkey not in slot_holders:
            return
        try:
            windows = sorted((w for w in await checkpoint_windows(lead.bucket) if w < below), reverse=True)
        except StorageError as exc:
            problem(lead, f"listing uid {lead.uid}'s checkpoints: {str(exc)[:160]}")
            return
        for w in windows[:listed_at_most]:
            heapq.heappush(queue, (-w, slot, next(order), lead))

    # every pointer read at once: one after another, each bucket that never answers cost its timeout (60 s)
    pointers = await asyncio.gather(*(latest_checkpoint_window(lead.bucket) for lead in candidates),
                                    return_exceptions=True)
    unusable = []
    for slot, (lead, window) in enumerate(zip(candidates, pointers, strict=True)):
        if isinstance(window, CheckpointError | StorageError):
            problem(lead, f"uid {lead.uid}'s latest.json: {str(window)[:160]}")
            log.warning(f"[SYNC] uid {lead.uid}'s latest checkpoint pointer is unusable: {str(window)[:160]}")
            unusable.append(older_manifests(slot, lead, float("inf")))
        elif isinstance(window, BaseException):
            raise window
        elif window is not None:
            heapq.heappush(queue, (-window, slot, next(order), lead))
    await asyncio.gather(*unusable)
    tried: set[tuple[str, int]] = set()
    while queue:
        negative, slot, _, lead = heapq.heappop(queue)
        window = -negative
        if window <= newer_than:
            break
        if (lead.hotkey, window) in tried:
            continue
        tried.add((lead.hotkey, window))
        name = f"checkpoint {window} of uid {lead.uid}"
        if window >= node.clock.current_window():  # its step is taken in the window after it, at the earliest
            log.warning(f"[SYNC] {name} is not the run's: window {window} has not ended")
            problem(lead, f"{name}: window {window} has not ended")
            continue
        decision = await decide_window(node, window)
        if not decision.settled or decision.lead is None or decision.lead.hotkey != lead.hotkey:
            why = (f"who led window {window} cannot be told ({decision.problem})" if not decision.settled
                   else f"uid {lead.uid} did not lead window {window}")
            log.warning(f"[SYNC] {name} is not the run's: {why}")
            problem(lead, f"{name}: {why}")
            continue
        log.info(f"[SYNC] Downloading {name} (the validator that led window {window})")
        try:
            ckpt = await download_latest_checkpoint(
                lead.bucket, node.state_dir / DOWNLOAD_FOLDER, run=node.run, max_bytes=_checkpoint_cap(node.model),
                deadline=node.clock.now() + CHECKPOINT_DOWNLOAD_SECONDS, progress=True, now=node.clock.now,
                window=window)
            if ckpt is None:
                continue
            await asyncio.to_thread(node.compute.load_model_file, ckpt.files[MODEL_FILE])
        except OSError as exc:  # our own disk (a bucket's faults are StorageError): full, read-only, a size limit
            folder = node.state_dir / DOWNLOAD_FOLDER
            await asyncio.to_thread(shutil.rmtree, folder, True)  # the partial copy would hold the space
            raise StateDiskError(f"cannot write {name} under {folder}: errno {exc.errno} ({exc.strerror or exc}). "
                                 "Fix: free space (a checkpoint is the model's size) or fix the directory, then start "
                                 "again") from exc
        except (CheckpointError, StorageError, KeyError) as exc:
            problems.append(f"{name}: {str(exc)[:200]}")
            log.warning(f"[SYNC] {name} is unusable: {str(exc)[:200]}")
            await older_manifests(slot, lead, window)
            continue
        log.info(f"[SYNC] Loaded checkpoint of window {ckpt.window} (global_step {ckpt.global_step})")
        # one copy on disk: each re-sync that loaded another checkpoint left the whole model (4.8 GB at 1.2B);
        # the one loaded stays, so a re-sync of the same checkpoint verifies it instead of downloading it again
        await asyncio.to_thread(_keep_only, node.state_dir / DOWNLOAD_FOLDER, str(ckpt.window))
        return NodeState(window=ckpt.window, global_step=ckpt.global_step)
    return "the candidates' checkpoints are unusable (" + "; ".join(problems)[:600] + ")" if problems else None


async def restore_when_possible(node: Node) -> tuple[NodeState, bool]:
    """`restore`, waiting while the run's state cannot be read (the lead's checkpoints unusable or
    its bucket down), with one `[SYNC]` line per attempt: a follower never starts from a guess.
    Raises `ResyncError` only if the node is stopped while it waits."""
    while True:
        try:
            return await restore(node)
        except ResyncError as exc:
            if node.stop.is_set():
                raise
            times = node.clock.times(node.clock.current_window())
            context(phase=Phase.DOWNLOAD).warning(f"[SYNC] Cannot restore the run's state yet ({exc}); retrying "
                                                  "in a window")
            await node.clock.sleep_until(node.clock.now() + times.end - times.start, node.stop)


def _keep_only(folder: Path, name: str) -> None:
    """Delete every entry of `folder` but `name`."""
    for entry in folder.iterdir() if folder.is_dir() else ():
        if entry.name == name:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _checkpoint_cap(model: torch.nn.Module) -> int:
    return int(sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 1.05) + (1 << 20)
