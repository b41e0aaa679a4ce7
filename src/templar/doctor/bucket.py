"""Checks of the node's own bucket: the locator it will commit, what its write key can do, what a
peer can do with the read key, and whether the link is fast enough for a window's payloads."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from templar.chain import MAX_COMMITMENT_BYTES, VALIDATOR_MARK, ChainError, Commitment
from templar.doctor.context import Doctor
from templar.doctor.result import CheckResult, failed, ok, skipped, warning
from templar.storage import StorageError, open_bucket
from templar.storage.locator import BucketLocator, Credentials, LocatorError, refuse_write_key
from templar.storage.probe import peer_read, probe_key, read_only, write_round_trip

PROBE_BYTES = 64 * 1024


async def check_bucket_locator(d: Doctor) -> CheckResult:
    """A locator and a write key are configured, the locator is valid and fits the chain, peers on
    this network accept its endpoint, and how it compares with what is committed now."""
    a = d.args
    if not a.bucket_locator:
        return failed("bucket-locator", "no bucket: --bucket.locator (or TEMPLAR_BUCKET) is not set",
                      "build one with `templar bucket locator` (docs/buckets.md)")
    try:
        d.locator = BucketLocator.parse(a.bucket_locator)
    except LocatorError as exc:
        return failed("bucket-locator", f"bucket configuration: {exc}", "rebuild the locator with `templar bucket "
                      "locator`")
    shadow = bool(getattr(a, "shadow", False))  # a shadow commits nothing
    wanted = Commitment(d.locator.encode(), validates=d.role == "validator" and not shadow)
    size = len(wanted.text)
    try:
        wanted.encode()
    except ValueError:
        return failed("bucket-locator", f"a validator's commitment is its locator after the mark {VALIDATOR_MARK!r}: "
                      f"{size} bytes, and the chain stores {MAX_COMMITMENT_BYTES}",
                      f"use a bucket name {size - MAX_COMMITMENT_BYTES} characters shorter (`templar bucket locator`)")
    try:
        d.credentials = (Credentials.from_file(a.bucket_credentials) if a.bucket_credentials
                         else Credentials.from_env())
    except LocatorError as exc:
        return failed("bucket-locator", f"write key: {exc}", "the write key goes in TEMPLAR_BUCKET_WRITE_KEY_ID/"
                      "_SECRET, or in a --bucket.credentials file of mode 0600 (docs/buckets.md)")
    kind = d.locator.kind
    if kind != "local" and d.credentials is None:
        return failed("bucket-locator", f"{kind} locator but no write key", "set TEMPLAR_BUCKET_WRITE_KEY_ID and "
                      "TEMPLAR_BUCKET_WRITE_SECRET, or pass --bucket.credentials FILE (mode 0600)")
    try:
        refuse_write_key(d.locator, d.credentials)
    except LocatorError:
        return failed("bucket-locator", "the locator carries the WRITE key: it would be public on chain",
                      "create a read-only key for the locator")
    if d.public and d.locator.is_private_endpoint:
        return failed("bucket-locator", f"peers on {d.network} refuse {kind} buckets on local or private addresses",
                      "use a bucket at a public hostname")
    if d.chain is not None and d.wallet is not None:
        try:
            d.committed = (await asyncio.to_thread(d.chain.commitments)).get(d.chain.hotkey)
        except ChainError as exc:
            return warning("bucket-locator", f"{kind} locator ({size} of 128 bytes); cannot read the commitment: {exc}",
                           "check the chain")
    where = d.locator.bucket or d.locator.path
    if shadow and d.committed is not None and not d.committed.validates:
        return warning("bucket-locator", f"{kind} bucket {where}; --shadow: the node never commits it, and this "
                       "hotkey's commitment declares no validator: validators score it as a miner and it cannot lead",
                       "start the live validator on this hotkey (it commits its locator as a validator's)")
    if shadow:
        return ok("bucket-locator", f"{kind} bucket {where} ({size} of 128 bytes); --shadow: the node never commits "
                  "it, the chain keeps " + ("no locator" if d.committed is None else "the live validator's"))
    if d.committed == wanted:
        return ok("bucket-locator", f"{kind} bucket {where}, committed on chain as a {d.role}'s ({size} of 128 bytes)")
    if d.committed is None:
        return ok("bucket-locator", f"{kind} bucket {where} ({size} of 128 bytes); the node commits it at start")
    if d.committed.locator == wanted.locator:
        was = "validator" if d.committed.validates else "miner"
        return ok("bucket-locator", f"{kind} bucket {where}, committed on chain as a {was}'s; the node commits it as "
                  f"a {d.role}'s at start ({size} of 128 bytes)")
    return warning("bucket-locator", f"{kind} bucket {where}: the chain holds another locator; the node commits this "
                   "one at start", "check that --bucket.locator is the bucket you mean to use")


async def check_bucket_write(d: Doctor) -> CheckResult:
    """The write key can put, read back and delete an object: our uploads will land, and the old
    ones can go. A second probe object stays for the peer checks (deleted when the checks end)."""
    if d.locator is None:
        return skipped("bucket-write", "needs a valid bucket configuration")
    try:
        d.bucket = open_bucket(d.locator, d.credentials, own=True)
    except (LocatorError, StorageError, OSError) as exc:
        return failed("bucket-write", f"cannot open the bucket: {exc}", "check the locator")
    result = await write_round_trip(d.bucket, probe_key("doctor-delete"), os.urandom(1024), timeout=d.timeout)
    if not result.ok:
        return failed("bucket-write", result.summary, result.fix)
    key, data = probe_key("doctor"), os.urandom(1024)
    kept = await write_round_trip(d.bucket, key, data, timeout=d.timeout, keep=True)
    if not kept.ok:
        return failed("bucket-write", kept.summary, kept.fix)
    d.probe = (key, data)
    return ok("bucket-write", f"the write key can write, read back and delete a probe object ({result.seconds:.2f}s "
                              "up)")


async def check_bucket_read(d: Doctor) -> CheckResult:
    """A peer holding only the locator reads what we wrote (the same endpoint rules as peers)."""
    if d.locator is None or d.probe is None:
        return skipped("bucket-read", "needs the write check's probe object")
    key, data = d.probe
    result = await peer_read(d.locator, key, data, allow_private=not d.public, timeout=d.timeout)
    return ok("bucket-read", result.summary) if result.ok else failed("bucket-read", result.summary, result.fix)


async def check_bucket_read_only(d: Doctor) -> CheckResult:
    """The committed read key cannot write: otherwise anyone reading the chain can overwrite our
    uploads (and our scores with them)."""
    if d.locator is None:
        return skipped("bucket-read-only", "needs a valid bucket configuration")
    result = await read_only(d.locator, timeout=d.timeout)
    if result.ok:
        return ok("bucket-read-only", result.summary)
    return failed("bucket-read-only", result.summary, result.fix)


async def check_bucket_throughput(d: Doctor) -> CheckResult:
    """Upload and download one payload of this run's size against what a window needs: a miner's
    gradient inside half the put window, and the window's downloads (the top-G gradients for a
    miner, `fast_eval_uids` for a validator) inside the gather time."""
    if d.bucket is None or d.sizing is None or d.hp is None or d.probe is None:
        return skipped("bucket-throughput", "needs a writable bucket and hparams")
    w, g = d.hp.windows, d.hp.gauntlet
    size = max(1, int(d.sizing["gradient_upload_max_mb"] * 1e6))
    downloads = g.top_g if d.role == "miner" else g.fast_eval_uids
    key = probe_key("throughput")
    data = os.urandom(size)
    budget_up, budget_down = w.put_window_seconds / 2, w.gather_seconds
    try:
        started = time.perf_counter()
        await d.bucket.put(key, data, timeout=w.put_window_seconds)
        up = time.perf_counter() - started
        started = time.perf_counter()
        back = await d.bucket.get(key, max_bytes=size, timeout=w.gather_seconds)
        down = time.perf_counter() - started
    except StorageError as exc:
        return failed("bucket-throughput", f"a {size / 1e6:.2f} MB payload did not go through: {exc}",
                      "a bucket this slow misses the put window every window: check the network and endpoint")
    finally:
        with contextlib.suppress(StorageError, TimeoutError):
            await asyncio.wait_for(d.bucket.delete(key, timeout=d.timeout), d.timeout)
    if back != data:
        return failed("bucket-throughput", "the payload read back differs", "use another provider")
    need_down = downloads * down
    data_ = {"payload_bytes": size, "upload_seconds": round(up, 3), "download_seconds": round(down, 3),
             "up_mb_s": round(size / 1e6 / max(up, 1e-6), 2), "down_mb_s": round(size / 1e6 / max(down, 1e-6), 2),
             "window_download_seconds": round(need_down, 2)}
    line = (f"{size / 1e6:.2f} MB up in {up:.2f}s ({data_['up_mb_s']} MB/s), down in {down:.2f}s; a window's "
            f"{downloads} downloads ≈ {need_down:.1f}s")
    fix = "a faster link or a bucket region nearer this machine (and the validators)"
    if up > w.put_window_seconds or need_down > budget_down:
        return failed("bucket-throughput", f"{line}: over the put window ({w.put_window_seconds:g}s) or the gather "
                      f"({budget_down:g}s)", fix, **data_)
    if up > budget_up or need_down > budget_down / 2:
        return warning("bucket-throughput", f"{line}: little margin (put window {w.put_window_seconds:g}s, gather "
                       f"{budget_down:g}s)", fix, **data_)
    return ok("bucket-throughput", line, **data_)


async def cleanup_probe(d: Doctor) -> None:
    """Delete the probe object (best effort: it is small and under `templar-probe/`)."""
    if d.bucket is not None and d.probe is not None:
        with contextlib.suppress(StorageError, TimeoutError):
            await asyncio.wait_for(d.bucket.delete(d.probe[0], timeout=d.timeout), d.timeout)
        d.probe = None
