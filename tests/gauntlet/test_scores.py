"""The paper's formulas against hand-computed values (the paper's eqs. 2-5 and its §3.2; docs/scoring.md)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from templar.core.config import load_hparams
from templar.gauntlet import (
    is_synced,
    loss_score,
    normalise,
    peer_score,
    penalise,
    size_credit,
    sync_steps,
    top_g,
    typical_gap,
    update_mu,
    window_gap,
)
from templar.gauntlet.scores import proof_gap, step_movement

# ---- SyncScore ------------------------------------------------------------------------------


def test_sync_steps_hand_example() -> None:
    # |diff| = [0, 0.0015, 0.003, 0]; mean = 0.0045 / 4 = 0.001125; / α=0.001 → 1.125 steps
    ours = torch.tensor([0.5, -0.25, 1.0, 2.0], dtype=torch.float64)
    theirs = torch.tensor([0.5, -0.2485, 0.997, 2.0], dtype=torch.float64)
    assert sync_steps(ours, theirs, 0.001) == pytest.approx(1.125, rel=1e-9)


def test_sync_steps_identical_is_zero_and_exact_step_multiples() -> None:
    theta = torch.randn(64, dtype=torch.float64)
    assert sync_steps(theta, theta.clone(), 0.01) == 0.0
    # a peer exactly 3 signed steps behind on every value: 3α / α = 3
    behind = theta + 3 * 0.01 * torch.sign(torch.randn(64, dtype=torch.float64))
    assert sync_steps(theta, behind, 0.01) == pytest.approx(3.0, rel=1e-9)


def test_sync_steps_accepts_low_precision_peer_values() -> None:
    ours = torch.tensor([1.0, 2.0])
    theirs = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert sync_steps(ours, theirs, 0.5) == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_sync_steps_non_finite_peer_is_infinitely_far(bad: float) -> None:
    assert sync_steps(torch.zeros(3), torch.tensor([0.0, bad, 0.0]), 0.001) == math.inf
    assert not is_synced(math.inf, 3.0)


@pytest.mark.parametrize("unit", [-0.1, math.nan, math.inf])
def test_sync_steps_rejects_a_bad_unit(unit: float) -> None:
    with pytest.raises(ValueError, match="unit"):
        sync_steps(torch.zeros(2), torch.zeros(2), unit)


def _sparse_step(theta: torch.Tensor, density: float, gen: torch.Generator) -> torch.Tensor:
    """θ after one SparseLoCo-like step: a `density` share of coordinates moved by α·v, v ~ 1e-4."""
    moved = torch.rand(theta.shape, generator=gen, dtype=torch.float64) < density
    return theta - 2.0 * moved * 1e-4 * torch.randn(theta.shape, generator=gen, dtype=torch.float64)


def test_a_sparse_rule_counts_its_own_steps_where_alpha_would_call_every_model_in_sync() -> None:
    """A model k steps behind under a sparse rule is ≈ k of the last step's movement away (exactly 1
    for one step), where a distance over α reads ≈ 0 steps for any k: the desync hole the unit closes."""
    gen = torch.Generator().manual_seed(0)
    history = [torch.randn(4096, generator=gen, dtype=torch.float64) * 0.02]
    for _ in range(6):
        history.append(_sparse_step(history[-1], 0.06, gen))
    ours = history[-1]
    unit = step_movement({"w": history[-2]}, {"w": ours})
    assert 0 < unit < 2.0 * 1e-4
    assert sync_steps(ours, history[-2], unit) == pytest.approx(1.0, rel=1e-12)
    for behind in (3, 5):
        steps = sync_steps(ours, history[-1 - behind], unit)
        assert 0.6 * behind < steps < 1.4 * behind, (behind, steps)
        assert sync_steps(ours, history[-1 - behind], 2.0) < 1e-3  # in units of α: "in sync"
    assert sync_steps(ours, ours.clone(), unit) == 0.0


def test_rounding_within_ulp_slack_is_no_distance_and_a_step_that_moved_nothing_is_a_zero_unit() -> None:
    ours = torch.tensor([0.5, -0.25, 1.0, 2.0], dtype=torch.float64)
    rounded = ours * (1 + 2.0**-23)  # one float32 ulp off each value: another device's rounding
    assert sync_steps(ours, rounded, 1e-9) > 1  # without the slack, rounding reads as steps
    assert sync_steps(ours, rounded, 1e-9, ulp_slack=8 * 2.0**-23) == 0.0
    assert step_movement({"a": ours}, {"a": ours.clone()}) == 0.0
    assert sync_steps(ours, rounded, 0.0, ulp_slack=8 * 2.0**-23) == 0.0  # nothing moved, nothing apart
    assert sync_steps(ours, ours + 1e-3, 0.0) == math.inf  # apart where the run did not move
    with pytest.raises(ValueError, match="different parameters"):
        step_movement({"a": ours}, {"b": ours})


def test_sync_steps_rejects_empty_and_mismatched() -> None:
    with pytest.raises(ValueError, match="no probed"):
        sync_steps(torch.zeros(0), torch.zeros(0), 0.1)
    with pytest.raises(ValueError, match="shape"):
        sync_steps(torch.zeros(2), torch.zeros(3), 0.1)
    with pytest.raises(ValueError, match="own probe"):
        sync_steps(torch.tensor([math.nan]), torch.zeros(1), 0.1)


def test_is_synced_threshold() -> None:
    assert is_synced(3.0, 3.0)
    assert not is_synced(3.0000001, 3.0)
    assert not is_synced(math.nan, 3.0)


# ---- LossScore ------------------------------------------------------------------------------


def test_loss_score_hand_values() -> None:
    assert loss_score(3.25, 3.0) == 0.25  # the update lowered the loss by 0.25 nats
    assert loss_score(3.0, 3.5) == -0.5  # the update hurt
    assert loss_score(2.0, 2.0) == 0.0


@pytest.mark.parametrize("after", [math.nan, math.inf])
def test_loss_score_destructive_update_is_minus_inf(after: float) -> None:
    assert loss_score(3.0, after) == -math.inf


def test_loss_score_rejects_bad_baseline() -> None:
    with pytest.raises(ValueError, match="baseline"):
        loss_score(math.nan, 3.0)


# ---- μ: proof of computation and the fast-eval penalty ------------------------------------------


def test_update_mu_hand_values() -> None:
    # γ=0.9: 0.9·0 + 0.1·sign(0.3−0.1)=+1 → 0.1
    assert update_mu(0.0, 0.3, 0.1, 0.9) == pytest.approx(0.1, abs=1e-15)
    # 0.9·0.5 + 0.1·sign(0.1−0.3)=−1 → 0.45 − 0.1 = 0.35
    assert update_mu(0.5, 0.1, 0.3, 0.9) == pytest.approx(0.35, abs=1e-15)
    # equal deltas: sign 0 → pure decay 0.9·0.5 = 0.45
    assert update_mu(0.5, 0.2, 0.2, 0.9) == pytest.approx(0.45, abs=1e-15)
    # γ=0.7: 0.7·(−0.2) + 0.3·(+1) = −0.14 + 0.3 = 0.16
    assert update_mu(-0.2, 0.02, 0.01, 0.7) == pytest.approx(0.16, abs=1e-15)


def test_update_mu_destructive_update_counts_as_minus_one() -> None:
    # −inf on both sets would be −inf − −inf = NaN in the raw formula; here it is −1:
    # 0.9·0.5 − 0.1 = 0.35
    assert update_mu(0.5, -math.inf, -math.inf, 0.9) == pytest.approx(0.35, abs=1e-15)
    assert update_mu(0.5, -math.inf, 0.1, 0.9) == pytest.approx(0.35, abs=1e-15)
    assert update_mu(0.5, 0.1, -math.inf, 0.9) == pytest.approx(0.35, abs=1e-15)


def test_update_mu_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="gamma"):
        update_mu(0.0, 0.1, 0.0, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        update_mu(0.0, math.nan, 0.0, 0.9)


def test_mu_stays_in_unit_interval_under_any_sequence() -> None:
    mu = 0.0
    for step in range(200):
        mu = update_mu(mu, 1.0 if step % 3 else -1.0, 0.0, 0.7)
        if step % 5 == 0:
            mu = penalise(mu, 0.75)
        assert -1.0 <= mu <= 1.0


def test_penalise_sequence() -> None:
    # 1 → 0.75 → 0.5625 → 0.421875 (φ = 0.75, exact in binary)
    mu = 1.0
    seen = []
    for _ in range(3):
        mu = penalise(mu, 0.75)
        seen.append(mu)
    assert seen == [0.75, 0.5625, 0.421875]


def test_penalise_negative_mu_moves_toward_zero_but_never_pays() -> None:
    # −0.4 · 0.75 = −0.3: "less negative", yet the floored PeerScore is 0 before and after.
    assert penalise(-0.4, 0.75) == pytest.approx(-0.3, abs=1e-15)
    assert peer_score(-0.4, 10.0) == 0.0
    assert peer_score(penalise(-0.4, 0.75), 10.0) == 0.0


def test_penalise_rejects_bad_phi() -> None:
    for phi in (0.0, 1.5, -0.75):
        with pytest.raises(ValueError, match="phi"):
            penalise(0.5, phi)


# ---- PeerScore --------------------------------------------------------------------------------


def test_peer_score_hand_values_and_exploit() -> None:
    assert peer_score(0.5, 4.0) == 2.0
    assert peer_score(-0.5, -4.0) == 0.0  # the raw product would be +2.0: the exploit
    assert peer_score(0.5, -4.0) == 0.0
    assert peer_score(-0.5, 4.0) == 0.0
    assert peer_score(math.nan, 4.0) == 0.0
    assert peer_score(0.5, math.nan) == 0.0


# ---- normalisation and top-G --------------------------------------------------------------------


def test_normalise_power_two_hand_example() -> None:
    # scores 0, 1, 2; min 0; squared 0, 1, 4; sum 5 → 0, 0.2, 0.8
    x = normalise({"a": 0.0, "b": 1.0, "c": 2.0}, 2.0)
    assert x == pytest.approx({"a": 0.0, "b": 0.2, "c": 0.8}, abs=1e-15)
    # paper's shift: 1, 2, 3 → min 1 → same 0, 1, 4 → same result; the minimum gets exactly 0
    assert normalise({"a": 1.0, "b": 2.0, "c": 3.0}, 2.0) == pytest.approx(x, abs=1e-15)
    # power 1: 1, 3 → 0, 2 → 0, 1
    assert normalise({"a": 1.0, "b": 3.0}, 1.0) == {"a": 0.0, "b": 1.0}


def test_normalise_floor_anchors_baseline_at_zero() -> None:
    # floor 0: min(1, 0) = 0; 1², 2² = 1, 4; sum 5 → 0.2, 0.8 (the weaker peer is not zeroed)
    assert normalise({"a": 1.0, "b": 2.0}, 2.0, floor=0.0) == pytest.approx({"a": 0.2, "b": 0.8}, abs=1e-15)
    assert normalise({"solo": 3.0}, 2.0, floor=0.0) == {"solo": 1.0}
    assert normalise({"solo": 3.0}, 2.0) == {"solo": 0.0}  # paper formula: a lone peer gets 0


def test_normalise_degenerate_inputs() -> None:
    assert normalise({}, 2.0) == {}
    assert normalise({"a": 0.0, "b": 0.0}, 2.0) == {"a": 0.0, "b": 0.0}
    assert normalise({"a": 5.0, "b": 5.0}, 2.0) == {"a": 0.0, "b": 0.0}
    assert normalise({"a": 0.0, "b": 0.0, "c": 0.7}, 2.0) == {"a": 0.0, "b": 0.0, "c": 1.0}
    with pytest.raises(ValueError, match="power"):
        normalise({"a": 1.0}, 0.0)
    with pytest.raises(ValueError, match="not finite"):
        normalise({"a": math.inf, "b": 0.0}, 2.0)


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([1.0, 2.0, 3.0]),
)
def test_normalise_is_a_distribution_and_order_free(scores: dict[str, float], power: float) -> None:
    x = normalise(scores, power, floor=0.0)
    assert set(x) == set(scores)
    assert all(value >= 0.0 for value in x.values())
    if any(value ** power > 0 for value in scores.values()):
        assert math.fsum(x.values()) == pytest.approx(1.0, abs=1e-12)
    reversed_input = dict(reversed(list(scores.items())))
    assert normalise(reversed_input, power, floor=0.0) == x


def test_top_g_is_deterministic_positive_only_and_tie_broken_by_hotkey() -> None:
    x = {"b": 0.5, "a": 0.5, "c": 0.9, "d": 0.0, "e": -1.0}
    assert top_g(x, 2) == ["c", "a"]
    assert top_g(x, 10) == ["c", "a", "b"]
    assert top_g(x, 0) == []
    assert top_g(dict(reversed(list(x.items()))), 10) == ["c", "a", "b"]
    with pytest.raises(ValueError):
        top_g(x, -1)


def test_top_g_ties_follow_the_draw_before_the_hotkey() -> None:
    """Equal PeerScores are common (saturated credits, a new book): ordered by hotkey string, a key ground
    for a small prefix won every tie, and a group that took most of the list so set its own trial steps'
    size (benchmarks/LOG.md §62). With `ties` they follow the draw; a better score still comes first."""
    x = {"0000a": 0.5, "0000b": 0.5, "h1": 0.5, "h2": 0.5, "best": 0.9}
    assert top_g(x, 3) == ["best", "0000a", "0000b"]
    order = {"h2": b"\x00", "0000b": b"\x01", "h1": b"\x02", "0000a": b"\x03", "best": b"\xff"}
    assert top_g(x, 3, ties=order.__getitem__) == ["best", "h2", "0000b"]
    assert top_g(x, 10, ties=lambda hotkey: b"") == top_g(x, 10)  # an even draw falls back to the hotkey


def test_a_top_g_slot_needs_a_share_of_the_best_score() -> None:
    """Hotkeys posting near-zero values score by rounding alone (1e-10 to 1e-5 against honest 20); where
    honest miners are fewer than G they filled the list, and the aggregate clipped every step to their size
    (benchmarks/LOG.md §59). A slot needs `top_g_min_share` of the best: production's 1 %."""
    assert load_hparams().gauntlet.top_g_min_share == 0.01
    x = {"honest1": 21.1, "honest2": 19.0, "faint1": 1.9e-5, "faint2": 1.2e-10, "newcomer": 0.3}
    assert top_g(x, 4) == ["honest1", "honest2", "newcomer", "faint1"]  # the paper's rule: any score > 0
    assert top_g(x, 4, 0.01) == ["honest1", "honest2", "newcomer"]  # a newcomer at 1.4 % of the best is in
    assert top_g({"faint1": 1.9e-5, "faint2": 1.2e-10}, 4, 0.01) == ["faint1"]  # relative: nobody better
    with pytest.raises(ValueError):
        top_g(x, 4, 1.0)


