"""Probing a bucket the way its owner and its peers will use it: before a node spends TAO and hours.

Three questions, each answered by real requests with deadlines, never by reading configuration:

- `write_round_trip`: can our write key put, read back and delete an object (and how fast)?
- `peer_read`: can a peer, holding only the committed read locator, read an object of ours?
- `read_only`: is the committed read key refused a write? A read key that can write lets anyone
  who reads the chain overwrite our gradients, commitments and checkpoints.

Each returns a `Probe`: `ok`, one line for the operator, the fix when not ok, and the seconds it took.
Probe objects live under `templar-probe/` and are deleted at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

from templar.core.log import peer_text
from templar.storage.base import (
    AccessDenied,
    Bucket,
    BucketUnreachable,
    EndpointNotPublic,
    ObjectNotFound,
    StorageError,
    StorageTimeout,
)
from templar.storage.locator import BucketLocator, LocatorError

PROBE_PREFIX = "templar-probe/"


@dataclass(frozen=True)
class Probe:
    ok: bool
    summary: str
    fix: str = ""
    seconds: float = 0.0


def probe_key(tag: str) -> str:
    """A fresh key under `templar-probe/` (random, so concurrent probes never collide)."""
    return f"{PROBE_PREFIX}{tag}-{os.urandom(6).hex()}"


async def write_round_trip(bucket: Bucket, key: str, data: bytes, *, timeout: float,
                           keep: bool = False) -> Probe:
    """PUT `data` at `key` with our (write) key, GET it back, and DELETE it unless `keep` (then the
    caller deletes it, after a peer read). `seconds` is the upload's time alone."""
    started = time.perf_counter()
    try:
        await bucket.put(key, data, timeout=timeout)
        uploaded = time.perf_counter() - started
        back = await bucket.get(key, max_bytes=len(data), timeout=timeout)
        if back != data:
            return Probe(False, f"{bucket.name}: the object read back differs from what was written",
                         "the bucket or a proxy in front of it alters objects: use another provider", uploaded)
        if not keep:
            await bucket.delete(key, timeout=timeout)
            try:
                await bucket.head(key, timeout=timeout)
                return Probe(False, "the write key cannot delete: the probe object is still there",
                             "give the write key delete permission (miners and the lead delete old objects)", uploaded)
            except ObjectNotFound:
                pass
    except AccessDenied as exc:
        return Probe(False, f"the write key was refused: {peer_text(exc)}",
                     "use a key with read, write and delete permission on this bucket "
                     "(TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET or --bucket.credentials)")
    except StorageTimeout as exc:
        return Probe(False, f"no answer within {timeout:.0f}s: {peer_text(exc)}",
                     "check the endpoint and this machine's network; a stalled bucket misses every put window")
    except StorageError as exc:
        return Probe(False, f"{type(exc).__name__}: {peer_text(exc)}", _fix_for(exc))
    return Probe(True, f"write key can write, read{'' if keep else ' and delete'} "
                       f"({len(data):,} bytes up in {uploaded:.2f}s)", seconds=uploaded)


def _fix_for(exc: StorageError) -> str:
    if isinstance(exc, EndpointNotPublic):
        return ("use a hostname that resolves to public addresses (peers on finney and test never connect to "
                "loopback, private or link-local ones)")
    if isinstance(exc, BucketUnreachable):
        return "check the locator's endpoint and bucket name (does the bucket exist?) and the network"
    return "see the message; `templar bucket check` shows what a peer sees"


async def peer_read(locator: BucketLocator, key: str, expected: bytes | None, *, allow_private: bool,
                    timeout: float) -> Probe:
    """GET `key` the way a peer does: from the committed locator alone (its read key), with the same
    refusal of private endpoints a node on a public network applies. `expected` None: the key may
    be missing (the bucket answering "no such key" is proof enough that the read key works)."""
    from templar.storage import open_bucket  # the package imports this module

    started = time.perf_counter()
    try:
        bucket = open_bucket(locator, allow_private=allow_private)
    except LocatorError as exc:
        return Probe(False, f"peers refuse this locator: {peer_text(exc)}",
                     "use a public hostname (peers on finney and test refuse local, loopback and private "
                     "addresses)")
    try:
        async with bucket:
            data = await bucket.get(key, max_bytes=max(4096, len(expected or b"")), timeout=timeout)
    except ObjectNotFound:
        if expected is None:
            return Probe(True, "the read key can read (the bucket answered; nothing at the key yet)",
                         seconds=time.perf_counter() - started)
        return Probe(False, "a peer does not see the object just written (another bucket, or not yet visible)",
                     "the locator must name the bucket the write key writes to")
    except AccessDenied as exc:
        return Probe(False, f"the read key was refused: {peer_text(exc)}",
                     "give the read key get, head and list permission on this bucket, and commit its pair")
    except StorageTimeout as exc:
        return Probe(False, f"no answer within {timeout:.0f}s: {peer_text(exc)}", "check the endpoint and the network")
    except StorageError as exc:
        return Probe(False, f"{type(exc).__name__}: {peer_text(exc)}", _fix_for(exc))
    seconds = time.perf_counter() - started
    if expected is not None and data != expected:
        return Probe(False, "a peer reads different bytes than were written",
                     "the locator must name the bucket the write key writes to")
    return Probe(True, f"a peer can read it with the committed read key ({seconds:.2f}s)", seconds=seconds)


async def read_only(locator: BucketLocator, *, timeout: float) -> Probe:
    """Try a PUT with the locator's read key: it must be refused. If it is accepted, the probe
    object is deleted with the same key (best effort) and the probe fails."""
    from templar.storage import open_bucket

    if locator.kind == "local":
        return Probe(True, "local bucket: no keys (refused by peers on public networks)")
    key = probe_key("read-key-write")
    try:
        async with open_bucket(locator) as bucket:
            try:
                await bucket.put(key, b"a read key must not write this", timeout=timeout)
            except AccessDenied:
                return Probe(True, "the read key is refused writes, as it must be")
            with contextlib.suppress(StorageError, TimeoutError):
                await asyncio.wait_for(bucket.delete(key, timeout=timeout), timeout)
    except StorageTimeout as exc:
        return Probe(False, f"could not tell: no answer within {timeout:.0f}s ({peer_text(exc)})",
                     "check the endpoint and the network")
    except StorageError as exc:
        return Probe(False, f"could not tell: {type(exc).__name__}: {peer_text(exc)}", _fix_for(exc))
    return Probe(False, "the committed read key can WRITE: anyone reading the chain can overwrite your uploads",
                 "create a read-only key (get, head, list) for the locator; keep the write key to yourself")
