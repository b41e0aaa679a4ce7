"""Joining a running subnet (docs/design.md §4), shared by miners and validators.

Phases, each announced by one `[SYNC]` line:
  1. registration check (in `templar.runtime.node.start_node`)
  2. state download: own local state if recent, else the lead validator's newest intact
     checkpoint (sha256-verified, resumable, progress bar), else θ_0 of the run if it has none
  3. catch-up: replay the lead's published aggregates up to the current window, no uploads
  4. warm-up and 5. active are the roles' business.

And, for as long as a node runs, proof that it still holds the run's model (`SyncCheck`): its own
fingerprint after each window against the one the lead publishes with its progress; on a mismatch,
one `[SYNC]` line and a re-sync by itself (`resync`: the lead's checkpoint, then replay).
"""

from __future__ import annotations

import asyncio
import time
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
    get_inputs,
    get_start_window,
)
from templar.comms.keys import aggregate_key, inputs_key
from templar.comms.progress import Progress, decode_fingerprint, get_progress
from templar.compress.methods import rule_of
from templar.core.log import context
from templar.core.schedule import learning_rate
from templar.runtime.fingerprint import model_in_sync, off_positions
from templar.runtime.node import Lead, Node
from templar.runtime.outer import peer_weight, update_step
from templar.runtime.state import STATE_FILE, NodeState
from templar.runtime.windows import apply_span
from templar.storage import StorageError
from templar.wire import (
    PayloadError,
    max_aggregate_bytes,
    max_bundle_bytes,
    max_inputs_bytes,
    read_aggregate,
    read_bundle,
    read_inputs,
)

MODEL_FILE = "model.safetensors"
CHECKPOINT_DOWNLOAD_SECONDS = 1800.0
RETRY_SECONDS = 2.0
"""Pause before catch-up retries a window whose update it could not establish."""


class ResyncError(Exception):
    """A re-sync could not be made now (no lead, or its checkpoint could not be read): the node
    stays out of sync and tries again later."""


class Phase(StrEnum):
    STARTUP = "startup"      # registration, bucket commitment, model build
    DOWNLOAD = "download"    # fetching the lead's checkpoint
    CATCHUP = "catchup"      # replaying published aggregates; no uploads
    WARMUP = "warmup"        # training to fill the error-feedback buffer; uploads carry weight 0
    ACTIVE = "active"        # full participation


async def restore(node: Node, *, use_local: bool = True) -> tuple[NodeState, bool]:
    """Phase 2. Returns the state and whether it is this node's own (so its error feedback, if
    the node keeps one, was restored with θ and warm-up may be skipped). `use_local=False` (a
    re-sync: our own model is known to differ from the run's) takes only the lead's checkpoints.

    The lead's newest intact checkpoint is taken (an unusable newest one is said to be unusable,
    and older ones are tried). θ_0 and the run's start window are taken only when the lead has
    published no checkpoint at all: a run whose checkpoints exist but cannot be used is never
    restarted from θ_0, because the aggregates before the oldest kept checkpoint are gone and a
    replay from θ_0 would not be the run's history. `ResyncError` when nothing usable can be read
    now (the model is then untouched): the caller retries later."""
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

    lead = await node.lead()
    if lead is None:
        log.warning("[SYNC] No lead validator with a readable bucket yet")
        if local is not None:
            return local, True
        if not use_local:
            raise ResyncError("no lead validator with a readable bucket")
        log.info(f"[SYNC] No checkpoint yet: starting from the run's initial weights (start window {current})")
        return NodeState(window=current - 1, global_step=0), False
    loaded = await _newest_intact_checkpoint(node, lead, newer_than=local.window if local is not None else -1)
    if isinstance(loaded, NodeState):
        return loaded, False
    if local is not None:
        return local, True
    if loaded is not None:  # checkpoints exist, and none could be used
        raise ResyncError(loaded)
    try:
        start = await get_start_window(lead.bucket, run=node.run)
    except (StorageError, RecordError) as exc:
        raise ResyncError(f"no checkpoint yet and the run's start window is unreadable ({exc})") from exc
    if start is None and not use_local:
        raise ResyncError("no checkpoint yet and no start window published")
    if not use_local:  # the model in memory is not θ_0: rebuild it (deterministic from init_seed)
        await asyncio.to_thread(compute.reset_model)
    start = current if start is None else start
    log.info(f"[SYNC] No checkpoint published yet: starting from the run's initial weights (start window {start})")
    return NodeState(window=start - 1, global_step=0), False


