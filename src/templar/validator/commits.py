"""The validator's reader of miners' commitments (`templar.comms.commit`), running beside its windows.

Each window's commitments are read in their `commit_read` span, before any gradient of the window
can count: what was not read there was not committed. Fast evaluation then takes the window's
document digests (`pop`); a payload whose `Gradient.document_digest` differs is `uncommitted`.

"Not read there" includes a hotkey that had no usable bucket on chain at the read, or was not yet a
miner: it committed nothing this validator could read, whatever bucket it names by the gather. Only
the reads this validator itself could not start in time leave a peer unjudged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from templar.chain import ChainError
from templar.comms.commit import read_commits
from templar.core.log import context
from templar.runtime.node import Node
from templar.storage import StorageError


@dataclass(frozen=True)
class WindowCommits:
    """One window's `commit_read` span as this validator read it."""

    read: dict[str, bytes]
    """The miners of the read, each with the digest read (b"": none, or no usable bucket on chain)."""
    unstarted: frozenset[str]
    """The miners whose read this validator could not start before the span closed (its own lateness)."""

    def judged(self, hotkeys: Iterable[str]) -> dict[str, bytes]:
        """The commitment each of `hotkeys` is judged on: what was read, and b"" for a hotkey the read
        did not know (registered, or its bucket committed on chain, after the span: it committed nothing
        a validator could read in time). Only the reads not started are left out (not judged)."""
        return {**{hk: b"" for hk in hotkeys if hk not in self.unstarted}, **self.read}


class CommitWatcher:
    """Reads every miner's commitment of each window in its span (docs/scoring.md §8); keeps a few spans."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.commits: dict[int, WindowCommits] = {}
        """Window → what was read in its `commit_read` span."""

    def pop(self, window: int, hotkeys: Iterable[str] = ()) -> dict[str, bytes] | None:
        """The digests `window`'s uploads are judged on (`WindowCommits.judged`; `hotkeys`: the peers
        gathered), None when none were read: no upload is judged on them."""
        commits = self.commits.pop(window, None)
        return commits.judged(hotkeys) if commits is not None else None

    async def run(self) -> None:
        """Until the node stops: each window's span, in real time (never a window behind)."""
        node = self.node
        window = node.clock.current_window()
        while not node.stop.is_set():
            try:
                opens, closes = node.clock.times(window).commit_read
            except ChainError as exc:  # the chain's head unreadable: tried again, never ahead of the chain
                context(window=window, phase="commit").warning(f"window {window}'s span cannot be timed: {exc}")
                if not await node.clock.sleep_until(node.clock.now() + 1.0, node.stop):
                    return
                continue  # a span that closed meanwhile is passed over above, window by window
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
        if buckets and not read:
            log.warning("commitments not read: this validator reached the span after it closed; nobody is "
                        "judged on them this window")
            return
        unstarted = frozenset(buckets) - frozenset(read)
        # a miner without a usable bucket on chain at the read committed nothing: b"", never unjudged
        self.commits[window] = WindowCommits({hk: read.get(hk, b"") for hk in miners if hk not in unstarted},
                                             unstarted)
        log.debug(f"read {sum(bool(d) for d in read.values())}/{len(miners)} commitments "
                  f"({len(miners) - len(buckets)} without a usable bucket: none; {len(unstarted)} not read in "
                  "time: not judged on them)")

    def report_stop(self, task: asyncio.Task) -> None:
        """A reader that died must not go unnoticed: from then on no upload is judged on its
        commitment (fast evaluation skips the check for windows with nothing read)."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            context(phase="commit").opt(exception=exc).error(
                f"commitment reader stopped: uploads are no longer checked against commitments ({exc!r})")
