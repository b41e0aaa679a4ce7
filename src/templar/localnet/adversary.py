"""Entry point of an adversarial miner in the localnet (never used by a real miner):

    python -m templar.localnet.adversary --strategy copycat [neurons/miner.py's node flags]

It is the production miner with one `templar.localnet.adversaries` hook set in, so what the
localnet proves about adversaries it proves about the code real miners run.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from templar.core.startup import libraries_loading
from templar.localnet.behaviours import ADVERSARY_NAMES, declared_extra_pages
from templar.runtime.flags import add_node_args, check_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Templar localnet adversary (testing only)")
    add_node_args(parser)
    parser.add_argument("--strategy", required=True, choices=sorted(ADVERSARY_NAMES))
    parser.add_argument("--copy.hotkey", dest="copy_hotkey", default=None,
                        help="copycat/duplicate: the hotkey whose payload to re-post")
    parser.add_argument("--pool.uids", dest="pool_uids", default=None,
                        help="pooled: comma-separated uids of the operator's group (this miner's included)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if code := check_config(args):  # before torch: answered in a second, as neurons/miner.py does
        return code
    with libraries_loading():  # the hooks, torch, the miner: templar/core/startup.py
        from templar.localnet.adversaries import make_adversary
        from templar.miner.loop import Miner
        from templar.runtime.node import run_node

    pool = [int(u) for u in args.pool_uids.split(",")] if args.pool_uids else None
    hooks = make_adversary(args.strategy, target=args.copy_hotkey, pool=pool)
    return run_node(args, "miner", lambda node: Miner(
        node, extra_pages=declared_extra_pages(args.strategy, node.hp.data), hooks=hooks).run(args.windows))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
