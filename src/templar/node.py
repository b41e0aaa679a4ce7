"""What miners and validators share: flags, start-up, peers' buckets, and shutdown.

A role builds a `Node` (registration check, own bucket committed, model and data ready), then
runs its own window loop. Nothing here knows about scoring or training strategy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from loguru import logger

from templar.chain import Chain, ChainError, Neuron, NotRegistered
from templar.chain.flags import add_chain_args, connect_from_args
from templar.config import HParams, HParamsError, load_hparams
from templar.data import ManifestError, PagePlan, PageReader
from templar.data.source import DEFAULT_CACHE_GB, open_reader
from templar.locator import BucketLocator, Credentials, LocatorError
from templar.log import setup_logging, short
from templar.model import build_model, parameter_shapes
from templar.storage import Bucket, StorageError, open_bucket
from templar.windows import Clock

EXIT_NOT_REGISTERED = 2
EXIT_CONFIG = 3


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """Flags every neuron takes, in Bittensor's dotted style."""
    add_chain_args(parser)
    parser.add_argument("--hparams", default=None, help="preset name (tiny) or path; default hparams.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--state.dir", dest="state_dir", type=Path, default=None,
                        help="where this node keeps its resumable state (default ~/.templar/WALLET/HOTKEY)")
    parser.add_argument("--bucket.locator", dest="bucket_locator", default=os.getenv("TEMPLAR_BUCKET"),
                        help="read locator of this node's bucket, committed on chain "
                             "(local:/dir | s3:... | r2:...); env TEMPLAR_BUCKET")
    parser.add_argument("--bucket.credentials", dest="bucket_credentials", type=Path,
                        default=os.getenv("TEMPLAR_BUCKET_CREDENTIALS"),
                        help="JSON file with the bucket WRITE key (or env TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET)")
    parser.add_argument("--data.locator", dest="data_locator", default=os.getenv("TEMPLAR_DATA_BUCKET"),
                        help="read the run's corpus from this bucket locator or folder instead of hparams "
                             "data.corpus (a mirror; the pinned manifest digest still applies)")
    parser.add_argument("--data.prefix", dest="data_prefix", default=None,
                        help="key prefix of the corpus in --data.locator (default: hparams data.corpus_prefix)")
    parser.add_argument("--data.cache_gb", dest="data_cache_gb", type=float, default=DEFAULT_CACHE_GB,
                        help="cap on the on-disk page cache (least recently used pages evicted)")
    parser.add_argument("--data.cache_dir", dest="data_cache_dir", type=Path, default=None,
                        help="page cache folder (default STATE_DIR/data)")
    parser.add_argument("--windows", type=int, default=0, help="stop after this many windows (0: run forever)")
    parser.add_argument("--logging.debug", dest="logging_debug", action="store_true")
    parser.add_argument("--logging.json", dest="logging_json", action="store_true", help="JSON lines on stderr")
    parser.add_argument("--logging.file", dest="logging_file", type=Path, default=None)


@dataclass
class Node:
    """A started neuron: chain, clock, model, data and its own bucket."""

    hp: HParams
    chain: Chain
    clock: Clock
    uid: int
    model: torch.nn.Module
    pages: PageReader
    plan: PagePlan
    bucket: Bucket
    state_dir: Path
    device: torch.device
    args: argparse.Namespace
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _peer_buckets: dict[str, tuple[str, Bucket]] = field(default_factory=dict)

    @property
    def allow_private_endpoints(self) -> bool:
        """Public networks refuse peer buckets on loopback/private addresses (no SSRF into our LAN)."""
        return self.args.subtensor_network not in {"finney", "test"}

    @property
    def hotkey(self) -> str:
        return self.chain.hotkey

    @property
    def shapes(self) -> dict[str, torch.Size]:
        return parameter_shapes(self.model)

    async def neurons(self) -> list[Neuron]:
        return await asyncio.to_thread(self.chain.metagraph)

    async def peer_buckets(self, hotkeys: list[str] | None = None) -> dict[str, Bucket]:
        """Readable buckets of registered hotkeys (all, or those named), from their commitments.

        A commitment that does not parse is ignored with a log line, never used to build a URL.
        """
        locators = await asyncio.to_thread(self.chain.bucket_locators)
        wanted = set(hotkeys) if hotkeys is not None else set(locators)
        out: dict[str, Bucket] = {}
        for hotkey in sorted(wanted):
            raw = locators.get(hotkey)
            if raw is None:
                continue
            cached = self._peer_buckets.get(hotkey)
            if cached and cached[0] == raw:
                out[hotkey] = cached[1]
                continue
            try:
                locator = BucketLocator.parse(raw)
            except LocatorError as exc:
                logger.warning(f"ignoring bucket commitment of {short(hotkey)}: {exc}")
                continue
            try:
                bucket = open_bucket(locator, allow_private=self.allow_private_endpoints)
            except (LocatorError, StorageError) as exc:
                logger.warning(f"ignoring bucket of {short(hotkey)}: {exc}")
                continue
            if cached:
                await cached[1].aclose()
            self._peer_buckets[hotkey] = (raw, bucket)
            out[hotkey] = bucket
        return out

    async def lead(self) -> tuple[Neuron, Bucket] | None:
        """The highest-stake validator and its bucket (checkpoints, peer lists, aggregates)."""
        lead = await asyncio.to_thread(self.chain.lead_validator)
        if lead is None:
            return None
        if lead.hotkey == self.hotkey:
            return lead, self.bucket
        buckets = await self.peer_buckets([lead.hotkey])
        return (lead, buckets[lead.hotkey]) if lead.hotkey in buckets else None

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM finish the current window, save, and exit."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._request_stop, sig)

    def _request_stop(self, sig: signal.Signals) -> None:
        if self.stop.is_set():
            logger.warning("second signal: exiting now")
            os._exit(130)
        logger.info(f"{sig.name} received: stopping after this window")
        self.stop.set()

    async def aclose(self) -> None:
        for _, bucket in self._peer_buckets.values():
            await bucket.aclose()
        await self.bucket.aclose()
        await self.pages.aclose()