async def _newest_intact_checkpoint(node: Node, lead: Lead, *, newer_than: int) -> NodeState | str | None:
    """Load the lead's newest usable checkpoint newer than `newer_than` into the model. Returns its
    state; else why none could be used (a `[SYNC]` line for each unusable one); None when the lead
    has published no checkpoint (or none newer than `newer_than`)."""
    log = context(window=node.clock.current_window(), phase=Phase.DOWNLOAD)
    bucket = lead.bucket
    log.info(f"[SYNC] Downloading the latest checkpoint from lead validator uid {lead.validator.uid}")
    problems: list[str] = []
    candidates: list[int | None] = [None]  # latest.json first, then older manifests newest first
    tried: set[int] = set()
    while candidates:
        window = candidates.pop(0)
        if window is not None and (window in tried or window <= newer_than):
            continue
        try:
            ckpt = await download_latest_checkpoint(
                bucket, node.state_dir / "download", run=node.run, max_bytes=_checkpoint_cap(node.model),
                deadline=node.clock.now() + CHECKPOINT_DOWNLOAD_SECONDS, progress=True, now=node.clock.now,
                window=window)
            if ckpt is None:
                if window is None:  # no latest.json: nothing was ever published
                    return None
                continue
            tried.add(ckpt.window)
            if ckpt.window <= newer_than:
                return None
            await asyncio.to_thread(node.compute.load_model_file, ckpt.files[MODEL_FILE])
        except (CheckpointError, StorageError, KeyError) as exc:
            name = "the latest checkpoint" if window is None else f"checkpoint {window}"
            problems.append(f"{name}: {str(exc)[:200]}")
            log.warning(f"[SYNC] {name} of the lead is unusable: {str(exc)[:200]}")
            if window is not None:
                tried.add(window)
            if window is None:
                try:
                    candidates += await checkpoint_windows(bucket)
                except StorageError as list_exc:
                    problems.append(f"listing its checkpoints: {list_exc}")
            continue
        log.info(f"[SYNC] Loaded checkpoint of window {ckpt.window} (global_step {ckpt.global_step})")
        return NodeState(window=ckpt.window, global_step=ckpt.global_step)
    return "the lead's checkpoints are unusable (" + "; ".join(problems)[:600] + ")" if problems else None


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


async def _window_update(node: Node, lead: Lead, window: int, cap: int) -> tuple[bool, Published | None, str]:
    """One look at the lead's record of `window`: (resolved, published update or None, what is wrong).
    Resolved means the update is known: its signed aggregate, or its inputs naming no payload
    (the window had no outer step). Anything else (absent, unreadable, malformed, not signed by
    the lead) is unresolved: never an empty window."""
    try:
        data = await get_aggregate(lead.bucket, window, max_bytes=cap, timeout=10.0)
        if data is not None:
            try:
                return True, await asyncio.to_thread(read_published, node, data, lead.hotkey, window), ""
            except PayloadError as exc:
                return False, None, f"{aggregate_key(window)} is malformed ({exc.reason})"
        data = await get_inputs(lead.bucket, window, max_bytes=max_inputs_bytes(), timeout=10.0)
        if data is not None:
            try:
                inputs = read_inputs(data, run=node.run, verify=verify_signature, expected_hotkey=lead.hotkey,
                                     expected_window=window)
            except PayloadError as exc:
                return False, None, f"{inputs_key(window)} is malformed ({exc.reason})"
            if not inputs.peers:
                return True, None, ""
            return False, None, f"{aggregate_key(window)} is not published yet"
        return False, None, f"{inputs_key(window)} is not published yet"
    except (StorageError, RecordError) as exc:
        return False, None, f"the lead's records of window {window} are unreadable ({str(exc)[:160]})"


