"""The chain's head on a real node: read by a follower thread, counted on by the caller.

A node's clock (`templar.runtime.consensus.windows.Clock`) asks the current block and block
timestamps many times a window, from its event loop. Read there, every second's head read stopped
the loop for a round trip, and for as long as another call of the chain session held it (the
session serialises its calls: a metagraph read takes seconds, a weights write waits for its
inclusion): the gather, the uploads and the lead's publications all waited. `ChainHead` keeps the
last head read and the timestamps of recent blocks; a node starts its follower (`follow`), which
reads them every quarter block on a connection of its own, and the caller only counts on from
the last read. The embedded chain needs none of this: its blocks come from the node's clock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import bittensor as bt
from loguru import logger

from templar.chain.types import ChainUnavailable

if TYPE_CHECKING:
    from templar.chain.client import _Session

BACKFILL_BLOCKS = 32
"""The most blocks made since the last head read whose timestamps a head read also fetches."""
TIMESTAMPS_KEPT = 4096
"""Block timestamps kept behind the head (about 14 h on finney)."""
HEAD_EXTRAPOLATION_SECONDS = 120.0
"""How long an endpoint that does not answer is bridged by counting blocks from the last head read
(about 10 blocks on finney); past it, a read of the head raises `ChainUnavailable`."""


async def read_head(client: bt.Client) -> tuple[int, float]:
    """(the head block, its unix timestamp), read in one call."""
    block = int(await client.block())
    return block, (await client.timestamp(block)).timestamp()


class ChainHead:
    """The head of one chain session, as a node's clock reads it (`block`, `timestamp`)."""

    def __init__(self, session: _Session, block_time: Callable[[], float]) -> None:
        self._session = session
        self._block_time = block_time  # (read from the chain once, when first asked)
        self._last: tuple[int, float] | None = None  # (block, monotonic time read)
        self._timestamps: dict[int, float] = {}
        self._outage: ChainUnavailable | None = None  # why the last read failed; None once one succeeds
        self._follower: threading.Thread | None = None
        self._closing = threading.Event()
        self._read_here_after = 0.0  # (monotonic) a read on the caller waits for this after one failed
        self._counted = 0  # the highest block `block` returned

    def block(self) -> int:
        """The current block, never less than one returned before, counted on from the last head read:
        the follower's (and then never a read here), or else one made here at most every quarter block
        (a block after a read that got no answer). Past `HEAD_EXTRAPOLATION_SECONDS` without an answer
        the count stops (`ChainUnavailable`)."""
        if self._closing.is_set():
            raise ChainUnavailable("read block: the chain connection is closed")
        block_time = self._block_time()
        now = time.monotonic()
        following = self._follower is not None and self._follower.is_alive()
        stale = self._last is None or now - self._last[1] > min(1.0, block_time / 4)
        if not following and stale and now >= self._read_here_after:
            self.refresh(self._session)
            self._read_here_after = time.monotonic() + (block_time if self._outage is not None else 0.0)
        if self._last is None:
            raise self._outage or ChainUnavailable("read block: no answer")
        block, read_at = self._last
        since = time.monotonic() - read_at
        if since > HEAD_EXTRAPOLATION_SECONDS:
            raise ChainUnavailable(f"read block: no answer for {since:.0f}s")
        # never back: another backend a block behind, or a count run ahead of a stalled read
        self._counted = max(self._counted, block + int(since // block_time))
        return self._counted

    def follow(self) -> None:
        """Start the follower thread that reads the head every quarter block (at most every second) on a
        connection of its own (`_Session.twin`), until `close`: for a long-running node."""
        if self._follower is not None or self._closing.is_set():
            return
        self.block()  # the first read, here: a node's start
        self._follower = threading.Thread(target=self._follow, name="templar-chain-head", daemon=True)
        self._follower.start()

    def _follow(self) -> None:
        """The follower's loop. When its own connection has not answered for 3 blocks (a provider that
        refuses a second connection), it reads on the node's connection instead, from this thread:
        the node never depends on the second connection alone, and its event loop never waits."""
        session = self._session.twin()
        try:
            while not self._closing.wait(min(1.0, self._block_time() / 4)) and not self._session.closed:
                self.refresh(session)
                if self._outage is not None and self._last is not None \
                        and time.monotonic() - self._last[1] > 3 * self._block_time():
                    self.refresh(self._session)
        finally:
            session.close()

    def refresh(self, session: _Session) -> None:
        """One read of the head and its timestamp into the caches, with the timestamps of the blocks made
        since the read before that are not known yet (up to `BACKFILL_BLOCKS` of them), so that a window's
        first block is known whenever its landmarks are asked. An endpoint that does not answer leaves
        the last read standing (the blocks are counted on from it), with one warning an outage."""
        last = self._last[0] if self._last is not None else None
        known = self._timestamps

        async def read(client: bt.Client) -> tuple[int, dict[int, float]]:
            block, stamp = await read_head(client)
            missed = [b for b in range(max(block - BACKFILL_BLOCKS, (last or block) + 1), block) if b not in known]
            stamps = await asyncio.gather(*(client.timestamp(b) for b in missed))
            return block, {b: t.timestamp() for b, t in zip(missed, stamps, strict=True)} | {block: stamp}

        try:
            block, stamps = session.call("read the chain head", read)
        except ChainUnavailable as exc:
            if self._outage is None and self._last is not None:
                logger.warning(f"{exc}; counting blocks from the head read {time.monotonic() - self._last[1]:.0f}s ago")
            self._outage = exc
            return
        self._timestamps.update(stamps)
        if len(self._timestamps) > 2 * TIMESTAMPS_KEPT:  # the oldest go; the recent ones are what is asked
            for old in [b for b in list(self._timestamps) if b < block - TIMESTAMPS_KEPT]:
                self._timestamps.pop(old, None)
        self._last, self._outage = (block, time.monotonic()), None

    def timestamp(self, block: int) -> float:
        """Unix time of `block`: the chain's timestamp for past blocks (read here only for one the head
        reads did not see: a window begun before the node started), counted on from the last head read
        for later ones (future blocks, and those made while the endpoint does not answer)."""
        if (stamp := self._timestamps.get(block)) is not None:
            return stamp
        self.block()  # the head's first read, and the deadline of counting on without an answer
        assert self._last is not None
        head = self._last[0]
        if block >= head:
            stamp = self._timestamps.get(head)
            return self._known_before(block) if stamp is None else stamp + (block - head) * self._block_time()
        try:
            stamp = self._session.call(f"read timestamp of block {block}", lambda c: c.timestamp(block)).timestamp()
        except ChainUnavailable:
            if self._outage is None:
                raise
            return self._known_before(block)
        self._timestamps[block] = stamp
        return stamp

    def _known_before(self, block: int) -> float:
        """`block`'s timestamp counted from the latest one known at or before it (`ChainUnavailable`
        when none is)."""
        known = [(b, t) for b, t in list(self._timestamps.items()) if b <= block]
        if not known:
            raise ChainUnavailable(f"read timestamp of block {block}: no answer, and none known before it")
        b, t = max(known)
        return t + (block - b) * self._block_time()

    def close(self) -> None:
        """Stop the follower (it closes its connection within a period) and refuse further reads."""
        self._closing.set()