def test_update_mu_margin_ignores_noise_and_gives_diluted_gaps_partial_credit():
    # Lazy peer: δa 0.050 vs δr 0.048; zone = 0.3·(0.050+0.048)/2 = 0.0147, gap 0.002 < zone/2
    # → direction 0, μ only decays: 0.5·0.7 = 0.35 (a bare sign would have given 0.65).
    assert update_mu(0.5, 0.050, 0.048, 0.7, margin=0.3) == pytest.approx(0.35)
    assert update_mu(0.5, 0.050, 0.048, 0.7) == pytest.approx(0.65)
    assert update_mu(0.5, 0.048, 0.050, 0.7, margin=0.3) == pytest.approx(0.35)
    # Honest peer: gap 0.04 far outside the zone 0.3·0.05 = 0.015 → full +1: 0.7·0 + 0.3 = 0.3
    assert update_mu(0.0, 0.07, 0.03, 0.7, margin=0.3) == pytest.approx(0.3)
    # and the other way round still counts −1
    assert update_mu(0.0, 0.03, 0.07, 0.7, margin=0.3) == pytest.approx(-0.3)
    # Extra data dilutes the gap: δa 0.11, δr 0.09 → zone 0.03, gap 0.02 is 1/3 of the way from
    # zone/2 to zone → credit 1/3 (a hard dead zone gave 0, and μ decayed).
    assert update_mu(0.0, 0.11, 0.09, 0.7, margin=0.3) == pytest.approx(0.3 / 3)
    # Both LossScores zero (a zero update): no evidence either way, μ decays.
    assert update_mu(0.5, 0.0, 0.0, 0.7, margin=0.3) == pytest.approx(0.35)
    # A broken update on either set is still −1 whatever the margin.
    assert update_mu(0.0, -math.inf, 0.01, 0.7, margin=0.3) == pytest.approx(-0.3)
    with pytest.raises(ValueError):
        update_mu(0.0, 0.1, 0.0, 0.7, margin=-0.1)


