"""Templar miner: train on your assigned pages, post compressed updates (SparseLoCo in production), earn by
improving the model.

    python neurons/miner.py --wallet.name W --wallet.hotkey H --netuid N --subtensor.network finney \
        --bucket.locator r2:... --device cuda
    torchrun --nproc_per_node 8 neurons/miner.py ...    # the same node over 8 GPUs (FSDP2; docs/mining.md §12)

See docs/mining.md for wallets, buckets (read-only keys on chain, write keys in the environment)
and what each log line means.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

# Transparent huge pages for torch's CPU allocator: 3-4x less page-fault time on large tensors
# (benchmarks/performance/compress.py). Must be set before torch is imported; harmless on GPU.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from templar.core.startup import libraries_loading
from templar.runtime.flags import add_memory_args, add_node_args, check_config, check_extra_pages


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Templar miner", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_node_args(parser)
    add_memory_args(parser)
    parser.add_argument("--extra-pages", type=int, default=0,
                        help="also train on this many more pages per window, declared in your payload: which pages "
                             "follows from the count (the same for every validator), validators check your work on "
                             "them like on your assigned pages, and proven extra work is paid: twice the pages "
                             "earns about 1.41x on production's rules (at most the run's data.max_extra_pages; docs/mining.md §10, "
                             "docs/scoring.md §4). Declaring pages you do not train pays less than not declaring")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if code := check_config(args) or check_extra_pages(args):  # before torch: answered in a second
        return code
    with libraries_loading():  # torch, transformers, the chain SDK: templar/core/startup.py
        from templar.distributed.launch import run_node  # one process, or this rank of a torchrun node
        from templar.miner.loop import Miner

    code = run_node(args, "miner", lambda node: Miner(node, extra_pages=args.extra_pages).run(args.windows))
    gc.freeze()  # exiting: spare the interpreter's last collection of torch's objects (seconds after stopping)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
