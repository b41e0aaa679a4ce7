"""`templar hparams [PRESET]`: validate a hyperparameter file, print it and what a window costs
(compute, memory, network, and the object-store requests and their monthly bill)."""

from __future__ import annotations

import argparse
import json

from templar.core.config import HParamsError, load_hparams
from templar.tools.bucket_costs import cost_table, format_costs
from templar.tools.sizing import DEFAULT_MFU, format_sizing, ranks_table, window_sizing


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("hparams", help="validate and print hyperparameters (a preset name or a path), "
                              "with per-window sizing: tokens, FLOPs, H100 time, memory, network, disk")
    p.add_argument("hparams", nargs="?", default=None, help="preset name (tiny) or path; default hparams.json")
    p.add_argument("--mfu", type=float, default=DEFAULT_MFU, help="model FLOPs utilisation assumed for GPU time")
    p.add_argument("--json", action="store_true", help="one JSON object (settings and sizing) only")
    p.add_argument("--ranks", type=int, nargs="+", default=None, metavar="N",
                   help="print a miner's memory per GPU for this model, 8B and 70B LLaMA at N ranks (torchrun)")
    p.add_argument("--miners", type=int, default=240, help="miners on the subnet, for the object-store figures")
    p.add_argument("--validators", type=int, default=16, help="validators on the subnet, for the object-store figures")
    p.add_argument("--joins-per-day", type=float, default=10.0,
                   help="nodes a day that download the lead's checkpoint to join (the lead's egress)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        hp = load_hparams(args.hparams)
    except HParamsError as exc:
        print(f"error: {exc}")
        return 2
    if args.ranks:
        if any(n <= 0 for n in args.ranks):
            print("error: --ranks must be positive")
            return 2
        print(ranks_table(hp, args.ranks))
        return 0
    if args.miners < 1 or args.validators < 1 or args.joins_per_day < 0:
        print("error: --miners and --validators must be positive, --joins-per-day >= 0")
        return 2
    sizing = window_sizing(hp, mfu=args.mfu)
    costs = cost_table(hp, sizing, miners=args.miners, validators=args.validators, joins_per_day=args.joins_per_day)
    if args.json:
        print(json.dumps({"digest": hp.digest(), **hp.model_dump(), "sizing": sizing, "object_store": costs},
                         indent=2))
        return 0
    print(json.dumps({"digest": hp.digest(), **hp.model_dump()}, indent=2))
    print(f"\nper window ({hp.name}):\n{format_sizing(sizing)}")
    print(f"\n{format_costs(costs)}")
    return 0
