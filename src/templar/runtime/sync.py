"""Joining a running subnet (docs/design.md §4), shared by miners and validators.

Phases, each announced by one `[SYNC]` line:
  1. registration check (in `templar.runtime.node.start_node`)
  2. state download: own local state if recent, else the newest intact checkpoint among the
     candidates of the succession whose publisher led its window (sha256-verified, resumable,
     progress bar), else θ_0 of the run if none was ever published
  3. catch-up: replay each window's published update, from the validator that led it
     (`templar.runtime.consensus.succession`), up to the current window, no uploads
  4. warm-up and 5. active are the roles' business.

And, for as long as a node runs, proof that it still holds the run's model (`SyncCheck`): its own
fingerprint after a window against the one the window's lead published with its progress; on a
mismatch, one `[SYNC]` line and a re-sync by itself (`resync`: a checkpoint, then replay).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

import torch

from templar.chain import verify_signature
from templar.comms import (
    CheckpointError,
    RecordError,
    checkpoint_windows,
    download_latest_checkpoint,
    get_aggregate,
    get_start_window,
    latest_checkpoint_window,
)
from templar.comms.keys import aggregate_key, progress_key, start_window_key
from templar.comms.progress import Progress, decode_fingerprint, get_progress
from templar.compress.methods import rule_of
from templar.core.log import context
from templar.core.schedule import learning_rate
from templar.runtime.consensus.fingerprint import model_in_sync, off_positions
from templar.runtime.consensus.follow import FollowError, apply_inputs
from templar.runtime.consensus.outer import OuterStep, peer_weight, update_step
from templar.runtime.consensus.succession import POLL_SECONDS, Decision, decide_window
from templar.runtime.consensus.windows import apply_span
from templar.runtime.node import Lead, Node
from templar.runtime.state import STATE_FILE, NodeState
from templar.storage import StorageError
from templar.wire import (
    Gradient,
    PayloadError,
    max_aggregate_bytes,
    max_bundle_bytes,
    read_aggregate,
    read_bundle,
)

MODEL_FILE = "model.safetensors"
CHECKPOINT_DOWNLOAD_SECONDS = 1800.0
PROGRESS_READ_SECONDS = 10.0
"""The longest one read of a lead's progress record may take."""
RETRY_SECONDS = 2.0
"""Pause before catch-up retries a window whose update it could not establish."""


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


