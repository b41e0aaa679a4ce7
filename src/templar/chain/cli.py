"""`templar chain`: create a dev chain, register wallets, and inspect a subnet.

    templar chain init --subtensor.chain_endpoint run/chain.sqlite --netuid 3 --block-time 1 [--tempo 360]
    templar chain register --wallet.name validator --stake 100 \\
        --subtensor.network embedded --subtensor.chain_endpoint run/chain.sqlite --netuid 3
    templar chain show --subtensor.network embedded --subtensor.chain_endpoint run/chain.sqlite [--json]

`show` never prints a secret: committed bucket locators carry read keys, so only their kind
and bucket are shown. What peers chose (a commitment is any printable ASCII) goes into the table
as plain `rich.text.Text`, never as rich markup (`_peer_text`).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from templar.chain.client import EMBEDDED
from templar.chain.devchain import OWNER_WALLET, ensure_subnet, register_wallet
from templar.chain.embedded.store import ChainSpec, ChainStore, subnet_row
from templar.chain.flags import add_chain_args, add_network_args, add_wallet_path_arg, connect_from_args
from templar.chain.types import ChainError, Neuron, is_miner
from templar.core.log import printable
from templar.storage.locator import redact_locator


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chain",
        help="dev chain setup and subnet inspection",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="chain_command", metavar="ACTION", required=True)

    init = commands.add_parser("init", help="create the embedded chain file, its subnet and owner wallet")
    add_network_args(init)
    add_wallet_path_arg(init)
    init.add_argument("--owner", default=OWNER_WALLET, help="wallet name of the subnet owner")
    init.add_argument(
        "--block-time",
        type=float,
        default=None,
        help="seconds per block, fixed when the file is created (default 1.0)",
    )
    init.add_argument(
        "--weights-rate-limit",
        type=int,
        default=None,
        help=f"blocks between two set_weights of one validator (new subnets: "
        f"{ChainSpec.weights_rate_limit}; omitted: unchanged)",
    )
    init.add_argument(
        "--tempo",
        type=int,
        default=None,
        help=f"blocks between two Yuma epochs of a new subnet (default {ChainSpec.tempo}, finney's; a "
        "rehearsal on fast blocks pays sooner with fewer)",
    )
    init.set_defaults(func=run_init, subtensor_network=EMBEDDED)

    reg = commands.add_parser(
        "register", help="register a wallet's hotkey (creating a dev wallet if missing)"
    )
    add_chain_args(reg)
    reg.add_argument(
        "--stake",
        type=float,
        default=0.0,
        help="TAO to stake on the hotkey (a validator permit needs stake > 0); on the embedded "
        "chain the wallet is topped up to this stake from the dev faucet",
    )
    reg.add_argument(
        "--create",
        action="store_true",
        help="create the wallet without a password if missing (implied on the embedded chain)",
    )
    reg.set_defaults(func=run_register)

    show = commands.add_parser("show", help="print the metagraph (with the last epoch's Yuma results) and current weights")
    add_chain_args(show)
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=run_show)


def _reported(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Chain and flag errors end the command with their message and exit code 1, no traceback."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (ChainError, ValueError) as exc:
            print(f"templar chain {args.chain_command}: {exc}", file=sys.stderr)
            return 1

    return wrapper


def _embedded_path(args: argparse.Namespace) -> str:
    if args.subtensor_network != EMBEDDED or not args.subtensor_chain_endpoint:
        raise ChainError("this needs --subtensor.network embedded and --subtensor.chain_endpoint PATH")
    return args.subtensor_chain_endpoint


@_reported
def run_init(args: argparse.Namespace) -> int:
    path = _embedded_path(args)
    block_time = args.block_time
    if block_time is None and Path(path).expanduser().is_file():
        with ChainStore(path) as existing:
            block_time = existing.spec.block_time
    spec = ChainSpec(block_time=block_time or 1.0, first_netuid=args.netuid,
                     **({"tempo": args.tempo} if args.tempo else {}))
    owner = ensure_subnet(
        path,
        netuid=args.netuid,
        spec=spec,
        wallet_path=args.wallet_path,
        owner=args.owner,
        weights_rate_limit=args.weights_rate_limit,
    )
    with ChainStore(path) as store, store.read() as conn:
        subnet = subnet_row(conn, args.netuid)
        print(
            f"embedded chain {store.path}: block {store.clock.block()}, block time {store.spec.block_time}s"
        )
    rate = subnet.weights_rate_limit if subnet else "?"
    print(
        f"subnet {args.netuid} owned by wallet {owner.wallet_name!r} (coldkey {owner.coldkey}); "
        f"weights rate limit {rate} blocks"
    )
    return 0


@_reported
def run_register(args: argparse.Namespace) -> int:
    with connect_from_args(args, create_wallet=args.create) as chain:
        if args.subtensor_network == EMBEDDED:
            with ChainStore(_embedded_path(args)) as store:
                wallet = register_wallet(chain, store, stake=args.stake)
            uid, stake = wallet.uid, wallet.stake
        else:
            uid = chain.register()
            if args.stake > 0:
                chain.add_stake(args.stake)
            stake = next((n.stake for n in chain.metagraph() if n.uid == uid), 0.0)
        print(
            f"wallet {args.wallet_name}/{args.wallet_hotkey} hotkey {chain.hotkey} is uid {uid} "
            f"on netuid {args.netuid} with stake {stake:g} TAO"
        )
    return 0


def _snapshot(args: argparse.Namespace) -> dict[str, Any]:
    with connect_from_args(args, read_only=True) as chain:
        block = chain.block()
        neurons: list[Neuron] = chain.metagraph(validator_trust=True)
        weights = chain.current_weights()
    return {
        "network": args.subtensor_network,
        "netuid": args.netuid,
        "block": block,
        "neurons": [
            {
                "uid": n.uid,
                "hotkey": n.hotkey,
                "coldkey": n.coldkey,
                "stake": n.stake,
                "validator_permit": n.validator_permit,
                "role": "miner" if is_miner(n) else "validator",
                "last_update": n.last_update,
                "bucket": redact_locator(n.commitment),
                "incentive": n.incentive,
                "dividends": n.dividends,
                "consensus": n.consensus,
                "trust": n.trust,
                "validator_trust": n.validator_trust,
                "emission": n.emission,
            }
            for n in neurons
        ],
        "weights": {str(v): {str(u): w for u, w in row.items()} for v, row in weights.items()},
    }


def _peer_text(value: str) -> Text:
    """A peer-chosen string as a table cell: rich reads `[...]` in a plain `str` cell as markup, so a
    commitment holding `[/]` crashed `show` (MarkupError) and `[link=...]` planted a hyperlink in the
    operator's terminal; a `Text` is shown as it is, and `printable` leaves no control character."""
    return Text(printable(value))


