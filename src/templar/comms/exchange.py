"""Small records of the run, published by the lead validator: peer lists, aggregates, start window.

Records are bounded JSON checked against strict schemas (hivemind's habit: `3.0` is not an int,
unknown fields are errors). A malformed record raises `RecordError` (a `ValueError`) so the
caller can tell "the lead published garbage" from "nothing published yet" (None).
"""

from __future__ import annotations

import itertools
import json
from typing import Annotated, Any, Literal

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from templar.comms.keys import (
    aggregate_key,
    inputs_key,
    peers_index_key,
    peers_key,
    peers_prefix,
    start_window_key,
    window_of,
)
from templar.core.config import PROTOCOL_VERSION
from templar.storage.base import DEFAULT_TIMEOUT, Bucket, ObjectExists, ObjectNotFound
from templar.wire import Run

MAX_RECORD_BYTES = 64 << 10
MAX_PEERS = 1024

Hotkey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
Window = Annotated[int, Field(ge=0, le=10**18)]


class RecordError(ValueError):
    """A published record exists but is not valid JSON of the expected schema."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _RunRecord(_Record):
    """A record of one run: it names the subnet and the run's hparams digest (`templar.wire.Run`),
    so a record another run left in a bucket (or a replayed one) is never taken for this run's."""

    protocol: Literal[PROTOCOL_VERSION]  # type: ignore[valid-type]
    netuid: Annotated[int, Field(ge=0, le=2**16 - 1)]
    run: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


def check_run(record: _RunRecord, run: Run, what: str) -> None:
    """RecordError unless `record` belongs to `run`."""
    if (other := run.check(record.netuid, record.run)) is not None:
        raise RecordError(f"{what} belongs to another run: {other}")


class PeerList(_RunRecord):
    """`v{P}/peers/{window}.json`: the top-G hotkeys in effect from `window`."""

    window: Window
    peers: list[Hotkey] = Field(max_length=MAX_PEERS)

    @field_validator("peers")
    @classmethod
    def _unique(cls, peers: list[str]) -> list[str]:
        if len(set(peers)) != len(peers):
            raise ValueError("duplicate hotkeys")
        return peers


PEER_INDEX_WINDOWS = 64
"""Peer-list windows the index names: the newest ones, so a reader finds the list in effect at any
window of the last 64 publications without listing the bucket."""


class PeerIndex(_RunRecord):
    """`v{P}/peers/index.json`: the windows of the lead's newest peer lists, ascending."""

    windows: list[Window] = Field(max_length=PEER_INDEX_WINDOWS)

    @field_validator("windows")
    @classmethod
    def _ascending(cls, windows: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(windows)):
            raise ValueError("windows must be strictly ascending")
        return windows


class StartWindow(_RunRecord):
    """`v{P}/start_window.json`: the window at which global_step was 0."""

    start_window: Window


def parse_record(data: bytes, model: type[_Record], what: str) -> Any:
    """Decode bounded JSON into `model`; every failure becomes `RecordError`."""
    try:
        raw = json.loads(data)
        return model.model_validate(raw)
    except (ValueError, RecursionError, ValidationError) as exc:  # deep nesting → RecursionError
        raise RecordError(f"{what}: {type(exc).__name__}: {str(exc)[:300]}") from exc


def dump_record(record: _Record) -> bytes:
    return record.model_dump_json().encode()


# -- peer lists -------------------------------------------------------------------------------

