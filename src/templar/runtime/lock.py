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


class StateLock:
    """The held lock of one state directory (`release` it when the node closes)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirLocked(f"state directory {directory} is in use by another node (pid {holder}); one "
                                 "node per state directory (pass another --state.dir)") from None
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
