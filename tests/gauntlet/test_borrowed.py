"""Borrowed public work and the pool check's unmovable baseline (docs/scoring.md §8): an upload
that copies an earlier window's aggregate or top-G upload is found, never against its own work;
a flood that holds most of a window's uploads, or a pool shaped to stay just under the absolute
thresholds, is still one pool, while honest windows never are."""

from __future__ import annotations

import math

import torch

from templar.core.config import load_hparams
from templar.gauntlet import Upload, find_pools, fingerprint
from templar.gauntlet.borrowed import AGGREGATE, Reference, aggregate_references, find_borrowed, top_of_mean
from templar.gauntlet.duplicates import PairBaseline, Typical, shared_positions, window_typical

RULES = load_hparams().gauntlet  # production's thresholds, margins, ceilings and history
COSINE, SHARED = RULES.duplicate_threshold, RULES.shared_positions_threshold
SIZE, PAIRS = RULES.fingerprint_size, RULES.typical_pair_min_pairs
CHUNK, K, ROWS = 256, 16, 8
LAYOUT = {"a": (CHUNK, K), "b": (CHUNK, K)}


def _sparse(gen: torch.Generator, positions: torch.Tensor | None = None, *, keep: float = 1.0,
            noise: float = 0.0, values: torch.Tensor | None = None) -> torch.Tensor:
    """ROWS chunks of CHUNK with K kept coefficients each; `positions` (ROWS × K) are reused for a
    share `keep` of each row (the rest re-chosen), `values` perturbed by `noise`."""
    dense = torch.zeros(ROWS, CHUNK)
    for row in range(ROWS):
        fresh = torch.randperm(CHUNK, generator=gen)
        if positions is None:
            chosen = fresh[:K]
        else:
            kept = positions[row][: round(keep * K)]
            others = fresh[~torch.isin(fresh, kept)][: K - kept.numel()]
            chosen = torch.cat([kept, others])
        vals = values[row] if values is not None else torch.randn(K, generator=gen)
        dense[row, chosen] = vals * (1 + noise * torch.randn(K, generator=gen))
    return dense.view(-1)


def _baseline() -> PairBaseline:
    """An empty memory of the first sample's typical pairs under production's rules."""
    return PairBaseline(Typical(RULES.typical_ceiling_cosine, RULES.typical_ceiling_shared), RULES.pair_history)


