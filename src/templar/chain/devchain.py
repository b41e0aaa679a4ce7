"""Dev chains in one call: an embedded chain file, a subnet, and N registered, staked wallets.

Used by `templar chain init/register`, the localnet and integration tests:

    dev = create_dev_chain("/tmp/run/chain.sqlite", netuid=3, block_time=0.2,
                           hotkeys={"validator": 100.0, "miner1": 0, "miner2": 0},
                           wallet_path="/tmp/run/wallets")
    dev["miner1"].uid, dev["miner1"].hotkey          # also: uid, hotkey = dev["miner1"][:2]
    with dev.connect("validator") as chain:
        chain.set_weights({dev["miner1"].uid: 1.0})

By default every name is its own wallet (coldkey) with hotkey "default"; with
`wallet_name="localnet"` the names are hotkeys of that one wallet, as an operator running
several neurons from one coldkey would have them.

Subnet creation, registration and staking go through the real SDK intents (`RegisterSubnet`,
`BurnedRegister` via the MEV-shield path, `AddStake`). Only funding is a direct write: the
embedded faucet stands in for the `//Alice` transfers a local node would need.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from templar.chain.client import Chain, connect, load_wallet
from templar.chain.embedded.store import RAO_PER_TAO, ChainSpec, ChainStore, Now, neuron_rows, subnet_row
from templar.chain.embedded.substrate import create_chain
from templar.chain.types import ChainError

OWNER_WALLET = "owner"
FEE_HEADROOM_RAO = RAO_PER_TAO // 100  # faucet slack on top of burn + stake


class DevWallet(NamedTuple):
    """A registered dev hotkey: its uid and address first, then where its keys live."""

    uid: int
    hotkey: str
    coldkey: str
    wallet_name: str
    hotkey_name: str
    stake: float


@dataclass(frozen=True)
class DevChain(Mapping[str, DevWallet]):
    """A ready embedded chain: a mapping from each requested name to its `DevWallet`.

    `connect(name)` opens a `Chain` acting as that wallet (or as the owner, `"owner"`)."""

    path: Path
    netuid: int
    block_time: float
    wallet_path: Path
    owner: DevWallet
    wallets: dict[str, DevWallet] = field(default_factory=dict)

    def __getitem__(self, name: str) -> DevWallet:
        return self.wallets[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.wallets)

    def __len__(self) -> int:
        return len(self.wallets)

    def _wallet(self, name: str) -> DevWallet:
        return self.owner if name == OWNER_WALLET else self.wallets[name]

    def connect(self, name: str, *, now: Now = time.time, read_timeout: float = 30.0) -> Chain:
        wallet = self._wallet(name)
        return connect(
            network="embedded",
            chain_endpoint=str(self.path),
            netuid=self.netuid,
            wallet_name=wallet.wallet_name,
            wallet_hotkey=wallet.hotkey_name,
            wallet_path=self.wallet_path,
            now=now,
            read_timeout=read_timeout,
        )

    def fund(self, name: str, tao: float) -> None:
        """Dev faucet: credit `tao` free TAO to the coldkey behind `name`."""
        with ChainStore(self.path) as store:
            store.fund(self._wallet(name).coldkey, round(tao * RAO_PER_TAO))

    def flags(self, name: str) -> list[str]:
        """Command-line flags that point a neuron at this chain as `name`."""
        wallet = self._wallet(name)
        return [
            "--wallet.name",
            wallet.wallet_name,
            "--wallet.hotkey",
            wallet.hotkey_name,
            "--wallet.path",
            str(self.wallet_path),
            "--netuid",
            str(self.netuid),
            "--subtensor.network",
            "embedded",
            "--subtensor.chain_endpoint",
            str(self.path),
        ]


def ensure_subnet(
    path: str | Path,
    *,
    netuid: int,
    spec: ChainSpec,
    wallet_path: str | Path,
    owner: str = OWNER_WALLET,
    weights_rate_limit: int | None = None,
    key_seed: bytes | None = None,
    now: Now = time.time,
) -> DevWallet:
    """Create the chain file (genesis `spec`) and subnet `netuid` owned by wallet `owner`.

    Idempotent. `weights_rate_limit`, when given, is applied to the subnet whether it is new
    or not; the block time of an existing chain cannot change (it would move every block).
    """
    if spec.first_netuid != netuid:
        raise ValueError(f"spec.first_netuid ({spec.first_netuid}) must equal netuid ({netuid})")
    with create_chain(path, spec, now=now) as store:
        if abs(store.spec.block_time - spec.block_time) > 1e-9:
            raise ChainError(
                f"{store.path} already runs with block time {store.spec.block_time}s, not "
                f"{spec.block_time}s; delete the file to start a new chain"
            )
        load_wallet(owner, "default", wallet_path, create=True, key_seed=key_seed)
        with connect(
            network="embedded",
            chain_endpoint=str(store.path),
            netuid=netuid,
            wallet_name=owner,
            wallet_path=wallet_path,
            now=now,
        ) as chain:
            with store.read() as conn:
                subnet = subnet_row(conn, netuid)
            if subnet is None:
                store.fund(chain.coldkey, store.spec.subnet_lock_rao + FEE_HEADROOM_RAO)
                created = chain.register_subnet()
                if created != netuid:
                    raise ChainError(
                        f"{store.path} assigned netuid {created}, not {netuid}: the chain was "
                        f"created for netuid {store.spec.first_netuid}; use that or a new file"
                    )
            elif subnet.owner_coldkey != chain.coldkey:
                raise ChainError(
                    f"subnet {netuid} on {store.path} belongs to {subnet.owner_coldkey}, "
                    f"not to wallet {owner!r} ({chain.coldkey})"
                )
            if weights_rate_limit is not None:
                store.set_subnet_params(netuid, weights_rate_limit=weights_rate_limit)
            return DevWallet(0, chain.hotkey, chain.coldkey, owner, "default", 0.0)


def register_wallet(chain: Chain, store: ChainStore, *, stake: float = 0.0) -> DevWallet:
    """Fund (faucet), register and stake `chain`'s wallet until it holds at least `stake` TAO."""
    if stake < 0:
        raise ValueError("stake must be >= 0")
    with store.read() as conn:
        subnet = subnet_row(conn, chain.netuid)
        neurons = {n.hotkey: n for n in neuron_rows(conn, chain.netuid)}
    if subnet is None:
        raise ChainError(f"subnet {chain.netuid} does not exist on {store.path}; run `templar chain init`")
    current = neurons[chain.hotkey].stake if chain.hotkey in neurons else 0
    top_up = max(0, round(stake * RAO_PER_TAO) - current)
    burn = 0 if chain.hotkey in neurons else subnet.burn
    if burn + top_up:
        store.fund(chain.coldkey, burn + top_up + FEE_HEADROOM_RAO)
    uid = chain.register()
    if top_up:
        chain.add_stake(top_up / RAO_PER_TAO)
    wallet = chain.wallet
    return DevWallet(
        uid,
        chain.hotkey,
        chain.coldkey,
        getattr(wallet, "name", "?"),
        getattr(wallet, "hotkey_str", "?"),
        (current + top_up) / RAO_PER_TAO,
    )


