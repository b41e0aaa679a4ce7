"""`Chain`: the project's one adapter over the bittensor 11 SDK.

Neurons see plain dataclasses (`Neuron`) and project exceptions; nothing from `bittensor`
leaks out. The same code runs against finney/test/a local node (`RpcSubstrate`) and the
embedded SQLite chain (`EmbeddedSubstrate`), so the SDK's intents, preflights and decoders are
exercised everywhere.

The API is blocking and thread-safe: neurons call it through `asyncio.to_thread`. Internally
one private event loop (a daemon thread) runs the SDK's async client; a lock serialises SDK
use, and every call runs under a deadline, so a dead endpoint surfaces as `ChainUnavailable`
instead of a hung thread. The chain's head, which a node's clock asks from its event loop, is
read by a follower thread on a second connection and only counted on by the caller (`Chain.block`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import bittensor as bt
from bittensor.sp_core import Keypair
from bittensor.wallet import Wallet
from loguru import logger

from templar.chain.embedded.store import BlockClock, Now
from templar.chain.embedded.substrate import EmbeddedSubstrate
from templar.chain.head import ChainHead, read_head
from templar.chain.sdk_errors import check_result, translate
from templar.chain.types import (
    ChainError,
    ChainUnavailable,
    Commitment,
    Neuron,
    NotRegistered,
    WeightsSettings,
    check_commitment,
    lead_of,
    succession_of,
)

T = TypeVar("T")
WalletLike = Wallet | bt.KeyedWallet  # an SDK Wallet, or any object carrying the three keypairs

NETWORKS = ("finney", "test", "local", "archive", "devnet")
EMBEDDED = "embedded"
EMBEDDED_LABEL = "ws://embedded.invalid"  # SDK label: keeps embedded caches apart from a real localnet
DEFAULT_WALLET_PATH = "~/.bittensor/wallets"

_READ_ONLY = "this Chain was opened read-only (no wallet); pass --wallet.name to act as a hotkey"


def verify_signature(hotkey_ss58: str, message: bytes, signature: bytes) -> bool:
    """True iff `signature` is `hotkey_ss58`'s sr25519 signature of `message`; never raises."""
    if not isinstance(hotkey_ss58, str) or not isinstance(message, bytes | bytearray):
        return False
    if not isinstance(signature, bytes | bytearray) or len(signature) not in (64, 65):
        return False
    try:
        return bool(Keypair(ss58_address=hotkey_ss58).verify(bytes(message), bytes(signature)))
    except (ValueError, TypeError):
        return False


def _dev_key_seed(key_seed: bytes, *parts: str) -> str:
    return "0x" + hashlib.blake2b("/".join(parts).encode(), key=key_seed[:64], digest_size=32).hexdigest()


def load_wallet(
    name: str, hotkey: str, path: str | Path = DEFAULT_WALLET_PATH, *, create: bool = False,
    key_seed: bytes | None = None,
) -> Wallet:
    """The SDK wallet `path/name/hotkeys/hotkey`; with `create`, missing keys are generated
    without a password (dev wallets only: never use `create` for keys that hold real TAO).

    `key_seed` (with `create`) derives missing keys from it and the wallet and hotkey names
    instead of the OS's randomness, so a localnet run with the same seed has the same hotkeys,
    hence the same evaluation draws (they are keyed hashes of hotkeys). Anyone who knows the seed
    has the keys: for throw-away dev chains only."""
    wallet = Wallet(name=name, hotkey=hotkey, path=str(Path(path).expanduser()))
    if create:
        # Another process may create the same key concurrently; whoever loses keeps the winner's.
        if not wallet.coldkeypub_file.exists_on_device():
            with contextlib.suppress(FileExistsError):
                if key_seed is None:
                    wallet.create_new_coldkey(use_password=False, overwrite=False, suppress=True)
                else:
                    wallet.regenerate_coldkey(seed=_dev_key_seed(key_seed, "coldkey", name), use_password=False,
                                              overwrite=False, suppress=True)
        if not wallet.hotkey_file.exists_on_device():
            with contextlib.suppress(FileExistsError):
                if key_seed is None:
                    wallet.create_new_hotkey(use_password=False, overwrite=False, suppress=True)
                else:
                    wallet.regenerate_hotkey(seed=_dev_key_seed(key_seed, "hotkey", name, hotkey),
                                             use_password=False, overwrite=False, suppress=True)
        wallet = Wallet(name=name, hotkey=hotkey, path=str(Path(path).expanduser()))
    for keyfile, what in (
        (wallet.hotkey_file, f"hotkey {hotkey!r}"),
        (wallet.coldkeypub_file, "coldkeypub.txt"),
    ):
        if not keyfile.exists_on_device():
            # what is missing only: how to create it depends on the network (the doctor's fix,
            # templar.doctor.context.Doctor.wallet_hint, and docs/mining.md §3 say it)
            raise ChainError(f"wallet {name!r} has no {what} under {wallet.path}")
    return wallet


