"""Posting our pseudo-gradient and gathering the peers', with a hard deadline.

`gather` is the fault-tolerant core of a window (docs/design.md §5): every peer gets a per-peer budget
inside a whole-round deadline, at most `concurrency` transfers run at once (begun in an order no peer
can choose: `start_order`), and each peer ends
in exactly one `GatherStatus`. A peer can make its own result fail; it can never make `gather`
raise, wait past the deadline, or spoil another peer's result. There are no retries past the
deadline: what arrived valid is used, the rest is recorded with its reason for the scorer.

Per peer, in order: `head` (absent → missing), the timestamp against the put window (→ early /
late, before a single body byte is fetched), the size against `max_bytes` (→ oversize), the
download (capped again while streaming), the timestamp of the downloaded version once more (a
peer that swaps its object after the head is still judged on what we read), then `validate`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from templar.comms.keys import gradient_key
from templar.core.clock import Now
from templar.core.config import PROTOCOL_VERSION
from templar.core.log import context, peer_text, short
from templar.storage.base import (
    DEFAULT_TIMEOUT,
    Bucket,
    BucketUnreachable,
    ObjectInfo,
    ObjectNotFound,
    ObjectTooLarge,
    StorageError,
    StorageTimeout,
)

T = TypeVar("T")

DEADLINE_GRACE = 0.25
"""Seconds a cancelled transfer gets to unwind after the deadline before it is abandoned."""
MIN_BUDGET_SHARE = 0.5
"""A transfer starts only with at least this share of its budget left in the round (its per-peer budget, or the
round when shorter), or less once valid payloads came faster (the longest of them so far); a peer whose slot
comes later is `unserved`. Without it, stalling buckets that know the deadline (the chain's schedule) freed
their slots just before it, and the honest peers that took them were `timeout`, a φ each, for transfers no
one could finish in what was left. The longest valid transfer keeps the round's tail for peers that can
finish in it (79 peers of 3.8 s each: 19 % unserved with half the budget alone, none with it)."""
LONGEST_MARGIN = 1.25
"""The longest valid transfer of the round, times this, is the least time a transfer may start with (under
`MIN_BUDGET_SHARE`'s): a slot handed over with exactly that left would end on the deadline."""


class GatherStatus(StrEnum):
    """How one peer's upload for the window ended."""

    OK = "ok"                    # inside the put window, within the cap, validated
    MISSING = "missing"          # no object for this window
    EARLY = "early"              # written before the put window opened
    LATE = "late"                # written after the put window closed
    OVERSIZE = "oversize"        # bigger than max_bytes (announced or streamed)
    MALFORMED = "malformed"      # `validate` rejected the bytes
    TIMEOUT = "timeout"          # per-peer budget or round deadline ran out
    UNREACHABLE = "unreachable"  # connection, auth, missing bucket or server error
    UNSERVED = "unserved"        # the round ended before a transfer slot was free: never asked for


@dataclass(frozen=True)
class GatherResult(Generic[T]):
    """One peer's outcome: `value` is set only when `status` is OK; `error` is the validator's
    exception, as raised (typed: e.g. a `PayloadError` with its reason code), when MALFORMED."""

    status: GatherStatus
    value: T | None = None
    reason: str = ""
    nbytes: int = 0
    seconds: float = 0.0
    timestamp: float | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.status is GatherStatus.OK


@dataclass(frozen=True)
class PutResult:
    """An upload: its key, size in bytes and wall seconds."""

    key: str
    nbytes: int
    seconds: float


async def put_gradient(bucket: Bucket, window: int, data: bytes, *, timeout: float = DEFAULT_TIMEOUT,
                       version: int = PROTOCOL_VERSION) -> PutResult:
    """Upload our payload for `window` to our own bucket."""
    key = gradient_key(window, version)
    started = time.perf_counter()
    await bucket.put(key, data, timeout=timeout)
    return PutResult(key=key, nbytes=len(data), seconds=time.perf_counter() - started)


def _status_of(exc: StorageError) -> GatherStatus:
    if isinstance(exc, ObjectNotFound):
        return GatherStatus.MISSING
    if isinstance(exc, ObjectTooLarge):
        return GatherStatus.OVERSIZE
    if isinstance(exc, StorageTimeout):
        return GatherStatus.TIMEOUT
    if isinstance(exc, BucketUnreachable):
        return GatherStatus.UNREACHABLE
    return GatherStatus.UNREACHABLE  # any other server-side failure: the bucket is not usable now


@dataclass(frozen=True)
class _Rules(Generic[T]):
    key: str
    put_window: tuple[float, float]
    clock_skew: float
    max_bytes: int
    validate: Callable[[str, bytes], T]
    malformed_errors: tuple[type[BaseException], ...]

    def timing(self, info: ObjectInfo) -> GatherResult[T] | None:
        """EARLY/LATE against the put window widened by the skew allowance, else None."""
        start, end = self.put_window
        if info.timestamp < start - self.clock_skew:
            return GatherResult(GatherStatus.EARLY, reason=f"written {start - info.timestamp:.1f}s before "
                                "the put window", nbytes=info.size, timestamp=info.timestamp)
        if info.timestamp > end + self.clock_skew:
            return GatherResult(GatherStatus.LATE, reason=f"written {info.timestamp - end:.1f}s after "
                                "the put window", nbytes=info.size, timestamp=info.timestamp)
        return None


async def _fetch_one(hotkey: str, bucket: Bucket, rules: _Rules[T], budget_end: float) -> GatherResult[T]:
    loop = asyncio.get_running_loop()

    def left() -> float:
        return max(budget_end - loop.time(), 0.001)

    try:
        info = await bucket.head(rules.key, timeout=left())
        if (verdict := rules.timing(info)) is not None:
            return verdict
        if info.size > rules.max_bytes:
            return GatherResult(GatherStatus.OVERSIZE, reason=f"{info.size} bytes > cap {rules.max_bytes}",
                                nbytes=info.size, timestamp=info.timestamp)
        blob = await bucket.fetch(rules.key, max_bytes=rules.max_bytes, timeout=left())
    except StorageError as exc:
        return GatherResult(_status_of(exc), reason=peer_text(exc))
    if (verdict := rules.timing(blob.info)) is not None:
        return verdict
    size, stamp = len(blob.data), blob.info.timestamp
    try:
        # Off the event loop: decoding a payload must not stall the other transfers' deadlines.
        value = await asyncio.to_thread(rules.validate, hotkey, blob.data)
    except rules.malformed_errors as exc:
        return GatherResult(GatherStatus.MALFORMED, reason=peer_text(f"{type(exc).__name__}: {exc}"),
                            nbytes=size, timestamp=stamp, error=exc)
    return GatherResult(GatherStatus.OK, value=value, nbytes=size, timestamp=stamp)


def start_order(hotkeys: Iterable[str], rng: random.Random | None = None) -> list[str]:
    """The order in which peers take the gather's transfer slots: a shuffle, by the system's randomness
    unless `rng` is given (tests).

    Why not the order asked for (the validator's is sorted by hotkey): a peer whose bucket stalls holds a
    slot for its whole per-peer budget, so hotkeys ground to sort first (an SS58 address is cheap to
    grind), with stalling buckets, would take every slot for the first budgets of each round and leave
    the peers queued behind them (honest miners, the top-G among them) to the round deadline. Shuffled,
    a staller's place is a draw, and stalling costs its owner a slot's share of the round, not a chosen
    one. A peer still queued when too little of the round is left for a transfer (`MIN_BUDGET_SHARE`) is
    `unserved`, which judges it on nothing (its bucket was never asked), so enough stallers can keep a peer
    out of a window's aggregate but not cost it a penalty. Which peers are gathered is no consensus: every
    node applies the lead's inputs."""
    order = list(hotkeys)
    (rng or random.SystemRandom()).shuffle(order)
    return order


async def gather(
    peers: Mapping[str, Bucket],
    window: int,
    *,
    put_window: tuple[float, float],
    deadline: float,
    max_bytes: int,
    validate: Callable[[str, bytes], T],
    concurrency: int = 16,
    per_peer_timeout: float = 10.0,
    clock_skew: float = 2.0,
    malformed_errors: tuple[type[BaseException], ...] = (ValueError,),
    version: int = PROTOCOL_VERSION,
    now: Now = time.time,
    rng: random.Random | None = None,
) -> dict[str, GatherResult[T]]:
    """Fetch and validate every peer's payload for `window`; returns by `deadline` (unix s by `now`).

    `put_window` is `(start, end)` in unix seconds; uploads outside it widened by `clock_skew`
    seconds (S3 timestamps have 1 s resolution and clocks drift) are early/late.
    `per_peer_timeout` starts when the peer's transfer starts (after waiting for a slot); peers take
    the slots in `start_order` (`rng`: its randomness, for tests). A transfer starts only with
    `MIN_BUDGET_SHARE` of the per-peer budget (or of the round, when shorter) left in the round, or
    `LONGEST_MARGIN` times the round's longest valid transfer so far when that is less; a peer that got no
    slot by then is `unserved`, not `timeout`: its bucket was never asked, so nothing is known of its upload
    and none of it is the peer's doing. The result lists them as `peers` does.
    `validate(hotkey, data)` runs in a worker thread; exceptions of `malformed_errors` mark the
    peer malformed (pass `templar.wire.PayloadError` to be strict), anything else is our bug
    and propagates.
    """
    if concurrency < 1 or per_peer_timeout <= 0 or max_bytes < 0:
        raise ValueError("concurrency >= 1, per_peer_timeout > 0 and max_bytes >= 0 required")
    loop = asyncio.get_running_loop()
    round_end = loop.time() + (deadline - now())
    min_budget = MIN_BUDGET_SHARE * min(per_peer_timeout, max(round_end - loop.time(), 0.0))
    rules = _Rules(gradient_key(window, version), put_window, clock_skew, max_bytes, validate,
                   malformed_errors)
    slots = asyncio.Semaphore(concurrency)
    log = context(window=window, phase="gather")
    longest_ok = 0.0  # the longest transfer of the round that delivered a valid payload so far

    async def one(hotkey: str, bucket: Bucket) -> GatherResult[T]:
        nonlocal longest_ok
        started = loop.time()
        asked = timed_out = False
        needed = min_budget
        try:
            async with asyncio.timeout_at(round_end):
                async with slots:
                    started = loop.time()
                    # what a valid payload has taken this round, up to `min_budget`: a staller cannot lower it
                    needed = min(min_budget, LONGEST_MARGIN * longest_ok) if longest_ok > 0 else min_budget
                    asked = started < round_end and round_end - started >= needed  # else the slot passes on
                    if asked:
                        budget_end = min(started + per_peer_timeout, round_end)
                        async with asyncio.timeout_at(budget_end):
                            result = await _fetch_one(hotkey, bucket, rules, budget_end)
                        if result.ok:
                            longest_ok = max(longest_ok, loop.time() - started)
        except TimeoutError:
            timed_out = True
        if not asked:  # its bucket was never asked: nothing is known of its upload, and none of it is its doing
            result = GatherResult(GatherStatus.UNSERVED, reason=f"no transfer slot came free with {needed:.3g} s "
                                  "of the round left")
        elif timed_out:
            waited = "round deadline" if loop.time() >= round_end - 1e-3 else "per-peer timeout"
            result = GatherResult(GatherStatus.TIMEOUT, reason=f"{waited} reached")
        return GatherResult(result.status, result.value, result.reason, result.nbytes,
                            loop.time() - started, result.timestamp, result.error)

    # a task takes a free slot in the order the tasks were created (the semaphore's waiters are FIFO)
    started_tasks = {hotkey: asyncio.create_task(one(hotkey, peers[hotkey]), name=f"gather-{short(hotkey)}")
                     for hotkey in start_order(peers, rng)}
    tasks = {hotkey: started_tasks[hotkey] for hotkey in peers}
    if tasks:
        _done, pending = await asyncio.wait(tasks.values(), timeout=max(round_end - loop.time(), 0)
                                            + DEADLINE_GRACE)
        for task in pending:  # a transfer that ignored cancellation: abandon it, never wait on it
            task.cancel()
    results: dict[str, GatherResult[T]] = {}
    for hotkey, task in tasks.items():
        if task.done() and not task.cancelled():
            results[hotkey] = task.result()  # re-raises our own bugs, never a peer's fault
        else:
            results[hotkey] = GatherResult(GatherStatus.TIMEOUT, reason="abandoned at the round deadline")
    for hotkey, res in results.items():
        if not res.ok:
            log.debug(f"peer {short(hotkey)}: {res.status} ({res.reason})")
    counts = Counter(r.status.value for r in results.values())
    total = sum(r.nbytes for r in results.values() if r.ok)
    log.info(f"gathered {counts.get('ok', 0)}/{len(results)} peers, {total / 1e6:.2f} MB; "
             + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return results
