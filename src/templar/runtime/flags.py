"""The flags every neuron takes, without torch, transformers or the model code.

Kept apart from `templar.runtime.node` so that `neurons/miner.py --help` answers in a fraction of
a second (the node's imports cost about 5 s of CPU) and entry points can parse and reject a
command line before loading anything heavy.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from loguru import logger

from templar.chain.flags import add_chain_args
from templar.core.config import DEFAULT_CACHE_GB, HParamsError, load_hparams
from templar.core.memory import CHECKPOINT_FLAG, OFFLOAD_FLAG, MemorySettings
from templar.runtime.lock import in_use, lock_holder
from templar.runtime.metrics import add_metrics_args

EXIT_UNEXPECTED = 1
EXIT_NOT_REGISTERED = 2
EXIT_CONFIG = 3
EXIT_OWN_BUCKET = 4
EXIT_STATE_LOCKED = 6
EXIT_STATE_DISK = 7
EXIT_HISTORY = 8
"""A neuron's exit codes: 1 a bug (an exception no code caught, logged with its traceback); for what
its operator must fix (`templar.runtime.node.NodeError`; 5 is
`templar.distributed.group.EXIT_RANK_LOST`): 2 not registered, 3 configuration, 4 our bucket
refuses writes, 6 another process holds the state directory, 7 the state directory cannot be
written, 8 a validator of the first slot whose published history it cannot restore or must not
overwrite. Each with its fix: docs/operating.md §8."""

AUTO_DEVICE = "auto"
"""`--device` default: the first CUDA device when there is one, else the CPU (`node_device`)."""


def add_node_args(parser: argparse.ArgumentParser) -> None:
    """Flags every neuron takes, in Bittensor's dotted style."""
    add_chain_args(parser)
    parser.add_argument("--hparams", default=None, help="preset name (tiny) or path; default hparams.json")
    parser.add_argument("--device", default=AUTO_DEVICE,
                        help="torch device (cuda, cuda:1, cpu); auto: cuda when available, else cpu")
    parser.add_argument("--state.dir", dest="state_dir", type=Path, default=None,
                        help="where this node keeps its resumable state (default ~/.templar/WALLET/HOTKEY)")
    parser.add_argument("--bucket.locator", dest="bucket_locator", default=os.getenv("TEMPLAR_BUCKET"),
                        help="read locator of this node's bucket, committed on chain "
                             "(local:/dir | s3:... | r2:...); env TEMPLAR_BUCKET")
    parser.add_argument("--bucket.credentials", dest="bucket_credentials", type=Path,
                        default=os.getenv("TEMPLAR_BUCKET_CREDENTIALS"),
                        help="JSON file with the bucket WRITE key (or env TEMPLAR_BUCKET_WRITE_KEY_ID/_SECRET)")
    parser.add_argument("--data.locator", dest="data_locator", default=os.getenv("TEMPLAR_DATA_BUCKET"),
                        help="read the run's corpus from this bucket locator or folder instead of hparams "
                             "data.corpus (a mirror; the pinned manifest digest still applies)")
    parser.add_argument("--data.prefix", dest="data_prefix", default=None,
                        help="key prefix of the corpus in --data.locator (default: hparams data.corpus_prefix)")
    parser.add_argument("--data.cache_gb", dest="data_cache_gb", type=float, default=DEFAULT_CACHE_GB,
                        help="cap on the on-disk page cache (least recently used pages evicted)")
    parser.add_argument("--data.cache_dir", dest="data_cache_dir", type=Path, default=None,
                        help="page cache folder (default STATE_DIR/data)")
    parser.add_argument("--windows", type=int, default=0, help="stop after this many windows (0: run forever)")
    parser.add_argument("--logging.debug", dest="logging_debug", action="store_true")
    parser.add_argument("--logging.json", dest="logging_json", action="store_true", help="JSON lines on stderr")
    parser.add_argument("--logging.file", dest="logging_file", type=Path, default=None)
    add_metrics_args(parser)  # --metrics.port / --metrics.host (templar.runtime.metrics; off by default)


