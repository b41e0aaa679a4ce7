"""One decode per payload for the nodes that share a process.

A localnet run in one process (`templar localnet --in-process`, the suite's integration runs) has every
node read every peer's payload of a window: nine miners and their validators decode each of the same
bytes about ten times, and the decoding (the container, the signature, the Rice indices) was a third
of such a run's Python time. Inside `sharing_reads()`, `read_gradient_shared` decodes a payload once,
keeps the validated `Gradient`, and hands every later reader of the same bytes, under the same checks, a
copy of it: what a reader gets is what `read_gradient` returns for those bytes, tensor for tensor.

A node in a process of its own reads each payload once, so nothing there turns sharing on, and
`read_gradient_shared` is `read_gradient`. A payload that fails a check is not kept: every reader
decodes it again and is refused with its own `PayloadError`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace

import torch

from templar.core.config import HParams
from templar.wire.container import Verifier
from templar.wire.gradient import Gradient, read_gradient
from templar.wire.schema import Run

__all__ = ["SharedReads", "read_gradient_shared", "sharing_reads"]


class SharedReads:
    """Validated gradients by everything a read checks: the payload's bytes (sha256), the reader's
    expected shapes, hotkey and window, the run, the hparams' digest and the signature check. The
    least recently read go first once the decoded tensors pass `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple, tuple[Gradient, int]] = OrderedDict()
        self._bytes = 0
        self._digests: dict[int, tuple[HParams, str]] = {}

    def run_digest(self, hp: HParams) -> str:
        """`hp.digest()`, computed once per settings object (a JSON dump of the whole run, 50 µs, was a
        tenth of a shared read); the object is held, so its id names no other while it is here."""
        kept = self._digests.get(id(hp))
        if kept is None or kept[0] is not hp:
            kept = self._digests[id(hp)] = (hp, hp.digest())
        return kept[1]

    def get(self, key: tuple) -> Gradient | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                self.misses += 1
                return None
            self._kept.move_to_end(key)
            self.hits += 1
            return kept[0]

    def keep(self, key: tuple, gradient: Gradient) -> None:
        size = _tensor_bytes(gradient)
        with self._lock:
            if key in self._kept or size > self.max_bytes:
                return
            self._kept[key] = (gradient, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, freed) = self._kept.popitem(last=False)
                self._bytes -= freed


_shared: SharedReads | None = None


@contextmanager
def sharing_reads(max_bytes: int = 1 << 30) -> Iterator[SharedReads]:
    """Payloads read in this process share one decode each until the block ends (nested blocks keep
    their own); `max_bytes` bounds the decoded tensors kept."""
    global _shared
    outer, _shared = _shared, SharedReads(max_bytes)
    try:
        yield _shared
    finally:
        _shared = outer


def read_gradient_shared(data: bytes, expected: Mapping[str, torch.Size], hp: HParams, *, run: Run,
                         verify: Verifier | None, expected_hotkey: str | None = None,
                         expected_window: int | None = None) -> Gradient:
    """`read_gradient`, decoded once per process inside `sharing_reads()`; each caller gets its own copy
    of the tensors, so no reader can change what another reads."""
    shared = _shared
    if shared is None:
        return read_gradient(data, expected, hp, run=run, verify=verify, expected_hotkey=expected_hotkey,
                             expected_window=expected_window)
    key = (hashlib.sha256(data).digest(), tuple((name, tuple(shape)) for name, shape in expected.items()),
           expected_hotkey, expected_window, run, shared.run_digest(hp), verify)
    gradient = shared.get(key)
    if gradient is None:
        gradient = read_gradient(data, expected, hp, run=run, verify=verify, expected_hotkey=expected_hotkey,
                                 expected_window=expected_window)
        shared.keep(key, gradient)
    return _copy(gradient)


def _copy(gradient: Gradient) -> Gradient:
    return replace(gradient,
                   tensors={name: replace(c, indices=c.indices.clone(), values=c.values.clone())
                            for name, c in gradient.tensors.items()},
                   probes={name: probe.clone() for name, probe in gradient.probes.items()})


def _tensor_bytes(gradient: Gradient) -> int:
    return sum(c.indices.nbytes + c.values.nbytes for c in gradient.tensors.values()) + sum(
        p.nbytes for p in gradient.probes.values())
