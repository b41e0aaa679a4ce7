"""`v{P}/progress.json`: the last window the lead validator finished, and whether it stepped.

Overwritten every window. It lets a joining node tell "no update that window" (the lead is past
it and published no aggregate) from "not published yet" (wait), instead of waiting out a whole
window for every window in which nobody was aggregated.
"""

from __future__ import annotations

from templar.comms.exchange import Window, _RunRecord, check_run, dump_record, parse_record
from templar.core.config import PROTOCOL_VERSION
from templar.storage.base import DEFAULT_TIMEOUT, Bucket, ObjectNotFound
from templar.wire import Run


def progress_key(version: int = PROTOCOL_VERSION) -> str:
    return f"v{version}/progress.json"


class Progress(_RunRecord):
    window: Window
    global_step: Window


async def put_progress(bucket: Bucket, window: int, global_step: int, *, run: Run,
                       timeout: float = DEFAULT_TIMEOUT) -> None:
    record = Progress(protocol=PROTOCOL_VERSION, netuid=run.netuid, run=run.digest, window=window,
                      global_step=global_step)
    await bucket.put(progress_key(), dump_record(record), timeout=timeout)


async def get_progress(bucket: Bucket, *, run: Run, timeout: float = DEFAULT_TIMEOUT) -> Progress | None:
    """The lead's progress in `run`, None if never published; `RecordError` if malformed or of
    another run."""
    try:
        data = await bucket.get(progress_key(), max_bytes=4096, timeout=timeout)
    except ObjectNotFound:
        return None
    record: Progress = parse_record(data, Progress, f"{bucket.name} progress")
    check_run(record, run, f"{bucket.name} progress")
    return record