async def start_node(args: argparse.Namespace, role: str) -> Node:
    """Registration check, bucket commitment, model and data. Exits with a clear message on
    configuration errors (code 3) or an unregistered hotkey (code 2)."""
    try:
        hp = load_hparams(args.hparams)
    except HParamsError as exc:
        logger.error(str(exc))
        sys.exit(EXIT_CONFIG)
    try:
        chain = await asyncio.to_thread(connect_from_args, args)
    except (ChainError, OSError, ValueError) as exc:
        logger.error(f"cannot connect to the chain or load the wallet: {exc}")
        sys.exit(EXIT_CONFIG)
    setup_logging(debug=args.logging_debug, json_lines=args.logging_json, logfile=args.logging_file,
                  hotkey=chain.hotkey)
    log = logger.bind(phase="startup")
    log.info(f"[SYNC] Checking registration of {role} hotkey {chain.hotkey} on netuid {args.netuid}")
    try:
        await asyncio.to_thread(chain.require_registered)
    except NotRegistered as exc:
        log.error(str(exc))
        sys.exit(EXIT_NOT_REGISTERED)
    uid = await asyncio.to_thread(chain.my_uid)
    assert uid is not None  # require_registered passed

    if not args.bucket_locator:
        log.error("no bucket: pass --bucket.locator (or set TEMPLAR_BUCKET); see docs/buckets.md")
        sys.exit(EXIT_CONFIG)
    try:
        locator = BucketLocator.parse(args.bucket_locator)
        credentials = (Credentials.from_file(args.bucket_credentials) if args.bucket_credentials
                       else Credentials.from_env())
    except (LocatorError, ValueError) as exc:
        log.error(f"bucket configuration: {exc}")
        sys.exit(EXIT_CONFIG)
    if locator.kind != "local" and credentials is None:
        log.error("no write key for the bucket: set TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET or pass "
                  "--bucket.credentials FILE (the committed locator carries only the read key)")
        sys.exit(EXIT_CONFIG)
    bucket = open_bucket(locator, credentials)
    committed = (await asyncio.to_thread(chain.bucket_locators)).get(chain.hotkey)
    if committed != locator.encode():
        log.info(f"committing bucket locator ({locator.kind}) on chain")
        try:
            await asyncio.to_thread(chain.commit_bucket, locator.encode())
        except ChainError as exc:
            log.error(f"could not commit the bucket locator: {exc}")
            sys.exit(EXIT_CONFIG)

    device = torch.device(args.device)
    model = build_model(hp, device)
    state_dir = args.state_dir or Path.home() / ".templar" / args.wallet_name / args.wallet_hotkey
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        pages = await open_reader(hp, args.data_cache_dir or state_dir / "data", locator=args.data_locator,
                                  prefix=args.data_prefix, cache_gb=args.data_cache_gb)
    except (ManifestError, LocatorError, StorageError) as exc:
        log.error(f"data: {exc}")
        sys.exit(EXIT_CONFIG)
    plan = PagePlan.build(pages.num_pages, hp.data.holdout_fraction, hp.data.data_seed, hp.data.pages_per_window)
    clock = Clock(hp.windows, chain.block, chain.block_timestamp)
    log.info(f"{role} uid {uid} ready: model {hp.name} on {device}, {pages.num_pages} pages, state in {state_dir}")
    return Node(hp=hp, chain=chain, clock=clock, uid=uid, model=model, pages=pages, plan=plan, bucket=bucket,
                state_dir=state_dir, device=device, args=args)
