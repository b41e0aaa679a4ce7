"""The miner: each window, train on the assigned pages, compress, post, gather the top-G, step.

`Miner.run` is the whole life of a miner; `run_window` is one window, as named phases:

    train (its `Training`: begin → inner steps → encode_and_commit) → read_ahead (overlapped runs)
    → upload (inside the put window) → step (gather the peers in effect, take the lead's step)
    → finish (record, save: the commit point)

A window has two halves. Its compute half (`Training`: the inner steps on the window's pages, then
the payload encoded, signed and committed to) runs on the node's compute; its exchange half (upload,
gather, outer step, record, save) mostly waits on the network. In a blocking run
(`HParams.inner.overlap`) the halves follow each other and the GPU idles through the exchange. In
an overlapped run the next window's compute half begins the moment this window's payload is
committed (`read_ahead`), and this window's exchange runs while it trains: on a working model, so
the outer step that lands on the run's θ meanwhile never touches a tensor the inner steps use
(`templar.runtime.compute`). Window w's update is computed from θ after window w − `base_lag`'s
step, its base, whose global_step the payload declares (docs/architecture.md §2): delayed trains
from that θ as it is; eager starts from the newest θ with the miner's own last update applied as a
proxy, and swaps the proxy for the real step when it lands (`Compute.land`).

Each phase is a method; what one hands to the next is a `MinerWindow` (`templar.miner.window`), which also builds the
window's record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import torch

from templar.comms import put_gradient
from templar.comms.commit import put_commit
from templar.compress import Compressed
from templar.compress.methods import rule_of
from templar.core.config import base_lag, overlapped
from templar.core.log import context
from templar.miner.hooks import MinerHooks
from templar.miner.upkeep import StaleObjects
from templar.miner.window import MinerWindow, Training, recorded_pace
from templar.runtime.consensus.follow import FollowError, follow_step
from templar.runtime.consensus.outer import gather_gradients
from templar.runtime.consensus.peers import peers_in_effect
from templar.runtime.node import Node, OwnBucketError
from templar.runtime.records import (
    MINER_WINDOWS_FILE,
    append_record,
    drop_uncommitted_records,
)
from templar.runtime.restore import Phase, ResyncError, restore_when_possible
from templar.runtime.state import NodeState
from templar.runtime.sync import SyncCheck, catch_up, resync
from templar.runtime.train import inner_lr, window_parts
from templar.storage import StorageError
from templar.wire import document_digest, max_gradient_bytes, write_gradient

MAX_FAILED_UPLOADS = 5
"""Consecutive windows whose upload our own bucket refused before the miner stops (`OwnBucketError`)."""
ENCODE_MARGIN_SECONDS = 1.0
"""The least time before its commitment deadline a trained window starts encoding, even when the
exchange of the window before is not finished (twice the last encoding's time when that is more)."""


class Miner:
    """One miner. `extra_pages`: pages trained on per window beyond the assigned ones, declared in
    each payload (`PagePlan.declared_pages`; proven and paid like assigned work, docs/scoring.md §4).
    `hooks`: see `templar.miner.hooks`."""

    def __init__(self, node: Node, *, extra_pages: int = 0, hooks: MinerHooks | None = None):
        if not 0 <= extra_pages <= node.hp.data.max_extra_pages:
            raise ValueError(f"extra_pages {extra_pages}: the run allows 0 to {node.hp.data.max_extra_pages}")
        self.node = node
        self.hp = node.hp
        self.extra_pages = extra_pages
        self.hooks = hooks or MinerHooks()
        self.compute = node.compute  # θ and the error feedback: one process, or torchrun's ranks
        self.stale_objects = StaleObjects(node.hp)  # what our bucket keeps (`miner.upkeep`)
        self.compute.enable_error_feedback()
        self.state = NodeState(window=-1, global_step=0)
        self.phase = Phase.STARTUP
        self.warmup_left = 0
        self.start_window = 0
        self.max_bytes = max_gradient_bytes(node.shapes, self.hp)
        self.failed_uploads = 0
        self.sync = SyncCheck(node)
        self.resync_pending = False
        self._stuck_at: int | None = None  # the window a join last found the miner stuck at (said once)
        self.lag, self.overlapped = base_lag(self.hp.inner), overlapped(self.hp.inner)
        self.training: Training | None = None
        """The window whose compute half is under way or done and not yet exchanged (overlapped)."""
        self.own_update: tuple[int, dict[str, Compressed]] | None = None
        """Eager: our last payload's window and its coefficients (the proxy of that window's step)."""
        self._group: asyncio.TaskGroup | None = None
        self.saved_through = -1  # the window the state file's θ holds (`note_saved`)
        self._saved = asyncio.Event()
        self.train_seconds: float | None = None  # the last window's pages and inner steps, on the node's clock
        self._untrained = -1  # the window `can_finish` last left untrained
        self.encode_seconds = 0.0
        """How long the last payload took to compress and encode (the margin before its commitment)."""

    # ------------------------------------------------------------------ life
    async def start(self) -> None:
        """Phases 2-3 of the join flow: restore or download state, then catch up."""
        self.state, own = await restore_when_possible(self.node)
        drop_uncommitted_records(self.node.state_dir, [MINER_WINDOWS_FILE], self.state.window)
        self.start_window = self.state.window + 1
        self.train_seconds = recorded_pace(self.node.state_dir / MINER_WINDOWS_FILE)  # (`can_finish`: first window)
        await self.join(own_state=own)
        await self.stale_objects.sweep(self.node.bucket, self.node.clock.current_window())

    async def run(self, max_windows: int = 0) -> None:
        """Join, then run windows until stopped (or `max_windows` windows, if not 0). The compute
        half read ahead runs in a task group with the loop: when either fails, the other stops where
        it is, as a process would."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                await self._run(max_windows)
        except BaseExceptionGroup as group_error:  # one failure, raised as itself
            raise group_error.exceptions[0] from None
        finally:
            self._group = None
        self.save()
        context(phase="stopped").info("miner stopped cleanly")

    async def _run(self, max_windows: int) -> None:
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
                await self.drop_training("re-syncing")
                self.state, own = await restore_when_possible(node)
                await self.join(own_state=own)
                continue
            if behind > 0:
                # A window's processing overran: replay what we missed rather than train on stale θ,
                # then look at the clock again (the replay itself may have taken time).
                if self.training is not None and self.training.window < current:
                    await self.drop_training(f"window {current} has begun")
                self.state = await catch_up(node, self.state, current - 1)
                await self.sync.record(self.state.window, self.state.global_step)
                await self.advanced()
                if self._stuck_at is not None and self.state.window >= node.clock.current_window() - 1:
                    self._stuck_at = None  # the gap a join found is closed: now the phase can be said
                    self._say_phase()
                continue
            await self.run_window(current)
            done += 1
            if max_windows and done >= max_windows:
                break
        await self.drop_training("stopping")

    async def join(self, *, own_state: bool) -> None:
        node = self.node
        self.phase = Phase.CATCHUP
        await self.drop_training("joining")
        self.state = await catch_up(node, self.state, node.clock.current_window() - 1)
        await self.sync.record(self.state.window, self.state.global_step)
        self.save()
        self.note_saved()
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
        record says `catchup`) and the run loop catches up. A window whose base θ has gone by (a
        delayed run's first window after a start) is not trained: it takes its step alone."""
        times = self.node.clock.times(window)
        if await self.node.window_checks():  # another uid: the pages read ahead were the old uid's
            await self.drop_training("this hotkey's uid changed")
        training = self.take_training(window)
        if training is None:
            if not await self.ensure_base(window):
                return
            training = await self.begin(window) if self.may_begin(window) and self.can_finish(window) else None
        work = training.work if training is not None else MinerWindow(window, times)
        if self.overlapped and not self.node.stop.is_set():
            if training is not None:
                await self._released(training)
            await self.read_ahead(window + 1)  # the GPU goes on with the next window at once
        if training is not None:
            assert training.task is not None
            await training.task
        if work.stats is not None:
            await self.upload(work)
        if not work.in_sync and await self._resync(window):
            await self.finish(work, Phase.CATCHUP)
            return
        if not await self.step(work):
            await self.finish(work, Phase.CATCHUP)
            return
        if work.stats is not None:
            self.advance_warmup(work)
            self.log_window(work)
        await self.finish(work, self.phase if work.stats is not None else Phase.CATCHUP)

    def take_training(self, window: int) -> Training | None:
        """The compute half of `window` read ahead, if that is the window it trains."""
        training, self.training = self.training, None
        if training is not None and training.window != window:
            self._cancel(training, f"window {window} runs instead")
            return None
        return training

    async def drop_training(self, why: str) -> None:
        """Give up the compute half read ahead (θ moved under it, or the node stops): its inner
        steps are dropped, and the window is redone or skipped, never its step."""
        training, self.training = self.training, None
        if training is not None:
            self._cancel(training, why)
            await asyncio.gather(training.task, return_exceptions=True)

    def _cancel(self, training: Training, why: str) -> None:
        if training.task is not None and not training.task.done():
            context(window=training.window, phase=self.phase).info(f"dropping window {training.window}'s training: "
                                                                   f"{why}")
            training.task.cancel()
        if training.work.warmup:
            self.warmup_left += 1  # that warm-up window is still to be trained

    async def ensure_base(self, window: int) -> bool:
        """Whether θ holds at least `window`'s base (θ after window − `base_lag`), catching up on it
        first: the last window may have stopped before its step (the lead's was not to be had), and
        a miner never trains on a model older than its base."""
        base = window - self.lag
        if self.state.window >= base:
            return True
        self.state = await catch_up(self.node, self.state, base)
        await self.advanced()
        if self.state.window < base:
            context(window=window, phase=self.phase).warning(
                f"[SYNC] still before window {base}: not training window {window}")
            return False
        return True

    def may_begin(self, window: int) -> bool:
        """Whether `window`'s inner steps can begin now: θ holds its base (delayed: exactly; eager:
        its base, or the window before with the proxy standing in for the step in flight)."""
        held = self.state.window
        if self.hp.inner.overlap == "delayed":
            return held == window - 2
        if self.hp.inner.overlap == "eager":
            return held in (window - 1, window - 2)
        return held == window - 1

    async def read_ahead(self, window: int) -> None:
        """Begin `window`'s compute half now, while the window before it goes through its exchange:
        the GPU does not wait for the put window, the gather and the step."""
        if self.training is None and self.may_begin(window) and self.can_finish(window):
            self.training = await self.begin(window)

    def can_finish(self, window: int) -> bool:
        """Whether `window`'s inner steps, begun now at the last window's pace, end before its payload must be
        encoded (pace unknown: yes). Overlapped, a window begun too late (a restart, a catch-up) missed its
        commitment and the next began only when it ended: a run of windows (9 in a review's run). Such a
        window is left untrained and the next begins now, its pace measured anew (one slow window must not
        stop every later one)."""
        if not self.overlapped or (self.train_seconds is None and window != self._untrained):
            return True
        if window == self._untrained:  # left so at its read-ahead: not begun late now either
            return False
        times = self.node.clock.times(window)
        if self.node.clock.now() + self.train_seconds <= self.encode_deadline(MinerWindow(window, times)):
            return True
        context(window=window, phase=self.phase).warning(
            f"too late to train window {window} before its commitment ({self.train_seconds:.1f}s of training): "
            "not training it; the next window's inner steps begin now")
        self._untrained, self.train_seconds = window, None
        return False

    async def begin(self, window: int) -> Training:
        """Begin `window`'s inner steps from θ as it is now (in a task: `train`). Delayed: θ is the
        base, and its probes are taken now, before the step in flight moves θ. Eager on the window
        before its base: the proxy (our last update) is applied to the working model."""
        hp = self.hp
        work = MinerWindow(window, self.node.clock.times(window), warmup=self.warmup_left > 0)
        self.warmup_left -= work.warmup  # counted when begun: whether the window before is exchanged yet or not
        lr = self.hooks.learning_rate(
            self, window, inner_lr(hp.inner, self.state.global_step, hp.optimizer))
        lands = hp.inner.overlap == "eager" and self.state.window == window - 2
        step = self.state.global_step

        def begin_window() -> None:  # the proxy's dense update is made here, off the event loop
            self.compute.begin_window(lr, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                                      proxy=self._proxy(window - 1) if lands else None, proxy_step=step)

        await asyncio.to_thread(begin_window)
        if self.state.window == window - self.lag:
            work.base_step = self.state.global_step
            work.probes = await asyncio.to_thread(self.compute.probes, window)
        training = Training(work, base_window=self.state.window, lands=lands)
        training.task = self._spawn(self.train(training), name=f"train-{window}")
        return training

    @staticmethod
    async def _released(training: Training) -> None:
        """Until `training` has compressed its update (or ended without one)."""
        assert training.task is not None
        released = asyncio.ensure_future(training.released.wait())
        try:
            await asyncio.wait({released, training.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            released.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, bool], *, name: str) -> asyncio.Task[bool]:
        return self._group.create_task(coro, name=name) if self._group is not None else \
            asyncio.create_task(coro, name=name)

    def _proxy(self, window: int) -> dict[str, torch.Tensor] | None:
        """Our own update of `window` as the outer rule would apply it alone (eager's stand-in for
        that window's step); None without one (we sent nothing for it)."""
        if self.own_update is None or self.own_update[0] != window:
            return None
        return rule_of(self.hp.optimizer.method).trial(self.own_update[1], self.node.shapes)

    async def advanced(self) -> None:
        """θ moved on (a step, a catch-up): an eager window begun on a proxy of the step θ now holds
        lands; one whose base θ has gone past is dropped."""
        training = self.training
        if training is None or self.state.window < training.window - 1:
            return
        if training.given_up:
            return
        if training.lands and not training.landed.is_set():
            if self.state.window == training.window - 1:
                await asyncio.to_thread(self.compute.land)  # its base (and probes) are θ's from now to its encoding
                training.landed.set()
            else:
                await self.drop_training(f"θ went past window {training.window - 1}")
        elif self.state.window >= training.window:
            await self.drop_training(f"θ already holds window {training.window}")

    async def train(self, training: Training) -> bool:
        """The compute half: the inner steps on this window's pages (the next window's read ahead),
        one op each, then the payload encoded and committed. Eager: the pseudo-gradient waits for the
        previous window's step to land (until the commitment deadline: else the window is dropped)."""
        hp, work = self.hp, training.work
        window, began = work.window, self.node.clock.now()
        pages = self.hooks.pages(self, window, self.pages(window))
        batch, work.pages = await self.node.pages.fetch(  # only these pages' bytes
            pages, prefetch=self.hooks.pages(self, window + 1, self.pages(window + 1)))
        batch = self.hooks.batch(self, window, batch)
        with work.busy():
            for part in window_parts(batch, hp.inner):
                await asyncio.to_thread(self.compute.inner_step, part)
        self.train_seconds = work.pace_seconds = self.node.clock.now() - began
        if not await self.exchanged(window - 1, self.encode_deadline(work)):
            if training.lands and not training.landed.is_set():
                context(window=window, phase=self.phase).warning(
                    f"[SYNC] window {window - 1}'s step did not land in time for window {window}'s commitment: its "
                    "update has no base to be formed against; not sending it")
                training.given_up = True  # a step that lands from now on has no inner steps to move
                self.warmup_left += work.warmup  # a warm-up given up is still to be sent
                await asyncio.to_thread(self.compute.end_window)
                return False
            context(window=window, phase=self.phase).warning(
                f"window {window - 1}'s exchange is not finished; encoding window {window} before it, so that "
                "its commitment is in time")
        with work.busy():
            work.stats = await asyncio.to_thread(self.compute.end_window)
            compressed = await self.compress(work)
        training.released.set()  # the GPU's part is done: the next window's inner steps may begin
        with work.busy():
            await self.encode_and_commit(work, compressed)
        return True

    def encode_deadline(self, work: MinerWindow) -> float:
        """The latest time (the node's clock) a window's payload may start being encoded and still be
        committed in time: what waits before it (the exchange of the window before, the lead's
        record of it for the sync check) waits at most until then. The encoding's time is measured on
        the same clock (wall time on a node; a test's virtual time, where computing takes none, so a
        loaded machine's slow encoding cannot move a virtual deadline)."""
        return work.times.commit_close - max(ENCODE_MARGIN_SECONDS, 2 * self.encode_seconds)

    async def exchanged(self, window: int, deadline: float) -> bool:
        """Wait until `window`'s exchange is saved (θ holds its step, its record and state written),
        at most until `deadline` (the node's clock): a window's payload is encoded after the window
        before it is committed, so the state file never holds error feedback of a window after its
        own (a restart redoes that window with the error feedback it began with). Eager: that step
        is also the one its proxy stood for. True when it is."""
        while self.saved_through < window:
            left = deadline - self.node.clock.now()
            if left <= 0:
                return False
            try:
                async with asyncio.timeout(left):
                    await self._saved.wait()
            except TimeoutError:
                return False
        return True

    async def compress(self, work: MinerWindow) -> dict[str, Compressed]:
        """The pseudo-gradient through the error feedback (the GPU's last op of the window), and the
        base's probes if θ holds the base only now (blocking; eager once landed)."""
        started = self.node.clock.now()
        assert work.stats is not None
        compressed = await asyncio.to_thread(self.compute.compress, work.stats.scale)
        if self.hp.inner.overlap == "eager":
            self.own_update = (work.window, compressed)  # the proxy of this window's step, for the next window
        if work.base_step is None:
            work.base_step = self.state.global_step
            work.probes = await asyncio.to_thread(self.compute.probes, work.window)
        self.encode_seconds = self.node.clock.now() - started
        return compressed

    async def encode_and_commit(self, work: MinerWindow, compressed: dict[str, Compressed]) -> None:
        """Sign the compressed pseudo-gradient, then commit to it before the commitment deadline. A
        node that cannot show it holds the run's model uploads with weight 0 (a warm-up payload)."""
        window = work.window
        work.in_sync = not self.hooks.checks_sync or (
            not self.resync_pending
            and await self.sync.check(window, self.state, wait_until=self.encode_deadline(work)))
        started = self.node.clock.now()  # the encoding's own time: what the check waited is not (`encode_deadline`)
        payload = await asyncio.to_thread(self._encode, work, compressed, not work.in_sync)
        self.encode_seconds += self.node.clock.now() - started
        work.payload = await self.hooks.before_commit(self, window, payload)
        await self._commit(window, work.payload)

    async def upload(self, work: MinerWindow) -> None:
        """Post the payload inside the put window, which opens when the next window's first block
        lands. A stop request does not interrupt a window: the error feedback already gave up what
        we send. `OwnBucketError` once our bucket has refused `MAX_FAILED_UPLOADS` in a row."""
        window = work.window
        await self.node.clock.ended(window)  # the next window's first block out: the put window is open
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
        if self.state.window < window - 1:  # the window before is not applied yet (a delayed run's start)
            self.state = await catch_up(self.node, self.state, window - 1)
            await self.advanced()
            if self.state.window < window - 1:
                context(window=window, phase=self.phase).warning(
                    f"[SYNC] still before window {window - 1}: not stepping window {window}")
                return False
        await self.node.clock.sleep_until(self.node.clock.times(window).gather_start)  # from the real end
        with work.busy():
            try:
                work.peers_aggregated = await self._aggregate(window)
            except FollowError as exc:
                context(window=window, phase=self.phase).warning(
                    f"[SYNC] {exc}: stopping before window {window} and catching up")
                return False
            self.hooks.after_step(self, window)
            self.state.window = window
            await self.sync.record(window, self.state.global_step)
            await self.advanced()
            await self.stale_objects.after_step(self.node.bucket, window)
        work.stepped = True
        return True

    def advance_warmup(self, work: MinerWindow) -> None:
        """One more warm-up window exchanged; the last one makes the miner active."""
        if self.phase == Phase.WARMUP and work.warmup and self.warmup_left <= 0:
            self.phase = Phase.ACTIVE
            context(window=work.window, phase=self.phase).info("[SYNC] Warm-up done: active")

    def log_window(self, work: MinerWindow) -> None:
        stats = work.stats
        context(window=work.window, phase=self.phase).info(
            f"loss {stats.loss:.4f} | {stats.tokens_per_second:,.0f} tok/s | {len(work.pages)} pages | "
            f"upload {work.upload_bytes / 1e3:.0f} kB in {work.upload_seconds:.2f}s | aggregated "
            f"{work.peers_aggregated} | step {self.state.global_step} | trained {work.utilisation:.0%} of the window | "
            f"overhead {work.overhead_share:.1%}")

    async def finish(self, work: MinerWindow, phase: Phase) -> None:
        """The commit point: the window's record is written first, so a crash before the save redoes
        the window and `drop_uncommitted_records` drops its record at the restart."""
        append_record(self.node.state_dir / MINER_WINDOWS_FILE, work.record(phase, self.hooks.name,
                                                                            self.state.global_step))
        await asyncio.to_thread(self.save)
        self.note_saved()

    def note_saved(self) -> None:
        """The state file holds θ after `state.window`: a compute half waiting on it may encode."""
        self.saved_through = self.state.window
        saved, self._saved = self._saved, asyncio.Event()
        saved.set()

    async def _resync(self, window: int) -> bool:
        """Checkpoint + replay up to the last finished window (this one: its aggregate is the lead's).
        False when it cannot be made now: the window goes on as usual and the next one retries."""
        await self.drop_training("re-syncing")  # begun on the model found to differ from the run's
        try:
            self.state = await resync(self.node)
        except ResyncError as exc:
            self.resync_pending = True
            context(window=window, phase="sync").warning(f"[SYNC] Re-sync not possible now ({exc}); retrying "
                                                         "next window, uploading with weight 0 until then")
            return False
        self.resync_pending = False
        await self.sync.record(self.state.window, self.state.global_step)
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
        """This window's assigned pages, then the `extra_pages` it declares (`PagePlan.declared_pages`)."""
        plan, n = self.node.plan, self.hp.data.pages_per_window
        return plan.assigned_pages(self.node.uid, window, n) + plan.declared_pages(self.node.uid, window,
                                                                                  self.extra_pages)

    def _encode(self, work: MinerWindow, compressed: dict[str, Compressed], weight_zero: bool = False) -> bytes:
        """The payload: the compressed pseudo-gradient, the base's probes and the base's global_step."""
        hp, node, window = self.hp, self.node, work.window
        assert work.probes is not None and work.base_step is not None
        values = self.hooks.transform(self, window, {k: c.values for k, c in compressed.items()})
        rule = rule_of(hp.optimizer.method)  # what a hook changed goes back onto the method's value grid
        compressed = {k: type(c)(indices=c.indices, values=rule.wire_values(values[k].float()), shape=c.shape,
                                 chunk=c.chunk)
                      for k, c in compressed.items()}
        return write_gradient(compressed, work.probes, window=window, global_step=work.base_step,
                              hotkey=node.hotkey, hp=hp, run=node.run, sign=node.chain.sign,
                              warmup=work.warmup or weight_zero, extra_pages=self.extra_pages)

    async def _aggregate(self, window: int) -> int:
        """Take the window's outer step: the lead's inputs (`templar.runtime.consensus.follow`), from the
        payloads of the peer list in effect gathered here and, for any they lack, fetched directly.
        `FollowError` when the lead's step cannot be had by the window's apply deadline."""
        node = self.node
        peers = await peers_in_effect(node, window)
        gathered = await gather_gradients(await node.peer_buckets(peers), window, clock=node.clock, hp=self.hp,
                                          shapes=node.shapes, run=node.run) if peers else {}
        step = await follow_step(node, window, self.state, gathered)
        return step.peers if step else 0
