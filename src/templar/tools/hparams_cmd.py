"""`templar hparams [PRESET]`: validate a hyperparameter file and print the resolved settings."""

from __future__ import annotations

import argparse
import json

from templar.config import HParamsError, load_hparams


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("hparams", help="validate and print hyperparameters (a preset name or a path)")
    p.add_argument("hparams", nargs="?", default=None, help="preset name (tiny) or path; default hparams.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        hp = load_hparams(args.hparams)
    except HParamsError as exc:
        print(f"error: {exc}")
        return 2
    print(json.dumps({"digest": hp.digest(), **hp.model_dump()}, indent=2))
    return 0
