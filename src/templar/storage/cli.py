"""`templar bucket locator|check`: build the string your node commits, and read it back as a peer.

    templar bucket locator r2 --account-id ACCOUNT --bucket my-bucket --read-key-id KEY --read-secret SECRET
    templar bucket locator s3 --endpoint https://s3.us-east-1.amazonaws.com --bucket my-bucket \\
        --read-key-id KEY --read-secret SECRET
    templar bucket locator local /srv/templar/bucket
    templar bucket check "$(templar bucket locator ...)" [--subtensor.network finney]

`locator` validates every field with the code that parses peers' commitments and prints only the
locator (so `$(...)` captures it); it carries the READ key. It never takes or prints the write key,
and refuses a read key equal to the write key in the environment. `check` opens the bucket from
the locator alone, as a peer does: the endpoint rules of the network, a read with the read key, a
write with the read key that must be refused, and what the bucket has published.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from templar.core.config import PROTOCOL_VERSION
from templar.storage.base import ObjectNotFound, StorageError
from templar.storage.locator import (
    BucketLocator,
    Credentials,
    LocatorError,
    allows_private_endpoints,
    refuse_write_key,
)
from templar.storage.probe import Probe, peer_read, probe_key, read_only

VALIDATOR_LOCATOR_BYTES = 126
"""The room a validator's locator has in the chain's 128-byte commitment, after its role mark `v:`:
`templar.chain.VALIDATOR_LOCATOR_BYTES`, written out so that this command does not load the chain's SDK
(tests/storage/test_bucket_cli.py holds the two equal)."""
READ_KEY_ID_ENV = "TEMPLAR_BUCKET_READ_KEY_ID"
READ_SECRET_ENV = "TEMPLAR_BUCKET_READ_SECRET"
PUBLISHED = {
    f"v{PROTOCOL_VERSION}/start_window.json": "lead: the run's start window",
    f"v{PROTOCOL_VERSION}/peers/index.json": "lead: peer lists",
    f"v{PROTOCOL_VERSION}/checkpoint/latest.json": "lead: newest checkpoint",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bucket", help="build a bucket locator, or read one back as a peer would",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bucket_command", metavar="ACTION", required=True)

    loc = sub.add_parser("locator", help="build, validate and print a locator (read key only)")
    kinds = loc.add_subparsers(dest="kind", metavar="KIND", required=True)
    r2 = kinds.add_parser("r2", help="Cloudflare R2")
    r2.add_argument("--account-id", required=True, help="32 lowercase hex characters (R2 dashboard)")
    r2.add_argument("--bucket", default=None, help="bucket name (default: named after the account id)")
    s3 = kinds.add_parser("s3", help="any S3-compatible store")
    s3.add_argument("--endpoint", required=True, help="http(s)://host[:port], no path")
    s3.add_argument("--bucket", required=True)
    for p in (r2, s3):
        p.add_argument("--read-key-id", default=os.getenv(READ_KEY_ID_ENV), help=f"read-only key id; env {READ_KEY_ID_ENV}")
        p.add_argument("--read-secret", default=os.getenv(READ_SECRET_ENV), help=f"its secret; env {READ_SECRET_ENV}")
        p.add_argument("--check", action="store_true", help="also run `templar bucket check` on the result")
        p.add_argument("--subtensor.network", dest="subtensor_network", default=os.getenv("BT_NETWORK", "finney"),
                       help="with --check: judge the endpoint as peers on this network do")
    local = kinds.add_parser("local", help="a directory (embedded chains and tests only)")
    local.add_argument("path", type=Path)
    loc.set_defaults(func=run_locator)

    check = sub.add_parser("check", help="read a locator back as a peer would (read works, writes are refused)")
    check.add_argument("locator", help="the locator string (what is, or will be, committed on chain)")
    check.add_argument("--subtensor.network", dest="subtensor_network", default=os.getenv("BT_NETWORK", "finney"),
                       help="judge the endpoint as peers on this network do (default finney; env BT_NETWORK)")
    check.add_argument("--timeout", type=float, default=20.0, help="seconds per request")
    check.add_argument("--no-write-test", action="store_true", help="skip the write attempt with the read key")
    check.set_defaults(func=run_check)


def build_locator(args: argparse.Namespace) -> BucketLocator:
    """The locator the flags describe; `LocatorError` naming what is wrong (never echoing a key)."""
    if args.kind == "local":
        return BucketLocator.local(str(Path(args.path).expanduser().resolve()))
    if not args.read_key_id or not args.read_secret:
        raise LocatorError(f"give the read-only key: --read-key-id and --read-secret (or {READ_KEY_ID_ENV} "
                           f"and {READ_SECRET_ENV})")
    if args.kind == "r2":
        locator = BucketLocator.r2(args.account_id, args.read_key_id, args.read_secret, args.bucket)
    else:
        locator = BucketLocator.s3(args.endpoint, args.bucket, args.read_key_id, args.read_secret)
    refuse_write_key(locator, _write_key())
    return locator


def _write_key() -> Credentials | None:
    """The write key this machine's node would use, to refuse a locator that carries it. A write key
    configured but unusable is named here rather than skipped: the node would stop on it at start."""
    try:
        path = os.getenv("TEMPLAR_BUCKET_CREDENTIALS")
        return Credentials.from_file(path) if path else Credentials.from_env()
    except LocatorError as exc:
        raise LocatorError(f"the write key this machine's node would use: {exc}") from exc


def run_locator(args: argparse.Namespace) -> int:
    try:
        locator = build_locator(args)
        text = locator.encode()
    except LocatorError as exc:
        print(f"templar bucket locator: {exc}", file=sys.stderr)
        return 2
    print(text)
    print(f"{_describe(locator)}; {len(text)} of 128 bytes. Commit it with --bucket.locator (or TEMPLAR_BUCKET).",
          file=sys.stderr)
    if len(text) > VALIDATOR_LOCATOR_BYTES:
        print(f"A validator's commitment is its locator after a 2-byte role mark: {len(text)} bytes is over a "
              f"validator's {VALIDATOR_LOCATOR_BYTES}; fine for a miner (a shorter bucket name fits both).",
              file=sys.stderr)
    if getattr(args, "check", False):
        return check_locator(text, args.subtensor_network, 20.0, write_test=True, out=sys.stderr)
    return 0


def _describe(locator: BucketLocator) -> str:
    if locator.kind == "local":
        return f"local directory {locator.path}"
    where = locator.endpoint_url
    return f"{locator.kind} bucket {locator.bucket} at {where}, read key id {locator.read_key_id[:6]}…"


def run_check(args: argparse.Namespace) -> int:
    return check_locator(args.locator, args.subtensor_network, args.timeout, write_test=not args.no_write_test,
                         out=sys.stdout)


def check_locator(text: str, network: str, timeout: float, *, write_test: bool, out) -> int:
    """Print one line per check; 0 when nothing failed, 1 otherwise."""
    failed = False

    def line(status: str, what: str, message: str, fix: str = "") -> None:
        nonlocal failed
        failed |= status == "failed"
        print(f"{status:<8} {what:<10} {message}" + (f"\n{'':<19} fix: {fix}" if fix else ""), file=out)

    def probe_line(what: str, probe: Probe) -> None:
        line("ok" if probe.ok else "failed", what, probe.summary, probe.fix)

    try:
        locator = BucketLocator.parse(text.strip())
        locator.encode()
    except LocatorError as exc:
        line("failed", "locator", f"not a valid locator: {exc}", "build it with `templar bucket locator`")
        return 1
    line("ok", "locator", _describe(locator))
    public = not allows_private_endpoints(network)
    if public and locator.is_private_endpoint:
        line("failed", "endpoint", f"peers on {network} refuse {'local' if locator.kind == 'local' else 'private'} "
             "buckets and will score you missing", "use a bucket at a public hostname")
        return 1

    async def probes() -> None:
        probe_line("read", await peer_read(locator, probe_key("absent"), None, allow_private=not public,
                                           timeout=timeout))
        if write_test:
            probe_line("read-only", await read_only(locator, timeout=timeout))
        await _published(locator, timeout, line)

    asyncio.run(probes())
    return 1 if failed else 0


async def _published(locator: BucketLocator, timeout: float, line) -> None:
    """What the bucket shows a peer: the lead's records, if any (info only)."""
    from templar.storage import open_bucket

    found = []
    try:
        async with open_bucket(locator) as bucket:
            for key, what in PUBLISHED.items():
                try:
                    info = await bucket.head(key, timeout=timeout)
                except ObjectNotFound:
                    continue
                found.append(f"{what} ({time.time() - info.timestamp:,.0f}s old)")
    except StorageError:
        return  # the read line above already said why
    line("ok", "published", "; ".join(found) if found else "no lead records (a miner's bucket, or nothing yet)")
