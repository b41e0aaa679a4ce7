"""Templar miner: train on your assigned pages, post DeMo-compressed updates, earn by improving the model.

    python neurons/miner.py --wallet.name W --wallet.hotkey H --netuid N --subtensor.network finney \
        --bucket.locator r2:... --device cuda

See docs/mining.md for wallets, buckets (read-only keys on chain, write keys in the environment)
and what each log line means.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

# Transparent huge pages for torch's CPU allocator: 3-4x less page-fault time on large tensors
# (benchmarks/compress.py). Must be set before torch is imported; harmless on GPU.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from templar.miner.strategies import STRATEGIES, make_strategy
from templar.node import add_node_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Templar miner", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_node_args(parser)
    parser.add_argument("--extra-pages", type=int, default=0,
                        help="train on this many extra (unassigned) pages per window: more work, better rating")
    parser.add_argument("--strategy", default="honest", choices=sorted(STRATEGIES),
                        help="testing only: run an adversarial behaviour (the localnet uses this)")
    parser.add_argument("--copy.hotkey", dest="copy_hotkey", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    from templar.metrics import start_metrics
    from templar.miner.loop import Miner
    from templar.node import start_node

    node = await start_node(args, "miner")
    node.install_signal_handlers()
    metrics = start_metrics(args, role="miner", hotkey=node.hotkey, uid=node.uid)
    strategy = make_strategy(args.strategy, node.hp.data.pages_per_window, args.extra_pages)
    try:
        await Miner(node, strategy, copy_hotkey=args.copy_hotkey).run()
    finally:
        if metrics is not None:
            metrics.close()
        await node.aclose()


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
