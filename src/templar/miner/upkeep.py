"""What a miner's own bucket keeps: its gradients and commitments of the windows a reader may still
ask for, and nothing older.

A gradient of window w is gathered within w and a commitment read within w's span; the newest
`max_allowed_stale + 2` windows of both are kept (`kept_windows`), a margin no reader reaches past.
Each window's outer step deletes the window that just fell out of that range: two DELETEs, which
R2 and S3 do not bill. What a single delete cannot see (everything a stopped miner left behind,
or the windows a re-sync jumped over) is found with one LIST of each prefix, when the miner starts
and after a jump, and deleted a bounded batch per window, so a bucket a miner left for months costs
no window more than `DELETES_PER_STEP` deletes. Best effort: a failed delete is logged and left to
the bucket's lifecycle rule, if it has one (docs/buckets.md).
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

    async def sweep(self, bucket: Bucket, window: int) -> None:
        """At start (and after a jump): queue every gradient and commitment of ours older than the
        range kept at `window`, found by one LIST of each prefix."""
        first_kept = window - self.kept + 1
        self.clean_before = max(first_kept, 0)
        if first_kept <= 0:
            return
        log = context(window=window, phase="cleanup")
        stale: list[tuple[int, str]] = []
        for key_of, suffix in _KINDS:
            prefix = folder_of(key_of)
            try:
                objects = await asyncio.wait_for(bucket.list(prefix, timeout=LIST_SECONDS), LIST_SECONDS)
            except (StorageError, TimeoutError) as exc:
                log.debug(f"could not list {prefix}: {exc}")
                continue
            stale += [(w, obj.key) for obj in objects
                      if (w := window_of(obj.key, prefix, suffix)) is not None and w < first_kept]
        if stale:
            log.info(f"{len(stale)} gradients and commitments of ours are older than any reader asks for: "
                     f"deleting them, {DELETES_PER_STEP} a window")
        self.pending = [key for _, key in sorted(stale)]

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
                if self.clean_before is None or first_kept - self.clean_before > self.kept:
                    await self.sweep(bucket, window)  # a jump (a re-sync): what is there, by a LIST
                else:
                    self.pending += [key_of(w) for w in range(self.clean_before, first_kept) for key_of, _ in _KINDS]
                    self.clean_before = max(first_kept, self.clean_before)
                await self._delete_batch(bucket, log)
        except TimeoutError:
            log.debug(f"cleanup stopped after {STEP_SECONDS:g}s; {len(self.pending)} stale objects wait for the next "
                      "windows")

    async def _delete_batch(self, bucket: Bucket, log) -> None:
        """Delete up to `DELETES_PER_STEP` of the queue; those a cancellation leaves undone go back first."""
        batch, self.pending = self.pending[:DELETES_PER_STEP], self.pending[DELETES_PER_STEP:]
        limit, settled = asyncio.Semaphore(DELETE_CONCURRENCY), set()

        async def delete(key: str) -> None:
            async with limit:
                try:
                    await bucket.delete(key, timeout=DELETE_SECONDS)
                except StorageError as exc:  # best effort: logged, left to a lifecycle rule
                    log.debug(f"could not delete {key}: {exc}")
                settled.add(key)

        try:
            await asyncio.gather(*(delete(key) for key in batch))
        finally:
            self.pending[:0] = [key for key in batch if key not in settled]
