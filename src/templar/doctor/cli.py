"""`templar doctor --role miner|validator [the node's flags]`: check a machine before it runs a node.

    templar doctor --role miner --wallet.name W --wallet.hotkey H --netuid N --subtensor.network finney \\
        --bucket.locator "$BUCKET" --hparams hparams.json [--json]

One line per check (ok / warning / failed / skipped) with the fix beneath each warning or failure;
exit code 1 when any check failed, 0 otherwise. `--json` prints one JSON object instead. Nothing is
changed on chain, and the only objects written are probes under `templar-probe/` in your own bucket,
deleted before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from templar.doctor.context import Doctor
from templar.doctor.result import Status, format_results
from templar.doctor.runner import ROLES, run_checks
from templar.runtime.flags import add_memory_args, add_node_args, add_validator_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="check wallet, chain, clock, bucket, data and GPU before running "
                                   "a node", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=ROLES, required=True, help="the node you are about to run")
    parser.add_argument("--json", action="store_true", help="one JSON object (for scripts)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per request a check makes")
    add_node_args(parser)
    add_memory_args(parser)  # the miner's: the GPU check sizes the node with them
    parser.add_argument("--extra-pages", type=int, default=0, help="the miner's own flag, accepted so that its "
                        "command line works here unchanged")
    add_validator_args(parser)  # the validator's own flags, likewise (--shadow: its locator is never committed)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from templar.core.log import setup_logging

    setup_logging(debug=args.logging_debug)
    results = asyncio.run(run_checks(Doctor(args=args, role=args.role, timeout=args.timeout)))
    bad = any(r.status == Status.FAILED for r in results)
    if args.json:
        print(json.dumps({"role": args.role, "ok": not bad, "checks": [r.to_json() for r in results]}, indent=2))
    else:
        print(format_results(results))
    return 1 if bad else 0
