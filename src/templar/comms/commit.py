"""`v{P}/commit/{window}.json`: a miner's commitment to its window's gradient, before any
gradient of the window is readable (docs/scoring.md §8: borrowed same-window work earns nothing).

A miner that mixes other peers' same-window updates into its own can only do so once those
updates are readable, in the put window. Each miner therefore writes the document digest of its
payload (`templar.wire.document_digest`: every tensor, gradient parts and probes, and the signed
metadata: window, global_step, warm-up flag, run, hotkey, codec) to its own bucket by
`WindowTimes.commit_close`, and every validator reads the commitments itself, in real time,
between `commit_close` and the earliest instant a gradient of the window can count
(`WindowTimes.commit_read`). A payload whose document digest differs from what the validator read
then fails fast evaluation as `uncommitted`: nothing in it, not even probes copied from another
peer or the claimed step, can change after the deadline. The validator's own read is the guard, not the
object's storage timestamp: a miner running its own storage server can backdate an object, but
it cannot make a validator have read, before the window's gradients existed, a digest of work it
had not yet borrowed. Only the bucket's owner can write its commitment, so it needs no signature
of its own; the gradient it names is signed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Annotated

from pydantic import StringConstraints

from templar.comms.exchange import RecordError, Window, _RunRecord, check_run, dump_record, parse_record
from templar.comms.keys import commit_key
from templar.core.config import PROTOCOL_VERSION
from templar.storage.base import DEFAULT_TIMEOUT, Bucket, ObjectNotFound, StorageError
from templar.wire import Run

MAX_COMMIT_BYTES = 4096


class Commit(_RunRecord):
    window: Window
    digest: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


async def put_commit(bucket: Bucket, window: int, digest: bytes, *, run: Run,
                     timeout: float = DEFAULT_TIMEOUT) -> None:
    record = Commit(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, window=window,
                    digest=digest.hex())
    await bucket.put(commit_key(window), dump_record(record), timeout=timeout)


async def get_commit(bucket: Bucket, window: int, *, run: Run, timeout: float = DEFAULT_TIMEOUT) -> bytes | None:
    """The digest committed for `window`, None if there is none; `RecordError` if malformed, of
    another run or of another window (a replayed record)."""
    try:
        data = await bucket.get(commit_key(window), max_bytes=MAX_COMMIT_BYTES, timeout=timeout)
    except ObjectNotFound:
        return None
    record: Commit = parse_record(data, Commit, f"{bucket.name} commit")
    check_run(record, run, f"{bucket.name} commit")
    if record.window != window:
        raise RecordError(f"{bucket.name} commit names window {record.window}, not {window}")
    return bytes.fromhex(record.digest)


async def read_commits(buckets: Mapping[str, Bucket], window: int, *, run: Run, deadline: float,
                       now: Callable[[], float]) -> dict[str, bytes]:
    """Every named peer's commitment for `window`, each read completed by `deadline` by the clock
    `now` (a validator passes the end of `WindowTimes.commit_read`). A peer with no (or a
    malformed) commitment, or whose bucket failed, stalled or answered after the deadline, maps to
    b"" (committed nothing): otherwise a copier could hide its commitment by making its own bucket
    unreadable for the read span and serve the borrowed payload afterwards. Only a read this
    reader could not even start before the deadline (its own lateness) leaves the peer absent
    (not judged on it).

    Every read starts at once, none waits for another's slot: the reads are one small object per
    miner (at most a subnet's uids), and a bounded pool let peers' stalling buckets hold every slot
    until the deadline, so that the reads queued behind them never started and the peers behind
    them (a copier whose hotkey sorts after its accomplices') went unjudged on their commitments."""

    async def one(hotkey: str, bucket: Bucket) -> tuple[str, bytes | None]:
        left = deadline - now()
        if left <= 0:
            return hotkey, None
        try:
            digest = await asyncio.wait_for(get_commit(bucket, window, run=run, timeout=left), left)
        except (RecordError, StorageError, TimeoutError):  # garbage, a failing or a stalling bucket
            return hotkey, b""
        return hotkey, (digest or b"") if now() <= deadline else b""

    found = await asyncio.gather(*(one(hk, b) for hk, b in sorted(buckets.items())))
    return {hk: digest for hk, digest in found if digest is not None}