@_reported
def run_show(args: argparse.Namespace) -> int:
    snapshot = _snapshot(args)
    if args.json:
        json.dump(snapshot, sys.stdout, indent=2)
        print()
        return 0
    console = Console()
    table = Table(title=f"netuid {snapshot['netuid']} on {snapshot['network']} at block {snapshot['block']}")
    for column in ("uid", "hotkey", "stake (τ)", "permit", "role", "updated", "bucket"):
        table.add_column(column, justify="right" if column in ("uid", "stake (τ)", "updated") else "left")
    for n in snapshot["neurons"]:
        table.add_row(
            str(n["uid"]),
            _peer_text(n["hotkey"][:8] + "…"),
            f"{n['stake']:.3f}",
            "✓" if n["validator_permit"] else "",
            n["role"],
            str(n["last_update"]),
            _peer_text(n["bucket"]),
        )
    console.print(table)
    epoch = Table(title="last Yuma epoch (fractions; emission in α per epoch)")
    keys = ("incentive", "dividends", "consensus", "trust", "validator_trust")
    for column in ("uid", "incentive", "dividends", "consensus", "trust", "vtrust", "emission"):
        epoch.add_column(column, justify="right")
    for n in snapshot["neurons"]:
        epoch.add_row(str(n["uid"]), *(f"{n[k]:.4f}" for k in keys), f"{n['emission']:.3f}")
    console.print(epoch)
    weights = Table(title="current weights (validator uid -> uid: fraction)")
    weights.add_column("validator", justify="right")
    weights.add_column("weights")
    for validator, row in snapshot["weights"].items():
        top = sorted(row.items(), key=lambda kv: -kv[1])
        weights.add_row(
            validator, ", ".join(f"{u}: {w:.3f}" for u, w in top[:12]) + (" …" if len(top) > 12 else "")
        )
    console.print(weights if snapshot["weights"] else "no weights set yet")
    return 0
