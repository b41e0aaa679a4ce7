"""Templar validator: score miners with the Gauntlet incentive, set weights, keep the model in sync.

    python neurons/validator.py --wallet.name W --wallet.hotkey H --netuid N --subtensor.network finney \
        --bucket.locator r2:... --device cuda
    torchrun --nproc_per_node 8 neurons/validator.py ...    # the same node over 8 GPUs (FSDP2; docs/mining.md §12)

See docs/validating.md for stake, buckets, and how to read the score log.
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
from templar.runtime.flags import add_node_args, add_validator_args, check_config


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Templar validator",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_node_args(parser)
    add_validator_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if code := check_config(args):  # before torch: a bad --hparams is answered in a second
        return code
    with libraries_loading():  # torch, transformers, the chain SDK: templar/core/startup.py
        from templar.distributed.launch import run_node  # one process, or this rank of a torchrun node
        from templar.validator.loop import Validator

    code = run_node(args, "validator", lambda node: Validator(node).run(args.windows))
    gc.freeze()  # exiting: spare the interpreter's last collection of torch's objects (seconds after stopping)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