class _Session:
    """One SDK connection on a private event loop, shared by every `Chain` built from it."""

    def __init__(
        self,
        network: str,
        *,
        substrate: Any = None,
        endpoint_pinned: bool = False,
        read_timeout: float = 30.0,
        write_timeout: float = 120.0,
    ) -> None:
        kwargs: dict[str, Any] = {"substrate": substrate}
        if endpoint_pinned:
            kwargs.update(fallback_endpoints=[], archive_endpoints=[])
        self.subtensor = bt.Subtensor(network, **kwargs)
        self._network, self._endpoint_pinned = network, endpoint_pinned
        self.endpoint = "embedded chain" if substrate is not None else self.subtensor.endpoint
        self.read_timeout, self.write_timeout = read_timeout, write_timeout
        self._client: bt.Client | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="templar-chain", daemon=True)
        self._thread.start()

    async def _open(self) -> bt.Client:
        return await self.subtensor  # async mode: connects on this loop, yields the async Client

    async def _with_client(self, fn: Callable[[bt.Client], Awaitable[T]], timeout: float) -> T:
        if self._client is None:
            self._client = await asyncio.wait_for(self._open(), timeout)
        return await asyncio.wait_for(fn(self._client), timeout)

    def call(self, what: str, fn: Callable[[bt.Client], Awaitable[T]], *, write: bool = False) -> T:
        """Run `fn(client)` on the loop under the read or write deadline; SDK errors translated."""
        timeout = self.write_timeout if write else self.read_timeout
        with self._lock:
            if self._loop.is_closed():
                raise ChainUnavailable(f"{what}: the chain connection is closed")
            future: Future = asyncio.run_coroutine_threadsafe(self._with_client(fn, timeout), self._loop)
            try:
                return future.result(timeout + 5.0)
            except TimeoutError as exc:
                future.cancel()
                raise ChainUnavailable(
                    f"{what}: no answer from {self.endpoint} within {timeout:.0f}s"
                ) from exc
            except Exception as exc:
                raise translate(what, exc, self.endpoint) from exc

    def twin(self) -> _Session:
        """A second connection to the same endpoint: the chain head's follower reads on it, so that it
        never waits behind this session's calls (a metagraph read, a weights write and its inclusion)."""
        return _Session(self._network, endpoint_pinned=self._endpoint_pinned, read_timeout=self.read_timeout,
                        write_timeout=self.write_timeout)

    @property
    def closed(self) -> bool:
        return self._loop.is_closed()

    def close(self) -> None:
        with self._lock:
            if self._loop.is_closed():
                return
            if self._client is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(5.0)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
            self._loop.close()


def _u16_fractions(values: object, n: int) -> list[float]:
    """`n` fractions from a chain vector of u16 values; anything malformed reads as zeros."""
    items = list(values) if isinstance(values, list | tuple) else []
    ok = all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535 for v in items)
    fractions = [v / 65535 for v in items] if ok else []
    return (fractions + [0.0] * n)[:n]


