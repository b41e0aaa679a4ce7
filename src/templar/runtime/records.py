"""Append-only JSONL records that roles write for operators, the live view and the report.

One line per event, flushed at once, so a reader (or a `kill -9`) never sees half a record.
Readers skip a torn last line instead of failing.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

SCORES_FILE = "scores.jsonl"
VALIDATOR_WINDOWS_FILE = "validator_windows.jsonl"
MINER_WINDOWS_FILE = "miner_windows.jsonl"
WEIGHTS_FILE = "weights.jsonl"
EVALUATIONS_FILE = "evaluations.jsonl"

_TAIL_BLOCK = 1 << 16
"""Bytes `trim_records` reads at a time, from the end of a record file."""


@dataclass(frozen=True)
class PeerScoreRecord:
    """A validator's verdict on one peer in one window (docs/design.md §8: every score explained)."""

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
    paid_mu: float | None = None
    """μ as the score reads it (μ̃: start-up ramp, a declaring peer's cap, saturation at the run's paid level,
    docs/scoring.md §4); pay follows it, not `mu`, the EMA behind it. None in records written before it."""


@dataclass(frozen=True)
class EvaluationRecord:
    """Every unit of one primary evaluation, as the score book received it (`gauntlet.PrimaryResult`):
    a validator's `--record-evaluations` writes them to `evaluations.jsonl`, the evidence behind a μ
    and what `benchmarks/incentive/subnet_sim_fit.py` refits the simulator from. Non-finite δ are
    written as JSON's -Infinity (a unit the update broke)."""

    window: int
    hotkey: str
    uid: int
    delta_assigned: float
    delta_rand: float
    pages: list[float]          # δ of each evaluated assigned page
    units: list[float]          # δ of each position range of each evaluated sequence (assigned, then declared)
    random_units: list[float]   # the same of the random pages: the evaluation's noise per unit
    work: float                 # the declared work, in units of the assigned work
    declared_units: int         # how many of `units` (the last ones) are on declared pages


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
    lead: bool = False                   # this validator was the lead (it published the window)
    clip_norm: float | None = None       # the lead's ceiling on the step's clip level (None: the list's median)


@dataclass(frozen=True)
class WeightsRecord:
    """One attempt of a validator to set weights, or how a round of attempts ended
    (`templar.validator.weights`): what the chain said and what the node does next."""

    window: int               # the weights window whose scores these weights carry
    attempt: int              # 1 for the first try of the round
    outcome: str              # set | refused | gave_up | superseded | shadow (computed, not set: --shadow)
    reason: str               # "" when set; else a refusal code (templar.chain.types.Refused.reason) or "error"
    uids: int                 # uids weighted in this attempt
    block: int                # chain block at the attempt (-1 when unknown)
    detail: str               # the chain's words, clipped
    next: str                 # what the node will do next, for the operator


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
    tokens: int = 0           # tokens trained on this window (forward and backward)
    train_seconds: float = 0.0  # the window's training: forward, backward and inner optimizer steps
    utilisation: float = 0.0  # compute utilisation: train_seconds over the window's wall-clock seconds
    pace_seconds: float = 0.0  # its inner steps begun to done, page reads included (0: not trained): read back
    # at a restart, the pace the first window is judged by (`templar.miner.window.recorded_pace`)


RecordListener = Callable[[Path, object], None]
_listeners: list[RecordListener] = []


