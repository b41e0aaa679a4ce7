"""Copy detection: identical or near-identical payloads from different hotkeys; the later loses."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from tests.rules import gauntlet_rules

from templar.core.config import GauntletConfig
from templar.gauntlet import Upload, find_copies, fingerprint

THRESHOLD = 0.98
SIZE = gauntlet_rules().fingerprint_size  # production's 1024


def cosine_only(threshold: float = THRESHOLD) -> GauntletConfig:
    """The shared-work rule on the fingerprints' cosine alone (no shared-positions threshold)."""
    return gauntlet_rules(duplicate_threshold=threshold, shared_positions_threshold=math.inf)


BOTH = gauntlet_rules(duplicate_threshold=0.8, shared_positions_threshold=0.75)
"""Production's two thresholds."""


def _payload(seed: int) -> dict[str, torch.Tensor]:
    """A stand-in for decoded DeMo coefficients: a few tensors of sparse-ish values."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "layers.0.attn.q.weight": torch.randn(64, 64, generator=gen) * 1e-3,
        "layers.0.mlp.up.weight": torch.randn(128, 64, generator=gen) * 5e-4,
        "embed.weight": torch.randn(4096, generator=gen) * 2e-3,
    }


def _digest(values: dict[str, torch.Tensor]) -> bytes:
    h = hashlib.sha256()
    for name in sorted(values):
        h.update(name.encode())
        h.update(values[name].numpy().tobytes())
    return h.digest()


def _upload(hotkey: str, timestamp: float, values: dict[str, torch.Tensor]) -> Upload:
    return Upload(hotkey, timestamp, _digest(values), fingerprint(values, size=SIZE))


def test_fingerprint_is_deterministic_unit_and_order_free() -> None:
    values = _payload(0)
    first = fingerprint(values, size=SIZE)
    assert first.shape == (1024,) and first.dtype == torch.float64
    assert torch.linalg.vector_norm(first).item() == pytest.approx(1.0, abs=1e-12)
    assert torch.equal(first, fingerprint(dict(reversed(list(values.items()))), size=SIZE))
    assert fingerprint(values, size=64).shape == (64,)


def test_fingerprint_ignores_per_tensor_rescaling() -> None:
    values = _payload(1)
    rescaled = {name: tensor * factor for (name, tensor), factor in zip(values.items(), (1e4, 3e-3, 7.0), strict=True)}
    assert float(fingerprint(values, size=SIZE) @ fingerprint(rescaled, size=SIZE)) == pytest.approx(1.0, abs=1e-9)


def test_fingerprint_cosine_tracks_true_cosine() -> None:
    # two peers sharing a common gradient direction: per-tensor cosine 0.5 by construction
    common, own_a, own_b = _payload(10), _payload(11), _payload(12)
    peer_a = {n: common[n] + own_a[n] for n in common}
    peer_b = {n: common[n] + own_b[n] for n in common}
    sketch_cos = float(fingerprint(peer_a, size=SIZE) @ fingerprint(peer_b, size=SIZE))
    assert 0.35 < sketch_cos < 0.65
    assert find_copies([_upload("a", 1.0, peer_a), _upload("b", 2.0, peer_b)], cosine_only()) == {}


def test_fingerprint_of_zeros_matches_nothing_and_bad_input_raises() -> None:
    zeros = {name: torch.zeros_like(t) for name, t in _payload(2).items()}
    assert torch.count_nonzero(fingerprint(zeros, size=SIZE)) == 0
    with pytest.raises(ValueError, match="non-finite"):
        fingerprint({"w": torch.tensor([1.0, float("nan")])}, size=SIZE)
    with pytest.raises(ValueError, match="no tensors"):
        fingerprint({}, size=SIZE)
    with pytest.raises(ValueError, match="size"):
        fingerprint(_payload(0), size=0)


def test_identical_payload_later_upload_loses() -> None:
    original = _payload(3)
    uploads = [
        _upload("copier", 12.5, {n: t.clone() for n, t in original.items()}),
        _upload("honest", 10.0, original),
        _upload("other", 11.0, _payload(4)),
    ]
    assert find_copies(uploads, cosine_only()) == {"copier": "honest"}


def test_identical_digest_caught_even_without_fingerprint_signal() -> None:
    blank = torch.zeros(1024, dtype=torch.float64)
    uploads = [Upload("b", 2.0, b"same", blank), Upload("a", 1.0, b"same", blank), Upload("c", 3.0, b"diff", blank)]
    assert find_copies(uploads, cosine_only()) == {"b": "a"}


def test_near_identical_scaled_copy_is_caught() -> None:
    original = _payload(5)
    gen = torch.Generator().manual_seed(99)
    # ×1e4 plus 1% relative noise: different bytes, same direction
    disguised = {n: t * 1e4 + 1e-2 * t.std() * 1e4 * torch.randn(t.shape, generator=gen) for n, t in original.items()}
    uploads = [_upload("orig", 1.0, original), _upload("copy", 2.0, disguised)]
    assert uploads[0].digest != uploads[1].digest
    assert find_copies(uploads, cosine_only()) == {"copy": "orig"}


def test_different_payloads_are_not_caught() -> None:
    uploads = [_upload(f"peer{i}", float(i), _payload(100 + i)) for i in range(20)]
    assert find_copies(uploads, cosine_only()) == {}


def test_timestamp_tie_broken_by_hotkey_and_chains_point_at_the_earliest() -> None:
    values = _payload(6)
    tied = [_upload("zed", 5.0, values), _upload("amy", 5.0, values)]
    assert find_copies(tied, cosine_only()) == {"zed": "amy"}
    chain = [_upload("third", 3.0, values), _upload("first", 1.0, values), _upload("second", 2.0, values)]
    assert find_copies(chain, cosine_only()) == {"second": "first", "third": "first"}


def test_find_copies_rejects_malformed_batches() -> None:
    values = _payload(7)
    with pytest.raises(ValueError, match="same hotkey"):
        find_copies([_upload("a", 1.0, values), _upload("a", 2.0, _payload(8))], cosine_only())
    short = Upload("b", 2.0, b"x", torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="length"):
        find_copies([_upload("a", 1.0, values), short], cosine_only())
    with pytest.raises(ValueError, match="threshold"):
        find_copies([], cosine_only(0.0))
    assert find_copies([_upload("a", 1.0, values)], cosine_only()) == {}


def test_find_copies_scales_to_a_full_window() -> None:
    gen = torch.Generator().manual_seed(0)
    prints = torch.nn.functional.normalize(torch.randn(256, 1024, generator=gen, dtype=torch.float64), dim=1)
    uploads = [Upload(f"hk{i:03d}", float(i), i.to_bytes(2, "big"), prints[i]) for i in range(256)]
    uploads.append(Upload("late-copy", 999.0, b"other", prints[17] * 3.0))
    assert find_copies(uploads, cosine_only()) == {"late-copy": "hk017"}


def test_pools_link_shared_positions_transitively_and_agree_with_the_pairwise_figure() -> None:
    """Pools (docs/scoring.md §8): noise on the values hides a pool from the cosine, not from the positions (a
    member with other values on the same positions joins too), independent payloads stay out,
    and `find_pools`' matrix of shared positions is `shared_positions` pair by pair."""
    from templar.gauntlet import find_pools, shared_positions
    from templar.gauntlet.duplicates import _shared_matrix

    def sparse(seed: int, keep: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        values = _payload(seed)
        gen = torch.Generator().manual_seed(seed + 1000)
        return {n: v * (keep[n] if keep is not None else (torch.rand(v.shape, generator=gen) < 0.1))
                for n, v in values.items()}

    base = sparse(1)
    keep = {n: v != 0 for n, v in base.items()}
    noisy = [{n: v * (1 + 2.0 * torch.randn(v.shape, generator=torch.Generator().manual_seed(i)))
              for n, v in base.items()} for i in range(2)]
    uploads = [Upload(f"pool{i}", float(i), _digest(v), fingerprint(v, size=SIZE), v) for i, v in enumerate(noisy)]
    uploads += [Upload(f"h{i}", 10.0 + i, _digest(v), fingerprint(v, size=SIZE), v) for i, v in ((0, sparse(7)), (1, sparse(8)))]
    uploads.append(Upload("pool2", 5.0, b"x", fingerprint(sparse(9, keep), size=SIZE), sparse(9, keep)))
    assert find_pools(uploads, cosine_only(0.8)) == []  # the cosine alone misses it
    assert find_pools(uploads, BOTH) == [["pool0", "pool1", "pool2"]]
    matrix = _shared_matrix(uploads)
    for i, a in enumerate(uploads):
        for j, b in enumerate(uploads):
            assert matrix[i][j] == pytest.approx(shared_positions(a.canonical, b.canonical))


def test_an_upload_that_keeps_only_what_every_upload_keeps_links_no_one() -> None:
    """A hotkey that does no work uploads values only where every upload keeps every position (a chunk
    no larger than k: every norm weight's) and zeros elsewhere. Over the smaller of two counts of kept
    positions it shared all of its own with every honest upload, and `find_pools` made it and every honest
    miner of the window one pool (each paid a share of one score, and its first member the others'
    original). Over the larger count it shares a few per cent with each, as honest pairs do."""
    from templar.gauntlet import find_pools, shared_positions

    def honest(seed: int) -> dict[str, torch.Tensor]:
        values = _payload(seed)
        gen = torch.Generator().manual_seed(seed + 1000)
        kept = {n: v * (torch.rand(v.shape, generator=gen) < 0.1) for n, v in values.items()}
        return {**kept, "layers.0.norm.weight": torch.randn(64, generator=gen) + 3.0}  # every position kept

    norm_only = {n: torch.zeros_like(v) for n, v in honest(0).items()}
    norm_only["layers.0.norm.weight"] = torch.ones(64)
    miners = [honest(seed) for seed in range(1, 7)]
    uploads = [Upload("bridge", 0.0, _digest(norm_only), fingerprint(norm_only, size=SIZE), norm_only)]
    uploads += [Upload(f"h{i}", 1.0 + i, _digest(v), fingerprint(v, size=SIZE), v) for i, v in enumerate(miners)]
    assert all(shared_positions(norm_only, v) < 0.2 for v in miners)
    assert find_pools(uploads, BOTH) == []
    # a pool on the same layout is still one: two noisy copies of one honest update keep its positions
    noisy = {n: v * (1 + torch.randn(v.shape, generator=torch.Generator().manual_seed(9))) for n, v in miners[0].items()}
    uploads.append(Upload("copy", 99.0, _digest(noisy), fingerprint(noisy, size=SIZE), noisy))
    assert find_pools(uploads, BOTH) == [["h0", "copy"]]


def test_shares_work_needs_the_threshold_and_a_margin_over_the_typical_pair() -> None:
    from templar.gauntlet.duplicates import Typical, shares_work, typical_pair

    # production's typical_pair_margin is 0.1: a pair must stand 0.1 above the typical pair of its window
    assert BOTH.typical_pair_margin == 0.1
    assert shares_work(0.85, 0.2, BOTH)  # no typical pair: the thresholds alone, as before
    assert not shares_work(0.85, 0.2, BOTH, Typical(cosine=0.80))  # everyone is this alike
    assert shares_work(0.95, 0.2, BOTH, Typical(cosine=0.80))
    assert shares_work(0.5, 1.0, BOTH, Typical(0.80, 0.8))  # same positions
    assert not shares_work(0.5, 0.85, BOTH, Typical(0.80, 0.8))
    assert not shares_work(0.7, 0.7, BOTH)  # below both thresholds, whatever the window
    # the median over distinct pairs (i > j) of a symmetric figure; two uploads have no typical pair
    assert typical_pair([[1.0, 0.2, 0.9], [0.2, 1.0, 0.4], [0.9, 0.4, 1.0]], 3) == pytest.approx(0.4)
    assert typical_pair([[1.0, 0.9], [0.9, 1.0]], 3) == -float("inf")


def test_a_window_where_every_honest_update_is_alike_is_no_pool_and_a_pool_still_stands_out() -> None:
    """The localnet's false pool (benchmarks/LOG.md §6): in a window where the
    validator's sample finds every honest update pointing the same way (pairwise cosine ≈ 0.86,
    over the 0.8 threshold), the absolute rule alone made all of them one pool. Against the
    window's typical pair none is, while three hotkeys posting one update with a little noise
    (cosine ≈ 0.998) are still found."""
    from templar.gauntlet import find_pools

    gen = torch.Generator().manual_seed(5)
    common = torch.randn(1024, generator=gen, dtype=torch.float64)

    def alike(noise: float, base: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(base + noise * torch.randn(1024, generator=gen, dtype=torch.float64),
                                             dim=0)

    honest = [Upload(f"honest{i}", float(i), bytes([i]), alike(0.4, common)) for i in range(6)]
    pool_update = common + 0.4 * torch.randn(1024, generator=gen, dtype=torch.float64)
    pool = [Upload(f"pool{i}", 10.0 + i, bytes([100 + i]), alike(0.05, pool_update)) for i in range(3)]
    cosines = [float(a.fingerprint @ b.fingerprint) for k, a in enumerate(honest) for b in honest[:k]]
    assert min(cosines) > 0.8  # the absolute rule alone takes every honest pair for shared work
    assert find_pools(honest, cosine_only(0.8)) == []
    assert find_pools(honest + pool, cosine_only(0.8)) == [["pool0", "pool1", "pool2"]]


def test_a_confirmation_has_the_last_word_on_alike_pairs_but_not_on_identical_digests() -> None:
    """`find_pools(confirm=…)`: a pair that crosses on the sample counts only if the second look
    agrees (fast evaluation's larger sample); identical digests need none, and pairs that do not
    cross are never asked about."""
    from templar.gauntlet import find_pools

    values = _payload(11)
    asked = []

    def never(a: Upload, b: Upload) -> bool:
        asked.append((a.hotkey, b.hotkey))
        return False

    alike = [Upload(name, float(i), bytes([i]), fingerprint(values, size=SIZE)) for i, name in enumerate(("a", "b"))]
    others = [_upload(f"o{i}", 10.0 + i, _payload(20 + i)) for i in range(3)]
    assert find_pools(alike + others, cosine_only()) == [["a", "b"]]
    assert find_pools(alike + others, cosine_only(), confirm=never) == []
    assert asked == [("b", "a")]  # only the crossing pair was asked about
    same = [_upload("x", 1.0, values), _upload("y", 2.0, values)]
    assert find_pools(same + others, cosine_only(), confirm=never) == [["x", "y"]]


def test_a_pool_is_confirmed_once_per_member_not_once_per_pair() -> None:
    """A pool of m uploads whose every pair crosses on the first sample asks the (costly) second look
    m - 1 times, not m(m-1)/2: pairs already in one group are not asked about again, and the groups
    are the same (a 64-member pool asked 2,016 looks, 13.8 s on 2 CPU cores)."""
    from templar.gauntlet import find_pools
    from templar.gauntlet.duplicates import Typical

    values = _payload(12)
    uploads = [Upload(f"p{i:02d}", float(i), bytes([i]), fingerprint(values, size=SIZE)) for i in range(16)]
    asked: list[tuple[str, str]] = []

    def always(a: Upload, b: Upload) -> bool:
        asked.append((a.hotkey, b.hotkey))
        return True

    # the typical pair as a fresh validator's baseline caps it (the window's own median would be the pool)
    typical = Typical(cosine_only().typical_ceiling_cosine, cosine_only().typical_ceiling_shared)
    assert find_pools(uploads, cosine_only(), confirm=always, typical=typical) == [[u.hotkey for u in uploads]]
    assert len(asked) == len(uploads) - 1
