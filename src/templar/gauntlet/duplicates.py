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
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from templar.core.config import GauntletConfig

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
    canonical: Mapping[str, torch.Tensor] | None = None
    """The position-canonical values the fingerprint was made from (for `shared_positions`)."""


def _hash_params(name: str) -> tuple[int, int, int, int]:
    raw = hashlib.blake2b(f"templar/fingerprint/{name}".encode(), digest_size=16).digest()
    words = [int.from_bytes(raw[i : i + 4], "little") % _PRIME for i in range(0, 16, 4)]
    a_bucket, b_bucket, a_sign, b_sign = words
    return max(a_bucket, 1), b_bucket, max(a_sign, 1), b_sign


def fingerprint(values: Mapping[str, torch.Tensor], *, size: int) -> torch.Tensor:
    """A deterministic float64 unit vector of length `size` (the rules' `fingerprint_size`)
    summarising a payload.

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


def shared_positions(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Share of kept (non-zero) positions two position-canonical payloads have in common, over
    the tensors both name: |A ∩ B| / max(|A|, |B|), 0.0 when either keeps nothing.

    Two independent updates keep largely different top-k coefficients (about 6 % in common on
    the tiny preset); two noisy copies of one update keep exactly the same ones, whatever noise
    was put on the values. Unlike the cosine, re-weighting values cannot lower it.

    Why the larger of the two counts: each uploader chooses its own, since a zero value is a
    position not kept. Over the smaller one, an upload that kept only the positions every upload
    keeps (chunks no larger than k, every norm weight's) shared all of its positions with every
    honest upload, and linked all of them into one pool (`find_pools`) at no cost of work.
    """
    common = kept_a = kept_b = 0
    for name in sorted(set(a) & set(b)):
        za, zb = a[name].reshape(-1) != 0, b[name].reshape(-1) != 0
        if za.numel() != zb.numel():
            raise ValueError(f"shared_positions: tensor {name} differs in length")
        common += int((za & zb).sum())
        kept_a += int(za.sum())
        kept_b += int(zb.sum())
    if not (kept_a and kept_b):
        return 0.0
    return common / max(kept_a, kept_b)


@dataclass(frozen=True)
class Typical:
    """The typical pair's figures a pair is judged against (-inf: none)."""

    cosine: float = -math.inf
    shared: float = -math.inf


class PairBaseline:
    """The typical pair of a window as the shared-work rule uses it, which the judged uploads
    cannot lift: the smallest of the window's own median, the median of earlier windows' typical
    pairs (kept in the validator's memory, at most `windows`: the rules' `pair_history`; a
    restarted validator starts with none) and a calibrated `ceiling`. A group holding most of a
    window's uploads makes a pool pair the window's median; the ceiling and the history stay where
    honest windows put them.

    The first sample's ceiling (`typical_ceiling_cosine`, `_shared`) is the default thresholds
    less the margin, so a window's typical pair can never switch the absolute thresholds off, and
    above every honest window's median measured (first sample: cosine 0.65, shared positions 0.61
    at most, `micro` with H = 2 and 4 inner AdamW steps; docs/scoring.md §8)."""

    def __init__(self, ceiling: Typical, windows: int) -> None:
        self.ceiling = ceiling
        self.history: deque[Typical] = deque(maxlen=windows)

    def observe(self, window: Typical) -> Typical:
        """The baseline for a window whose own median is `window`; then remembers that median
        (capped by the ceiling) for the windows after it."""
        def robust(own: float, earlier: list[float], ceiling: float) -> float:
            candidates = [own, ceiling, *([statistics.median(earlier)] if earlier else [])]
            finite = [c for c in candidates if math.isfinite(c)]
            return min(finite) if finite else -math.inf

        out = Typical(robust(window.cosine, [t.cosine for t in self.history if math.isfinite(t.cosine)],
                             self.ceiling.cosine),
                      robust(window.shared, [t.shared for t in self.history if math.isfinite(t.shared)],
                             self.ceiling.shared))
        if math.isfinite(window.cosine) or math.isfinite(window.shared):
            self.history.append(Typical(min(window.cosine, self.ceiling.cosine),
                                        min(window.shared, self.ceiling.shared)))
        return out


