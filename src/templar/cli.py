"""`templar` command line: one subcommand per tool; each lives in its own module.

A subcommand module exposes `register(subparsers) -> None`, adding a parser whose
`func(args) -> int` runs it. Only the module of the command being run is imported (a module
imports what its command needs: torch, the chain SDK, the S3 client), so `templar bucket locator`
starts in a fraction of a second instead of paying for every other command's imports; `templar
--help` imports them all to list them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from templar import __version__
from templar.core.startup import libraries_loading

SUBCOMMANDS: dict[str, str] = {
    "hparams": "templar.tools.hparams_cmd",
    "chain": "templar.chain.cli",
    "localnet": "templar.localnet.cli",
    "dashboard": "templar.dashboard.cli",
    "data": "templar.data.cli",
    "bucket": "templar.storage.cli",
    "s3": "templar.storage.server_cli",
    "doctor": "templar.doctor.cli",
}
"""Command name -> the module that registers it."""


def _command(argv: list[str]) -> str | None:
    """The subcommand `argv` names (its first word that is not an option), if it is one of ours."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in SUBCOMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: the named command's module only, or every module (help, errors, or
    `argv=None`)."""
    parser = argparse.ArgumentParser(
        prog="templar",
        description="Permissionless LLM pre-training on Bittensor: tools for miners, validators and operators.",
    )
    parser.add_argument("--version", action="version", version=f"templar {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = _command(argv) if argv is not None else None
    for name, module in SUBCOMMANDS.items():
        if wanted is None or name == wanted:
            importlib.import_module(module).register(subparsers)
        else:
            subparsers.add_parser(name)  # listed, not loaded: only `wanted` can run
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with libraries_loading():  # the command's module and what it loads (templar/core/startup.py)
        parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
