"""What miners and validators share: flags, start-up, peers' buckets, and shutdown.

A role builds a `Node` (registration check, own bucket committed, model and data ready), then
runs its own window loop. Nothing here knows about scoring or training strategy.

Library code raises: `start_node` raises a `StartupError` that carries the message and exit code
an operator should see; the entry points (`neurons/*.py`) print it and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from loguru import logger

from templar.chain import (
    VALIDATOR_LOCATOR_BYTES,
    Chain,
    ChainError,
    ChainUnavailable,
    Commitment,
    Neuron,
    NotRegistered,
    is_miner,
)
from templar.chain.flags import connect_from_args
from templar.core.clock import SYSTEM_TIME, TimeSource
from templar.core.config import HParams, HParamsError, load_hparams
from templar.core.log import UNCAUGHT, setup_logging, short
from templar.core.model import build_model, parameter_shapes
from templar.core.startup import OPEN_FILES_NEEDED, flushes_subnormals, raise_open_files_limit
from templar.data import ManifestError, PagePlan, PageReader
from templar.data.source import open_reader
from templar.runtime.compute import Compute, LocalCompute
from templar.runtime.consensus.succession import Lead, LeadHistory
from templar.runtime.consensus.windows import Clock
from templar.runtime.flags import (
    EXIT_CONFIG,
    EXIT_NOT_REGISTERED,
    EXIT_OWN_BUCKET,
    EXIT_STATE_DISK,
    EXIT_STATE_LOCKED,
    EXIT_UNEXPECTED,
    memory_settings,
    node_device,
    state_dir_of,
)
from templar.runtime.lock import StateDirLocked, StateLock
from templar.runtime.metrics import start_metrics
from templar.runtime.state import STATE_FILE, NodeState, StateWriteError
from templar.storage import Bucket, StorageError, open_bucket
from templar.storage.locator import (
    BucketLocator,
    Credentials,
    LocatorError,
    allows_private_endpoints,
    refuse_write_key,
)
from templar.storage.resolve import operator_proxies
from templar.wire import Run

WRITABLE_PROBE_KEY = "writable-check"

class NodeError(Exception):
    """A node cannot go on, for a reason its operator must fix. The message is meant for the
    operator (one line, no traceback); `exit_code` is what the entry point exits with."""

    exit_code = 1


class StartupError(NodeError):
    """A node cannot start: bad configuration, wallet, chain connection, bucket or data."""

    exit_code = EXIT_CONFIG


class NotRegisteredError(StartupError):
    exit_code = EXIT_NOT_REGISTERED


class DeregisteredError(NodeError):
    """Our hotkey no longer holds a uid on the subnet (the chain gave it to a new registration)."""

    exit_code = EXIT_NOT_REGISTERED


class StateLockedError(StartupError):
    """Another process runs a node on this state directory."""

    exit_code = EXIT_STATE_LOCKED


class StateDiskError(NodeError):
    """The node's state could not be written `MAX_FAILED_SAVES` times in a row."""

    exit_code = EXIT_STATE_DISK


MAX_FAILED_SAVES = 3
"""Windows in a row whose state could not be written before the node stops (`StateDiskError`)."""


class OwnBucketError(NodeError):
    """Our own bucket keeps refusing our writes at run time (a revoked key, a full or read-only
    bucket): uploading nothing, window after window, helps nobody."""

    exit_code = EXIT_OWN_BUCKET


