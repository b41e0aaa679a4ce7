"""Templar validator: score miners with the Gauntlet incentive, set weights, keep the model in sync.

    python neurons/validator.py --wallet.name W --wallet.hotkey H --netuid N --subtensor.network finney \
        --bucket.locator r2:... --device cuda

See docs/validating.md for stake, buckets, and how to read the score log.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

# Transparent huge pages for torch's CPU allocator: 3-4x less page-fault time on large tensors
# (benchmarks/compress.py). Must be set before torch is imported; harmless on GPU.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from templar.node import add_node_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Templar validator",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_node_args(parser)
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    from templar.metrics import start_metrics
    from templar.node import start_node
    from templar.validator.loop import Validator

    node = await start_node(args, "validator")
    node.install_signal_handlers()
    metrics = start_metrics(args, role="validator", hotkey=node.hotkey, uid=node.uid)
    try:
        await Validator(node).run()
    finally:
        if metrics is not None:
            metrics.close()
        await node.aclose()


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
