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
from pathlib import Path

from templar.core.config import HParamsError, load_hparams
from templar.data.manifest import ManifestError
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
        manifest = prepare(args.source, args.tokenizer, work, Geometry(seq, spp, pages_per_shard, args.shuffle_seed),
                           name=name, text_field=args.text_field, workers=args.workers,
                           progress=not args.no_progress)
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
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from templar.data.verify import verify

    digest = args.digest
    if args.hparams:
        try:
            digest = load_hparams(args.hparams).data.manifest or None
        except HParamsError as exc:
            print(f"error: {exc}")
            return 2

    async def check():
        async with corpus_bucket(args.corpus) as bucket:
            return await verify(bucket, args.prefix, digest=digest, progress=True)

    try:
        report = asyncio.run(check())
    except (ManifestError, LocatorError, StorageError) as exc:
        print(f"error: {exc}")
        return 1
    m = report.manifest
    for problem in report.problems[:50]:
        print(f"  {problem}")
    print(f"{m.name}: {report.shards_ok}/{len(m.shards)} shards ok, {m.num_pages:,} pages, digest {m.digest()}"
          + ("" if digest else " (no expected digest given)"))
    return 0 if report.ok else 1


def run_pin(args: argparse.Namespace) -> int:
    """Read the published manifest as a node will (the read locator), check it against the run's
    geometry, and write its location and sha256 into the run's hparams file."""
    from templar.data.pin import PinError, pin_corpus

    try:
        digest, run_digest = asyncio.run(pin_corpus(args.corpus, args.hparams, base=args.base, prefix=args.prefix,
                                                    name=args.name))
    except PinError as exc:
        print(f"error: {exc}")
        return 1
    print(f"pinned data.manifest {digest} in {args.hparams}")
    print(f"run digest (every node's hparams must give this): {run_digest}")
    return 0
