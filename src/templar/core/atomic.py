"""Files that survive `kill -9`: the one way this project replaces a file it must not lose.

`atomic_write` writes to a temporary name in the destination's directory (or a staging directory
on the same file system), fsyncs the file, renames it over the destination, then fsyncs the
directory so the rename itself is durable. A crash at any instant leaves either the previous
file or the new one, never a torn or empty one.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

Writer = Callable[[Path], None]
"""Writes the new content to the path it is given (e.g. `safetensors.torch.save_file`)."""


def fsync_dir(directory: Path) -> None:
    """Make a rename or creation in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, content: bytes | Writer, *, mode: int | None = None,
                 staging_dir: Path | None = None, stamp: float | None = None, create_only: bool = False) -> None:
    """Replace `path` with `content` (bytes, or a function writing the file) atomically.

    `mode`: permission bits for the new file, set before it becomes visible (0o600 for secrets).
    `staging_dir`: where the temporary file lives (same file system as `path`; default its
    directory). `stamp`: the modification time to give the file (unix seconds), set before the
    rename so no reader sees another one. `create_only`: never replace an existing `path`
    (`FileExistsError`): the whole file appears by a hard link, which fails if the name is taken,
    so the check and the write are one step (no other writer can slip in between).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir or path.parent
    tmp = staging / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        if isinstance(content, bytes | bytearray | memoryview):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
        else:
            content(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if stamp is not None:
            os.utime(tmp, (stamp, stamp))
        if create_only:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
