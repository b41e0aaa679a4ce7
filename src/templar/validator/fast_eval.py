"""Fast evaluation (paper §3.2) of many peers per window: cheap checks, each failure a named status.

A peer passes when its upload arrived inside the put window, decoded cleanly, is the document it
committed to before any gradient of the window was readable (`uncommitted` otherwise: its document
digest covers every tensor, probes included, and the signed metadata), does not repeat an upload of
an earlier window (`replay`: `templar.validator.replays`), claims the
global_step we hold (`templar.runtime.outer.update_step`: a claim is checked, never adopted), is in sync with our
model (mean |θ_val − θ_peer| / α over this window's probes ≤ `sync_max_steps`), is not a copy
of an earlier upload by another hotkey, and is not shouting: the L2 norm of its values is at most
`max_norm_ratio` times the window's median. Only the upper side is checked: error-feedback
buffers grow with a miner's age (up to 1/(1 − decay) = 1000×), so a new honest miner is quiet. Aggregation normalises every peer, so a rescaled update
cannot move the model, but its sign is an honest peer's; without this check it would be paid like
one while probing for implementations that forget to normalise. Everything else multiplies μ by φ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch

from templar.comms import GatherResult, GatherStatus
from templar.compress import Compressed
from templar.gauntlet import (
    FastVerdict,
    Status,
    Upload,
    find_pools,
    fingerprint,
    is_synced,
    shared_positions,
    shares_work,
    sync_steps,
)
from templar.validator.replays import Sighting
from templar.wire import Gradient, PayloadError

FINGERPRINT_TENSORS = 4
FINGERPRINT_CHUNKS = 8
CONFIRM_TENSORS = 32
CONFIRM_CHUNKS = 32
"""A pair whose sample crosses a shared-work threshold is looked at again on a larger, independent
sample (up to 32 tensors × 32 chunks, 32 times the first) before it counts. The first sample is
small so that comparing every pair of F_t stays cheap, and its figures scatter: honest pairs of a
`tiny` localnet reach sampled cosine 0.66 and, one window in a few hundred, a single pair crosses
0.8 (a false pool remembered for 720 windows). A pool's members share their positions everywhere
and cross on any sample; the second look costs one larger sample per upload, for flagged pairs only."""


def failure_verdict(res: GatherResult) -> FastVerdict:
    """The verdict on a failed gather: its status, with the payload's stable reason code when the
    bytes were malformed (labelled `malformed:bad_signature`)."""
    reason = res.error.reason if res.status == GatherStatus.MALFORMED and isinstance(res.error, PayloadError) else ""
    return FastVerdict(Status(res.status.value), reason=reason)


def canonical_values(tensors: Mapping[str, Compressed], salt: int, *, tensor_count: int = FINGERPRINT_TENSORS,
                     chunk_count: int = FINGERPRINT_CHUNKS) -> dict[str, torch.Tensor]:
    """Position-canonical coefficients of `chunk_count` chunks of `tensor_count` tensors, for copy
    fingerprints.

    Raw top-k value arrays are not canonical (a copier could permute values with their indices);
    scattering them to their positions is, and costs O(chunks·chunk_size) per tensor. Which tensors
    and chunks are used comes from the validator's private `salt`, so a copier cannot know which
    part of a payload to perturb to evade detection.
    """
    g = torch.Generator().manual_seed(salt & 0x7FFF_FFFF_FFFF_FFFF)
    names = sorted(tensors)
    picked = torch.randperm(len(names), generator=g)[:tensor_count].sort().values
    out = {}
    for i in picked.tolist():
        c = tensors[names[i]]
        n_chunks = c.indices.shape[0]
        rows = torch.randperm(n_chunks, generator=g)[:chunk_count].sort().values
        dense = torch.zeros(len(rows), c.plan.chunk_numel, dtype=torch.float32)
        dense.scatter_(1, c.indices[rows].cpu(), c.values[rows].float().cpu())
        out[names[i]] = dense.view(-1)
    return out


def probe_sync_steps(own: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor], lr: float) -> float:
    names = sorted(own)
    mine = torch.cat([own[n].reshape(-1).double() for n in names])
    peer = torch.cat([theirs[n].reshape(-1).double() for n in names])
    return sync_steps(mine, peer, lr)


def fast_evaluate(
    results: Mapping[str, GatherResult[Gradient]],
    own_probes: Mapping[str, torch.Tensor],
    lr: float,
    *,
    sync_max_steps: float,
    duplicate_threshold: float,
    salt: int,
    shared_positions_threshold: float = math.inf,
    max_norm_ratio: float = float("inf"),
    expected_step: int | None = None,
    commitments: Mapping[str, bytes] | None = None,
    replayed: Mapping[str, Sighting] | None = None,
) -> dict[str, FastVerdict]:
    """A verdict for every gathered peer; pure given the gather results and our probes.
    `expected_step`: our global_step for the window; a payload claiming another is `wrong_step`.
    `commitments`: the document digests read before the window's gradients were readable
    (`templar.comms.commit`; b"": none); a payload whose `Gradient.document_digest` differs is
    `uncommitted`. A peer absent from it (its bucket could not be read in time), or None for all, is
    not judged on it. `replayed`: the peers whose gradient repeats an earlier window's upload
    (`ReplayMemory.observe`), each `replay`."""
    verdicts: dict[str, FastVerdict] = {}
    uploads: list[Upload] = []
    for hotkey, res in results.items():
        if res.status != GatherStatus.OK or res.value is None:
            verdicts[hotkey] = failure_verdict(res)
            continue
        g = res.value
        if commitments is not None and hotkey in commitments and not _committed(commitments[hotkey], g):
            verdicts[hotkey] = FastVerdict(Status.UNCOMMITTED)
            continue
        if replayed and hotkey in replayed:
            verdicts[hotkey] = FastVerdict(Status.REPLAY, copied_from=replayed[hotkey].hotkey)
            continue
        if expected_step is not None and g.global_step != expected_step:
            verdicts[hotkey] = FastVerdict(Status.WRONG_STEP)
            continue
        steps = probe_sync_steps(own_probes, g.probes, lr)
        if not is_synced(steps, sync_max_steps):
            verdicts[hotkey] = FastVerdict(Status.DESYNC, sync_steps=steps)
            continue
        verdicts[hotkey] = FastVerdict(Status.WARMUP if g.warmup else Status.OK, sync_steps=steps)
        if g.warmup:  # earns nothing and is never aggregated: no work to share, and no pool to remember
            continue
        canonical = canonical_values(g.tensors, salt)
        uploads.append(Upload(hotkey=hotkey, timestamp=float(res.timestamp or 0.0), digest=g.digest,
                              fingerprint=fingerprint(canonical), canonical=canonical))
    # A group sharing work is paid as one (the book splits its score, one top-G slot): the earliest
    # upload stands for it and is rated, the others are `copy` (docs/scoring.md §8). Warm-up payloads
    # stay out: every miner's first window starts from fresh error feedback and the same few
    # gradients, so they are alike (whole-payload cosine 0.60-0.72 in an 8-page localnet), and a
    # false pool there would split honest miners' pay for the book's whole pool memory.
    confirm = _second_look({hk: results[hk].value for hk in (u.hotkey for u in uploads)}, salt,
                           duplicate_threshold, shared_positions_threshold)
    for pool in find_pools(uploads, duplicate_threshold, shared_positions_threshold, confirm=confirm):
        first, *rest = pool
        verdicts[first] = replace(verdicts[first], pool=tuple(pool))
        for member in rest:
            verdicts[member] = FastVerdict(Status.COPY, sync_steps=verdicts[member].sync_steps, copied_from=first,
                                           pool=tuple(pool))
    for hotkey in norm_outliers({hk: results[hk].value for hk, v in verdicts.items() if v.passed}, max_norm_ratio):
        verdicts[hotkey] = FastVerdict(Status.SCALE, sync_steps=verdicts[hotkey].sync_steps)
    return verdicts


def _committed(commitment: bytes, g: Gradient) -> bool:
    """Whether the payload is the document committed to (an empty commitment matches nothing)."""
    return bool(commitment) and commitment == g.document_digest


def _second_look(payloads: Mapping[str, Gradient], salt: int, cosine_threshold: float,
                 shared_threshold: float) -> Callable[[Upload, Upload], bool]:
    """`find_pools`' confirmation of a pair that crossed on the first sample: the same rule on a
    larger sample drawn from another private salt (`CONFIRM_TENSORS` × `CONFIRM_CHUNKS`), each
    upload's sample made once and only when asked for."""
    samples: dict[str, tuple[dict[str, torch.Tensor], torch.Tensor]] = {}

    def sample(hotkey: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if hotkey not in samples:
            values = canonical_values(payloads[hotkey].tensors, salt + 1, tensor_count=CONFIRM_TENSORS,
                                      chunk_count=CONFIRM_CHUNKS)
            samples[hotkey] = (values, fingerprint(values))
        return samples[hotkey]

    def confirm(a: Upload, b: Upload) -> bool:
        (values_a, print_a), (values_b, print_b) = sample(a.hotkey), sample(b.hotkey)
        return shares_work(float(print_a @ print_b), shared_positions(values_a, values_b), cosine_threshold,
                           shared_threshold)

    return confirm


MIN_PEERS_FOR_NORM_CHECK = 3


def payload_norm(g: Gradient) -> float:
    return float(torch.sqrt(sum(c.values.double().square().sum() for c in g.tensors.values())))


def norm_outliers(payloads: Mapping[str, Gradient], max_ratio: float) -> list[str]:
    """Peers whose value norm exceeds `max_ratio` times the median of the window (needs 3 peers)."""
    if len(payloads) < MIN_PEERS_FOR_NORM_CHECK:
        return []
    norms = {hk: payload_norm(g) for hk, g in payloads.items()}
    median = float(torch.tensor(sorted(norms.values()), dtype=torch.float64).median())
    if median <= 0:
        return []
    return sorted(hk for hk, n in norms.items() if n > median * max_ratio)