def add_memory_args(parser: argparse.ArgumentParser) -> None:
    """A miner's memory settings (`templar.core.memory`): the node's own, not the run's; payloads
    and θ are bit-identical under every setting. `templar hparams` prints what each costs."""
    group = parser.add_argument_group("memory", "where the miner keeps its state (results are identical; "
                                      "`templar hparams` and docs/mining.md give each setting's memory and time)")
    group.add_argument(OFFLOAD_FLAG, dest="memory_offload", action="store_true",
                       help="keep the θ_t snapshot, the error feedback and the inner AdamW moments in (pinned) host "
                            "memory, streamed to the GPU per parameter group around the step that needs them")
    group.add_argument(CHECKPOINT_FLAG, dest="memory_checkpoint_activations", action="store_true",
                       help="keep only each decoder layer's input for the backward pass and recompute the layer "
                            "(about a third more training compute)")


def memory_settings(args: argparse.Namespace) -> MemorySettings:
    """The memory settings of the parsed flags (the default for a node without them: a validator)."""
    return MemorySettings(offload=bool(getattr(args, "memory_offload", False)),
                          checkpoint_activations=bool(getattr(args, "memory_checkpoint_activations", False)))


def add_validator_args(parser: argparse.ArgumentParser) -> None:
    """Flags only a validator takes."""
    parser.add_argument("--shadow", action="store_true",
                        help="score, publish records and metrics as usual, but never set weights or commit a "
                             "bucket locator on chain: to try a new machine beside the one that sets weights")
    parser.add_argument("--record-evaluations", dest="record_evaluations", action="store_true",
                        help="also write every unit of every primary evaluation to evaluations.jsonl in the state "
                             "directory (about 8 kB per evaluated peer in production: the evidence behind each μ; "
                             "localnets do, for the simulator's fit)")


def check_config(args: argparse.Namespace) -> int:
    """The exit code for what the command line alone shows is wrong (0: nothing), after one log
    line naming it. Entry points call this before the node's imports: an unreadable or invalid
    `--hparams`, a run whose corpus is not published yet, or a state directory another node holds, is
    answered in about a second (before the chain, the bucket and the lock) instead of
    after torch and the model code load (about 5 s of CPU). `start_node` checks the same again
    (and takes the lock); this only answers sooner."""
    try:
        hp = load_hparams(args.hparams)
    except HParamsError as exc:
        logger.error(str(exc))
        return EXIT_CONFIG
    if not hp.data.manifest:  # before the chain, the lock and the bucket: nothing on this machine to fix
        logger.error("data: this run's corpus is not published yet (hparams data.manifest is empty): nothing to fix "
                     "on this machine; the subnet owner publishes and pins it (docs/launch.md §11)")
        return EXIT_CONFIG
    if os.environ.get("RANK", "0") == "0":  # torchrun's other ranks take no lock: rank 0 holds the node's
        state_dir = state_dir_of(args)
        if (holder := lock_holder(state_dir)) is not None:
            logger.error(in_use(state_dir, holder))
            return EXIT_STATE_LOCKED
    return 0


def state_dir_of(args: argparse.Namespace) -> Path:
    """Where the node keeps its state: `--state.dir`, else ~/.templar/<wallet>/<hotkey>."""
    return args.state_dir or Path.home() / ".templar" / args.wallet_name / args.wallet_hotkey


def check_extra_pages(args: argparse.Namespace) -> int:
    """The miner's `--extra-pages` against the run's `data.max_extra_pages` (a payload declaring more
    is refused by every validator): the exit code and one log line when it is out of range, else 0."""
    allowed = load_hparams(args.hparams).data.max_extra_pages
    if not 0 <= args.extra_pages <= allowed:
        logger.error(f"--extra-pages {args.extra_pages}: this run allows 0 to {allowed} pages beyond the assigned "
                     "ones (hparams data.max_extra_pages)")
        return EXIT_CONFIG
    return 0


def node_device(flag: str):
    """The torch device `--device` names (`auto`: cuda when available, else cpu)."""
    import torch

    if flag == AUTO_DEVICE:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(flag)
