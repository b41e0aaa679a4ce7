"""A process's start-up: its libraries loaded with the cyclic garbage collector paused, and room for
the files and sockets a node keeps open (`raise_open_files_limit`).

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
import sys
from collections.abc import Iterator
from contextlib import contextmanager

OPEN_FILES_WANTED = 65_536
"""The soft limit on open files a node asks for (within the hard limit the operator allows)."""
_MACOS_OPEN_MAX = 10_240  # OPEN_MAX: the most macOS's setrlimit takes under an unlimited hard limit
_MACOS_UNLIMITED = 2**63 - 1  # macOS's RLIM_INFINITY
OPEN_FILES_NEEDED = 4_096
"""Below this a node warns: a validator of a full subnet (256 uids) opens a connection to every
miner's bucket at once when it reads their commitments, and while a name is looked up a socket
more, beside its own files, its data and the chain's connection: 265 files at the peak for 256 peers
(counted: `benchmarks.performance.open_files`, one socket per peer), with room to spare."""


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


def flushes_subnormals() -> bool:
    """Whether this process's CPU flushes subnormal floats to zero (x86's FTZ/DAZ bits). A native library
    built with `-ffast-math` sets them for the whole process when it loads (`crtfastmath.o`), and then
    every float the node computes near zero, torch's included, differs from every other node's. The
    operands are made at run time, so the compiler folds nothing."""
    smallest, small, tenth = float("5e-324"), float("1e-308"), float("0.1")
    return smallest * 1.0 == 0.0 or small * tenth == 0.0


def open_files_target(soft: int, hard: int, wanted: int = OPEN_FILES_WANTED, platform: str = sys.platform) -> int:
    """The soft limit a node sets, from the process's (soft, hard) limits: `wanted`, within the hard
    limit, and never lower than the soft limit already is. Linux writes "unlimited" as -1
    (`resource.RLIM_INFINITY`); where it is a huge number instead, the same arithmetic holds. macOS
    takes no soft limit over OPEN_MAX (10,240) under an unlimited hard one, so that is what a node gets
    there (and what `templar doctor` reports)."""
    if soft < 0:
        return soft  # unlimited already
    target = max(soft, wanted if hard < 0 else min(wanted, hard))
    if platform == "darwin" and (hard < 0 or hard >= _MACOS_UNLIMITED):
        target = max(soft, min(target, _MACOS_OPEN_MAX))
    return target


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> tuple[int, int]:
    """Raise this process's soft limit on open files to `wanted`, or to the hard limit if that is lower,
    as Go does for every program it starts. The usual soft limit, 1,024, leaves a validator of a full
    subnet little room (`OPEN_FILES_NEEDED`), and running out fails every open at once: connections to
    honest peers (scored unreachable), the state save, the log. Returns (soft, hard) afterwards;
    (-1, -1) where the platform has no such limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = open_files_target(soft, hard, wanted)
    for limit in dict.fromkeys((target, min(target, _MACOS_OPEN_MAX))):
        if limit <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            soft = limit
            break
        except (ValueError, OSError):  # macOS refuses a soft limit over OPEN_MAX under an unlimited hard one
            continue
    return soft, hard