async def restore(node: Node, *, use_local: bool = True) -> tuple[NodeState, bool]:
    """Phase 2. Returns the state and whether it is this node's own (so its error feedback, if
    the node keeps one, was restored with θ and warm-up may be skipped). `use_local=False` (a
    re-sync: our own model is known to differ from the run's) takes only published checkpoints.

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
    loaded = await _newest_intact_checkpoint(node, candidates, newer_than=local.window if local is not None else -1)
    if isinstance(loaded, NodeState):
        return loaded, False
    if local is not None:
        return local, True
    if loaded is not None:  # checkpoints exist (or may), and none could be used
        raise ResyncError(loaded)
    start = await published_start(node, candidates)
    if start is None and not use_local:
        raise ResyncError("no checkpoint yet and no start window published")
    if not use_local:  # the model in memory is not θ_0: rebuild it (deterministic from init_seed)
        await asyncio.to_thread(compute.reset_model)
    start = current if start is None else start
    log.info(f"[SYNC] No checkpoint published yet: starting from the run's initial weights (start window {start})")
    return NodeState(window=start - 1, global_step=0), False


async def published_start(node: Node, candidates: list[Lead] | None = None) -> int | None:
    """The run's start window: the copy of the first candidate that has one. None only when every
    candidate's bucket says it has none; a copy that cannot be read or parsed is never taken for
    "no run yet": another candidate's is used (one line names the bad one), and with none readable
    `ResyncError` names the object and what to do. A copy naming a window that has not begun is not
    the run's and is passed over (one line)."""
    candidates = candidates if candidates is not None else [c for c in await node.candidates() if c.bucket]
    problems: list[str] = []
    latest = node.clock.current_window() + 1
    for lead in candidates:
        try:
            start = await get_start_window(lead.bucket, run=node.run)
        except (StorageError, RecordError) as exc:
            where = f"uid {lead.uid}'s {start_window_key()}"
            problems.append(f"{where} is unreadable ({str(exc)[:160]})")
            context(phase=Phase.DOWNLOAD).warning(f"[SYNC] {problems[-1]}; looking for the run's start window in "
                                                  "another candidate's bucket")
            continue
        if start is not None and start > latest:
            # never the run's: a run starts at the window its first lead is in, and copies copy that. Taken, a
            # copy planted far ahead (by any validator of the succession) held every node back until then.
            context(phase=Phase.DOWNLOAD).warning(f"[SYNC] uid {lead.uid}'s {start_window_key()} names window "
                                                  f"{start}, which has not begun: not the run's, ignored")
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
    queue: list[tuple[int, int, Lead]] = []  # (window, slot, publisher), newest first
    # Only these can have led a window by today's order (`succession.order_of`). What another one's bucket
    # holds of checkpoints of windows it did not lead (a pointer, unreadable or not, a listing) is not "a
    # checkpoint that exists but cannot be used": counted as one, a permit and a little stake kept every
    # joiner (and the first slot's validator) from starting a run that had no checkpoint yet.
    slot_holders = {c.hotkey for c in (await node.candidates())[:node.hp.windows.lead_slots]}

    def problem(lead: Lead, text: str) -> None:
        if lead.hotkey in slot_holders:
            problems.append(text)

    async def older_manifests(slot: int, lead: Lead, below: float) -> None:
        try:
            queue.extend((w, slot, lead) for w in await checkpoint_windows(lead.bucket) if w < below)
        except StorageError as exc:
            problem(lead, f"listing uid {lead.uid}'s checkpoints: {str(exc)[:160]}")

    for slot, lead in enumerate(candidates):
        try:
            window = await latest_checkpoint_window(lead.bucket)
        except (CheckpointError, StorageError) as exc:
            problem(lead, f"uid {lead.uid}'s latest.json: {str(exc)[:160]}")
            log.warning(f"[SYNC] uid {lead.uid}'s latest checkpoint pointer is unusable: {str(exc)[:160]}")
            await older_manifests(slot, lead, float("inf"))
            continue
        if window is not None:
            queue.append((window, slot, lead))
    tried: set[tuple[str, int]] = set()
    while queue:
        queue.sort(key=lambda item: (-item[0], item[1]))
        window, slot, lead = queue.pop(0)
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
            if not decision.settled:
                problems.append(f"{name}: {why}")
            else:
                problem(lead, f"{name}: {why}")
            continue
        log.info(f"[SYNC] Downloading {name} (the validator that led window {window})")
        try:
            ckpt = await download_latest_checkpoint(
                lead.bucket, node.state_dir / "download", run=node.run, max_bytes=_checkpoint_cap(node.model),
                deadline=node.clock.now() + CHECKPOINT_DOWNLOAD_SECONDS, progress=True, now=node.clock.now,
                window=window)
            if ckpt is None:
                continue
            await asyncio.to_thread(node.compute.load_model_file, ckpt.files[MODEL_FILE])
        except (CheckpointError, StorageError, KeyError) as exc:
            problems.append(f"{name}: {str(exc)[:200]}")
            log.warning(f"[SYNC] {name} is unusable: {str(exc)[:200]}")
            await older_manifests(slot, lead, window)
            continue
        log.info(f"[SYNC] Loaded checkpoint of window {ckpt.window} (global_step {ckpt.global_step})")
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


def _checkpoint_cap(model: torch.nn.Module) -> int:
    return int(sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 1.05) + (1 << 20)


@dataclass(frozen=True)
class Published:
    """The lead's update of one window, as published: what to apply and the step it was applied at."""

    update: dict[str, torch.Tensor]
    global_step: int


def read_published(node: Node, data: bytes, lead_hotkey: str, window: int) -> Published:
    """The lead's published update of `window` in the run's own form (`PayloadError` if it is not):
    a signed run's bit-packed signs, a SparseLoCo run's bundle of the aggregated payloads put through
    the method's own aggregate (a pure function of them: the live step's update, bit for bit)."""
    hp, shapes = node.hp, node.shapes
    if hp.optimizer.method == "signed":
        agg = read_aggregate(data, shapes, run=node.run, verify=verify_signature, expected_hotkey=lead_hotkey,
                             expected_window=window)
        return Published(agg.signs, agg.global_step)
    bundle = read_bundle(data, shapes, hp, run=node.run, verify=verify_signature, expected_hotkey=lead_hotkey,
                         expected_window=window)
    # the bundle holds the payloads the lead's step aggregated (`aggregation_weights`' eligible ones)
    weights = [peer_weight(hp)] * len(bundle.peers)
    try:
        update = rule_of(hp.optimizer.method).aggregate(bundle.peers, weights, shapes)
    except ValueError as exc:  # off the method's grid: a lead's bundle that no honest step produced
        raise PayloadError("bad_encoding", str(exc)[:120]) from exc
    return Published(update, bundle.global_step)


