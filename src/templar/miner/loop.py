"""The miner: each window, train on the assigned pages, compress, post, gather the top-G, step.

`Miner.run` is the whole life of a miner; `run_window` is one window, as named phases:

    ensure_base → train → encode_and_commit → upload (inside the put window)
    → step (gather the peers in effect, take the lead's step) → finish (record, save: the commit point)

Each phase is a method; what one hands to the next is a `MinerWindow`, which also builds the
window's record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from templar.comms import put_gradient
from templar.comms.commit import put_commit
from templar.comms.keys import gradient_key
from templar.compress.methods import rule_of
from templar.core.log import context
from templar.core.schedule import learning_rate
from templar.miner.hooks import MinerHooks
from templar.runtime.follow import FollowError, follow_step
from templar.runtime.node import Node, OwnBucketError
from templar.runtime.outer import gather_gradients
from templar.runtime.peers import peers_in_effect
from templar.runtime.records import (
    MINER_WINDOWS_FILE,
    MinerWindowRecord,
    append_record,
    drop_uncommitted_records,
)
from templar.runtime.state import NodeState
from templar.runtime.sync import Phase, ResyncError, SyncCheck, catch_up, restore_when_possible, resync
from templar.runtime.train import TrainStats, inner_lr
from templar.runtime.windows import WindowTimes
from templar.storage import StorageError
from templar.wire import document_digest, max_gradient_bytes, write_gradient

MAX_FAILED_UPLOADS = 5
"""Consecutive windows whose upload our own bucket refused before the miner stops (`OwnBucketError`)."""


@dataclass
class MinerWindow:
    """What one window's phases hand to the next, and the one place its record is built from."""

    window: int
    times: WindowTimes
    pages: list[int] = field(default_factory=list)
    stats: TrainStats | None = None
    in_sync: bool = True
    payload: bytes = b""
    uploaded: bool = False
    upload_bytes: int = 0
    upload_seconds: float = 0.0
    peers_aggregated: int = 0
    stepped: bool = False
    """Whether the window's outer step was taken (else the node stopped before it)."""
    busy_seconds: float = 0.0
    """Time spent on the window outside the waits for its landmarks (training included)."""

    @contextmanager
    def busy(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.busy_seconds += time.perf_counter() - started

    @property
    def overhead_share(self) -> float:
        """Share of the window spent busy outside forward/backward (0 for a window not stepped)."""
        if not self.stepped or self.stats is None:
            return 0.0
        return max(0.0, self.busy_seconds - self.stats.seconds) / (self.times.end - self.times.start)

    def record(self, phase: Phase, strategy: str, global_step: int) -> MinerWindowRecord:
        """The window's record. One stopped before its step records its loss and upload but no
        peers aggregated, no overhead and no `tokens`: those count the windows this node completed
        (the localnet report's trained tokens)."""
        stats = self.stats
        assert stats is not None, "a window is recorded only after it trained"
        return MinerWindowRecord(
            window=self.window, phase=str(phase), strategy=strategy, global_step=global_step, loss=stats.loss,
            tokens_per_second=stats.tokens_per_second, pages=len(self.pages), uploaded=self.uploaded,
            upload_bytes=self.upload_bytes, upload_seconds=self.upload_seconds,
            peers_aggregated=self.peers_aggregated if self.stepped else 0, overhead_share=self.overhead_share,
            tokens=stats.tokens if self.stepped else 0)


class Miner:
    """One miner. `extra_pages`: unassigned pages trained on per window on top of the assigned
    ones (more work, a better rating: the paper's Figure 2). `hooks`: see `templar.miner.hooks`."""

    def __init__(self, node: Node, *, extra_pages: int = 0, hooks: MinerHooks | None = None):
        self.node = node
        self.hp = node.hp
        self.extra_pages = extra_pages
        self.hooks = hooks or MinerHooks()
        self.compute = node.compute  # θ and the error feedback: one process, or torchrun's ranks
        self.compute.enable_error_feedback()
        self.state = NodeState(window=-1, global_step=0)
        self.phase = Phase.STARTUP
        self.warmup_left = 0
        self.start_window = 0
        self.max_bytes = max_gradient_bytes(node.shapes, self.hp)
        self.failed_uploads = 0
        self.sync = SyncCheck(node)
        self.resync_pending = False
        self._stuck_at: int | None = None
        """The window a join last found the miner stuck at (the `[SYNC]` line says it once)."""

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Phases 2-3 of the join flow: restore or download state, then catch up."""
        self.state, own = await restore_when_possible(self.node)
        drop_uncommitted_records(self.node.state_dir, [MINER_WINDOWS_FILE], self.state.window)
        self.start_window = self.state.window + 1
        await self.join(own_state=own)

    async def run(self, max_windows: int = 0) -> None:
        """Join, then run windows until stopped (or `max_windows` windows, if not 0)."""
        node = self.node
        await self.start()
        done = 0
        while not node.stop.is_set():
            current = node.clock.current_window()
            behind = current - self.state.window - 1
            if behind > self.hp.windows.max_allowed_stale:
                if self._stuck_at != self.state.window:
                    context(window=current, phase=self.phase).warning(
                        f"[SYNC] {behind} windows behind (max {self.hp.windows.max_allowed_stale}): re-syncing from "
                        "the newest checkpoint")
                self.state, own = await restore_when_possible(node)
                await self.join(own_state=own)
                continue
            if behind > 0:
                # A window's processing overran: replay what we missed rather than train on stale θ,
                # then look at the clock again (the replay itself may have taken time).
                self.state = await catch_up(node, self.state, current - 1)
                self.sync.record(self.state.window, self.state.global_step)
                if self._stuck_at is not None and self.state.window >= node.clock.current_window() - 1:
                    self._stuck_at = None  # the gap a join found is closed: now the phase can be said
                    self._say_phase()
                continue
            await self.run_window(current)
            done += 1
            if max_windows and done >= max_windows:
                break
        self.save()
        context(phase="stopped").info("miner stopped cleanly")

    async def join(self, *, own_state: bool) -> None:
        node = self.node
        self.phase = Phase.CATCHUP
        self.state = await catch_up(node, self.state, node.clock.current_window() - 1)
        self.sync.record(self.state.window, self.state.global_step)
        self.save()
        self.warmup_left = 0 if own_state else self.hp.windows.warmup_windows
        self.phase = Phase.WARMUP if self.warmup_left else Phase.ACTIVE
        behind = node.clock.current_window() - 1 - self.state.window
        if behind > 0:  # the run's update of a window could not be had: said once per gap, never "Active"
            if self._stuck_at != self.state.window:
                context(phase=Phase.CATCHUP).warning(
                    f"[SYNC] Still {behind} windows behind the run (at window {self.state.window}): waiting for the "
                    f"update of window {self.state.window + 1} (the [SYNC] line above names it)")
            self._stuck_at = self.state.window
            return
        self._stuck_at = None
        self._say_phase()

    def _say_phase(self) -> None:
        """The join's last line, once the miner holds the run's latest window: warm-up or active."""
        if self.warmup_left:
            context(phase=self.phase).info(
                f"[SYNC] Warm-up: training {self.warmup_left} windows to build the error-feedback buffer; "
                "uploads carry weight 0")
        else:
            context(phase=self.phase).info("[SYNC] Active: full participation")

    def save(self) -> None:
        self.node.save_state(self.state)

    # ------------------------------------------------------------------ one window
    async def run_window(self, window: int) -> None:
        """One window as its phases; a window that cannot take the run's step stops before it (its
        record says `catchup`) and the run loop catches up."""
        times = self.node.clock.times(window)
        await asyncio.to_thread(self.node.clock.check_skew)
        if not await self.ensure_base(window):
            return
        work = MinerWindow(window, times)
        with work.busy():
            await self.train(work)
            await self.encode_and_commit(work)
        await self.upload(work)
        if not work.in_sync and await self._resync(window):
            await self.finish(work, Phase.CATCHUP)
            return
        if not await self.step(work):
            await self.finish(work, Phase.CATCHUP)
            return
        self.advance_warmup(window)
        self.log_window(work)
        await self.finish(work, self.phase)

    async def ensure_base(self, window: int) -> bool:
        """Whether θ holds the previous window's update, catching up on it first: the last window
        may have stopped before its step (the lead's was not to be had), and a miner never trains on
        a model that does not hold it."""
        if self.state.window >= window - 1:
            return True
        self.state = await catch_up(self.node, self.state, window - 1)
        self.sync.record(self.state.window, self.state.global_step)
        if self.state.window < window - 1:
            context(window=window, phase=self.phase).warning(
                f"[SYNC] still before window {window - 1}: not training window {window}")
            return False
        return True

    async def train(self, work: MinerWindow) -> None:
        """The inner steps on this window's pages (the next window's read ahead)."""
        hp, window = self.hp, work.window
        pages = self.hooks.pages(self, window, self.pages(window))
        batch, work.pages = await self.node.pages.fetch(  # only these pages' bytes
            pages, prefetch=self.hooks.pages(self, window + 1, self.pages(window + 1)))
        batch = self.hooks.batch(self, window, batch)
        lr = self.hooks.learning_rate(
            self, window, inner_lr(hp.inner, learning_rate(self.state.global_step, hp.optimizer), hp.optimizer))
        work.stats = await asyncio.to_thread(self.compute.train, batch, hp.optimizer.micro_batch_size,
                                             hp.optimizer.grad_clip, lr)

    async def encode_and_commit(self, work: MinerWindow) -> None:
        """Compress and sign the pseudo-gradient, then commit to it before the commitment deadline.
        A node that cannot show it holds the run's model uploads with weight 0 (a warm-up payload)."""
        window = work.window
        work.in_sync = not self.hooks.checks_sync or (not self.resync_pending
                                                      and await self.sync.check(window, self.state))
        payload = await asyncio.to_thread(self._compress_and_encode, window, work.stats.scale, not work.in_sync)
        work.payload = await self.hooks.before_commit(self, window, payload)
        await self._commit(window, work.payload)

    async def upload(self, work: MinerWindow) -> None:
        """Post the payload inside the put window, which opens when the next window's first block
        lands. A stop request does not interrupt a window: the error feedback already gave up what
        we send. `OwnBucketError` once our bucket has refused `MAX_FAILED_UPLOADS` in a row."""
        window = work.window
        await self.node.clock.sleep_until(work.times.end)
        payload = await self.hooks.before_upload(self, window, work.payload)
        with work.busy():
            try:
                put = await put_gradient(self.node.bucket, window, payload, timeout=self.hp.windows.put_window_seconds)
            except StorageError as exc:
                self.failed_uploads += 1
                context(window=window, phase=self.phase).warning(
                    f"upload failed ({self.failed_uploads}/{MAX_FAILED_UPLOADS} in a row): {exc}")
                if self.failed_uploads >= MAX_FAILED_UPLOADS:
                    raise OwnBucketError(f"our bucket refused {self.failed_uploads} uploads in a row (last: {exc}); "
                                         "check its write key, permissions and space") from exc
            else:
                self.failed_uploads = 0
                work.uploaded, work.upload_bytes, work.upload_seconds = True, put.nbytes, put.seconds

    async def step(self, work: MinerWindow) -> bool:
        """The window's outer step, once the gather may start: the lead's inputs over the payloads
        of the peer list in effect. False when it cannot be had by the window's apply deadline: no
        guess, the model stays before this window and the run loop catches up on the lead's
        published update of it (waiting for it, re-syncing once too far behind)."""
        window = work.window
        await self.node.clock.sleep_until(work.times.gather_start)
        with work.busy():
            try:
                work.peers_aggregated = await self._aggregate(window)
            except FollowError as exc:
                context(window=window, phase=self.phase).warning(
                    f"[SYNC] {exc}: stopping before window {window} and catching up")
                return False
            self.hooks.after_step(self, window)
            self.state.window = window
            self.sync.record(window, self.state.global_step)
            await self._delete_stale_gradient(window)
        work.stepped = True
        return True

    def advance_warmup(self, window: int) -> None:
        """One more warm-up window done; the last one makes the miner active."""
        if self.phase == Phase.WARMUP:
            self.warmup_left -= 1
            if self.warmup_left <= 0:
                self.phase = Phase.ACTIVE
                context(window=window, phase=self.phase).info("[SYNC] Warm-up done: active")

    def log_window(self, work: MinerWindow) -> None:
        stats = work.stats
        context(window=work.window, phase=self.phase).info(
            f"loss {stats.loss:.4f} | {stats.tokens_per_second:,.0f} tok/s | {len(work.pages)} pages | "
            f"upload {work.upload_bytes / 1e3:.0f} kB in {work.upload_seconds:.2f}s | aggregated "
            f"{work.peers_aggregated} | step {self.state.global_step} | overhead {work.overhead_share:.1%}")

    async def finish(self, work: MinerWindow, phase: Phase) -> None:
        """The commit point: the window's record is written first, so a crash before the save redoes
        the window and `drop_uncommitted_records` drops its record at the restart."""
        append_record(self.node.state_dir / MINER_WINDOWS_FILE, work.record(phase, self.hooks.name,
                                                                            self.state.global_step))
        await asyncio.to_thread(self.save)

    async def _resync(self, window: int) -> bool:
        """Checkpoint + replay up to the last finished window (this one: its aggregate is the lead's).
        False when it cannot be made now: the window goes on as usual and the next one retries."""
        try:
            self.state = await resync(self.node)
        except ResyncError as exc:
            self.resync_pending = True
            context(window=window, phase="sync").warning(f"[SYNC] Re-sync not possible now ({exc}); retrying "
                                                         "next window, uploading with weight 0 until then")
            return False
        self.resync_pending = False
        self.sync.record(self.state.window, self.state.global_step)
        return True

    async def _commit(self, window: int, payload: bytes) -> None:
        """Commit to the payload's document digest (every tensor, probes included, and the signed
        metadata: `templar.wire.document_digest`) before any gradient of the window is readable
        (`templar.comms.commit`): without it validators fail the upload as `uncommitted`."""
        node = self.node
        log = context(window=window, phase=self.phase)
        close = node.clock.times(window).commit_close
        left = close - node.clock.now()
        if left <= 0:
            log.warning(f"commitment deadline passed {-left:.1f}s ago ({self._overran_because()}): this window's "
                        "upload will fail fast evaluation as 'uncommitted'")
            return
        try:
            await put_commit(node.bucket, window, document_digest(payload, node.shapes, self.hp), run=node.run,
                             timeout=left)
        except StorageError as exc:
            log.warning(f"commitment upload failed: {exc}")

    def _overran_because(self) -> str:
        """Why a window's commitment came too late: this machine's clock when it is off the chain's by
        more than the allowance (every deadline is then missed by that much; the `[CLOCK]` line),
        else the window's work."""
        clock = self.node.clock
        off = clock.skew()
        if abs(off) > self.hp.windows.clock_skew_seconds:
            return (f"this machine's clock is {abs(off):.1f}s {'ahead of' if off > 0 else 'behind'} the chain's: "
                    "synchronise it (NTP, chrony); see the [CLOCK] line")
        return "training overran: fewer inner steps or a faster device fit the window"

    def pages(self, window: int) -> list[int]:
        """This window's assigned pages, plus `extra_pages` unassigned ones."""
        plan, n = self.node.plan, self.hp.data.pages_per_window
        pages = plan.assigned_pages(self.node.uid, window, n)
        if self.extra_pages:
            pages += plan.random_pages(window, self.extra_pages, salt=1000 + self.node.uid, exclude=pages)
        return pages

    async def _delete_stale_gradient(self, window: int) -> None:
        """Keep our bucket bounded: nobody reads a gradient older than `max_allowed_stale` windows."""
        old = window - self.hp.windows.max_allowed_stale - 2
        if old >= 0:
            try:
                await self.node.bucket.delete(gradient_key(old))
            except StorageError as exc:
                context(window=window, phase="cleanup").debug(f"could not delete gradient {old}: {exc}")

    def _compress_and_encode(self, window: int, scale: float, weight_zero: bool = False) -> bytes:
        hp, node = self.hp, self.node
        compressed = self.compute.compress(scale)
        values = self.hooks.transform(self, window, {k: c.values for k, c in compressed.items()})
        rule = rule_of(hp.optimizer.method)  # what a hook changed goes back onto the method's value grid
        compressed = {k: type(c)(indices=c.indices, values=rule.wire_values(values[k].float()), shape=c.shape,
                                 chunk=c.chunk)
                      for k, c in compressed.items()}
        return write_gradient(compressed, self.compute.probes(window), window=window,
                              global_step=self.state.global_step, hotkey=node.hotkey, hp=hp, run=node.run,
                              sign=node.chain.sign, warmup=self.phase == Phase.WARMUP or weight_zero)

    async def _aggregate(self, window: int) -> int:
        """Take the window's outer step: the lead's inputs (`templar.runtime.follow`), from the
        payloads of the peer list in effect gathered here and, for any they lack, fetched directly.
        `FollowError` when the lead's step cannot be had by the window's apply deadline."""
        node = self.node
        peers = await peers_in_effect(node, window)
        gathered = await gather_gradients(await node.peer_buckets(peers), window, clock=node.clock, hp=self.hp,
                                          shapes=node.shapes, run=node.run) if peers else {}
        step = await follow_step(node, window, self.state, gathered)
        return step.peers if step else 0