def add_listener(listener: RecordListener) -> None:
    """Call `listener(path, record)` after every `append_record` in this process.

    This is how `templar.runtime.metrics` follows the roles without a line in their loops: every number
    it exports is already in a record. A listener must be quick and must not raise; if it does,
    the error is logged and the record still counts as written.
    """
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener: RecordListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def append_record(path: Path, record: object) -> bool:
    """Append one record (flushed and fsynced) and tell the listeners; False, with one logged line,
    when the disk refuses it (full, a file-size limit, read-only): a record is the operator's view
    of a window, and losing one never stops the node."""
    line = json.dumps(asdict(record) if hasattr(record, "__dataclass_fields__") else record, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _append_whole(path, (line + "\n").encode())
    except OSError as exc:
        from loguru import logger

        logger.bind(phase="records").error(f"cannot append to {path}: errno {exc.errno} ({exc.strerror or exc}); "
                                           "this record is lost, the node goes on")
        return False
    for listener in list(_listeners):
        try:
            listener(path, record)
        except Exception as exc:  # an exporter's bug must never stop a window
            from loguru import logger

            logger.warning(f"record listener {getattr(listener, '__name__', listener)!r} failed: {exc!r}")
    return True


def _append_whole(path: Path, data: bytes) -> None:
    """Append `data` and fsync it, or leave the file as it was: a write the disk cut short (full, a
    size limit) is cut off again, else the next record would be glued to its fragment and both lost."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


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


def trim_records(path: Path, last_window: int) -> int:
    """Drop the records of windows after `last_window` (and a torn last line) from the end of `path`:
    they were appended for a window whose state never committed, and that window will be recorded
    again. Returns how many lines were dropped.

    Records are appended in window order, so those are the file's last lines: the file is read
    backwards from its end, up to its last complete record of a window <= `last_window`, and cut
    there (truncated in place and fsynced; a crash before the cut leaves the lines to the next
    restart). Why not the whole file: a 256-peer validator appends about 85 MB a day to
    `scores.jsonl` (rotating it is the operator's, docs/validating.md §7), and parsing all of it,
    then holding and rewriting it, at every restart cost seconds and hundreds of MB of memory per
    day of history. A line that does not parse before that record is left to the readers, which
    skip it (`read_records`)."""
    if not path.exists():
        return 0
    with open(path, "r+b") as f:
        cut = f.seek(0, os.SEEK_END)
        dropped = 0
        for start, line in _lines_from_end(f, cut):
            window = _window_of(line)
            if window is not None and window <= last_window:
                break
            cut, dropped = start, dropped + 1
        if dropped:
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())
    return dropped


def _lines_from_end(f: BinaryIO, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of the first `end` bytes of `f`, last line first; each line keeps its newline
    (the last one may have none: torn)."""
    data, position = b"", end
    while True:
        stop = len(data)
        while (newline := data.rfind(b"\n", 0, max(stop - 1, 0))) >= 0:
            yield position + newline + 1, data[newline + 1:stop]
            stop = newline + 1
        data = data[:stop]
        if position == 0:
            if data:
                yield 0, data
            return
        size = min(_TAIL_BLOCK, position)
        position -= size
        f.seek(position)
        data = f.read(size) + data


def newest_record(path: Path, wanted: Callable[[dict], bool], *, lines: int = 64) -> dict | None:
    """The newest complete record of `path` that `wanted` accepts, among its last `lines` lines (read
    backwards from the end: a record file grows by a line a window for as long as its node runs)."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        for count, (_, line) in enumerate(_lines_from_end(f, f.seek(0, os.SEEK_END))):
            if count >= lines:
                return None
            try:
                record = json.loads(line) if line.endswith(b"\n") else None
            except ValueError:  # not JSON, or not UTF-8
                continue
            if isinstance(record, dict) and wanted(record):
                return record
    return None


def _window_of(line: bytes) -> int | None:
    """The window of a complete record line; None for a torn line or one that is not a record."""
    if not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    window = record.get("window") if isinstance(record, dict) else None
    return window if isinstance(window, int) else None


def drop_uncommitted_records(state_dir: Path, names: list[str], last_window: int) -> None:
    """At a restart: `trim_records` on each of a node's record files, with one log line saying
    what was dropped (nothing is logged when the records and the state already agree)."""
    from loguru import logger

    dropped = {}
    for name in names:
        try:
            dropped[name] = trim_records(state_dir / name, last_window)
        except OSError as exc:  # as an append that fails: the records are the operator's view, never the node's
            logger.bind(phase="startup").error(
                f"cannot drop the uncommitted records of {state_dir / name}: errno {exc.errno} ({exc.strerror or exc}); "
                "windows after the state's may be recorded twice there. Fix: make the file writable by this user")
    if any(dropped.values()):
        logger.bind(phase="startup").info(
            "[SYNC] dropped records of windows after the restored state's window "
            f"{last_window} (written before a crash, never committed): "
            + ", ".join(f"{name} {n}" for name, n in dropped.items() if n))