def test_update_mu_pays_extra_work_more_than_noise_over_many_windows():
    """Over a run, a peer training on 2x pages (relative gaps 0.15-0.5, as measured in a tiny localnet)
    keeps most of an honest peer's μ, while a lazy one (gaps ±0.12 around 0) stays near 0."""
    honest = [0.6, 0.9, 0.4, 0.5, 0.7, 0.55, 0.5, 0.6]
    more = [0.9, 0.27, 0.18, 0.36, 0.4, 0.47, 0.4, 0.2]
    lazy = [-0.08, 0.03, 0.12, -0.05, 0.0, 0.03, -0.1, 0.06]

    def final_mu(relative_gaps: list[float]) -> float:
        mu = 0.0
        for r in relative_gaps:  # δr = 0.05, δa chosen so (δa−δr)/((δa+δr)/2) = r
            d_rand = 0.05
            d_assigned = d_rand * (2 + r) / (2 - r)
            mu = update_mu(mu, d_assigned, d_rand, 0.7, margin=0.3)
        return mu

    assert final_mu(honest) > 0.9
    assert final_mu(more) > 0.7 * final_mu(honest)  # a hard dead zone left it at 0.56
    assert abs(final_mu(lazy)) < 0.05


def test_update_mu_measures_gaps_against_the_window_scale_when_that_is_larger():
    # A noise peer barely moves the loss: δa 0.0012, δr −0.0013. Against its own size the gap is
    # ~2x "relative" and counts +1; against the window's typical LossScore 0.05 it is noise.
    assert update_mu(0.0, 0.0012, -0.0013, 0.7, margin=0.3) == pytest.approx(0.3)
    assert update_mu(0.0, 0.0012, -0.0013, 0.7, margin=0.3, scale=0.05) == pytest.approx(0.0)
    # A peer with large δs keeps its own, larger zone: a window of tiny-δ peers cannot shrink it.
    assert update_mu(0.0, 0.050, 0.048, 0.7, margin=0.3, scale=0.001) == pytest.approx(0.0)
    # Honest gaps still count +1 against the window scale.
    assert update_mu(0.0, 0.07, 0.03, 0.7, margin=0.3, scale=0.05) == pytest.approx(0.3)
    # margin 0 is the paper whatever the scale
    assert update_mu(0.0, 0.0012, -0.0013, 0.7, margin=0.0, scale=0.05) == pytest.approx(0.3)
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            update_mu(0.0, 0.1, 0.0, 0.7, margin=0.3, scale=bad)


