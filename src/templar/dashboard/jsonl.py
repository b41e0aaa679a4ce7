"""Incremental reading of an append-only JSONL file that another process is writing.

The roles append one fsynced line per record (`templar.runtime.records`), so a reader can see a line
that is still being written, and an operator may rotate or truncate the file. `JsonlTail`
remembers its byte offset and the file's identity, returns only records completed since the
last poll, and never raises on bad content: a torn last line waits for its newline, a line that
is not a JSON object is counted and skipped, a replaced or truncated file is read again from
the start.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_LINE_BYTES = 64 * 1024
"""A record is a few hundred bytes; anything longer is not one of ours and is skipped."""

MAX_READ_BYTES = 32 * 1024 * 1024
"""Bytes read per poll, so a huge file is caught up over several polls instead of one stall."""


@dataclass
class TailStatus:
    """What an operator should know about one file: present, how much was read, what was skipped."""

    path: Path
    exists: bool = False
    records: int = 0
    skipped: int = 0
    last_skip_reason: str = ""
    resets: int = 0
    pending_bytes: int = 0      # a torn last line waiting for its newline
    truncated_start: bool = False  # only the file's tail was read (JsonlTail.start_bytes)
    error: str = ""


@dataclass
class JsonlTail:
    """New complete JSON-object lines of `path` on each `poll()`."""

    path: Path
    start_bytes: int | None = None  # on first sight of a file, skip all but its last this many bytes
    status: TailStatus = field(init=False)
    _offset: int = 0
    _identity: tuple[int, int] | None = None
    _align: bool = False             # the offset may be mid-line: drop up to the first newline

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.status = TailStatus(self.path)

    def poll(self) -> tuple[list[dict], bool]:
        """(new records, whether the file was replaced or truncated so earlier records are void)."""
        status = self.status
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            status.exists, status.error = False, ""
            reset = self._identity is not None
            self._identity, self._offset = None, 0
            return [], reset
        except OSError as exc:
            status.error = f"cannot stat: {exc.strerror or exc}"
            return [], False
        status.exists = True
        identity = (st.st_dev, st.st_ino)
        reset = False
        if self._identity is not None and (identity != self._identity or st.st_size < self._offset):
            reset = True
            status.resets += 1
            status.records = 0
            self._offset = 0
        if (self._identity is None or reset) and self.start_bytes is not None and st.st_size > self.start_bytes:
            self._offset = st.st_size - self.start_bytes
            self._align = True
            status.truncated_start = True
        self._identity = identity
        if st.st_size == self._offset:
            return [], reset
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read(MAX_READ_BYTES)
        except OSError as exc:
            status.error = f"cannot read: {exc.strerror or exc}"
            return [], reset
        status.error = ""
        if self._align:
            first = chunk.find(b"\n")
            if first < 0:
                return [], reset
            self._offset += first + 1
            chunk = chunk[first + 1:]
            self._align = False
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) > MAX_LINE_BYTES:  # a line that will never be a record: skip past it
                self._offset += len(chunk)
                self._skip(f"line longer than {MAX_LINE_BYTES} bytes")
            status.pending_bytes = 0 if len(chunk) > MAX_LINE_BYTES else len(chunk)
            return [], reset
        complete = chunk[: end + 1]
        self._offset += len(complete)
        status.pending_bytes = len(chunk) - len(complete)
        records = []
        for line in complete.split(b"\n")[:-1]:
            record = self._parse(line)
            if record is not None:
                records.append(record)
        status.records += len(records)
        return records, reset

    def _parse(self, line: bytes) -> dict | None:
        if not line.strip():
            return None
        if len(line) > MAX_LINE_BYTES:
            self._skip(f"line longer than {MAX_LINE_BYTES} bytes")
            return None
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._skip("not valid JSON")
            return None
        if not isinstance(value, dict):
            self._skip("not a JSON object")
            return None
        return value

    def _skip(self, reason: str) -> None:
        self.status.skipped += 1
        self.status.last_skip_reason = reason