T = TypeVar("T")


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
    compute: Compute
    """Everything computed on θ (`templar.runtime.compute`): `LocalCompute` for one process, the
    torchrun launcher's `NodeCompute` for a node over several ranks (set before the role starts)."""
    allow_private_endpoints: bool = False
    """Whether peers' buckets may be on loopback/private addresses or local directories: never on
    public networks (no SSRF into our LAN), always on the embedded chain (`allows_private_endpoints`)."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _peer_buckets: dict[str, tuple[str, Bucket]] = field(default_factory=dict)
    bucket_faults: dict[str, str] = field(default_factory=dict)
    """Why a peer's committed locator could not be opened, by hotkey (its gathers: `unreachable`)."""
    open_bucket: Callable[..., Bucket] = field(default=open_bucket, repr=False)
    """How this node opens a bucket, its own and its peers': `templar.storage.open_bucket` (a test
    puts a fault-injecting bucket around every bucket a node opens through this)."""
    state_lock: StateLock | None = None
    """This process's hold on `state_dir` (`templar.runtime.lock`), released by `aclose`."""
    shadow: bool = False
    """A validator's `--shadow`: it scores and reports as usual but writes nothing on chain (no
    weights, no bucket commitment), to try a machine next to the one that sets the weights."""
    record_evaluations: bool = False
    """A validator's `--record-evaluations`: every primary evaluation's units go to `evaluations.jsonl`."""
    failed_saves: int = 0
    leads: LeadHistory = field(default_factory=LeadHistory)
    """Who led the windows this node applied (`templar.runtime.consensus.succession`)."""
    _last_reads: dict[str, tuple[float, object]] = field(default_factory=dict, repr=False)
    """Each chain read's last answer and when (the node's clock): `_chain_read`'s fallback."""
    uid_followers: list[Callable[[int], None]] = field(default_factory=list, repr=False)
    """Called with the new uid when our hotkey is found on another (`check_registered`): what names this
    node by its uid outside the roles (the Prometheus exporter's `templar_info`)."""

    async def _chain_read(self, what: str, read: Callable[[], T]) -> T:
        """`read()` of the chain, off the event loop. When the endpoint does not answer
        (`ChainUnavailable`: a public endpoint reconnecting, a node restarting), its last answer if it
        is at most a window old, with one warning: an RPC hiccup degrades a window, never stops the
        node mid-window (it did: exit 1, and a lead lost its slot for the rest of the order's cadence)."""
        try:
            value = await asyncio.to_thread(read)
        except ChainUnavailable as exc:
            last = self._last_reads.get(what)
            age = None if last is None else self.clock.now() - last[0]
            if age is None or age > self.hp.windows.window_seconds:
                raise
            logger.bind(phase="chain").warning(f"{exc}; using the {what} read {age:.0f}s ago")
            return last[1]  # type: ignore[return-value]
        self._last_reads[what] = (self.clock.now(), value)
        return value

    async def window_checks(self) -> bool:
        """What a node checks once a window, before its work: this machine's clock against the chain's
        (`Clock.check_skew`) and its hotkey's uid (`check_registered`). True when the uid changed."""
        await asyncio.to_thread(self.clock.check_skew)
        return await self.check_registered()

    async def check_registered(self) -> bool:
        """Our hotkey still holds a uid, and it is `uid` (True: it changed); `DeregisteredError` when it
        holds none.

        Why each window, not once at start: a full subnet gives its lowest-ranked uid to each new
        registration. A node that lost its uid is scored by nobody and cannot set weights, and it went
        on for as long as it ran; a hotkey registered again holds another uid, and a miner still on the
        uid it read at start trained that uid's pages (its new holder's), failing every proof of work.
        A hotkey found without a uid is asked again a block later before the node stops (a read made
        while the chain swaps a uid's holder); a read without an answer leaves it to the next window."""
        log = logger.bind(phase="chain")
        try:
            uid = await asyncio.to_thread(self.chain.my_uid)
            if uid is None:
                await self.clock.sleep_until(self.clock.now() + self.hp.windows.block_time, self.stop)
                uid = await asyncio.to_thread(self.chain.my_uid)
        except ChainUnavailable as exc:  # unknown, not gone: asked again next window
            log.warning(f"{exc}; our uid is checked again next window")
            return False
        if uid is None:
            raise DeregisteredError(f"hotkey {self.hotkey} lost its uid {self.uid} on netuid {self.chain.netuid} (a new "
                                    "registration took it): register it again, then start the node")
        if uid != self.uid:
            log.warning(f"hotkey {self.hotkey} now holds uid {uid}, not {self.uid} (registered again): its pages and "
                        f"weights follow uid {uid} from this window")
            self.uid = uid
            for follow in self.uid_followers:
                follow(uid)
            return True
        return False

    def save_state(self, state: NodeState) -> bool:
        """A window's commit point: θ (and what the role keeps with it) in the state file. A local
        disk failure is one logged line and the node goes on (its state is rebuilt from the lead's
        checkpoint and aggregates after a restart); `MAX_FAILED_SAVES` in a row stop it
        (`StateDiskError`). True when the state was written."""
        try:
            self.compute.save_state(self.state_dir / STATE_FILE, state)
        except StateWriteError as exc:
            self.failed_saves += 1
            if self.failed_saves >= MAX_FAILED_SAVES:
                raise StateDiskError(f"{exc} ({self.failed_saves} windows in a row): free space or fix the "
                                     "directory, then start the node again") from exc
            logger.bind(window=state.window, phase="save").error(
                f"{exc} ({self.failed_saves}/{MAX_FAILED_SAVES} in a row); going on without it")
            return False
        self.failed_saves = 0
        return True

    @property
    def hotkey(self) -> str:
        return self.chain.hotkey

    @property
    def shapes(self) -> dict[str, torch.Size]:
        return parameter_shapes(self.model)

    @property
    def run(self) -> Run:
        """The run this node's signed objects belong to: our subnet and our hparams' digest."""
        return Run(self.chain.netuid, self.hp.digest())

    async def neurons(self) -> list[Neuron]:
        return await self._chain_read("metagraph", self.chain.metagraph)

    async def miners(self) -> dict[str, int]:
        """The subnet's miners but ourselves, hotkey → uid (`templar.chain.is_miner`)."""
        return {n.hotkey: n.uid for n in await self.neurons() if is_miner(n) and n.hotkey != self.hotkey}

    async def peer_buckets(self, hotkeys: list[str] | None = None) -> dict[str, Bucket]:
        """Readable buckets of registered hotkeys (all, or those named), from their commitments.

        A commitment that does not parse is ignored with a log line, never used to build a URL.
        """
        locators = await self._chain_read("commitments", self.chain.bucket_locators)
        await self._forget_uncommitted(locators)
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
                bucket = self.open_bucket(locator, allow_private=self.allow_private_endpoints)
            except Exception as exc:  # whatever a hostile commitment triggers is its owner's problem alone
                reason = f"bucket commitment unusable: {type(exc).__name__}: {str(exc)[:160]}"
                if self.bucket_faults.get(hotkey) != reason:
                    logger.warning(f"ignoring bucket of {short(hotkey)}: {reason}")
                self.bucket_faults[hotkey] = reason
                if (old := self._peer_buckets.pop(hotkey, None)) is not None:  # its commitment turned unusable
                    self.leads.rebind(hotkey, None)
                    await old[1].aclose()
                continue
            self.bucket_faults.pop(hotkey, None)
            # stored before the await below: a call meanwhile reuses it instead of opening (and leaking) another
            self._peer_buckets[hotkey] = (raw, bucket)
            if cached:
                self.leads.rebind(hotkey, bucket)  # before the old one closes: the windows it led read the new
                await cached[1].aclose()
            out[hotkey] = bucket
        return out

    async def _forget_uncommitted(self, locators: Mapping[str, str]) -> None:
        """Close and forget the buckets, and forget the faults, of hotkeys that no longer hold a commitment
        in `locators` (the chain names registered hotkeys only: a deregistered hotkey, or a uid that changed
        hands), as a changed commitment closes the bucket it replaces.

        Why: both caches are keyed by hotkey, and every hotkey that ever held a uid stayed in them, with
        its opened client (an S3 client and its connection pool, about 0.3 MiB) and its reason string, for
        as long as the node ran: one entry per registration, which a subnet's churn (or anyone paying to
        re-register hotkeys) grows without end. Now they hold at most the registered hotkeys."""
        for hotkey in [h for h in self.bucket_faults if h not in locators]:
            del self.bucket_faults[hotkey]
        for hotkey in [h for h in self._peer_buckets if h not in locators]:
            if (gone := self._peer_buckets.pop(hotkey, None)) is not None:  # (a call meanwhile may have)
                self.leads.rebind(hotkey, None)  # the windows it led: no bucket to read them at any more
                await gone[1].aclose()

    async def candidates(self) -> list[Lead]:
        """The succession order (`Chain.succession`) with each candidate's bucket (ours for us). A shadow
        reads its hotkey's as every other node does, from the chain: the live validator on the same
        hotkey publishes there, and the shadow's own bucket is nobody's (it holds no slot either)."""
        order = await self._chain_read("succession", self.chain.succession)
        ours = not self.shadow
        buckets = await self.peer_buckets([n.hotkey for n in order if n.hotkey != self.hotkey or not ours])
        return [Lead(n, self.bucket if ours and n.hotkey == self.hotkey else buckets.get(n.hotkey)) for n in order]

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
        if self.state_lock is not None:
            self.state_lock.release()