async def put_peers(bucket: Bucket, window: int, hotkeys: list[str], *, run: Run,
                    timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Publish the peer list in effect from `window` (validated before upload), unless a list for
    that window is already published (`put_new`: history is append-only), then name it in the index
    (list first, index second: the index never names a list that is not there yet). True when the
    list was written."""
    record = PeerList(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, window=window,
                      peers=list(hotkeys))
    written = await put_new(bucket, peers_key(window), dump_record(record), timeout=timeout)
    try:
        known = await _peer_index(bucket, run=run, timeout=timeout)
    except RecordError as exc:  # our own bucket: an unreadable index is rewritten, not trusted
        logger.warning(f"peer index unreadable ({exc}); writing a new one")
        known = []
    windows = sorted({*(known or []), window})[-PEER_INDEX_WINDOWS:]
    index = PeerIndex(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, windows=windows)
    await bucket.put(peers_index_key(), dump_record(index), timeout=timeout)
    return written


async def _peer_index(bucket: Bucket, *, run: Run, timeout: float) -> list[int] | None:
    """The windows of the index, or None if there is no index."""
    try:
        data = await bucket.get(peers_index_key(), max_bytes=MAX_RECORD_BYTES, timeout=timeout)
    except ObjectNotFound:
        return None
    index: PeerIndex = parse_record(data, PeerIndex, f"{bucket.name} peers/index")
    check_run(index, run, f"{bucket.name} peers/index")
    return list(index.windows)


async def _read_peers(bucket: Bucket, effective: int, run: Run, timeout: float,
                      max_bytes: int, max_peers: int | None) -> tuple[int, list[str]] | None:
    try:
        data = await bucket.get(peers_key(effective), max_bytes=max_bytes, timeout=timeout)
    except ObjectNotFound:
        return None
    record: PeerList = parse_record(data, PeerList, f"{bucket.name} peers/{effective}")
    check_run(record, run, f"{bucket.name} peers/{effective}")
    if record.window != effective:
        raise RecordError(f"peer list at window {effective} claims window {record.window}")
    if max_peers is not None and len(record.peers) > max_peers:
        raise RecordError(f"peer list at window {effective} names {len(record.peers)} peers, the run aggregates "
                          f"at most {max_peers}")
    return effective, list(record.peers)


async def get_peers(bucket: Bucket, window: int, *, run: Run, timeout: float = DEFAULT_TIMEOUT,
                    max_bytes: int = MAX_RECORD_BYTES, max_peers: int | None = None) -> tuple[int, list[str]] | None:
    """The newest peer list of `run` whose window is <= `window`, as (effective_window, hotkeys).

    None if none has been published; `RecordError` if the one in effect is malformed, of another
    run, or names more than `max_peers` (the run's `gauntlet.top_g`: every node gathers each one).
    Every node asks every window, so this never lists the bucket in the steady state: one GET
    when the lead published a list for `window` (it names one each window), else the index and
    the list it points to. Only a window older than the index's 64 publications costs a LIST.
    """
    found = await _read_peers(bucket, window, run, timeout, max_bytes, max_peers)
    if found is not None:
        return found
    windows = await _peer_index(bucket, run=run, timeout=timeout)
    if windows is None:
        return None
    earlier = [w for w in windows if w <= window]
    if not earlier and len(windows) == PEER_INDEX_WINDOWS:
        prefix = peers_prefix()
        earlier = [w for obj in await bucket.list(prefix, timeout=timeout)
                   if (w := window_of(obj.key, prefix, ".json")) is not None and w <= window]
    if not earlier:
        return None
    return await _read_peers(bucket, max(earlier), run, timeout, max_bytes, max_peers)


# -- aggregates -------------------------------------------------------------------------------

async def put_aggregate(bucket: Bucket, window: int, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Publish the update applied at `window` (opaque bytes; see `templar.wire`), unless one is
    already published (`put_new`). True when written."""
    return await put_new(bucket, aggregate_key(window), data, timeout=timeout)


async def get_aggregate(bucket: Bucket, window: int, *, max_bytes: int,
                        timeout: float = DEFAULT_TIMEOUT) -> bytes | None:
    """The update applied at `window`, or None if it was never published."""
    try:
        return await bucket.get(aggregate_key(window), max_bytes=max_bytes, timeout=timeout)
    except ObjectNotFound:
        return None


# -- the lead's inputs of each window's step ----------------------------------------------------

async def get_inputs(bucket: Bucket, window: int, *, max_bytes: int, timeout: float = DEFAULT_TIMEOUT) -> bytes | None:
    """The lead's signed record of the payloads it aggregated at `window` (`templar.wire.inputs`),
    or None if it was never published."""
    try:
        return await bucket.get(inputs_key(window), max_bytes=max_bytes, timeout=timeout)
    except ObjectNotFound:
        return None


# -- published history is append-only ---------------------------------------------------------

async def put_new(bucket: Bucket, key: str, data: bytes, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Write `key` unless it already exists; True when written. The run's published history
    (inputs, aggregates, progress records, peer lists, checkpoint manifests, the start window) is
    append-only: a validator that finds an object of a past window already published keeps it
    (followers may have applied it) and never writes another over it. The write is create-only
    (`Bucket.create`: S3's conditional PUT), so the check and the write are one step."""
    try:
        await bucket.create(key, data, timeout=timeout)
    except ObjectExists:
        return False
    return True


# -- start window -----------------------------------------------------------------------------

async def put_start_window(bucket: Bucket, window: int, *, run: Run, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Publish the run's start window, create-only: `ObjectExists` (naming the object) when the
    bucket already holds one, which is never written over."""
    record = StartWindow(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, start_window=window)
    await bucket.create(start_window_key(), dump_record(record), timeout=timeout)


async def get_start_window(bucket: Bucket, *, run: Run, timeout: float = DEFAULT_TIMEOUT) -> int | None:
    """The start window of `run`, or None if not yet published; `RecordError` if malformed or of
    another run."""
    try:
        data = await bucket.get(start_window_key(), max_bytes=4096, timeout=timeout)
    except ObjectNotFound:
        return None
    record: StartWindow = parse_record(data, StartWindow, f"{bucket.name} start_window")
    check_run(record, run, f"{bucket.name} start_window")
    return record.start_window