def test_size_credit_follows_the_gap_relative_to_the_window():
    """Credit by size (`gauntlet.proof_credit` "size"): a page helped a quarter as much as the
    window's typical page earns a quarter; the typical gap earns 1, more is capped at 1, a gap
    below δ_rand is negative down to −1, a broken page −1."""
    typical = 0.02
    assert size_credit([0.05 + 0.02], 0.05, typical) == pytest.approx(1.0)
    assert size_credit([0.05 + 0.005], 0.05, typical) == pytest.approx(0.25)
    assert size_credit([0.05 + 0.08], 0.05, typical) == 1.0
    assert size_credit([0.05 - 0.01], 0.05, typical) == pytest.approx(-0.5)
    assert size_credit([0.05 + 0.02, 0.05], 0.05, typical) == pytest.approx(0.5)  # page by page: one untrained
    assert size_credit([-math.inf], 0.05, typical) == -1.0
    assert size_credit([0.06], 0.05, 0.0) == 1.0  # no scale in the window: the sign
    with pytest.raises(ValueError):
        size_credit([], 0.05, typical)
    with pytest.raises(ValueError):
        size_credit([math.nan], 0.05, typical)


def test_the_typical_gap_is_the_median_of_the_windows_medians_with_a_floor():
    rules = load_hparams().gauntlet  # production's: a floor of 2 % of the scale, 16 windows
    assert (rules.proof_gap_floor, rules.proof_gap_history, rules.proof_gap_resolution) == (0.02, 16, 1e-5)
    run = {"floor": rules.proof_gap_floor, "history": rules.proof_gap_history, "resolution": rules.proof_gap_resolution}
    assert window_gap([0.01, 0.02, 0.03, math.inf]) == pytest.approx(0.02)  # non-finite left out
    assert window_gap([0.01, 0.02, 0.03, 0.05]) == pytest.approx(0.025)
    assert window_gap([math.inf]) is None and typical_gap(None, [], scale=0.0, **{**run, "resolution": 0.0}) == 0.0
    assert typical_gap(None, [], scale=0.0, **run) == 1e-5  # never below what float32 losses resolve
    # a window whose S_t is mostly near-zero uploads: their gaps and LossScores are rounding (~1e-8 nats),
    # and so would the relative floor be; the absolute one holds, so rounding earns about nothing
    assert typical_gap(window_gap([3e-8, -1e-8, 2e-8, 0.004]), [], scale=4e-8, **run) == 1e-5
    # a window of page-skippers: their gaps are noise, the floor (a share of the LossScore scale) holds
    assert typical_gap(window_gap([0.001, -0.0005, 0.0002]), [], scale=0.05, **run) == pytest.approx(0.02 * 0.05)
    assert typical_gap(0.025, [], scale=0.05, **run) == pytest.approx(0.025)  # a first window: its own median
    # with earlier windows, one window's own median moves the scale no further than one vote of 16:
    honest = [0.02, 0.021, 0.019, 0.02]
    assert typical_gap(0.0001, honest, scale=0.05, **run) == pytest.approx(0.02)  # cheats filled this S_t
    assert typical_gap(0.5, honest, scale=0.05, **run) == pytest.approx(0.02)  # an over-fitting flood lifted it
    # only the last `proof_gap_history` windows count: a run's honest gaps shrink and the scale follows
    assert typical_gap(0.01, [0.04] * 20 + [0.01] * 8, scale=0.05, **run) == pytest.approx(0.01)
    assert typical_gap(0.01, [0.04] * 20 + [0.01] * 6, scale=0.05, **run) == pytest.approx(0.04)
    # the history is the run's: with 4 windows, three earlier ones and this one's own
    assert typical_gap(0.01, [0.04] * 20 + [0.01] * 2, scale=0.05, floor=0.02, history=4,
                       resolution=0.0) == pytest.approx(0.01)
    assert typical_gap(0.01, [0.04, 0.04], scale=0.05, floor=0.02, history=1, resolution=0.0) == pytest.approx(0.01)
    assert proof_gap(0.07, 0.05, (0.08, 0.06)) == pytest.approx(0.02)
    assert proof_gap(0.07, 0.05, None) == pytest.approx(0.02)


def test_update_mu_by_size_ignores_the_margin():
    """With the window's typical gap given, μ moves by the size credit, whatever the margin."""
    mu = update_mu(0.0, 0.055, 0.05, 0.9, margin=0.3, scale=0.05, typical=0.02)
    assert mu == pytest.approx(0.1 * 0.25)
    assert update_mu(0.0, 0.055, 0.05, 0.9, pages=(0.07, 0.05), typical=0.02) == pytest.approx(0.1 * 0.5)
