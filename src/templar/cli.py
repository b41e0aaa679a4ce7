"""`templar` command line: one subcommand per tool; each lives in its own module.

A subcommand module exposes `register(subparsers) -> None`, adding a parser whose
`func(args) -> int` runs it. Modules are imported only when listed here.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from templar import __version__

SUBCOMMANDS: tuple[str, ...] = (
    "templar.tools.hparams_cmd",
    "templar.chain.cli",
    "templar.localnet.cli",
    "templar.dashboard.cli",
    "templar.data.cli",
    "templar.storage.cli",
    "templar.doctor.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="templar",
        description="Permissionless LLM pre-training on Bittensor: tools for miners, validators and operators.",
    )
    parser.add_argument("--version", action="version", version=f"templar {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