async def start_node(args: argparse.Namespace, role: str, *, time: TimeSource = SYSTEM_TIME,
                     configure_logging: bool = True, open_bucket: Callable[..., Bucket] = open_bucket) -> Node:
    """Registration check, bucket commitment, model and data, from the parsed node flags.

    Raises `StartupError` (configuration, code 3) or `NotRegisteredError` (code 2) with a message
    for the operator. `time` is where the node's "now" comes from (virtual in tests).
    `configure_logging=False` leaves the process's logging as it is (many nodes in one process).
    `open_bucket` opens every bucket the node uses (`Node.open_bucket`). `role` "validator" declares
    the hotkey a validator in its commitment (`templar.chain.is_miner`); any other commits its
    bucket as a miner's.
    """
    try:
        hp = load_hparams(args.hparams)
    except HParamsError as exc:
        raise StartupError(str(exc)) from exc
    if flushes_subnormals():
        raise StartupError("this process flushes subnormal floats to zero (a native library loaded into it was built "
                           "with -ffast-math): its arithmetic would differ from every other node's. Fix: rebuild "
                           "without -ffast-math or -funsafe-math-optimizations in CFLAGS (`./scripts/bootstrap.sh`)")
    try:
        chain = await asyncio.to_thread(connect_from_args, args, now=time.now)
    except (ChainError, OSError, ValueError) as exc:
        raise StartupError(f"cannot connect to the chain or load the wallet: {exc}") from exc
    if configure_logging:
        setup_logging(debug=args.logging_debug, json_lines=args.logging_json, logfile=args.logging_file,
                      hotkey=chain.hotkey)
    log = logger.bind(phase="startup")
    open_files, _ = raise_open_files_limit()
    if role == "validator" and 0 <= open_files < OPEN_FILES_NEEDED:
        log.warning(f"this process may open only {open_files} files (the hard limit, `ulimit -Hn`): a validator of a "
                    "full subnet holds several hundred at its peak, and past the limit every connection fails. Fix: "
                    f"raise it to {OPEN_FILES_NEEDED:,} or more (systemd LimitNOFILE=, docker --ulimit nofile=, "
                    "/etc/security/limits.conf)")
    log.info(f"[SYNC] Checking registration of {role} hotkey {chain.hotkey} on netuid {args.netuid}")
    try:
        uid = await asyncio.to_thread(chain.require_registered)
    except NotRegistered as exc:
        raise NotRegisteredError(str(exc)) from exc
    except ChainError as exc:
        raise StartupError(f"cannot read our registration: {exc}") from exc

    state_dir = state_dir_of(args)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = StateLock(state_dir)  # before anything in the directory is read or written
    except StateDirLocked as exc:
        raise StateLockedError(str(exc)) from exc
    except OSError as exc:
        raise StartupError(f"state directory {state_dir}: {exc.strerror or exc}") from exc
    shadow = bool(getattr(args, "shadow", False))
    if shadow:
        log.info("shadow mode (--shadow): scoring and reporting as usual; never setting weights or committing a "
                 "bucket locator on chain")
    try:
        try:  # the clock reads the head from its event loop: a follower thread keeps it (a real node only)
            await asyncio.to_thread(chain.follow_head)
        except ChainError as exc:
            raise StartupError(f"cannot read the chain's head: {exc}") from exc
        bucket = await _open_own_bucket(args, chain, time, open_bucket, commit=not shadow,
                                         validator=role == "validator")
        try:
            pages = await open_reader(hp, args.data_cache_dir or state_dir / "data", locator=args.data_locator,
                                      prefix=args.data_prefix, cache_gb=args.data_cache_gb)
        except (ManifestError, LocatorError, StorageError) as exc:
            await bucket.aclose()
            raise StartupError(f"data: {exc}") from exc
    except NodeError:
        lock.release()
        chain.close()  # (and its head follower)
        raise
    device = node_device(args.device)
    model = build_model(hp, device)
    memory = memory_settings(args)
    plan = PagePlan.build(pages.num_pages, hp.data.holdout_fraction, hp.data.data_seed, hp.data.pages_per_window,
                          hp.data.max_extra_pages)
    clock = Clock(hp.windows, chain.block, chain.block_timestamp, time)
    log.info(f"{role} uid {uid} ready: model {hp.name} on {device} (memory: {memory.name}), {pages.num_pages} pages, "
             f"state in {state_dir}")
    if not allows_private_endpoints(args.subtensor_network) and (proxies := operator_proxies()):
        shown = ", ".join(sorted(f"{host}:{port}" for host, port in proxies))
        log.warning(f"peers' buckets are read through the proxy ({shown}, HTTPS_PROXY): it resolves their names, so "
                    "refusing the private addresses a peer's name may point at is the proxy's to do. Fix: a proxy "
                    "that refuses them, or none")
    # a peer's local bucket answers by the same clock as ours (an S3 server by its own)
    return Node(hp=hp, chain=chain, clock=clock, uid=uid, model=model, pages=pages, plan=plan, bucket=bucket,
                state_dir=state_dir, device=device, compute=LocalCompute(model, hp, memory), state_lock=lock,
                allow_private_endpoints=allows_private_endpoints(args.subtensor_network),
                open_bucket=functools.partial(open_bucket, now=time.now), shadow=shadow,
                record_evaluations=bool(getattr(args, "record_evaluations", False)))