def published_cap(node: Node) -> int:
    """Byte cap of the lead's published update of a window in this run's form."""
    return max_aggregate_bytes(node.shapes) if node.hp.optimizer.method == "signed" \
        else max_bundle_bytes(node.shapes, node.hp)


async def _window_update(node: Node, window: int, cap: int) -> tuple[Decision, Published | None, str]:
    """One look at window `window`: its decision (`templar.runtime.consensus.succession`), and when it has an
    update the lead's published one, or what is wrong. Resolved means the update is known: the
    window has none (no candidate published in time, or its inputs name no payload), or its lead's
    signed aggregate is read. Anything else (undecided, the aggregate absent, unreadable, malformed
    or not signed by the lead) is unresolved: never an empty window."""
    decision = await decide_window(node, window)
    if not decision.settled or decision.no_step:
        return decision, None, decision.problem
    lead = decision.lead
    assert lead is not None and lead.bucket is not None
    name = f"uid {lead.uid}'s {aggregate_key(window)}"
    try:
        data = await get_aggregate(lead.bucket, window, max_bytes=cap, timeout=10.0)
    except (StorageError, RecordError) as exc:
        return decision, None, f"{name} is unreadable ({str(exc)[:160]})"
    if data is None:
        return decision, None, f"{name} is not published yet"
    try:
        return decision, await asyncio.to_thread(read_published, node, data, lead.hotkey, window), ""
    except PayloadError as exc:
        return decision, None, f"{name} is malformed ({exc.reason})"


Republish = Callable[[int, OuterStep | None, list[Gradient], int], Awaitable[None]]
"""A validator's hook for a window it led whose aggregate it never published: (window, the step its
inputs made, the payloads it aggregated, global_step after it)."""


async def catch_up(node: Node, state: NodeState, until: int, *, verify: bool = True,
                   republish: Republish | None = None) -> NodeState:
    """Phase 3: apply each window's published update for windows (state.window, until], read from
    the validator that led it.

    A window counts as one without an update only when the succession's rule says so: no candidate
    published inputs in its slot, or the lead's signed inputs name no payload. An update that cannot
    be had (not published yet, a stalled bucket, a malformed or unsigned object, a lead that could
    not be told) is waited for until one window after its own; a lead that stopped between its
    inputs and its aggregate leaves the payloads its inputs name, which are fetched and stepped like
    the live step did. Failing all that, catch-up stops *before* that window, never assuming it was
    empty (that would fork this node from the run for good), names the object in its `[SYNC]` line
    and returns: the caller retries, and past `max_allowed_stale` re-syncs from a newer checkpoint.

    A validator passes `republish`: a window it led itself and left without its aggregate (it stopped
    between the two) is stepped from its inputs' payloads, as above, and handed to `republish` while
    those payloads are still in the miners' buckets. Without it, every node replaying that window
    later would need them long after the miners deleted them.

    With `verify`, the replayed model is then compared with the fingerprint published by the lead
    of the window it ends at: a fork never heals by itself (the same later updates keep two models
    apart), so one check at the end proves every replayed window. On a mismatch (our starting state
    was not the run's) it re-syncs from a checkpoint (`resync`).
    """
    if state.window >= until:
        return state
    log = context(window=until, phase=Phase.CATCHUP)
    log.info(f"[SYNC] Synchronising weights with the run's published history. No uploads in this phase. "
             f"Replaying windows {state.window + 1}..{until}")
    started, applied, first = time.perf_counter(), 0, state.window
    cap = published_cap(node)
    for window in range(state.window + 1, until + 1):
        if node.stop.is_set():
            break
        # Due by the end of the next window (or once every slot settled, if later); a node that reaches
        # it later still looks for a while (a lead whose bucket was stalled publishes what it held back
        # as soon as it can).
        span = apply_span(node.hp.windows)
        times = node.clock.times(window)
        publish_by = max(node.clock.times(window + 1).end, times.apply_deadline, node.clock.now() + span)
        tries = 0  # looks at the payloads the inputs name (at once, and once more at the end)
        while True:
            decision, agg, problem = await _window_update(node, window, cap)
            resolved = decision.settled and (decision.no_step or agg is not None)
            late = node.clock.now() > publish_by or node.stop.is_set()
            if not resolved and decision.settled and tries < 1 + late:
                tries = 2 if late else 1
                ours = republish is not None and decision.lead is not None and decision.lead.hotkey == node.hotkey
                try:  # the lead's inputs without its aggregate (not out yet, or its lead stopped before it):
                    # the payloads they name, as the live step took them
                    step, payloads = await apply_inputs(node, window, decision.inputs, state, {}, keep_signs=ours,
                                                        deadline=node.clock.now() + span)
                    resolved, agg = True, None
                    applied += 1
                    if ours:
                        assert republish is not None
                        await republish(window, step, payloads, state.global_step)
                except FollowError as exc:
                    problem = f"{problem}, and the payloads its inputs name cannot be had ({exc})"
            if resolved or late:
                break
            await asyncio.sleep(0.5)
        if agg is not None:
            step = update_step(state.global_step, published=agg.global_step)
            await asyncio.to_thread(node.compute.apply_update, agg.update, step)
            state.global_step = step + 1
            applied += 1
        if not resolved:
            if not node.stop.is_set():
                log.warning(f"[SYNC] The update of window {window} cannot be established: {problem}; not "
                            f"assuming there was none: caught up to window {state.window}, retrying")
                await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
            break
        node.leads.applied(decision)
        state.window = window
    seconds = time.perf_counter() - started
    rate = (state.window - first) / seconds if seconds > 0 else 0.0
    log.info(f"[SYNC] Caught up to window {state.window}: {applied} updates applied in {seconds:.1f}s "
             f"({rate:.1f} windows/s), global_step {state.global_step}")
    if verify and state.window > first and not node.stop.is_set():
        problem = await fingerprint_problem(node, state)
        if problem is not None:
            context(window=state.window, phase=Phase.CATCHUP).warning(
                f"[SYNC] The replayed model differs from the run's at window {state.window} ({problem}): "
                "our starting state was not the run's; re-syncing from a checkpoint")
            try:
                return await resync(node)
            except ResyncError as exc:
                context(window=state.window, phase=Phase.CATCHUP).warning(
                    f"[SYNC] Re-sync not possible now ({exc}); the next check retries")
    return state


