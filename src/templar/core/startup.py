"""A process's start-up: its libraries loaded with the cyclic garbage collector paused.

Importing torch, transformers and bittensor builds about 0.7 million objects that live as long as
the process. While that heap grows, the collector's full passes walk all of it again and again:
7-8 passes, 0.8-1.1 s of CPU in every node process, about a quarter of what its imports cost
(2026-12-01, the miner's imports: 3.28 s of CPU with the collector, 2.56 s without). Each later full
pass walked the whole heap again (0.23 s each). So an entry point loads its libraries inside
`libraries_loading()`: the collector is paused, and what the imports built is then frozen
(`gc.freeze`: moved to a permanent generation the collector never walks) before it resumes.

The cost: the cyclic garbage the imports leave (about 250 thousand small objects, 6 MB of resident
memory in a miner) stays for the process's life; collecting it first would cost 0.4 s.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def libraries_loading() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (a process's heavy imports), then freeze
    every object that exists and let the collector run again as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
