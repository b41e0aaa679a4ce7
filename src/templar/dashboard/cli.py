"""`templar dashboard`: serve the operator's live view on 127.0.0.1.

    templar dashboard --localnet localnet/
    templar dashboard --validator.dir ~/.templar/W/H --subtensor.network finney --netuid 3
    templar dashboard --miner.dir ~/.templar/W/M --subtensor.network test --netuid 268 --port 9000

It reads only what already exists (state dirs, a localnet directory, the chain), writes nothing,
and never shows a secret. With `--localnet` and no chain flags it opens the localnet's embedded
chain (netuid 1) and its preset for the window length.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

from templar.chain.flags import DEFAULT_NETUID, DEFAULT_NETWORK, add_network_args


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard", help="the operator's live web view (local, read-only) of a subnet, validator or miner",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--localnet", type=Path, default=None, metavar="DIR",
                   help="a `templar localnet --out` directory: its nodes, state dirs and chain")
    p.add_argument("--validator.dir", dest="validator_dirs", type=Path, action="append", default=[],
                   metavar="DIR", help="a validator's --state.dir (repeatable); the first is shown by default")
    p.add_argument("--miner.dir", dest="miner_dirs", type=Path, action="append", default=[], metavar="DIR",
                   help="a miner's --state.dir (repeatable)")
    add_network_args(p)
    p.set_defaults(netuid=None, subtensor_network=None)
    p.add_argument("--no-chain", action="store_true", help="do not read the chain (files only)")
    p.add_argument("--chain-interval", type=float, default=None, metavar="S",
                   help="seconds between two chain reads (default: one block, at least 2 s)")
    p.add_argument("--hparams", default=None,
                   help="preset name or path, for the window length (default: the localnet's, else hparams.json)")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8787; 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding to a non-loopback address (no authentication: prefer an SSH tunnel)")
    p.set_defaults(func=run)


def localnet_hparams(out: Path) -> str:
    """The preset a localnet ran with: its own hparams.json (--seed) or tiny."""
    return str(out / "hparams.json") if (out / "hparams.json").is_file() else "tiny"


def board_config(args: argparse.Namespace):
    """The `BoardConfig` the parsed flags describe (raises ValueError on a bad combination)."""
    from templar.chain import connect
    from templar.core.config import load_hparams
    from templar.dashboard.board import BoardConfig

    hp = load_hparams(args.hparams or (localnet_hparams(args.localnet) if args.localnet else None))
    network = args.subtensor_network
    endpoint = args.subtensor_chain_endpoint
    netuid = args.netuid
    if args.localnet and network is None and endpoint is None:
        from templar.runtime.roster import CHAIN_FILE, NETUID

        network, endpoint = "embedded", str(args.localnet / CHAIN_FILE)
        netuid = NETUID if netuid is None else netuid
    network = network or os.getenv("BT_NETWORK", DEFAULT_NETWORK)
    netuid = int(os.getenv("BT_NETUID", DEFAULT_NETUID)) if netuid is None else netuid
    interval = args.chain_interval or max(2.0, hp.windows.block_time if network == "embedded" else 12.0)
    connector = None
    label = ""
    if not args.no_chain:
        if network == "embedded" and not endpoint:
            raise ValueError("--subtensor.network embedded needs --subtensor.chain_endpoint PATH")
        connector = partial(connect, network=network, chain_endpoint=endpoint, netuid=netuid, wallet_name=None,
                            read_timeout=10.0)
        label = f"{network} netuid {netuid}"
    return BoardConfig(localnet=args.localnet, validator_dirs=list(args.validator_dirs),
                       miner_dirs=list(args.miner_dirs), connect=connector, chain_label=label,
                       chain_interval=interval, blocks_per_window=hp.windows.blocks_per_window,
                       hparams_name=hp.name, window_seconds=hp.windows.blocks_per_window * hp.windows.block_time,
                       windows_per_weights=hp.windows.windows_per_weights)


def run(args: argparse.Namespace) -> int:
    from templar.core.config import HParamsError
    from templar.core.log import setup_logging
    from templar.dashboard.board import Board
    from templar.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, BindError, serve

    setup_logging()
    try:
        config = board_config(args)
        serve(Board(config), args.host or DEFAULT_HOST, DEFAULT_PORT if args.port is None else args.port,
              allow_remote=args.allow_remote)
    except (BindError, HParamsError, ValueError) as exc:
        print(f"templar dashboard: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