async def fingerprint_problem(node: Node, state: NodeState) -> str | None:
    """What differs between our model (holding `state.window`) and the fingerprint published by the
    validator that led that window; None when they agree or there is nothing to compare with (who led
    it cannot be told, nobody led it, or its progress record is not there or unreadable: then a
    line names the record, and the next window's check compares again)."""
    decision = await decide_window(node, state.window)
    if not decision.settled or decision.lead is None or decision.lead.bucket is None:
        return None
    progress = await _read_progress(node, decision.lead, state.window)
    if progress is None or progress.fingerprint is None:
        return None
    own = await asyncio.to_thread(node.compute.fingerprint, state.window)
    return compare_with_lead(node, progress, state.global_step, own)


async def resync(node: Node) -> NodeState:
    """Checkpoint + replay, never from our own state: the newest intact checkpoint of a candidate
    that led its window (or θ_0 and the run's start window when none was published), then the
    published updates up to the last finished window, then the fingerprint check. Error feedback (a miner's own residual, not part
    of the run's model) is kept. `ResyncError` when the lead or its checkpoint cannot be read now,
    or when the re-synced model still differs from the lead's fingerprint (the object at fault is
    named): the node stays out of sync and retries."""
    state, _ = await restore(node, use_local=False)
    state = await catch_up(node, state, node.clock.current_window() - 1, verify=False)
    problem = await fingerprint_problem(node, state)
    if problem is not None:
        raise ResyncError(f"the checkpoint replayed to window {state.window} still differs from the fingerprint of "
                          f"that window's lead ({problem})")
    return state


async def _read_progress(node: Node, lead: Lead, window: int) -> Progress | None:
    """`lead`'s progress record of `window`; None when it has none or it cannot be read (a line names
    it: nothing can be checked against it, which is no evidence either way)."""
    try:
        return await get_progress(lead.bucket, window, run=node.run, timeout=PROGRESS_READ_SECONDS)
    except (StorageError, RecordError) as exc:
        _say_unreadable(lead, window, exc)
        return None


def _say_unreadable(lead: Lead, window: int, exc: Exception) -> None:
    context(window=window, phase="sync").warning(
        f"[SYNC] uid {lead.uid}'s {progress_key(window)} is unreadable ({str(exc)[:160]}): the model cannot be "
        "checked against it; the next window's check compares again")