def _payload(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {name: _sparse(gen) for name in LAYOUT}


def _upload(hotkey: str, stamp: float, values: dict[str, torch.Tensor]) -> Upload:
    digest = b"".join(v.numpy().tobytes() for v in values.values())[:32] + hotkey.encode()
    return Upload(hotkey, stamp, digest, fingerprint(values, size=SIZE), values)


def _like(gen: torch.Generator, base: dict[str, torch.Tensor], keep: float, noise: float) -> dict[str, torch.Tensor]:
    """A pool member's payload: `base`'s positions kept at share `keep`, its values with noise."""
    out = {}
    for name, flat in base.items():
        rows = flat.view(ROWS, CHUNK)
        positions = torch.stack([r.abs().topk(K).indices for r in rows])
        values = torch.stack([r[p] for r, p in zip(rows, positions, strict=True)])
        out[name] = _sparse(gen, positions, keep=keep, noise=noise, values=values)
    return out


def _honest_windows(baseline: PairBaseline, gen: torch.Generator, windows: int = 4, miners: int = 6) -> None:
    for _ in range(windows):
        uploads = [_upload(f"h{i}", float(i), _payload(gen)) for i in range(miners)]
        typical = baseline.observe(window_typical(uploads, PAIRS))
        assert find_pools(uploads, RULES, typical=typical) == []


def test_a_flood_holding_most_uploads_is_still_one_pool() -> None:
    """11 of 15 uploads are one update with noise: the pool's pairs are the window's typical pair,
    so judged against the window alone the pool hides; the baseline's ceiling takes the typical
    pair back down and the pool stands (with or without a history of honest windows)."""
    gen = torch.Generator().manual_seed(1)
    base = _payload(gen)
    flood = [_upload(f"pool{i:02d}", float(i), _like(gen, base, 1.0, 0.3)) for i in range(11)]
    honest = [_upload(f"h{i}", 20.0 + i, _payload(gen)) for i in range(4)]
    uploads = flood + honest
    assert find_pools(uploads, RULES) == []  # the attack: the window's own median moves
    for history in (0, 4):
        baseline = _baseline()
        _honest_windows(baseline, gen, windows=history)
        typical = baseline.observe(window_typical(uploads, PAIRS))
        assert typical.shared <= 0.65
        assert find_pools(uploads, RULES, typical=typical) == [[u.hotkey for u in flood]]


def test_a_pool_just_under_the_thresholds_but_far_above_the_baseline_is_caught() -> None:
    """A pool that re-chooses a third of its positions and puts noise on its values stays under both
    absolute thresholds (shared ≈ 0.67, cosine < 0.8), but its pairs stand ≥ 5× above honest pairs:
    the relative rule finds it, in an honest window and in a flood after honest windows."""
    gen = torch.Generator().manual_seed(2)
    base = _payload(gen)
    pool = [_upload(f"pool{i:02d}", float(i), _like(gen, base, 0.67, 1.0)) for i in range(11)]
    pairs = [(a, b) for k, a in enumerate(pool) for b in pool[:k]]
    assert all(shared_positions(a.canonical, b.canonical) < SHARED for a, b in pairs)
    assert all(float(a.fingerprint @ b.fingerprint) < COSINE for a, b in pairs)
    honest = [_upload(f"h{i}", 20.0 + i, _payload(gen)) for i in range(6)]
    typical_honest = window_typical(honest, PAIRS)
    assert min(shared_positions(a.canonical, b.canonical) for a, b in pairs) >= 5 * typical_honest.shared

    assert find_pools(pool[:3] + honest, RULES, typical=_baseline().observe(
        window_typical(pool[:3] + honest, PAIRS))) == [[u.hotkey for u in pool[:3]]]
    baseline = _baseline()
    _honest_windows(baseline, gen)
    flood = pool + honest[:4]
    assert find_pools(flood, RULES) == []  # the window's median alone: hidden
    assert find_pools(flood, RULES, typical=baseline.observe(window_typical(flood, PAIRS))) == [
        [u.hotkey for u in pool]]


def test_the_baseline_is_the_smallest_of_window_history_and_ceiling_and_remembers_capped() -> None:
    baseline = PairBaseline(Typical(0.7, 0.65), windows=3)
    assert baseline.observe(Typical()) == Typical(0.7, 0.65)  # nothing known: the ceiling
    assert baseline.history == type(baseline.history)()  # an empty window teaches nothing
    assert baseline.observe(Typical(0.2, 0.1)) == Typical(0.2, 0.1)
    assert baseline.observe(Typical(0.9, 1.0)) == Typical(0.2, 0.1)  # a flood: the history holds
    assert list(baseline.history)[-1] == Typical(0.7, 0.65)  # remembered capped
    for _ in range(3):
        baseline.observe(Typical(0.9, 1.0))
    assert baseline.observe(Typical(0.9, 1.0)) == Typical(0.7, 0.65)  # a lasting flood: the ceiling


def test_copies_of_earlier_public_work_are_found_but_never_against_their_own_work() -> None:
    gen = torch.Generator().manual_seed(3)
    earlier = {f"g{i}": _payload(gen) for i in range(8)}
    refs = [Reference(hk, 4, fingerprint(v, size=SIZE), v, frozenset({hk}), digest=hk.encode()) for hk, v in earlier.items()]
    refs += aggregate_references(4, earlier, LAYOUT, size=SIZE)
    assert sum(r.source == AGGREGATE for r in refs) == 9  # the mean, and each contributor's leave-one-out

    rescaled = {n: 7.0 * v for n, v in earlier["g1"].items()}
    aggregate = {n: -0.01 * v for n, v in top_of_mean(list(earlier.values()), LAYOUT).items()}
    perturbed_aggregate = _like(gen, top_of_mean(list(earlier.values()), LAYOUT), 1.0, 0.3)
    uploads = [_upload("copier", 1.0, rescaled), _upload("agg", 2.0, perturbed_aggregate),
               _upload("flipped", 3.0, aggregate), _upload("honest", 4.0, _payload(gen)),
               _upload("g0", 5.0, earlier["g0"]),  # its own previous upload again: not this check's
               _upload("g2", 6.0, perturbed_aggregate)]  # a contributor: judged on the others' mean
    found = find_borrowed(uploads, refs, RULES)
    # a negated aggregate keeps its positions: no work of its own either
    assert {hk: r.source for hk, r in found.items()} == {"copier": "g1", "agg": AGGREGATE, "flipped": AGGREGATE,
                                                         "g2": AGGREGATE}
    assert found["g2"].owners == frozenset(earlier) - {"g2"}
    same_digest = Upload("twin", 7.0, b"g3", torch.zeros(SIZE), None)
    assert find_borrowed([same_digest], refs, RULES)["twin"].source == "g3"
    assert find_borrowed(uploads, refs, RULES, confirm=lambda u, r: False) == {}


def test_top_of_mean_keeps_k_per_chunk_of_the_normalised_mean() -> None:
    gen = torch.Generator().manual_seed(4)
    members = [_payload(gen), {n: 1000.0 * v for n, v in _payload(gen).items()}]
    mean = top_of_mean(members, LAYOUT)
    assert set(mean) == set(LAYOUT)
    rows = mean["a"].view(ROWS, CHUNK)
    assert ((rows != 0).sum(dim=1) == K).all()
    # each member counts alike whatever its scale (aggregation normalises every peer)
    unit = [m["a"] / m["a"].norm() for m in members]
    assert math.isclose(float(torch.nn.functional.cosine_similarity((unit[0] + unit[1]) / 2, mean["a"], dim=0)),
                        1.0, rel_tol=0.5)