def shares_work(cosine: float, shared: float, rules: GauntletConfig, typical: Typical = Typical()) -> bool:
    """THE shared-work rule: two payloads share work when their fingerprints' cosine or the share
    of top-k positions they have in common reaches its threshold (`duplicate_threshold`,
    `shared_positions_threshold`) *and* stands `typical_pair_margin` above the same figure for the
    typical pair (`typical`: `PairBaseline`'s figures for the window; -inf when there is none), or
    when their shared positions stand `relative_shared_factor` times above the typical pair's (and
    at least `relative_shared_floor`) whatever the thresholds.

    Both thresholds are calibrated on the measured honest distribution (`benchmarks/incentive/similarity.py`,
    docs/scoring.md §8): honest pairs of independent miners, each seeing the other's work only
    through the aggregate, stay far below them (tiny preset: cosine ≤ 0.25, positions ≤ 15 % over
    the validator's sample), while two hotkeys posting one update with noise on the values keep
    every position. Either figure alone suffices: noise on the values lowers the cosine but
    not the positions, and re-choosing positions lowers both but throws the update away.

    Why relative too: the figures come from the validator's sample of each payload (a few tensors
    and chunks), and in some windows the sample lands where every honest update points the same
    way. With 4,096 training tokens per miner (four times `tiny`'s) one such sample put all 15
    honest pairs of a localnet window at cosine 0.8–0.9 (whole payloads: 0.56–0.59), and the
    lead split one score among five honest miners for the rest of the run (benchmarks/LOG.md
    §6). Members of a pool are alike *beyond* their window (same positions, shared
    ≈ 1.0); honest miners that are alike are alike together, and the typical pair moves with them
    (up to the ceiling of `PairBaseline`, which a pool cannot lift).

    Why the relative branch looks at the positions only: their expected value does not depend on
    how much of a payload is sampled (the cosine over a small sample runs well above the whole
    payload's), so the second look's larger sample is judged on the same scale. Measured honest
    pairs stand at most 1.9× their window's typical pair on the second look (docs/scoring.md §8).
    """
    margin = rules.typical_pair_margin
    return ((cosine >= rules.duplicate_threshold and cosine >= typical.cosine + margin)
            or (shared >= rules.shared_positions_threshold and shared >= typical.shared + margin)
            or (math.isfinite(typical.shared) and typical.shared > 0
                and shared >= max(rules.relative_shared_floor, rules.relative_shared_factor * typical.shared)))


def typical_pair(matrix: Sequence[Sequence[float]], min_pairs: int) -> float:
    """The median of a symmetric pairwise figure over its distinct pairs (i > j); -inf with fewer
    than `min_pairs` pairs (the rules' `typical_pair_min_pairs`: two uploads have no typical pair
    of their own, the thresholds and the history decide)."""
    values = sorted(matrix[i][j] for i in range(len(matrix)) for j in range(i))
    if len(values) < min_pairs:
        return -math.inf
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def window_typical(uploads: Sequence[Upload], min_pairs: int) -> Typical:
    """The window's own typical pair: the medians of the fingerprints' cosine and of the shared
    positions over every pair of `uploads` (-inf where there are fewer than `min_pairs` pairs or
    no positions)."""
    if len(uploads) < 2:
        return Typical()
    cosine = _cosine_matrix(uploads)
    shared = _shared_matrix(uploads)
    return Typical(typical_pair(cosine, min_pairs), typical_pair(shared, min_pairs) if shared else -math.inf)


def _cosine_matrix(uploads: Sequence[Upload]) -> list[list[float]]:
    lengths = {upload.fingerprint.numel() for upload in uploads}
    if len(lengths) != 1:
        raise ValueError(f"fingerprints differ in length: {sorted(lengths)}")
    prints = torch.stack([u.fingerprint.detach().to("cpu", torch.float64).reshape(-1) for u in uploads])
    if not bool(torch.isfinite(prints).all()):
        raise ValueError("non-finite fingerprint")
    norms = torch.linalg.vector_norm(prints, dim=1, keepdim=True)
    unit = torch.where(norms > 0, prints / norms.clamp_min(1e-300), torch.zeros_like(prints))
    return (unit @ unit.T).tolist()


