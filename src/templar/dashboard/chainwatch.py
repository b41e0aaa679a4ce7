"""The chain as the dashboard sees it: a snapshot polled in a worker thread, and validator agreement.

Reads go through `templar.chain` (metagraph, weights, block), read-only (no wallet), under a
short deadline, so an unreachable endpoint becomes a message on the page while the last good
snapshot stays visible, marked stale. Works alike on the embedded chain and on finney/test.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loguru import logger

from templar.chain import Chain, ChainError, Neuron, lead_of
from templar.storage.locator import redact_locator


@dataclass(frozen=True)
class ChainSnapshot:
    taken_at: float
    block: int
    neurons: list[Neuron]
    weights: dict[int, dict[int, float]]

    @property
    def by_uid(self) -> dict[int, Neuron]:
        return {n.uid: n for n in self.neurons}

    @property
    def by_hotkey(self) -> dict[str, Neuron]:
        return {n.hotkey: n for n in self.neurons}

    @property
    def validator_weights(self) -> dict[int, dict[int, float]]:
        """The weight rows of validator-permit holders: the only rows Yuma reads.

        Any uid may set a weight on itself without a permit, so `weights` can hold a row per uid of
        the subnet: read as validators, every miner would show as one that disagrees, and miners
        would choose the agreement's cost (it grows with the square of the rows)."""
        permits = {n.uid for n in self.neurons if n.validator_permit}
        return {uid: row for uid, row in self.weights.items() if uid in permits}

    def lead(self) -> Neuron | None:
        """The lead validator of this snapshot (`templar.chain.lead_of`, as `Chain.lead_validator`)."""
        return lead_of(self.neurons)


def bucket_label(neuron: Neuron) -> str:
    """What may be shown of a commitment: its kind and bucket, never a key."""
    return redact_locator(neuron.commitment)


@dataclass
class ChainWatch:
    """Polls the chain at most every `interval` seconds; `snapshot` is the last good read."""

    connect: Callable[[], Chain]
    label: str
    interval: float = 6.0
    snapshot: ChainSnapshot | None = None
    error: str = ""
    last_attempt: float = 0.0
    _chain: Chain | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def due(self) -> bool:
        return time.monotonic() - self.last_attempt >= self.interval

    def poll(self) -> bool:
        """Read block, metagraph and weights; True when the snapshot changed. Never raises ChainError."""
        with self._lock:
            self.last_attempt = time.monotonic()
            try:
                if self._chain is None:
                    self._chain = self.connect()
                chain = self._chain
                snap = ChainSnapshot(taken_at=time.time(), block=chain.block(), neurons=chain.metagraph(),
                                     weights=chain.current_weights())
            except (ChainError, OSError, ValueError) as exc:
                message = f"chain {self.label} unreachable: {str(exc)[:300]}"
                if message != self.error:
                    logger.warning(message)
                self.error = message
                self.close_locked()
                return True
            changed = (self.snapshot is None or snap.block != self.snapshot.block
                       or snap.neurons != self.snapshot.neurons or snap.weights != self.snapshot.weights
                       or bool(self.error))
            self.snapshot, self.error = snap, ""
            return changed

    def close_locked(self) -> None:
        if self._chain is not None:
            try:
                self._chain.close()
            except Exception as exc:  # closing a broken connection must not take the poller down
                logger.debug(f"closing chain connection: {exc}")
            self._chain = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


@dataclass(frozen=True)
class Agreement:
    """One validator's weight vector against the stake-weighted mean of the others'."""

    uid: int
    stake: float
    uids_weighted: int
    top_uid: int | None
    cosine: float | None     # None: no other validator has set weights


def cosine(a: dict[int, float], b: dict[int, float]) -> float | None:
    dot = math.fsum(a[k] * b.get(k, 0.0) for k in a)
    na = math.sqrt(math.fsum(v * v for v in a.values()))
    nb = math.sqrt(math.fsum(v * v for v in b.values()))
    return dot / (na * nb) if na > 0 and nb > 0 else None


def agreement(weights: dict[int, dict[int, float]], stakes: dict[int, float]) -> list[Agreement]:
    """Per validator: cosine of its row with the others' stake-weighted mean row (1.0 = identical).

    A validator whose view diverges (a stale state, a different model, a bug, or collusion) shows
    a low cosine; with one validator there is nothing to compare and `cosine` is None.
    """
    out = []
    for uid in sorted(weights):
        row = weights[uid]
        others: dict[int, float] = {}
        total = 0.0
        for other, orow in weights.items():
            if other == uid:
                continue
            s = max(stakes.get(other, 0.0), 0.0) or 1e-9
            total += s
            for k, v in orow.items():
                others[k] = others.get(k, 0.0) + s * v
        mean = {k: v / total for k, v in others.items()} if total > 0 else {}
        top = max(row, key=lambda k: (row[k], -k)) if row else None
        out.append(Agreement(uid=uid, stake=stakes.get(uid, 0.0), uids_weighted=sum(1 for v in row.values() if v > 0),
                             top_uid=top, cosine=cosine(row, mean) if mean else None))
    return out


def pairwise(weights: dict[int, dict[int, float]],
             rows: Sequence[int] | None = None) -> dict[tuple[int, int], float | None]:
    """Cosine of every pair of validators' rows; with `rows`, only the pairs (a, b) with `a` in them
    (the rows a page shows)."""
    uids = sorted(weights)
    return {(a, b): cosine(weights[a], weights[b]) for a in (uids if rows is None else rows) for b in uids}
