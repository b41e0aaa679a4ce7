"""One node per state directory: an exclusive lock taken before any state is touched.

Two processes on one state directory would both append the same windows' records and replace each
other's state file (three windows recorded twice, in the fault that found it). The lock is an
advisory `flock` on `node.lock` in the directory: the kernel drops it when the process dies (even by
`kill -9`), so a crashed node never blocks its own restart, and a second process is refused at once
with the holder's pid in the message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "node.lock"


class StateDirLocked(Exception):
    """Another process holds the state directory; the message names it."""


def in_use(directory: Path, holder: str) -> str:
    """The one line that refuses a second node on `directory` (the lock's and the entry points' early
    question's alike)."""
    return (f"state directory {directory} is in use by another node (pid {holder}); one node per state "
            "directory (pass another --state.dir)")


def _holder(fd: int) -> str:
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"


def lock_holder(directory: Path) -> str | None:
    """The pid holding `directory`'s lock (as written in it), or None when no process holds it.

    Only a question: the entry points ask it before torch loads, so a second node on a directory is
    refused in about a second, not after 5 s of imports and a chain connection; `StateLock` is still
    what takes and holds the lock. Asking takes a shared lock for an instant, so only a process that
    starts on the same directory at that very instant could be refused for it, and of two nodes
    starting on one directory one must be refused anyway."""
    try:
        fd = os.open(directory / LOCK_FILE, os.O_RDONLY)
    except OSError:  # none yet, or unreadable: `StateLock` gives the answer, with its reason
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # closing drops the shared lock, if it was taken
    return None


class StateLock:
    """The held lock of one state directory (`release` it when the node closes)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise StateDirLocked(in_use(directory, holder)) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Give the directory up (closing the descriptor drops the lock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
