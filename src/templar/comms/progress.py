"""`v{P}/progress/<w>.json`: the global_step and a fingerprint of the model after window `w`,
published by the validator that led `w` (`templar.runtime.consensus.succession`), create-only like the rest
of the run's history.

Its `fingerprint` (θ in float32 at a few hundred public positions, `templar.runtime.consensus.fingerprint`)
lets every node check that it holds the run's model (no silent forks: docs/architecture.md §4,
"Proof of sync"). One record per window, so a reader asks the validator that led the window it
holds, whoever led the windows around it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

import torch
from pydantic import StringConstraints

from templar.comms.exchange import (
    RecordError,
    Window,
    _RunRecord,
    check_run,
    dump_record,
    parse_record,
    put_new,
)
from templar.comms.keys import progress_key
from templar.core.config import PROTOCOL_VERSION
from templar.storage.base import DEFAULT_TIMEOUT, Bucket, ObjectNotFound
from templar.wire import Run

MAX_PROGRESS_BYTES = 4096


class Progress(_RunRecord):
    window: Window
    global_step: Window
    fingerprint: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]*={0,2}$", max_length=2732)] | None = None  # ≤ 512 values
    """θ after `window` at the fingerprint positions: little-endian float32, base64. None from a
    lead that has not computed one (then no node can compare)."""


def encode_fingerprint(values: torch.Tensor) -> str:
    return base64.b64encode(values.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4")
                            .tobytes()).decode()


def decode_fingerprint(text: str, count: int) -> torch.Tensor:
    """The float32 values of a published fingerprint; `RecordError` unless exactly `count` finite ones."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RecordError(f"progress fingerprint: not base64 ({exc})") from exc
    if len(raw) != 4 * count:
        raise RecordError(f"progress fingerprint: {len(raw)} bytes, expected {4 * count}")
    values = torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()
    if not bool(torch.isfinite(values).all()):
        raise RecordError("progress fingerprint: non-finite values")
    return values


def progress_bytes(window: int, global_step: int, *, run: Run, fingerprint: torch.Tensor | None = None) -> bytes:
    """The progress record of `window` as published."""
    record = Progress(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, window=window,
                      global_step=global_step,
                      fingerprint=None if fingerprint is None else encode_fingerprint(fingerprint))
    return dump_record(record)


async def put_progress(bucket: Bucket, window: int, global_step: int, *, run: Run,
                       fingerprint: torch.Tensor | None = None, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Publish the progress record of `window`, unless one is already published (`put_new`: history
    is append-only). True when written."""
    data = progress_bytes(window, global_step, run=run, fingerprint=fingerprint)
    return await put_new(bucket, progress_key(window), data, timeout=timeout)


async def get_progress(bucket: Bucket, window: int, *, run: Run, timeout: float = DEFAULT_TIMEOUT) -> Progress | None:
    """The progress record of `window` in `run`, None if never published; `RecordError` if
    malformed, of another run or of another window."""
    try:
        data = await bucket.get(progress_key(window), max_bytes=MAX_PROGRESS_BYTES, timeout=timeout)
    except ObjectNotFound:
        return None
    record: Progress = parse_record(data, Progress, f"{bucket.name} progress/{window}")
    check_run(record, run, f"{bucket.name} progress/{window}")
    if record.window != window:
        raise RecordError(f"{bucket.name} progress/{window} claims window {record.window}")
    return record
