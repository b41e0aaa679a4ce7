"""The windowed exchange on buckets: gradients, peer lists, aggregates, checkpoints, data shards.

Every read of another node's bucket is capped in bytes and bounded in time; `gather` never
waits past its deadline and never raises because of a peer. Keys live under `v{P}/` (see
`templar.comms.keys`).
"""

from __future__ import annotations

from templar.comms.checkpoint import (
    Checkpoint,
    CheckpointError,
    ChecksumMismatch,
    Manifest,
    checkpoint_windows,
    cleanup_checkpoints,
    download_latest_checkpoint,
    latest_checkpoint_window,
    save_checkpoint,
)
from templar.comms.exchange import (
    PeerList,
    RecordError,
    get_aggregate,
    get_inputs,
    get_peers,
    get_start_window,
    put_aggregate,
    put_new,
    put_peers,
    put_start_window,
)
from templar.comms.gather import GatherResult, GatherStatus, PutResult, gather, put_gradient

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "ChecksumMismatch",
    "GatherResult",
    "GatherStatus",
    "Manifest",
    "PeerList",
    "PutResult",
    "RecordError",
    "checkpoint_windows",
    "cleanup_checkpoints",
    "download_latest_checkpoint",
    "gather",
    "get_aggregate",
    "get_inputs",
    "get_peers",
    "get_start_window",
    "latest_checkpoint_window",
    "put_aggregate",
    "put_gradient",
    "put_new",
    "put_peers",
    "put_start_window",
    "save_checkpoint",
]
