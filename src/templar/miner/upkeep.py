"""What a miner's own bucket keeps: its gradients and commitments of the windows a reader may still
ask for, and nothing older.

A gradient of window w is gathered within w and a commitment read within w's span; the newest
`max_allowed_stale + 2` windows of both are kept (`kept_windows`), a margin no reader reaches past.
Each window's outer step deletes the window that just fell out of that range: two DELETEs, which
R2 and S3 do not bill. What a single delete cannot see (everything a stopped miner left behind,
or the windows a re-sync jumped over) is found with one LIST of each prefix, when the miner starts
and after a jump, and deleted a bounded batch per window, so a bucket a miner left for months costs
no window more than `DELETES_PER_STEP` deletes. A LIST that fails is asked again after 1, 2, 4, ...
windows (at most `SWEEP_RETRY_MAX_WINDOWS`), and a DELETE that fails is tried again after 1, 2, 4, ...
windows, `DELETE_ATTEMPTS` times in all (over 63 windows, about 1.5 h at 84 s windows): a bucket down for a
while loses nothing, and one that refuses for good costs a few requests a window. What still stays
is left to the bucket's lifecycle rule, if it has one (docs/buckets.md).
"""

from __future__ import annotations

import asyncio

from templar.comms.keys import commit_key, folder_of, gradient_key, window_of
from templar.core.config import HParams
from templar.core.log import context
from templar.storage import Bucket, StorageError

DELETES_PER_STEP = 64
"""The most stale objects one window's step deletes (a sweep's backlog waits for the next windows)."""
STEP_SECONDS = 5.0
"""The most time one window's step spends deleting (and, after a jump, listing): the next window's
upload waits behind the step. 64 deletes, 8 at a time, take well under a second on R2 or S3."""
DELETE_CONCURRENCY = 8
DELETE_SECONDS = 10.0
LIST_SECONDS = 30.0
DELETE_ATTEMPTS = 7
"""How many times one stale object's DELETE is tried (the wait before the next doubling) before it is left."""
SWEEP_RETRY_MAX_WINDOWS = 64
"""The longest wait, in windows, before a sweep whose LIST failed is asked again (the wait doubles)."""

_KINDS = ((gradient_key, ".safetensors"), (commit_key, ".json"))


def kept_windows(hp: HParams) -> int:
    """How many of its newest windows' gradients and commitments a miner's bucket keeps."""
    return hp.windows.max_allowed_stale + 2


class StaleObjects:
    """Deletes the miner's own objects of windows no reader asks for any more (see the module)."""

    def __init__(self, hp: HParams) -> None:
        self.kept = kept_windows(hp)
        self.clean_before: int | None = None  # every window before it is deleted or queued
        self.pending: list[str] = []
        self.failures: dict[str, int] = {}  # a stale object's failed DELETEs so far
        self.retry_at: dict[str, int] = {}  # a failed DELETE's key: the window to try it again
        self.sweep_again_at: int | None = None  # a sweep's LIST failed: the window to list again
        self.sweep_wait = 1  # windows until that, doubling with each failed sweep

    async def sweep(self, bucket: Bucket, window: int) -> None:
        """At start, after a jump and after a failed LIST's wait: queue every gradient and commitment of
        ours older than the range kept at `window`, found by one LIST of each prefix."""
        first_kept = window - self.kept + 1
        self.clean_before = max(first_kept, 0)
        if first_kept <= 0:
            self.sweep_again_at = None
            return
        log = context(window=window, phase="cleanup")
        # due again unless it completes (a step's time may cut it short as well as a failed LIST)
        self.sweep_again_at = window + self.sweep_wait
        self.sweep_wait = min(2 * self.sweep_wait, SWEEP_RETRY_MAX_WINDOWS)
        stale: list[tuple[int, str]] = []
        failed = False
        for key_of, suffix in _KINDS:
            prefix = folder_of(key_of)
            try:
                objects = await asyncio.wait_for(bucket.list(prefix, timeout=LIST_SECONDS), LIST_SECONDS)
            except (StorageError, TimeoutError) as exc:
                log.debug(f"could not list {prefix}: {exc}")
                failed = True
                continue
            stale += [(w, obj.key) for obj in objects
                      if (w := window_of(obj.key, prefix, suffix)) is not None and w < first_kept]
        if failed:
            log.debug(f"listing our stale objects again at window {self.sweep_again_at}")
        else:
            self.sweep_again_at, self.sweep_wait = None, 1
        if stale:
            log.info(f"{len(stale)} gradients and commitments of ours are older than any reader asks for: "
                     f"deleting them, {DELETES_PER_STEP} a window")
        found = [key for _, key in sorted(stale)]
        listed = set(found)
        self.pending = found + [key for key in self.pending if key not in listed]  # a retry keeps the queue

    async def after_step(self, bucket: Bucket, window: int) -> None:
        """Called once `window`'s outer step is taken: queue what fell out of the kept range, and delete
        a batch from our `bucket`, within `STEP_SECONDS` (the next window's upload waits behind the step;
        what the time leaves undone waits for the next window)."""
        first_kept = window - self.kept + 1
        if first_kept <= 0:
            return
        log = context(window=window, phase="cleanup")
        try:
            async with asyncio.timeout(STEP_SECONDS):
                jumped = self.clean_before is None or first_kept - self.clean_before > self.kept  # a re-sync
                if not jumped:
                    self.pending += [key_of(w) for w in range(self.clean_before, first_kept) for key_of, _ in _KINDS]
                    self.clean_before = max(first_kept, self.clean_before)
                if jumped or (self.sweep_again_at is not None and window >= self.sweep_again_at):
                    await self.sweep(bucket, window)  # what is there, by a LIST
                due = [key for key, at in self.retry_at.items() if at <= window]
                for key in due:
                    del self.retry_at[key]
                self.pending += due
                await self._delete_batch(bucket, window, log)
        except TimeoutError:
            log.debug(f"cleanup stopped after {STEP_SECONDS:g}s; {len(self.pending)} stale objects wait for the next "
                      "windows")

    async def _delete_batch(self, bucket: Bucket, window: int, log) -> None:
        """Delete up to `DELETES_PER_STEP` of the queue. Those a cancellation leaves undone go back first;
        one that failed waits 1, 2, 4, ... windows for its next try, `DELETE_ATTEMPTS` tries in all."""
        batch, self.pending = self.pending[:DELETES_PER_STEP], self.pending[DELETES_PER_STEP:]
        limit, settled = asyncio.Semaphore(DELETE_CONCURRENCY), set()

        async def delete(key: str) -> None:
            async with limit:
                try:
                    await bucket.delete(key, timeout=DELETE_SECONDS)
                    self.failures.pop(key, None)
                except StorageError as exc:
                    self.failures[key] = tries = self.failures.get(key, 0) + 1
                    if tries < DELETE_ATTEMPTS:
                        self.retry_at[key] = window + 2 ** (tries - 1)
                        log.debug(f"could not delete {key} ({exc}); trying again at window {self.retry_at[key]}")
                    else:
                        del self.failures[key]
                        log.info(f"could not delete {key} in {tries} tries ({exc}); leaving it to the bucket's "
                                 "lifecycle rule, if any")
                settled.add(key)

        try:
            await asyncio.gather(*(delete(key) for key in batch))
        finally:
            self.pending[:0] = [key for key in batch if key not in settled]
