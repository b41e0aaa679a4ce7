"""The validator's commitment reader: what it did not read in a window's span was not committed, so a hotkey
with no usable bucket on chain at the read, or not yet a miner then, is judged as having committed nothing
(docs/scoring.md §8); only the reads the validator itself could not start are left unjudged."""

from __future__ import annotations

import asyncio
import math
import time
from types import SimpleNamespace

import torch
from tests.rules import gauntlet_rules

from templar.comms import GatherResult, GatherStatus
from templar.comms.commit import put_commit
from templar.storage import LocalBucket
from templar.validator.commits import CommitWatcher, WindowCommits
from templar.validator.fast_eval import fast_evaluate
from templar.wire import Gradient, Run

RUN = Run(netuid=7, digest="ab" * 32)
WINDOW = 5


class _Node:
    """What the reader asks of a node: the miners, their buckets as the chain names them now, the run, a clock."""

    def __init__(self, miners: list[str], buckets: dict[str, LocalBucket]) -> None:
        self._miners, self._buckets = miners, buckets
        self.run = RUN
        self.clock = SimpleNamespace(now=time.time)

    async def miners(self) -> dict[str, int]:
        return {hk: uid for uid, hk in enumerate(self._miners)}

    async def peer_buckets(self, hotkeys: list[str]) -> dict[str, LocalBucket]:
        return {hk: b for hk, b in self._buckets.items() if hk in hotkeys}


def test_a_peer_the_read_could_not_reach_committed_nothing(tmp_path, real_peers) -> None:
    """`silent` committed no bucket on chain before the read (it names one by the gather), `newcomer` was not
    registered at the read: both once went unjudged, so a copier needed only to set its bucket on chain (or
    register) between the read and the gather to post a same-window payload it never committed to. Now both
    are `uncommitted`, and a peer that committed in time still passes."""
    shapes, peers = real_peers
    probes = {n: torch.linspace(-1, 1, 16) for n in shapes}

    async def read() -> dict[str, bytes] | None:
        honest = LocalBucket(tmp_path / "honest")
        await put_commit(honest, WINDOW, b"doc:honest".ljust(32, b"\0"), run=RUN)
        watcher = CommitWatcher(_Node(["honest", "silent"], {"honest": honest}))  # type: ignore[arg-type]
        await watcher._read(WINDOW, time.time() + 1.0)
        return watcher.pop(WINDOW, ["honest", "silent", "newcomer"])

    commitments = asyncio.run(read())
    assert commitments == {"honest": b"doc:honest".ljust(32, b"\0"), "silent": b"", "newcomer": b""}
    results = {hk: GatherResult(GatherStatus.OK, timestamp=100.0 + i, value=Gradient(
        window=WINDOW, global_step=2, hotkey=hk, warmup=False, tensors=peers[i], probes=probes, digest=hk.encode(),
        nbytes=0, document_digest=b"doc:honest".ljust(32, b"\0") if hk == "honest" else b"doc:" + hk.encode()))
        for i, hk in enumerate(["honest", "silent", "newcomer"])}
    rules = gauntlet_rules(sync_max_steps=3.0, duplicate_threshold=0.98, shared_positions_threshold=math.inf,
                           max_norm_ratio=math.inf)
    verdicts = fast_evaluate(results, probes, 1e-3, rules=rules, salt=7, commitments=commitments)
    assert {hk: v.status for hk, v in verdicts.items()} == {"honest": "ok", "silent": "uncommitted",
                                                            "newcomer": "uncommitted"}


def test_reads_the_validator_could_not_start_stay_unjudged(tmp_path) -> None:
    """The validator's own lateness (its read reached the span after it closed) judges nobody on it: a read
    it could not start leaves its peer out, and a window where it started none is not read at all."""
    watcher = CommitWatcher(_Node(["late"], {"late": LocalBucket(tmp_path / "late")}))  # type: ignore[arg-type]
    asyncio.run(watcher._read(WINDOW, time.time() - 1.0))
    assert watcher.pop(WINDOW, ["late", "newcomer"]) is None
    assert WindowCommits({"read": b"\x01" * 32}, frozenset({"late"})).judged(["read", "late", "newcomer"]) == {
        "read": b"\x01" * 32, "newcomer": b""}
