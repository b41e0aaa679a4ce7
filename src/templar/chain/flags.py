"""Bittensor-style chain flags (the v11 SDK parses none itself), with btcli's env fallbacks.

--wallet.name NAME          env BT_WALLET         (default "default")
--wallet.hotkey NAME        env BT_WALLET_HOTKEY  (default "default")
--wallet.path DIR           env BT_WALLET_PATH    (default ~/.bittensor/wallets)
--netuid N                  env BT_NETUID         (default 3, templar's netuid on finney)
--subtensor.network NET     env BT_NETWORK        finney | test | local | embedded | ws(s)://...
--subtensor.chain_endpoint  env BT_CHAIN_ENDPOINT a ws(s):// URL, or the chain file for `embedded`
"""

from __future__ import annotations

import argparse
import os
import time

from templar.chain.client import DEFAULT_WALLET_PATH, EMBEDDED, NETWORKS, Chain, connect
from templar.chain.embedded.store import Now

DEFAULT_NETUID = 3
DEFAULT_NETWORK = "finney"


def add_wallet_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--wallet.name",
        dest="wallet_name",
        default=os.getenv("BT_WALLET", "default"),
        help="wallet (coldkey) name; env BT_WALLET",
    )
    parser.add_argument(
        "--wallet.hotkey",
        dest="wallet_hotkey",
        default=os.getenv("BT_WALLET_HOTKEY", "default"),
        help="hotkey name inside the wallet; env BT_WALLET_HOTKEY",
    )
    add_wallet_path_arg(parser)


def add_wallet_path_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--wallet.path",
        dest="wallet_path",
        default=os.getenv("BT_WALLET_PATH", DEFAULT_WALLET_PATH),
        help="directory holding wallets; env BT_WALLET_PATH",
    )


def add_network_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--netuid",
        type=int,
        default=int(os.getenv("BT_NETUID", DEFAULT_NETUID)),
        help=f"subnet uid (default {DEFAULT_NETUID}); env BT_NETUID",
    )
    parser.add_argument(
        "--subtensor.network",
        dest="subtensor_network",
        default=os.getenv("BT_NETWORK", DEFAULT_NETWORK),
        help=f"{' | '.join((*NETWORKS[:3], EMBEDDED))} | ws(s)://host:port; env BT_NETWORK",
    )
    parser.add_argument(
        "--subtensor.chain_endpoint",
        dest="subtensor_chain_endpoint",
        default=os.getenv("BT_CHAIN_ENDPOINT"),
        help="ws(s):// endpoint overriding the network, or the chain file (.sqlite) "
        "for --subtensor.network embedded; env BT_CHAIN_ENDPOINT",
    )


def add_chain_args(parser: argparse.ArgumentParser) -> None:
    """Add the wallet, netuid and subtensor flags to `parser` (in their own help group)."""
    group = parser.add_argument_group("chain")
    add_wallet_args(group)
    add_network_args(group)


def connect_from_args(
    args: argparse.Namespace, *, create_wallet: bool = False, read_only: bool = False, now: Now = time.time
) -> Chain:
    """The `Chain` the parsed flags describe (`read_only`: no wallet is loaded or needed)."""
    return connect(
        network=args.subtensor_network,
        chain_endpoint=args.subtensor_chain_endpoint,
        netuid=args.netuid,
        wallet_name=None if read_only else args.wallet_name,
        wallet_hotkey=args.wallet_hotkey,
        wallet_path=args.wallet_path,
        create_wallet=create_wallet,
        now=now,
    )
