"""The miner: each window, train on the assigned pages, compress, post, gather the top-G, step.

`Miner.run` is the whole life of a miner; `run_window` is one window, as named phases:
train → compress → upload (inside the put window) → gather top-G → outer step → save.
"""

from __future__ import annotations

import asyncio
import time

from templar.comms import put_gradient
from templar.comms.commit import put_commit
from templar.comms.keys import gradient_key
from templar.compress.methods import rule_of
from templar.core.log import context
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
from templar.runtime.train import inner_lr
from templar.storage import StorageError
from templar.wire import document_digest, max_gradient_bytes, write_gradient

MAX_FAILED_UPLOADS = 5
"""Consecutive windows whose upload our own bucket refused before the miner stops (`OwnBucketError`)."""


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
                context(window=current, phase=self.phase).warning(
                    f"[SYNC] {behind} windows behind (max {self.hp.windows.max_allowed_stale}): re-syncing from "
                    "the lead's newest checkpoint")
                self.state, own = await restore_when_possible(node)
                await self.join(own_state=own)
                continue
            if behind > 0:
                # A window's processing overran: replay what we missed rather than train on stale θ,
                # then look at the clock again (the replay itself may have taken time).
                self.state = await catch_up(node, self.state, current - 1)
                self.sync.record(self.state.window, self.state.global_step)
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
        node, hp = self.node, self.hp
        times = node.clock.times(window)
        log = context(window=window, phase=self.phase)
        await asyncio.to_thread(node.clock.check_skew)
        if self.state.window < window - 1:
            # The last window stopped before its step (the lead's was not to be had): never train on
            # a model that does not hold the previous window's update.
            self.state = await catch_up(node, self.state, window - 1)
            self.sync.record(self.state.window, self.state.global_step)
            if self.state.window < window - 1:
                log.warning(f"[SYNC] still before window {window - 1}: not training window {window}")
                return
        busy_started = time.perf_counter()

        pages = self.hooks.pages(self, window, self.pages(window))
        batch, pages = await node.pages.fetch(  # only these pages' bytes; the next window's read ahead
            pages, prefetch=self.hooks.pages(self, window + 1, self.pages(window + 1)))
        batch = self.hooks.batch(self, window, batch)
        lr = self.hooks.learning_rate(self, window, inner_lr(hp.inner, self.state.global_step, hp.optimizer))
        stats = await asyncio.to_thread(self.compute.train, batch, hp.optimizer.micro_batch_size,
                                        hp.optimizer.grad_clip, lr)
        # A node that cannot show it holds the run's model uploads with weight 0 (a warm-up payload).
        in_sync = not self.hooks.checks_sync or (not self.resync_pending and await self.sync.check(window, self.state))
        payload = await asyncio.to_thread(self._compress_and_encode, window, stats.scale, not in_sync)
        payload = await self.hooks.before_commit(self, window, payload)
        await self._commit(window, payload)
        busy = time.perf_counter() - busy_started

        # Upload inside the put window: it opens when the next window's first block lands. A stop
        # request does not interrupt a window: the error feedback already gave up what we send.
        await node.clock.sleep_until(times.end)
        payload = await self.hooks.before_upload(self, window, payload)
        busy_started = time.perf_counter()
        uploaded, up_bytes, up_seconds = False, 0, 0.0
        try:
            put = await put_gradient(node.bucket, window, payload, timeout=hp.windows.put_window_seconds)
            uploaded, up_bytes, up_seconds = True, put.nbytes, put.seconds
        except StorageError as exc:
            self.failed_uploads += 1
            log.warning(f"upload failed ({self.failed_uploads}/{MAX_FAILED_UPLOADS} in a row): {exc}")
            if self.failed_uploads >= MAX_FAILED_UPLOADS:
                raise OwnBucketError(f"our bucket refused {self.failed_uploads} uploads in a row (last: {exc}); "
                                     "check its write key, permissions and space") from exc
        else:
            self.failed_uploads = 0
        busy += time.perf_counter() - busy_started

        if not in_sync and await self._resync(window):
            append_record(node.state_dir / MINER_WINDOWS_FILE, MinerWindowRecord(
                window=window, phase=str(Phase.CATCHUP), strategy=self.hooks.name,
                global_step=self.state.global_step, loss=stats.loss, tokens_per_second=stats.tokens_per_second,
                pages=len(pages), uploaded=uploaded, upload_bytes=up_bytes, upload_seconds=up_seconds,
                peers_aggregated=0, overhead_share=0.0))
            await asyncio.to_thread(self.save)
            return
        await node.clock.sleep_until(times.gather_start)
        busy_started = time.perf_counter()
        try:
            peers_aggregated = await self._aggregate(window)
        except FollowError as exc:
            # No guess: the model stays before this window, and the run loop catches up on the
            # lead's published update of it (waiting for it, re-syncing once too far behind).
            log.warning(f"[SYNC] {exc}: stopping before window {window} and catching up")
            append_record(node.state_dir / MINER_WINDOWS_FILE, MinerWindowRecord(
                window=window, phase=str(Phase.CATCHUP), strategy=self.hooks.name,
                global_step=self.state.global_step, loss=stats.loss, tokens_per_second=stats.tokens_per_second,
                pages=len(pages), uploaded=uploaded, upload_bytes=up_bytes, upload_seconds=up_seconds,
                peers_aggregated=0, overhead_share=0.0))
            await asyncio.to_thread(self.save)
            return
        self.hooks.after_step(self, window)
        self.state.window = window
        self.sync.record(window, self.state.global_step)
        await self._delete_stale_gradient(window)
        busy += time.perf_counter() - busy_started

        if self.phase == Phase.WARMUP:
            self.warmup_left -= 1
            if self.warmup_left <= 0:
                self.phase = Phase.ACTIVE
                log.info("[SYNC] Warm-up done: active")
        window_seconds = times.end - times.start
        overhead = max(0.0, busy - stats.seconds) / window_seconds
        log.info(f"loss {stats.loss:.4f} | {stats.tokens_per_second:,.0f} tok/s | {len(pages)} pages | "
                 f"upload {up_bytes / 1e3:.0f} kB in {up_seconds:.2f}s | aggregated {peers_aggregated} | "
                 f"step {self.state.global_step} | overhead {overhead:.1%}")
        append_record(node.state_dir / MINER_WINDOWS_FILE, MinerWindowRecord(
            window=window, phase=str(self.phase), strategy=self.hooks.name,
            global_step=self.state.global_step, loss=stats.loss, tokens_per_second=stats.tokens_per_second,
            pages=len(pages), uploaded=uploaded, upload_bytes=up_bytes, upload_seconds=up_seconds,
            peers_aggregated=peers_aggregated, overhead_share=overhead, tokens=stats.tokens))
        # The commit point: the window's record is written first, so a crash before this line
        # redoes the window and `trim_records` drops its uncommitted record at the restart.
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
            log.warning(f"commitment deadline passed {-left:.1f}s ago (training overran): this window's "
                        "upload will fail fast evaluation as 'uncommitted'")
            return
        try:
            await put_commit(node.bucket, window, document_digest(payload, node.shapes, self.hp), run=node.run,
                             timeout=left)
        except StorageError as exc:
            log.warning(f"commitment upload failed: {exc}")

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
