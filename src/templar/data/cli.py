"""`templar data prepare|verify`: publish a run's corpus, and check one.

    templar data prepare assets/corpus --tokenizer assets/tokenizer --hparams tiny --out /tmp/shards
    templar data prepare hub:HuggingFaceFW/fineweb-edu:sample-100BT --tokenizer hub:<repo> \\
        --out 'r2:<read locator>' --credentials write-key.json --work /scratch/fineweb
    templar data verify /tmp/shards --hparams tiny
    templar data pin 's3:<read locator>' --hparams run.json --base tiny   # the run's hparams name the corpus
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

from templar.core.config import HParams, HParamsError, load_hparams
from templar.data.manifest import ManifestError
from templar.data.plan import MAX_UIDS, disjoint_assignment_pages, holdout_count
from templar.data.prepare import Geometry, PrepareError, prepare, upload
from templar.data.source import corpus_bucket
from templar.storage import StorageError, open_bucket
from templar.storage.locator import BucketLocator, Credentials, LocatorError

SHARD_TOKENS = 1 << 27
"""Default shard size: 128M tokens (256 MB of uint16), ~1000 pages of the production geometry."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="prepare a corpus into token shards, or verify one (docs/data.md)")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    pr = sub.add_parser("prepare", help="tokenize text/jsonl/parquet or a hub dataset into shards + manifest")
    pr.add_argument("source", help="local file or folder (.txt/.jsonl/.parquet), or hub:<repo>[:<config>]")
    pr.add_argument("--out", required=True,
                    help="a folder, or a bucket locator (r2:/s3:/local:) to upload to (needs --work)")
    pr.add_argument("--tokenizer", required=True, help="local tokenizer folder, or hub:<repo> on online machines")
    pr.add_argument("--hparams", default=None, help="take sequence length and page size from this preset")
    pr.add_argument("--sequence-length", type=int, default=None)
    pr.add_argument("--sequences-per-page", type=int, default=None)
    pr.add_argument("--pages-per-shard", type=int, default=None,
                    help=f"default: about {SHARD_TOKENS >> 20}M tokens per shard")
    pr.add_argument("--shuffle-seed", type=int, default=0, help="keyed shuffle of sequences within each shard")
    pr.add_argument("--name", default=None, help="corpus label in the manifest (default: the source's name)")
    pr.add_argument("--text-field", default="text", help="column or JSON key holding the document text")
    pr.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: cores - 1; 0, in this process, below 3 cores)")
    pr.add_argument("--work", type=Path, default=None,
                    help="local folder for shards before upload (resumable; default: --out if it is a folder)")
    pr.add_argument("--prefix", default="", help="key prefix inside the bucket, e.g. fineweb-edu/")
    pr.add_argument("--credentials", type=Path, default=None,
                    help="JSON file with the bucket WRITE key (or env TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET)")
    pr.add_argument("--max-tokens", type=int, default=None,
                    help="stop once this many tokens are cut (whole pages): a sample of a large streamed dataset")
    pr.add_argument("--no-progress", action="store_true")
    pr.set_defaults(func=run_prepare)

    ve = sub.add_parser("verify", help="check every shard and page of a prepared corpus against its manifest")
    ve.add_argument("corpus", help="a folder or a bucket locator")
    ve.add_argument("--prefix", default="", help="key prefix inside the bucket")
    ve.add_argument("--digest", default=None, help="the manifest's expected sha256")
    ve.add_argument("--hparams", default=None, help="expect the digest pinned in this preset's data.manifest")
    ve.set_defaults(func=run_verify)

    pin = sub.add_parser("pin", help="pin a published corpus in the run's hparams (data.corpus, corpus_prefix, "
                         "manifest digest)")
    pin.add_argument("corpus", help="the corpus' READ locator (what every node will read), or a folder")
    pin.add_argument("--hparams", required=True, type=Path,
                     help="the run's hparams file: updated in place if it exists, else created from --base")
    pin.add_argument("--base", default=None, help="preset the new file builds on (e.g. tiny, or hparams.json)")
    pin.add_argument("--prefix", default="", help="key prefix of manifest.json inside the bucket")
    pin.add_argument("--name", default=None, help="the run's name in a new file (default: the file's stem)")
    pin.set_defaults(func=run_pin)