async def _open_own_bucket(args: argparse.Namespace, chain: Chain, time: TimeSource,
                           open_bucket: Callable[..., Bucket], *, commit: bool = True,
                           validator: bool = False) -> Bucket:
    """Our bucket, with its read locator committed on chain (write keys never leave this node) in a
    commitment that declares our role (a validator's, or a miner's); `commit=False` (shadow mode)
    leaves the chain's commitment as it is."""
    log = logger.bind(phase="startup")
    if not args.bucket_locator:
        raise StartupError("no bucket: pass --bucket.locator (or set TEMPLAR_BUCKET); see docs/buckets.md")
    try:
        locator = BucketLocator.parse(args.bucket_locator)
        credentials = (Credentials.from_file(args.bucket_credentials) if args.bucket_credentials
                       else Credentials.from_env())
        refuse_write_key(locator, credentials)  # the locator goes on chain, in public
    except (LocatorError, ValueError) as exc:
        raise StartupError(f"bucket configuration: {exc}") from exc
    wanted = Commitment(locator.encode(), validates=validator)
    try:
        if commit:  # (a shadow commits nothing)
            wanted.encode()
    except ValueError as exc:  # a validator's mark took the last bytes of a long locator
        raise StartupError(f"the bucket commitment: {exc}; a validator's locator has {VALIDATOR_LOCATOR_BYTES} of "
                           "the chain's bytes: use a shorter bucket name") from exc
    if locator.kind != "local" and credentials is None:
        raise StartupError("no write key for the bucket: set TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET or pass "
                           "--bucket.credentials FILE (the committed locator carries only the read key)")
    try:
        bucket = open_bucket(locator, credentials, own=True, now=time.now)
    except (LocatorError, StorageError, OSError) as exc:
        raise StartupError(f"bucket {locator.kind}: {exc}") from exc
    try:  # a bucket we cannot write to is found now, not one failed upload per window
        await bucket.put(WRITABLE_PROBE_KEY, b"ok", timeout=30.0)
        await bucket.delete(WRITABLE_PROBE_KEY, timeout=30.0)
    except StorageError as exc:
        await bucket.aclose()
        raise StartupError(f"our bucket ({locator.kind}) is not writable with our key: {exc}") from exc
    try:
        committed = (await asyncio.to_thread(chain.commitments)).get(chain.hotkey)
    except ChainError as exc:
        await bucket.aclose()
        raise StartupError(f"cannot read our bucket commitment: {exc}") from exc
    if committed != wanted and not commit:
        log.info(f"shadow mode: not committing our bucket locator ({locator.kind}); the chain keeps "
                 f"{'none' if committed is None else 'the one committed'} for this hotkey")
    elif committed != wanted:
        role = "validator" if validator else "miner"
        change = "" if committed is None or committed.validates == validator else (
            " (declaring this hotkey a validator: a commitment without the mark `v:` is a miner's)" if validator
            else " (this hotkey's commitment declared a validator: validators did not score it)")
        log.info(f"committing bucket locator ({locator.kind}) on chain as a {role}'s{change}")
        try:
            await asyncio.to_thread(chain.commit_bucket, locator.encode(), validator=validator)
        except ChainError as exc:
            raise StartupError(f"could not commit the bucket locator: {exc}") from exc
    return bucket


