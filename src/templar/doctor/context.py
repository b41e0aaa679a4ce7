"""What the checks share: the node's flags, and what earlier checks found (hparams, wallet, chain,
registration, bucket), so each check is a small function and a later one can say "skipped: no
chain" instead of failing for an earlier check's reason."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from templar.chain import Chain, Commitment, Neuron
from templar.chain.embedded.store import Now
from templar.chain.flags import DEFAULT_WALLET_PATH
from templar.core.config import HParams
from templar.runtime.flags import state_dir_of
from templar.storage import Bucket
from templar.storage.locator import BucketLocator, Credentials, allows_private_endpoints


@dataclass
class Doctor:
    """One run of the checks for one node (`role`: miner or validator) with its usual flags.

    `now` is this machine's clock (the one the node's deadlines use); `chain_now` is the embedded
    chain's time source (None: the wall clock; tests give it an offset to fake a skewed clock).
    `timeout` bounds every request a check makes."""

    args: argparse.Namespace
    role: str
    timeout: float = 20.0
    now: Now = time.time
    chain_now: Now | None = None
    # found by the checks, in order
    hp: HParams | None = None
    sizing: dict[str, Any] | None = None
    wallet: Any = None
    chain: Chain | None = None
    uid: int | None = None
    neurons: list[Neuron] = field(default_factory=list)
    locator: BucketLocator | None = None
    credentials: Credentials | None = None
    committed: Commitment | None = None
    bucket: Bucket | None = None
    probe: tuple[str, bytes] | None = None
    """(key, bytes) of the probe object in our bucket, deleted when the checks end."""

    @property
    def network(self) -> str:
        return self.args.subtensor_network

    @property
    def public(self) -> bool:
        """Peers on this network refuse private endpoints (and so must we, reading them)."""
        return not allows_private_endpoints(self.network)

    @property
    def embedded(self) -> bool:
        return self.network == "embedded"

    @property
    def state_dir(self) -> Path:
        return state_dir_of(self.args)  # the node's own rule

    @property
    def hotkey(self) -> str | None:
        return self.chain.hotkey if self.chain is not None and self.wallet is not None else None

    def _btcli_wallet(self) -> str:
        """btcli's wallet flags for this node's wallet (its `--wallet-path` only when not the default)."""
        a = self.args
        path = Path(a.wallet_path).expanduser()
        custom = path != Path(DEFAULT_WALLET_PATH).expanduser()
        return f"-w {a.wallet_name} -H {a.wallet_hotkey}" + (f" --wallet-path {a.wallet_path}" if custom else "")

    def wallet_hint(self) -> str:
        """How to create this node's missing keys: the one recipe (docs/mining.md §3 says the same).
        A dev chain's wallets come from `templar chain register` (no password); elsewhere btcli
        creates a coldkey with its hotkey, or a hotkey for a coldkey already there."""
        a = self.args
        if self.embedded:
            return f"templar chain register --wallet.name {a.wallet_name} --wallet.hotkey {a.wallet_hotkey}"
        coldkey = Path(a.wallet_path).expanduser() / a.wallet_name / "coldkeypub.txt"
        if coldkey.exists():
            return f"btcli wallet new-hotkey {self._btcli_wallet()}"
        return f"btcli wallet create {self._btcli_wallet()}"

    def register_hint(self) -> str:
        """How to register this wallet's hotkey on this network."""
        a = self.args
        if self.embedded:
            return (f"templar chain register --wallet.name {a.wallet_name} --wallet.hotkey {a.wallet_hotkey} "
                    f"--subtensor.network embedded --subtensor.chain_endpoint {a.subtensor_chain_endpoint} "
                    f"--netuid {a.netuid}" + (" --stake 100" if self.role == "validator" else ""))
        return f"btcli subnets register --netuid {a.netuid} {self._btcli_wallet()} -n {self.network}"

    async def close(self) -> None:
        if self.bucket is not None:
            await self.bucket.aclose()
            self.bucket = None
        if self.chain is not None:
            self.chain.close()
            self.chain = None
