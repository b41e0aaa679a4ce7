"""The validator's reader of miners' commitments (`templar.comms.commit`), running beside its windows.

Each window's commitments are read in their `commit_read` span, before any gradient of the window
can count: what was not read there was not committed. Fast evaluation then takes the window's
document digests (`pop`); a payload whose `Gradient.document_digest` differs is `uncommitted`.
"""

from __future__ import annotations

import asyncio

from templar.chain import ChainError
from templar.comms.commit import read_commits
from templar.core.log import context
from templar.runtime.node import Node
from templar.storage import StorageError


class CommitWatcher:
    """Reads every miner's commitment of each window in its span (docs/scoring.md §8); keeps a few spans."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.commits: dict[int, dict[str, bytes]] = {}
        """Window → the digests read in its `commit_read` span (b"": the miner committed none)."""

    def pop(self, window: int) -> dict[str, bytes] | None:
        """The digests read for `window` (None when none were read: no upload is judged on them)."""
        return self.commits.pop(window, None)

    async def run(self) -> None:
        """Until the node stops: each window's span, in real time (never a window behind)."""
        node = self.node
        window = node.clock.current_window()
        while not node.stop.is_set():
            opens, closes = node.clock.times(window).commit_read
            if node.clock.now() >= closes - 0.5:
                window += 1  # too late for this window's span: its gradients are not judged on it
                continue
            if not await node.clock.sleep_until(opens, node.stop):
                return
            await self._read(window, closes)
            for old in [w for w in self.commits if w < window - 2 * node.hp.windows.max_allowed_stale]:
                del self.commits[old]
            window += 1

    async def _read(self, window: int, closes: float) -> None:
        node, log = self.node, context(window=window, phase="commit")
        try:
            miners = sorted(await node.miners())
            buckets = await node.peer_buckets(miners)
            read = await read_commits(buckets, window, run=node.run, deadline=closes, now=node.clock.now)
        except (ChainError, StorageError) as exc:
            log.warning(f"commitments unavailable: {exc}")
            return
        self.commits[window] = read
        log.debug(f"read {sum(bool(d) for d in read.values())}/{len(miners)} commitments "
                  f"({len(miners) - len(read)} without a bucket or not read in time: not judged on them)")

    def report_stop(self, task: asyncio.Task) -> None:
        """A reader that died must not go unnoticed: from then on no upload is judged on its
        commitment (fast evaluation skips the check for windows with nothing read)."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            context(phase="commit").opt(exception=exc).error(
                f"commitment reader stopped: uploads are no longer checked against commitments ({exc!r})")