def run_node(args: argparse.Namespace, role: str, run: Callable[[Node], Awaitable[None]], *,
             attach: Callable[[Node], AbstractAsyncContextManager[None]] | None = None) -> int:
    """What a neuron's `main` does: start the node, run the role on it, close it. Returns the
    process exit code: 0, or a `NodeError`'s code after logging its message in one line (no
    traceback for what the operator must fix), or `EXIT_UNEXPECTED` after logging any other
    exception with its traceback (a bug). SIGINT/SIGTERM finish the current window, then stop.
    `attach`: entered once the node is started, around the role (torchrun: θ sharded over the
    node's ranks, see `templar.distributed.launch`)."""

    async def main() -> None:
        node = await start_node(args, role)
        node.install_signal_handlers()
        metrics = start_metrics(args, role=role, hotkey=node.hotkey, uid=node.uid, windows=node.hp.windows,
                                state_file=node.state_dir / STATE_FILE, shadow=node.shadow)
        if metrics is not None:
            node.uid_followers.append(metrics.follow_uid)
        try:
            async with attach(node) if attach is not None else nullcontext():
                await run(node)
        finally:
            if metrics is not None:
                metrics.close()
            await node.aclose()

    async def logged_main() -> None:
        # The error is written here, while the loop still owns SIGTERM: once `asyncio.run` closes
        # the loop the signal's default action is back, and under torchrun the SIGTERM that
        # follows a dead rank within 0.1 s would kill us before a line written after it.
        try:
            await main()
        except NodeError as exc:
            logger.error(str(exc))
            raise
        except Exception:  # a bug: its traceback, escaped like any logged one (templar.core.log)
            logger.opt(exception=True).critical(UNCAUGHT)
            raise

    try:
        asyncio.run(logged_main())
    except NodeError as exc:
        return exc.exit_code
    except Exception:  # logged above, with its traceback
        return EXIT_UNEXPECTED
    return 0