def create_dev_chain(
    path: str | Path,
    *,
    netuid: int,
    hotkeys: Mapping[str, float],
    wallet_path: str | Path,
    block_time: float = 1.0,
    weights_rate_limit: int = 10,
    wallet_name: str | None = None,
    now: Now = time.time,
    key_seed: bytes | None = None,
    **spec: int,
) -> DevChain:
    """An embedded chain at `path` with subnet `netuid` and one registered hotkey per entry of
    `hotkeys` (`{name: stake in TAO}`; stake > 0 earns a validator permit), in uid order.

    Each name is its own wallet with hotkey "default", or, with `wallet_name`, a hotkey of that
    single wallet. Keys are created password-less under `wallet_path`. Idempotent: rerunning
    reuses what exists and only tops stake up. `key_seed`: keys derived from it (see
    `load_wallet`), for reproducible dev runs. Extra keyword arguments are `ChainSpec` fields
    (e.g. `max_validators=8`). Takes roughly 10-25 ms per hotkey.
    """
    if OWNER_WALLET in hotkeys or wallet_name == OWNER_WALLET:
        raise ValueError(f"{OWNER_WALLET!r} is reserved for the subnet owner's wallet")
    chain_spec = ChainSpec(
        block_time=block_time, first_netuid=netuid, weights_rate_limit=weights_rate_limit, **spec
    )
    owner = ensure_subnet(
        path,
        netuid=netuid,
        spec=chain_spec,
        wallet_path=wallet_path,
        weights_rate_limit=weights_rate_limit,
        now=now,
        key_seed=key_seed,
    )
    wallets: dict[str, DevWallet] = {}
    with (
        ChainStore(path, now=now) as store,
        connect(
            network="embedded",
            chain_endpoint=str(path),
            netuid=netuid,
            wallet_name=OWNER_WALLET,
            wallet_path=wallet_path,
            now=now,
        ) as session_chain,
    ):
        for name, stake in hotkeys.items():
            wallet = (
                load_wallet(name, "default", wallet_path, create=True, key_seed=key_seed)
                if wallet_name is None
                else load_wallet(wallet_name, name, wallet_path, create=True, key_seed=key_seed)
            )
            wallets[name] = register_wallet(session_chain.for_wallet(wallet), store, stake=stake)
    return DevChain(
        path=Path(path),
        netuid=netuid,
        block_time=block_time,
        wallet_path=Path(wallet_path),
        owner=owner,
        wallets=wallets,
    )