async def _skip_to_run_start(node: Node, state: NodeState, until: int) -> NodeState:
    """Windows before the run's start window (the lead's `start_window.json`) had no update: a node
    still at θ_0 (global_step 0) moves past them without waiting for inputs the lead will never
    publish. A node that started before the lead did (no start window readable yet) took its own
    current window as the start; when the lead then starts a window later, that node would otherwise
    wait for the lead's inputs of a window the run never had."""
    if state.global_step != 0:
        return state
    lead = await node.lead()
    if lead is None:
        return state
    try:
        start = await get_start_window(lead.bucket, run=node.run)
    except (StorageError, RecordError):
        return state  # unreadable: catch-up waits for the inputs as usual
    if start is None or start - 1 <= state.window:
        return state
    first, state.window = state.window + 1, min(start - 1, until)
    context(window=until, phase=Phase.CATCHUP).info(
        f"[SYNC] The run starts at window {start}: windows {first}..{state.window} had no update")
    return state


async def catch_up(node: Node, state: NodeState, until: int, *, verify: bool = True) -> NodeState:
    """Phase 3: apply the lead's published aggregates for windows (state.window, until].

    A window counts as one without an update only when the lead's signed inputs of it name no
    payload. An aggregate that cannot be had (not published yet, a stalled bucket, a malformed or
    unsigned object) is waited for until one window after its own; then catch-up stops *before*
    that window, never assuming it was empty (that would fork this node from the run for good),
    names the object in its `[SYNC]` line and returns: the caller retries, and past
    `max_allowed_stale` re-syncs from the lead's newest checkpoint (one at or after the bad window
    ends the wait).

    With `verify`, the replayed model is then compared with the fingerprint the lead published
    for the window it ends at (when the lead's progress names that window): a fork never heals by
    itself (the same later updates keep two models apart), so one check at the end proves every
    replayed window. On a mismatch (our starting state was not the run's) it re-syncs from the
    lead's checkpoint (`resync`).
    """
    if state.window >= until:
        return state
    log = context(window=until, phase=Phase.CATCHUP)
    state = await _skip_to_run_start(node, state, until)
    if state.window >= until:
        return state
    log.info(f"[SYNC] Synchronising weights with the lead validator. No uploads in this phase. "
             f"Replaying windows {state.window + 1}..{until}")
    started, applied, first = time.perf_counter(), 0, state.window
    cap = published_cap(node)
    for window in range(state.window + 1, until + 1):
        if node.stop.is_set():
            break
        # Due by the end of the next window; a node that reaches it later still looks for a while
        # (a lead whose bucket was stalled publishes what it held back as soon as it can).
        publish_by = max(node.clock.times(window + 1).end,
                         node.clock.now() + apply_span(node.hp.windows))
        resolved, agg, problem = False, None, "not readable: no lead validator with a readable bucket"
        while True:
            lead = await node.lead()
            if lead is not None:
                resolved, agg, problem = await _window_update(node, lead, window, cap)
                if resolved:
                    break
            if node.clock.now() > publish_by or node.stop.is_set():
                break
            await asyncio.sleep(0.5)
        if not resolved:
            if not node.stop.is_set():
                log.warning(f"[SYNC] The lead's update of window {window} cannot be established: {problem}; not "
                            f"assuming there was none: caught up to window {state.window}, retrying")
                await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
            break
        if agg is not None:
            step = update_step(state.global_step, published=agg.global_step)
            await asyncio.to_thread(node.compute.apply_update, agg.update, step)
            state.global_step = step + 1
            applied += 1
        state.window = window
    seconds = time.perf_counter() - started
    rate = (state.window - first) / seconds if seconds > 0 else 0.0
    log.info(f"[SYNC] Caught up to window {state.window}: {applied} aggregates applied in {seconds:.1f}s "
             f"({rate:.1f} windows/s), global_step {state.global_step}")
    if verify and state.window > first and not node.stop.is_set():
        problem = await fingerprint_problem(node, state)
        if problem is not None:
            context(window=state.window, phase=Phase.CATCHUP).warning(
                f"[SYNC] The replayed model differs from the lead's at window {state.window} ({problem}): "
                "our starting state was not the run's; re-syncing from the lead's checkpoint")
            try:
                return await resync(node)
            except ResyncError as exc:
                context(window=state.window, phase=Phase.CATCHUP).warning(
                    f"[SYNC] Re-sync not possible now ({exc}); the next check retries")
    return state


