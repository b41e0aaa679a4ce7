"""Append-only JSONL records that roles write for operators, the live view and the report.

One line per event, flushed at once, so a reader (or a `kill -9`) never sees half a record.
Readers skip a torn last line instead of failing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

SCORES_FILE = "scores.jsonl"
VALIDATOR_WINDOWS_FILE = "validator_windows.jsonl"
MINER_WINDOWS_FILE = "miner_windows.jsonl"


@dataclass(frozen=True)
class PeerScoreRecord:
    """A validator's verdict on one peer in one window (DESIGN §7, issue: explainable scores)."""

    window: int
    hotkey: str
    uid: int
    status: str               # ok | missing | late | early | malformed:<reason> | copy | desync | ...
    evaluated: bool           # primary evaluation ran this window
    sync_steps: float | None
    delta_assigned: float | None
    delta_rand: float | None
    mu: float
    rating: float
    score: float
    weight: float
    in_top_g: bool


@dataclass(frozen=True)
class ValidatorWindowRecord:
    window: int
    global_step: int
    learning_rate: float
    holdout_loss: float
    peers_aggregated: int
    gathered: int
    evaluated: int
    wall_seconds: float
    weights_set: bool
    gather_seconds: float | None = None  # the gather alone (absent in records of older versions)


@dataclass(frozen=True)
class MinerWindowRecord:
    window: int
    phase: str
    strategy: str
    global_step: int
    loss: float | None
    tokens_per_second: float
    pages: int
    uploaded: bool
    upload_bytes: int
    upload_seconds: float
    peers_aggregated: int
    overhead_share: float     # share of the window spent outside forward/backward


RecordListener = Callable[[Path, object], None]
_listeners: list[RecordListener] = []


def add_listener(listener: RecordListener) -> None:
    """Call `listener(path, record)` after every `append_record` in this process.

    This is how `templar.metrics` follows the roles without a line in their loops: every number
    it exports is already in a record. A listener must be quick and must not raise; if it does,
    the error is logged and the record still counts as written.
    """
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: RecordListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def append_record(path: Path, record: object) -> None:
    line = json.dumps(asdict(record) if hasattr(record, "__dataclass_fields__") else record, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    for listener in list(_listeners):
        try:
            listener(path, record)
        except Exception as exc:  # an exporter's bug must never stop a window
            from loguru import logger

            logger.warning(f"record listener {getattr(listener, '__name__', listener)!r} failed: {exc!r}")


def read_records(path: Path) -> Iterator[dict]:
    """Every complete record in `path` (none if it does not exist yet)."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a record still being written
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