def _is_locator(text: str) -> bool:
    return text.startswith(("r2:", "s3:", "local:"))


def run_prepare(args: argparse.Namespace) -> int:
    seq, spp = args.sequence_length, args.sequences_per_page
    if not args.out.strip():
        print("error: --out is empty (did the `templar bucket locator` that should fill it fail?)")
        return 2
    if args.hparams:
        try:
            hp = load_hparams(args.hparams)
        except HParamsError as exc:
            print(f"error: {exc}")
            return 2
        seq, spp = seq or hp.data.sequence_length, spp or hp.data.sequences_per_page
    if not seq or not spp:
        print("error: give --hparams or both --sequence-length and --sequences-per-page")
        return 2
    pages_per_shard = args.pages_per_shard or max(1, SHARD_TOKENS // (seq * spp))
    remote = _is_locator(args.out)
    work = args.work or (None if remote else Path(args.out))
    if work is None:
        print("error: uploading to a bucket needs --work DIR (a local folder for the shards)")
        return 2
    name = args.name or (args.source[4:] if args.source.startswith("hub:") else Path(args.source).name)
    try:
        if remote:
            locator = BucketLocator.parse(args.out)
            creds = Credentials.from_file(args.credentials) if args.credentials else Credentials.from_env()
            if locator.kind != "local" and creds is None:
                print("error: no write key: pass --credentials FILE or set TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET")
                return 2
            # Hours of tokenizing must not end in a refused upload: the write key and the read
            # locator are tried on the real bucket first (seconds), exactly as the upload and the
            # nodes will use them.
            problem = asyncio.run(preflight(locator, creds, args.prefix))
            if problem:
                print(f"error: the corpus bucket is not ready, nothing was tokenized: {problem}")
                return 1
        manifest = prepare(args.source, args.tokenizer, work, Geometry(seq, spp, pages_per_shard, args.shuffle_seed),
                           name=name, text_field=args.text_field, workers=args.workers,
                           progress=not args.no_progress, max_tokens=args.max_tokens)
        if remote:
            async def push() -> None:
                async with open_bucket(locator, creds) as b:
                    await upload(work, b, args.prefix, manifest)

            asyncio.run(push())
    except (PrepareError, LocatorError, StorageError, ValueError, OSError) as exc:
        print(f"error: {exc}")
        return 1
    print(f"{manifest.name}: {manifest.num_tokens:,} tokens, {manifest.num_pages:,} pages of "
          f"{manifest.page_tokens:,} tokens, {len(manifest.shards)} shards, {manifest.total_bytes / 1e6:,.1f} MB")
    print(f"manifest digest (hparams data.manifest): {manifest.digest()}")
    if args.hparams:
        _warn_if_overlapping(manifest.num_pages, hp)
    return 0


PREFLIGHT_TIMEOUT = 10.0
"""Seconds per request of the bucket checks before tokenizing."""


async def preflight(locator: BucketLocator, creds: Credentials | None, prefix: str) -> str | None:
    """Why the corpus could not be published to `locator` (None: it can): a probe object written
    with the write key, read back with the locator's read key (as every node will read the corpus),
    and deleted."""
    from templar.storage.probe import peer_read, probe_key, write_round_trip

    key = prefix + probe_key("data-prepare")
    async with open_bucket(locator, creds) as bucket:
        wrote = await write_round_trip(bucket, key, b"templar data prepare: bucket check", timeout=PREFLIGHT_TIMEOUT,
                                       keep=True)
        if not wrote.ok:
            return f"{wrote.summary}; fix: {wrote.fix}"
        try:
            read = await peer_read(locator, key, b"templar data prepare: bucket check", allow_private=True,
                                   timeout=PREFLIGHT_TIMEOUT)
        finally:
            with contextlib.suppress(StorageError, TimeoutError):
                await bucket.delete(key, timeout=PREFLIGHT_TIMEOUT)
    return None if read.ok else f"{read.summary}; fix: {read.fix}"


def overlap_warning(pages: int, hp: HParams) -> str | None:
    """A warning when a corpus of `pages` pages is too small for every uid to have pages of its own."""
    needed = disjoint_assignment_pages(hp.data.pages_per_window, hp.data.holdout_fraction)
    if pages >= needed:
        return None
    return (f"warning: {pages:,} pages are fewer than the {needed:,} that keep assignments from overlapping "
            f"({MAX_UIDS} uids × {hp.data.pages_per_window} pages a window, plus the held-out "
            f"{hp.data.holdout_fraction:g}): uids past the first {max(1, (pages - holdout_count(pages, hp.data.holdout_fraction)) // hp.data.pages_per_window)} "
            "share pages. Fine for a rehearsal with a few miners; a public run needs more text (docs/data.md).")


def _warn_if_overlapping(pages: int, hp: HParams) -> None:
    warning = overlap_warning(pages, hp)
    if warning:
        print(warning)


def run_verify(args: argparse.Namespace) -> int:
    """Every shard and page against the manifest; then the manifest against the digest expected
    (`--digest`, or the one pinned in `--hparams`) and, with `--hparams`, the run's page geometry."""
    from templar.data.source import check_geometry
    from templar.data.verify import verify

    hp = None
    if args.hparams:
        try:
            hp = load_hparams(args.hparams)
        except HParamsError as exc:
            print(f"error: {exc}")
            return 2
    expected = args.digest or (hp.data.manifest if hp else None) or None

    async def check():
        async with corpus_bucket(args.corpus) as bucket:
            return await verify(bucket, args.prefix, digest=None, progress=True)

    try:
        report = asyncio.run(check())
    except (ManifestError, LocatorError, StorageError) as exc:
        print(f"error: {exc}")
        return 1
    m = report.manifest
    for problem in report.problems[:50]:
        print(f"  {problem}")
    print(f"{m.name}: {report.shards_ok}/{len(m.shards)} shards ok, {m.num_pages:,} pages, digest {m.digest()}")
    ok = report.ok
    if expected is None:
        print("no expected digest: the shards match this manifest, but nothing says it is the run's "
              "(pass --digest, or --hparams with a pinned data.manifest)")
    elif m.digest() != expected:
        ok = False
        where = "--digest" if args.digest else f"data.manifest of {args.hparams}"
        print(f"error: this manifest's digest is not {where} ({expected[:16]}…): it is another corpus than the "
              f"one pinned. If this corpus is the run's, pin it: templar data pin CORPUS --hparams RUN_FILE "
              f"(docs/launch.md §4); to check it on its own, pass --digest {m.digest()}")
    if hp is not None:
        try:
            check_geometry(m, hp)
        except ManifestError as exc:
            ok = False
            print(f"error: {exc}")
        _warn_if_overlapping(m.num_pages, hp)
    return 0 if ok else 1


def run_pin(args: argparse.Namespace) -> int:
    """Read the published manifest as a node will (the read locator), check it against the run's
    geometry, and write its location and sha256 into the run's hparams file."""
    from templar.data.pin import PinError, machine_paths, pin_corpus, portable_location

    try:
        digest, run_digest = asyncio.run(pin_corpus(args.corpus, args.hparams, base=args.base, prefix=args.prefix,
                                                    name=args.name))
    except PinError as exc:
        print(f"error: {exc}")
        return 1
    print(f"pinned data.manifest {digest} in {args.hparams}")
    print(f"run digest (every node's hparams must give this): {run_digest}")
    warning = machine_paths(portable_location(args.corpus))
    if warning:
        print(f"warning: {warning}")
    return 0
