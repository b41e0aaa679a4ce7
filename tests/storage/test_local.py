"""`LocalBucket` against what a hostile peer can plant in its directory (localnets only: public
networks refuse `local:` locators)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from templar.storage import LocalBucket, ObjectNotFound


def _release(fifo: Path) -> None:
    """Open the FIFO's write end once, so a reader stuck opening it (the bug) gets to go."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_or_a_directory_at_a_key_is_no_object(tmp_path: Path) -> None:
    """Opening a FIFO waits for a writer in a worker thread that no timeout stops: each read cost the
    node an executor thread for good, and `asyncio.run` then waited for it forever at exit."""
    root = tmp_path / "peer"
    (root / "v1" / "dir").mkdir(parents=True)
    fifo = root / "v1" / "fifo"
    os.mkfifo(fifo)

    async def body() -> None:
        bucket = LocalBucket(root, create=False)
        for key in ("v1/fifo", "v1/dir"):
            with pytest.raises(ObjectNotFound):
                await bucket.get(key, max_bytes=10, timeout=2.0)
            with pytest.raises(ObjectNotFound):
                await bucket.get_range(key, 0, 4, timeout=2.0)
            with pytest.raises(ObjectNotFound):
                await bucket.head(key, timeout=2.0)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(body())
    finally:
        _release(fifo)
        loop.close()