class Chain:
    """Our wallet's view of one subnet. Build with `templar.chain.connect(...)`."""

    def __init__(
        self,
        session: _Session,
        wallet: WalletLike | None,
        netuid: int,
        *,
        network: str,
        clock: BlockClock | None = None,
    ) -> None:
        self._session = session
        self._wallet = wallet
        self.netuid = netuid
        self.network = network
        self._clock = clock  # embedded chains: block number/time without a round trip
        self._block_time: float | None = clock.block_time if clock else None
        self._head = ChainHead(session, lambda: self.block_time)  # a real node's (`block`)
        # Public views only: reading addresses never unlocks (or prompts for) a key.
        self._hotkey: str | None = bt.public_view(wallet, "hotkey").ss58_address if wallet else None
        self._coldkey: str | None = bt.public_view(wallet, "coldkey").ss58_address if wallet else None

    def __repr__(self) -> str:
        return f"Chain(network={self.network!r}, netuid={self.netuid}, hotkey={self._hotkey})"

    @property
    def wallet(self) -> WalletLike:
        if self._wallet is None:
            raise ChainError(_READ_ONLY)
        return self._wallet

    @property
    def hotkey(self) -> str:
        """Our hotkey's ss58 address."""
        if self._hotkey is None:
            raise ChainError(_READ_ONLY)
        return self._hotkey

    @property
    def coldkey(self) -> str:
        """Our coldkey's ss58 address (from the public key file; never unlocks)."""
        if self._coldkey is None:
            raise ChainError(_READ_ONLY)
        return self._coldkey

    def for_wallet(self, wallet: WalletLike, *, netuid: int | None = None) -> Chain:
        """The same connection seen from another wallet and/or subnet (dev tooling).

        Any wallet-shaped object works (`coldkey`, `coldkeypub`, `hotkey` keypairs), e.g. dev
        keys built from `//Alice` for a local node."""
        return Chain(
            self._session,
            wallet,
            self.netuid if netuid is None else netuid,
            network=self.network,
            clock=self._clock,
        )

    def close(self) -> None:
        """Close the connection (shared with every `for_wallet` sibling of this chain) and its head follower's."""
        self._head.close()
        self._session.close()

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Callable[[bt.Client], Awaitable[T]], *, write: bool = False) -> T:
        return self._session.call(what, fn, write=write)

    # -- time --------------------------------------------------------------------------------

    @property
    def block_time(self) -> float:
        """Seconds per block (read once from the chain's slot duration)."""
        if self._block_time is None:
            self._block_time = float(self._call("read block time", lambda c: c.block_time()))
        return self._block_time

    def block(self) -> int:
        """The current block. Free on the embedded chain; on a node, counted on from the last head read
        (`templar.chain.head.ChainHead`: a follower thread's once a node starts it, `follow_head`)."""
        return self._clock.block() if self._clock is not None else self._head.block()

    def follow_head(self) -> None:
        """Start reading the head on a follower thread and a connection of its own, until `close`: for a
        long-running node, whose clock asks the block from its event loop. Nothing on the embedded chain
        (no round trip)."""
        if self._clock is None:
            self._head.follow()

    def block_timestamp(self, block: int) -> float:
        """Unix time of `block`: the chain's timestamp for past blocks, counted on from the last head read
        for later ones (`ChainHead.timestamp`)."""
        return self._clock.timestamp(block) if self._clock is not None else self._head.timestamp(block)

    def head(self) -> tuple[int, float]:
        """(the current block, its timestamp), read now (never cached): what a clock check needs."""
        if self._clock is not None:
            block = self._clock.block()
            return block, self._clock.timestamp(block)
        return self._call("read the chain head", read_head)

    # -- reads -------------------------------------------------------------------------------

    def weights_settings(self) -> WeightsSettings:
        """Our subnet's weight-setting hyperparameters (rate limit, commit-reveal, limits)."""
        names = ("WeightsSetRateLimit", "CommitRevealWeightsEnabled", "MinAllowedWeights", "MaxWeightsLimit", "Tempo")

        async def read(c: bt.Client) -> list[Any]:
            return list(await asyncio.gather(*(c.query(("SubtensorModule", n), [self.netuid]) for n in names)))

        rate, reveal, least, most, tempo = self._call("read the subnet's weight settings", read)
        if rate is None and tempo is None:
            raise ChainError(f"subnet {self.netuid} does not exist on {self.network}")
        return WeightsSettings(rate_limit=int(rate or 0), commit_reveal=bool(reveal),
                               min_allowed_weights=int(least or 0),
                               max_weight_fraction=(int(most) if most is not None else 65535) / 65535,
                               tempo=int(tempo or 0))

    def metagraph(self, *, validator_trust: bool = False) -> list[Neuron]:
        """Every neuron on our subnet, ordered by uid.

        Incentive, dividends, consensus and trust come with the runtime's metagraph record.
        vtrust is not in finney's record: it is read from storage only with
        `validator_trust=True` (one more read, for operators' tools; nodes do not need it).
        The embedded chain carries it in the record, so it is always filled there.
        """
        graph = self._call("read metagraph", lambda c: c.subnets.metagraph(self.netuid))
        if graph is None:
            raise ChainError(f"subnet {self.netuid} does not exist on {self.network}")
        price = graph.price or 1.0
        raw = getattr(graph, "raw", None)
        carried = raw.get("validator_trust") if isinstance(raw, dict) else None
        if carried is None and validator_trust:
            carried = self._validator_trust()
        vtrust = _u16_fractions(carried, len(graph.neurons))
        return [
            Neuron(
                uid=n.uid,
                hotkey=n.hotkey,
                coldkey=n.coldkey,
                stake=n.total_stake.rao / 1e9 * price,
                validator_permit=n.validator_permit,
                last_update=n.last_update,
                commitment=committed.locator if committed else None,
                incentive=n.incentive,
                dividends=n.dividends,
                consensus=n.consensus,
                trust=n.trust,
                validator_trust=vtrust[n.uid],
                emission=n.emission.rao / 1e9,
                validates=committed.validates if committed else False,
            )
            for n in graph.neurons
            for committed in [Commitment.read(n.commitment.value) if n.commitment else None]
        ]

    def _validator_trust(self) -> object:
        """Storage `ValidatorTrust[netuid]`, or None when the chain does not answer it.

        Display data: a failed read must never fail the metagraph read it decorates.
        """
        try:
            return self._call(
                "read validator trust", lambda c: c.query(("SubtensorModule", "ValidatorTrust"), [self.netuid])
            )
        except ChainError as exc:
            logger.debug(f"validator trust unavailable: {exc}")
            return None

    def my_uid(self) -> int | None:
        """Our hotkey's uid on the subnet, or None when it is not registered."""
        return self._call(
            "look up our uid", lambda c: c.neurons.uid(hotkey_ss58=self.hotkey, netuid=self.netuid)
        )

    def require_registered(self) -> int:
        """Our uid; raises `NotRegistered` naming the wallet, hotkey and netuid otherwise."""
        uid = self.my_uid()
        if uid is None:
            raise NotRegistered(
                f"hotkey {self.hotkey} (wallet {getattr(self.wallet, 'name', '?')!r}, "
                f"hotkey {getattr(self.wallet, 'hotkey_str', '?')!r}) "
                f"is not registered on netuid {self.netuid} of {self.network}; register it first "
                f"(`templar chain register` on a dev chain, `btcli subnets register` on a real one)"
            )
        return uid

    def commitments(self) -> dict[str, Commitment]:
        """Well-formed commitments of the currently registered hotkeys, keyed by hotkey."""
        records = self._call("read commitments", lambda c: c.subnets.commitments(self.netuid))
        out: dict[str, Commitment] = {}
        for hotkey, record in records.items():
            committed = Commitment.read(record.value)
            if record.uid is not None and committed is not None:
                out[str(hotkey)] = committed
        return out

    def bucket_locators(self) -> dict[str, str]:
        """The bucket locators the currently registered hotkeys committed, keyed by hotkey."""
        return {hotkey: committed.locator for hotkey, committed in self.commitments().items()}

    def current_weights(self) -> dict[int, dict[int, float]]:
        """`{validator_uid: {uid: fraction}}`, each row normalised to sum 1."""
        return self._call("read weights", lambda c: c.weights.weights(netuid=self.netuid))

    def lead_validator(self) -> Neuron | None:
        """The first of the succession order (`lead_of`), or None."""
        return lead_of(self.metagraph())

    def succession(self) -> list[Neuron]:
        """The validators able to lead, in the order they take over a window (`succession_of`)."""
        return succession_of(self.metagraph())

    # -- writes ------------------------------------------------------------------------------

    def commit_bucket(self, locator: str, *, validator: bool = False) -> None:
        """Publish `locator` as our commitment (printable ASCII, at most 128 bytes with its mark),
        declaring a validator when `validator` (`templar.chain.is_miner`)."""
        data = check_commitment(Commitment(locator, validator).encode())
        call = bt.calls.Commitments.set_commitment(
            netuid=self.netuid, info={"fields": [[{f"Raw{len(data)}": data}]]}
        )
        what = f"commit bucket locator on netuid {self.netuid}"
        result = self._call(
            what,
            lambda c: c.submit_call(call, self.wallet, signer="hotkey", wait_for_finalization=False),
            write=True,
        )
        check_result(what, result, self._session.endpoint)

    def set_weights(self, weights: Mapping[int, float]) -> None:
        """Set our weights (`{uid: weight}`, relative). Raises `RateLimited` when too soon.

        The SDK conforms them to the subnet (max-weight clip, u16 quantisation) and picks the
        plain or commit-reveal path. `ChainUnavailable` leaves the outcome unknown: the
        extrinsic may still land, so callers just retry at their next weights window."""
        if not weights:
            raise ValueError("set_weights needs at least one weight")
        for uid, weight in weights.items():
            if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
                raise ValueError(f"uids must be non-negative ints, got {uid!r}")
            if not (isinstance(weight, int | float) and math.isfinite(weight) and weight >= 0):
                raise ValueError(f"weight for uid {uid} must be finite and >= 0, got {weight!r}")
        if not any(weights.values()):
            raise ValueError("set_weights needs at least one positive weight")
        intent = bt.SetWeights(netuid=self.netuid, weights={int(u): float(w) for u, w in weights.items()})
        what = f"set weights on netuid {self.netuid}"
        result = self._call(
            what, lambda c: c.execute(intent, self.wallet, wait_for_finalization=False, retries=2), write=True
        )
        check_result(what, result, self._session.endpoint)

    def register(self) -> int:
        """Register our hotkey (burned registration, paid by our coldkey); returns our uid."""
        uid = self.my_uid()
        if uid is not None:
            return uid
        what = f"register {self.hotkey} on netuid {self.netuid}"
        result = self._call(
            what, lambda c: c.execute(bt.BurnedRegister(netuid=self.netuid), self.wallet), write=True
        )
        check_result(what, result, self._session.endpoint)
        return self.require_registered()

    def register_subnet(self) -> int:
        """Create a subnet owned by our coldkey (our hotkey becomes its uid 0); returns its netuid."""
        what = "register a subnet"
        result = self._call(what, lambda c: c.execute(bt.RegisterSubnet(), self.wallet), write=True)
        netuid = check_result(what, result, self._session.endpoint).data.get("netuid")
        if not isinstance(netuid, int):
            raise ChainError(f"{what}: the chain reported success but no NetworkAdded netuid")
        return netuid

    def add_stake(self, tao: float, hotkey: str | None = None) -> None:
        """Stake `tao` from our coldkey onto `hotkey` (ours by default) on this subnet: the chain lets
        any coldkey stake onto any registered hotkey."""
        if not (math.isfinite(tao) and tao > 0):
            raise ValueError(f"stake must be a positive amount of TAO, got {tao!r}")
        hotkey = hotkey or self.hotkey
        intent = bt.AddStake(
            hotkey_ss58=hotkey, netuid=self.netuid, amount_tao=bt.Balance.from_rao(round(tao * 1e9))
        )
        what = f"stake {tao} TAO on {hotkey}"
        check_result(
            what,
            self._call(what, lambda c: c.execute(intent, self.wallet), write=True),
            self._session.endpoint,
        )

    def sign(self, message: bytes) -> bytes:
        """Our hotkey's sr25519 signature of `message` (64 bytes)."""
        return bytes(self.wallet.hotkey.sign(bytes(message)))

    verify_signature = staticmethod(verify_signature)