def find_pools(uploads: Sequence[Upload], rules: GauntletConfig, *,
               confirm: Callable[[Upload, Upload], bool] | None = None,
               typical: Typical | None = None) -> list[list[str]]:
    """Groups of hotkeys whose uploads share work (identical digests or `shares_work` under
    `rules`, against `typical`; None: the typical pair of these uploads alone), among one
    window's uploads: the
    connected components of size ≥ 2, each ordered by (timestamp, hotkey), so its first member is
    the earliest upload; groups ordered by their first member. `confirm`, when given, is asked
    about every pair that `shares_work` on these figures and is not yet in one group, and has the
    last word (identical digests need no confirmation). Why "not yet in one group": the second look
    is the costly part (a larger sample per pair), and a pool of m members whose every pair crosses
    would otherwise be confirmed m(m-1)/2 times (64 members: 2,016 looks, 13.8 s on 2 CPU cores)
    where m - 1 decide the same groups.
    """
    if not 0.0 < rules.duplicate_threshold <= 1.0:
        raise ValueError(f"find_pools: cosine threshold must be in (0, 1], got {rules.duplicate_threshold!r}")
    if not rules.shared_positions_threshold > 0.0:
        raise ValueError(f"find_pools: shared-positions threshold must be > 0, got "
                         f"{rules.shared_positions_threshold!r}")
    if len(uploads) < 2:
        return []
    hotkeys = [upload.hotkey for upload in uploads]
    if len(set(hotkeys)) != len(hotkeys):
        raise ValueError("find_pools: more than one upload for the same hotkey")
    for upload in uploads:
        if not math.isfinite(upload.timestamp):
            raise ValueError(f"find_pools: non-finite timestamp for {upload.hotkey}")
    ordered = sorted(uploads, key=lambda upload: (upload.timestamp, upload.hotkey))
    try:
        cosine = _cosine_matrix(ordered)
    except ValueError as exc:
        raise ValueError(f"find_pools: {exc}") from None

    parent = list(range(len(ordered)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    shared = _shared_matrix(ordered) if math.isfinite(rules.shared_positions_threshold) else None
    if typical is None:
        min_pairs = rules.typical_pair_min_pairs
        typical = Typical(typical_pair(cosine, min_pairs), typical_pair(shared, min_pairs) if shared else -math.inf)
    for i in range(len(ordered)):
        for j in range(i):
            if root(i) == root(j):
                continue  # already one group: joining again changes nothing, and asking `confirm` is not free
            a, b = ordered[i], ordered[j]
            alike = shares_work(cosine[i][j], shared[i][j] if shared else 0.0, rules, typical)
            if a.digest == b.digest or (alike and (confirm is None or confirm(a, b))):
                parent[root(i)] = root(j)
    groups: dict[int, list[str]] = {}
    for i, upload in enumerate(ordered):
        groups.setdefault(root(i), []).append(upload.hotkey)
    return [members for members in groups.values() if len(members) > 1]


def _shared_matrix(uploads: Sequence[Upload]) -> list[list[float]] | None:
    """`shared_positions` of every pair at once (one matmul of the kept-position masks); None
    unless every upload carries canonical values over the same tensors and lengths."""
    if any(u.canonical is None for u in uploads):
        return None
    names = sorted(uploads[0].canonical)  # type: ignore[arg-type]
    try:
        masks = torch.stack([torch.cat([u.canonical[n].reshape(-1) != 0 for n in names])  # type: ignore[index]
                             for u in uploads]).to(torch.float64)
    except (KeyError, RuntimeError):
        return None  # tensors or lengths differ: no position figure rather than a wrong one
    common = masks @ masks.T
    kept = masks.sum(dim=1)
    larger = torch.maximum(kept.unsqueeze(0), kept.unsqueeze(1))
    both = (kept.unsqueeze(0) > 0) & (kept.unsqueeze(1) > 0)
    return torch.where(both, common / larger.clamp_min(1), torch.zeros_like(common)).tolist()


def one_per_pool(scores: Mapping[str, float], pools: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """`scores` with only the best-scoring member of each pool (ties by hotkey) left in: a group
    of hotkeys that share work occupies one top-G slot. `pools` maps a hotkey to its group (itself
    included); a hotkey in no pool is kept."""
    out = {}
    for hotkey, score in scores.items():
        group = {hotkey, *(h for h in pools.get(hotkey, ()) if h in scores)}
        if min(group, key=lambda h: (-scores[h], h)) == hotkey:
            out[hotkey] = score
    return out


def find_copies(uploads: Sequence[Upload], rules: GauntletConfig) -> dict[str, str]:
    """Map each copying hotkey to the hotkey it copied, among one window's uploads: in each group
    of `find_pools`, every member but the earliest upload maps to that earliest one."""
    return {member: pool[0] for pool in find_pools(uploads, rules) for member in pool[1:]}