def compare_with_lead(node: Node, progress: Progress, global_step: int, own: torch.Tensor) -> str | None:
    """None when our model after `progress.window` (global_step and fingerprint `own`) is the
    lead's, else what differs (for the `[SYNC]` line). A progress record without a fingerprint,
    or with a malformed one, proves nothing either way: None."""
    if progress.fingerprint is None:
        return None
    try:
        published = decode_fingerprint(progress.fingerprint, own.numel())
    except RecordError as exc:
        context(window=progress.window, phase="sync").debug(f"lead's fingerprint unusable: {exc}")
        return None
    if progress.global_step != global_step:
        return f"global_step {global_step}, the lead's {progress.global_step}"
    lr = learning_rate(max(global_step - 1, 0), node.hp.optimizer)
    every = rule_of(node.hp.optimizer.method).moves_every_coordinate
    if not model_in_sync(own, published, lr, node.hp.sync, moves_every_coordinate=every):
        off = off_positions(own, published, lr, node.hp.sync, moves_every_coordinate=every)
        return f"{off}/{own.numel()} fingerprint positions off by more than {'α/2' if every else 'rounding'}"
    return None


class SyncCheck:
    """A node's own fingerprints of its last few windows, compared with the one published by the
    validator that led the window (its progress record of it). The newest window the node holds is
    compared first; its lead may not have published yet, so the one before it is the fallback."""

    KEEP = 8

    def __init__(self, node: Node) -> None:
        self.node = node
        self.own: dict[int, tuple[int, torch.Tensor]] = {}

    def record(self, window: int, global_step: int) -> None:
        """Call after the model holds `window`'s update (live step, catch-up or re-sync)."""
        if window < 0:  # nothing applied yet (before the run's start window)
            return
        self.own[window] = (global_step, self.node.compute.fingerprint(window))
        for old in [w for w in self.own if w <= window - self.KEEP or w > window]:
            del self.own[old]

    async def check(self, window: int, state: NodeState, *, wait_until: float | None = None) -> bool:
        """False only on evidence of a fork (logged in one `[SYNC]` line): the validator that led the
        window our model holds (`state`: then the model itself is fingerprinted now, so damage since
        that window's step shows too), or the one before, published a fingerprint of it, and ours
        differs. Who led is decided again here, a window after the live decision, so a node that took
        another slot's inputs than the run did (a write that became visible late) finds out. Nothing
        to compare (we led it, nobody did, an unreadable or late progress record) is not evidence:
        True. `window` is the one we are in (for the log).

        `wait_until` (the node's clock): how long the lead's record of the window our model holds
        is waited for before the one before it is compared instead. A node that took a step at
        the moment its lead did (an overlapped miner encoding as soon as the step lands) would
        otherwise race the lead's publication, and the window before's fingerprint was taken
        before anything that happened to the model since: the check's verdict would depend on
        which write came first."""
        node = self.node
        for held in (state.window, state.window - 1):
            if held < 0 or (held != state.window and held not in self.own):
                continue
            until = wait_until if held == state.window and wait_until is not None else node.clock.now()
            decision, progress = await self._lead_record(held, until)
            if decision is None:
                continue
            if decision.lead is not None and decision.lead.hotkey == node.hotkey:
                return True  # we led it: we are the reference
            if progress is None:
                continue
            if held == state.window:
                self.record(state.window, state.global_step)
            global_step, own = self.own[held]
            problem = compare_with_lead(node, progress, global_step, own)
            if problem is None:
                return True
            context(window=window, phase="sync").warning(
                f"[SYNC] Our model differs from the run's after window {held} (uid {decision.lead.uid} led it; "
                f"{problem}): not uploading as active; re-syncing from a checkpoint")
            return False
        return True

    async def _lead_record(self, held: int, until: float) -> tuple[Decision | None, Progress | None]:
        """Who led `held` and that lead's progress record of it, looked for again every
        `POLL_SECONDS` until `until` while the record is not published yet (or who led cannot be
        told yet). (None, None): nobody led it or who did cannot be told; (decision, None): its lead
        has no readable record of it by then (an unreadable one is said once, not waited on)."""
        node = self.node
        while True:
            decision = await decide_window(node, held)
            lead = decision.lead if decision.settled else None
            if lead is None or lead.bucket is None:
                if decision.settled or node.clock.now() + POLL_SECONDS > until or node.stop.is_set():
                    return None, None
            elif lead.hotkey == node.hotkey:
                return decision, None
            else:
                timeout = min(PROGRESS_READ_SECONDS, max(until - node.clock.now(), POLL_SECONDS))
                try:
                    progress = await get_progress(lead.bucket, held, run=node.run, timeout=timeout)
                except (StorageError, RecordError) as exc:
                    _say_unreadable(lead, held, exc)
                    return decision, None
                if progress is not None or node.clock.now() + POLL_SECONDS > until or node.stop.is_set():
                    return decision, progress
            await asyncio.sleep(POLL_SECONDS)