async def fingerprint_problem(node: Node, state: NodeState) -> str | None:
    """What differs between our model (holding `state.window`) and the lead's published
    fingerprint of that window; None when they agree or there is nothing to compare with (no
    lead, no progress, or the progress names another window)."""
    lead = await node.lead()
    progress = await _read_progress(node, lead.bucket) if lead is not None else None
    if progress is None or progress.window != state.window or progress.fingerprint is None:
        return None
    own = await asyncio.to_thread(node.compute.fingerprint, state.window)
    return compare_with_lead(node, progress, state.global_step, own)


async def resync(node: Node) -> NodeState:
    """Checkpoint + replay, never from our own state: the lead's newest intact checkpoint (or θ_0
    and the run's start window when it has published none), then its aggregates up to the last
    finished window, then the fingerprint check. Error feedback (a miner's own residual, not part
    of the run's model) is kept. `ResyncError` when the lead or its checkpoint cannot be read now,
    or when the re-synced model still differs from the lead's fingerprint (the object at fault is
    named): the node stays out of sync and retries."""
    state, _ = await restore(node, use_local=False)
    state = await catch_up(node, state, node.clock.current_window() - 1, verify=False)
    problem = await fingerprint_problem(node, state)
    if problem is not None:
        raise ResyncError(f"the lead's checkpoint replayed to window {state.window} still differs from the lead's "
                          f"fingerprint ({problem})")
    return state


async def _read_progress(node: Node, bucket) -> Progress | None:
    try:
        return await get_progress(bucket, run=node.run, timeout=10.0)
    except (StorageError, RecordError) as exc:
        context(phase="sync").debug(f"lead's progress unreadable: {str(exc)[:160]}")
        return None


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
    if not model_in_sync(own, published, lr, node.hp.sync):
        return (f"{off_positions(own, published, lr, node.hp.sync)}/{own.numel()} fingerprint positions off by "
                "more than α/2")
    return None


class SyncCheck:
    """A node's own fingerprints of its last few windows, compared with the one the lead publishes
    with its progress. A check is made against whatever window the lead's progress names, so a lead
    publishing late (or a node checking early) still compares like with like."""

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

    async def check(self, window: int, state: NodeState) -> bool:
        """False only on evidence of a fork (logged in one `[SYNC]` line): the lead's progress names
        the window our model holds (`state`: then the model itself is fingerprinted now, so damage
        since that window's step shows too) or one we hold a fingerprint of, and ours differs.
        Nothing to compare (no lead, an unreadable or late progress record) is not evidence: True.
        `window` is the one we are in (for the log)."""
        node = self.node
        lead = await node.lead()
        if lead is None or lead.hotkey == node.hotkey:
            return True
        progress = await _read_progress(node, lead.bucket)
        if progress is None:
            return True
        if progress.window == state.window:
            self.record(state.window, state.global_step)
        if progress.window not in self.own:
            return True
        global_step, own = self.own[progress.window]
        problem = compare_with_lead(node, progress, global_step, own)
        if problem is None:
            return True
        context(window=window, phase="sync").warning(
            f"[SYNC] Our model differs from the lead's after window {progress.window} ({problem}): not uploading "
            "as active; re-syncing from the lead's checkpoint")
        return False
