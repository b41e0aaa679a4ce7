"""Probe positions for the sync score: which parameter values a miner reports each window.

A pure function of (seed, window, parameter name): keyed BLAKE2b, so every machine derives the
same positions and a miner cannot know them before the window's seed exists.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

__all__ = ["probe_positions", "take_probes"]

_PERSON = b"templar-probe"


def probe_positions(seed: int, window: int, name: str, numel: int, count: int, *,
                    person: bytes = _PERSON) -> torch.Tensor:
    """`count` flat positions in `[0, numel)`, distinct when `numel >= count` (int64, drawn order).

    `seed` is a non-negative integer below 2**512 (e.g. a block hash read as an integer).
    `person` separates independent uses of the same seed (the sync probes, the model fingerprint
    of `templar.runtime.consensus.fingerprint`): at most 16 bytes.
    """
    if not 0 <= seed < 2**512 or window < 0 or numel <= 0 or count <= 0:
        raise ValueError("seed/window must be non-negative, numel and count positive")
    key = seed.to_bytes(64, "little")
    message = window.to_bytes(8, "little") + name.encode()
    positions: list[int] = []
    seen: set[int] = set()
    counter = 0
    while len(positions) < count:
        h = hashlib.blake2b(message + counter.to_bytes(8, "little"), key=key, person=person, digest_size=8)
        counter += 1
        pos = int.from_bytes(h.digest(), "little") % numel
        if pos in seen and len(seen) < numel:
            continue
        seen.add(pos)
        positions.append(pos)
    return torch.tensor(positions, dtype=torch.int64)


def take_probes(params: Mapping[str, torch.Tensor], *, seed: int, window: int, count: int) -> dict[str, torch.Tensor]:
    """The miner's (or validator's) own values at the probe positions: float32 CPU `[count]` each."""
    out = {}
    for name, p in params.items():
        flat = p.detach().reshape(-1)
        idx = probe_positions(seed, window, name, flat.numel(), count).to(flat.device)
        out[name] = flat[idx].to("cpu", torch.float32)
    return out