def resolve_network(network: str, endpoint: str | None) -> tuple[str, str | None]:
    """(SDK network or ws URL, embedded file path or None) for the dotted flags' values."""
    if network == EMBEDDED:
        if not endpoint:
            raise ValueError(
                "--subtensor.network embedded needs --subtensor.chain_endpoint /path/to/chain.sqlite"
            )
        return EMBEDDED_LABEL, endpoint
    if endpoint and endpoint.startswith(("ws://", "wss://")):
        return endpoint, None  # an explicit endpoint wins over the network name, as in btcli
    if endpoint:
        raise ValueError(
            f"--subtensor.chain_endpoint {endpoint!r} must be a ws:// or wss:// URL "
            "(or a file path with --subtensor.network embedded)"
        )
    if network in NETWORKS or network.startswith(("ws://", "wss://")):
        return network, None
    raise ValueError(
        f"unknown network {network!r}: use one of {', '.join((*NETWORKS, EMBEDDED))} or ws://..."
    )


def connect(
    *,
    network: str,
    netuid: int,
    wallet_name: str | None = "default",
    wallet_hotkey: str = "default",
    wallet_path: str | Path = DEFAULT_WALLET_PATH,
    chain_endpoint: str | None = None,
    create_wallet: bool = False,
    read_timeout: float = 30.0,
    write_timeout: float = 120.0,
    now: Now = time.time,
) -> Chain:
    """A `Chain` for our wallet on `netuid` (read-only when `wallet_name` is None). Wallets are
    created (password-less) when missing only on the embedded network or with `create_wallet`.
    `now` overrides the embedded chain's time source (tests)."""
    sdk_network, embedded_path = resolve_network(network, chain_endpoint)
    wallet = (
        None
        if wallet_name is None
        else load_wallet(wallet_name, wallet_hotkey, wallet_path, create=create_wallet or bool(embedded_path))
    )
    substrate = EmbeddedSubstrate(embedded_path, now=now) if embedded_path else None
    session = _Session(
        sdk_network,
        substrate=substrate,
        endpoint_pinned=sdk_network.startswith("ws"),
        read_timeout=read_timeout,
        write_timeout=write_timeout,
    )
    return Chain(
        session,
        wallet,
        netuid,
        network=network if not embedded_path else f"embedded:{embedded_path}",
        clock=substrate.clock if substrate else None,
    )
