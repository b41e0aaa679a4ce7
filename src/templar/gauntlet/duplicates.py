"""Copy and duplicate detection across one window's uploads (beyond the paper).

The paper's proof of computation (§3.1, eq. 3) makes a copier's μ drift to 0 on average, but a
copier still rides on someone else's work while it does. Here we catch the blunt cases directly:
two hotkeys whose payloads are byte-identical (same digest) or whose fingerprints point the same
way (cosine ≥ `duplicate_threshold`) in one window. The earlier upload is presumed original; the
later one loses (ties in timestamp are broken by hotkey string, so every validator agrees).

A fingerprint is a count sketch (random ±1 hashing into `size` buckets) of the per-tensor
L2-normalised values. Inner products between sketches estimate inner products between the full
vectors, so cosine(sketch) ≈ cosine(payload), while any per-tensor rescaling (which the
aggregation's normalisation makes free for a copier) changes nothing.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

_PRIME = (1 << 31) - 1
"""Mersenne prime of the universal hash ((a·i + b) mod p); a < 2^31 and i < 2^32 fit in int64."""


@dataclass(frozen=True)
class Upload:
    """One peer's gradient upload in a window, as the validator saw it."""

    hotkey: str
    timestamp: float
    """Storage timestamp of the object (seconds); earlier wins."""
    digest: bytes
    """Hash of the payload bytes (e.g. sha256); equal digests are identical payloads."""
    fingerprint: torch.Tensor
    """`fingerprint(...)` of the decoded payload; all uploads in one call share its length."""


def _hash_params(name: str) -> tuple[int, int, int, int]:
    raw = hashlib.blake2b(f"templar/fingerprint/{name}".encode(), digest_size=16).digest()
    words = [int.from_bytes(raw[i : i + 4], "little") % _PRIME for i in range(0, 16, 4)]
    a_bucket, b_bucket, a_sign, b_sign = words
    return max(a_bucket, 1), b_bucket, max(a_sign, 1), b_sign


def fingerprint(values: Mapping[str, torch.Tensor], size: int = 1024) -> torch.Tensor:
    """A deterministic float64 unit vector of length `size` summarising a payload.

    Pass position-canonical values, e.g. each parameter's DeMo coefficients scattered to their
    indices for a fixed set of chunks: a raw top-k `values` array could be permuted together
    with its indices by a copier without changing the decoded update. Each tensor is flattened,
    L2-normalised (so rescaling any tensor by a positive factor leaves the result unchanged),
    count-sketched with a hash keyed on its name, and the sum is normalised. All-zero input
    yields the zero vector, which matches nothing. Non-finite values raise ValueError (wire
    validation rejects them before this point).
    """
    if size <= 0:
        raise ValueError(f"fingerprint: size must be positive, got {size}")
    if not values:
        raise ValueError("fingerprint: no tensors")
    sketch = torch.zeros(size, dtype=torch.float64)
    for name in sorted(values):
        flat = values[name].detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        if flat.numel() == 0:
            continue
        if flat.numel() >= 1 << 32:
            raise ValueError(f"fingerprint: tensor {name} too large to sketch ({flat.numel()} values)")
        if not bool(torch.isfinite(flat).all()):
            raise ValueError(f"fingerprint: tensor {name} holds non-finite values")
        norm = torch.linalg.vector_norm(flat)
        if norm == 0:
            continue
        a_bucket, b_bucket, a_sign, b_sign = _hash_params(name)
        position = torch.arange(flat.numel(), dtype=torch.int64)
        bucket = ((position * a_bucket + b_bucket) % _PRIME) % size
        sign = (((position * a_sign + b_sign) % _PRIME) & 1).to(torch.float64) * 2.0 - 1.0
        sketch.index_add_(0, bucket, sign * (flat / norm))
    total = torch.linalg.vector_norm(sketch)
    return sketch / total if total > 0 else sketch


def find_copies(uploads: Sequence[Upload], threshold: float) -> dict[str, str]:
    """Map each copying hotkey to the hotkey it copied, among one window's uploads.

    Two uploads from different hotkeys match when their digests are equal or the cosine of
    their fingerprints is ≥ `threshold`. Uploads are ordered by (timestamp, hotkey); an upload
    that matches any earlier one loses to the earliest it matches. The cosine matrix is one
    n×n matmul (fine for the few hundred uploads a window holds).
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"find_copies: threshold must be in (0, 1], got {threshold!r}")
    if len(uploads) < 2:
        return {}
    hotkeys = [upload.hotkey for upload in uploads]
    if len(set(hotkeys)) != len(hotkeys):
        raise ValueError("find_copies: more than one upload for the same hotkey")
    for upload in uploads:
        if not math.isfinite(upload.timestamp):
            raise ValueError(f"find_copies: non-finite timestamp for {upload.hotkey}")
    ordered = sorted(uploads, key=lambda upload: (upload.timestamp, upload.hotkey))
    lengths = {upload.fingerprint.numel() for upload in ordered}
    if len(lengths) != 1:
        raise ValueError(f"find_copies: fingerprints differ in length: {sorted(lengths)}")

    prints = torch.stack([u.fingerprint.detach().to("cpu", torch.float64).reshape(-1) for u in ordered])
    if not bool(torch.isfinite(prints).all()):
        raise ValueError("find_copies: non-finite fingerprint")
    norms = torch.linalg.vector_norm(prints, dim=1, keepdim=True)
    unit = torch.where(norms > 0, prints / norms.clamp_min(1e-300), torch.zeros_like(prints))
    similar = (unit @ unit.T) >= threshold

    digest_group: dict[bytes, int] = {}
    groups = torch.tensor([digest_group.setdefault(u.digest, len(digest_group)) for u in ordered])
    identical = groups.unsqueeze(0) == groups.unsqueeze(1)

    earlier_match = torch.tril(similar | identical, diagonal=-1)
    has_match = earlier_match.any(dim=1)
    first = earlier_match.to(torch.int8).argmax(dim=1)  # argmax returns the first maximal index
    return {
        ordered[i].hotkey: ordered[int(first[i])].hotkey
        for i in torch.nonzero(has_match).flatten().tolist()
    }
