"""Work borrowed from earlier windows (beyond the paper): an upload that copies what was public
before the window's commit deadline.

Commitments stop a miner from borrowing same-window work, and the pool check compares one
window's uploads with each other; neither sees a miner that re-posts, rescaled or lightly
perturbed, an earlier window's public work: the previous window's aggregate (every reader can
rebuild it from the top-G's payloads) or one of the top-G's uploads (readable in their buckets).
Such an upload could be committed in time, since it existed before the window began. Here each
upload is compared with those references by the one shared-work rule (`shares_work`, absolute
thresholds: a reference is one payload, not a window of peers with a typical pair).

A reference that holds a miner's own work is never held against that miner: error feedback makes
an honest miner's consecutive uploads alike, and the aggregate it contributed to holds its own
update. So every reference names its `owners`, and the aggregate is given to each of its
contributors as the mean of the *others'* payloads (leave-one-out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from templar.core.config import GauntletConfig
from templar.gauntlet.duplicates import Upload, fingerprint, shared_positions, shares_work

AGGREGATE = "aggregate"
"""`Reference.source` of a mean of earlier uploads (no single hotkey was copied)."""


@dataclass(frozen=True)
class Reference:
    """One piece of earlier public work, sampled like this window's uploads."""

    source: str
    """Who is copied: the earlier upload's hotkey, or `AGGREGATE`."""
    window: int
    """The window the work was uploaded in."""
    fingerprint: torch.Tensor
    canonical: Mapping[str, torch.Tensor] | None
    owners: frozenset[str]
    """Hotkeys whose own work is in it: never judged against it (for the aggregate: exactly the
    uploads its mean is made of)."""
    digest: bytes = b""
    """The earlier upload's content digest (b"": a mean, which no payload equals)."""


def top_of_mean(members: Sequence[Mapping[str, torch.Tensor]], layout: Mapping[str, tuple[int, int]]
                ) -> dict[str, torch.Tensor]:
    """What a copier of the aggregate would upload, on the validator's sample: the mean of the
    members' position-canonical values (each tensor L2-normalised per member first, as aggregation
    normalises each peer), keeping only the `k` largest coefficients of each chunk. `layout` maps a
    tensor to (chunk size, k); tensors outside it, or not held by every member, are left out."""
    out = {}
    for name, (chunk_numel, k) in sorted(layout.items()):
        if not members or any(name not in m for m in members):
            continue
        rows = [m[name].detach().to("cpu", torch.float64).reshape(-1, chunk_numel) for m in members]
        if len({r.shape for r in rows}) != 1:
            continue
        mean = torch.stack([r / torch.linalg.vector_norm(r).clamp_min(1e-300) for r in rows]).mean(dim=0)
        keep = mean.abs().topk(min(k, chunk_numel), dim=1).indices
        sparse = torch.zeros_like(mean)
        sparse.scatter_(1, keep, mean.gather(1, keep))
        out[name] = sparse.reshape(-1).float()
    return out


def aggregate_references(window: int, samples: Mapping[str, Mapping[str, torch.Tensor]],
                         layout: Mapping[str, tuple[int, int]], *, size: int) -> list[Reference]:
    """The aggregate of `window` (the mean of `samples`: hotkey → its sampled canonical values)
    as references: the whole mean, held against everyone but its contributors, and for each
    contributor the mean of the others' (with at least two others: one other's payload is already
    a reference of its own). `size`: the fingerprints' length (`fingerprint_size`)."""
    if not samples:
        return []
    hotkeys = sorted(samples)
    out = []

    def reference(members: list[str], judged: str | None) -> None:
        values = top_of_mean([samples[h] for h in members], layout)
        if values:
            owners = frozenset(hotkeys) - ({judged} if judged else set())
            out.append(Reference(AGGREGATE, window, fingerprint(values, size=size), values, owners))

    reference(hotkeys, None)
    if len(hotkeys) >= 3:
        for hotkey in hotkeys:
            reference([h for h in hotkeys if h != hotkey], hotkey)
    return out


def find_borrowed(uploads: Sequence[Upload], references: Sequence[Reference], rules: GauntletConfig, *,
                  confirm: Callable[[Upload, Reference], bool] | None = None) -> dict[str, Reference]:
    """Each upload that copies earlier public work, mapped to the first reference it copies: an
    equal digest, or `shares_work` on the absolute thresholds (no typical pair; confirmed by `confirm`, when given,
    which has the last word). An upload is never judged against a reference it owns."""
    out: dict[str, Reference] = {}
    for upload in uploads:
        mine = upload.fingerprint.detach().to("cpu", torch.float64).reshape(-1)
        for ref in references:
            if upload.hotkey in ref.owners:
                continue
            if ref.digest and ref.digest == upload.digest:
                out[upload.hotkey] = ref
                break
            theirs = ref.fingerprint.to(torch.float64).reshape(-1)
            if theirs.numel() != mine.numel():
                raise ValueError(f"find_borrowed: fingerprints differ in length ({mine.numel()}, {theirs.numel()})")
            cosine = float(mine @ theirs)
            shared = (shared_positions(upload.canonical, ref.canonical)
                      if upload.canonical is not None and ref.canonical is not None else 0.0)
            if shares_work(cosine, shared, rules) and (confirm is None or confirm(upload, ref)):
                out[upload.hotkey] = ref
                break
    return out
