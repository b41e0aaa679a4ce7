"""Yuma consensus (`templar.chain.embedded.yuma`) against small cases computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from templar.chain.embedded.yuma import EpochInputs, agreement, consensus, epoch


def _inputs(weights, stake, **kw) -> EpochInputs:
    n = len(stake)
    defaults = dict(
        permit=np.array([s > 0 for s in stake]),
        last_update=np.full(n, 100),
        registered_at=np.zeros(n, dtype=int),
        block=200,
    )
    defaults.update(kw)
    return EpochInputs(weights=np.array(weights, dtype=float), stake=np.array(stake, dtype=float), **defaults)


TWO_VALIDATORS = [[0, 0, 0.75, 0.25], [0, 0, 0.25, 0.75], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_two_validators_two_miners():
    """uids 0, 1 validators with stake 60 / 40 (S = 0.6, 0.4); uids 2, 3 miners; κ = 0.5.

    v0 gives (0.75, 0.25), v1 gives (0.25, 0.75) to (uid 2, uid 3).
    Consensus: uid 2's weights descending are 0.75 (S 0.6 ≥ 0.5) → C2 = 0.75;
               uid 3's are 0.75 (0.4 < 0.5), 0.25 (1.0) → C3 = 0.25.
    Clipped W̄: v0 (0.75, 0.25) unchanged, v1 (0.25, 0.25).
    Ranks: R2 = 0.6·0.75 + 0.4·0.25 = 0.55, R3 = 0.6·0.25 + 0.4·0.25 = 0.25 (Σ 0.8)
           → incentive (0.6875, 0.3125).
    Pre-ranks: P2 = 0.55, P3 = 0.6·0.25 + 0.4·0.75 = 0.45 → trust (1, 0.25/0.45 = 0.5556).
    Validator trust: v0 0.75 + 0.25 = 1, v1 0.25 + 0.25 = 0.5.
    Bonds (first epoch: the EMA of ΔB alone, renormalised = ΔB): column 2 ∝ (0.45, 0.10) =
           (0.8182, 0.1818); column 3 ∝ (0.15, 0.10) = (0.6, 0.4).
    Dividends: v0 0.8182·0.6875 + 0.6·0.3125 = 0.5625 + 0.1875 = 0.75; v1 0.125 + 0.125 = 0.25.
    Emission 1000: owner 180; miners 410 × I = 281.875, 128.125; validators 410 × D = 307.5, 102.5.
    """
    result = epoch(_inputs(TWO_VALIDATORS, [60, 40, 0, 0], emission=1000.0))
    assert result.consensus[2:] == pytest.approx([0.75, 0.25])
    assert result.incentive == pytest.approx([0, 0, 0.6875, 0.3125])
    assert result.trust[2:] == pytest.approx([1.0, 0.25 / 0.45])
    assert result.validator_trust[:2] == pytest.approx([1.0, 0.5])
    assert result.bonds[:2, 2] == pytest.approx([0.45 / 0.55, 0.10 / 0.55])
    assert result.bonds[:2, 3] == pytest.approx([0.6, 0.4])
    assert result.dividends == pytest.approx([0.75, 0.25, 0, 0])
    assert result.emission == pytest.approx([307.5, 102.5, 281.875, 128.125])
    assert result.rank == pytest.approx(result.incentive)


def test_bonds_follow_the_moving_average():
    """Same weights; previous bonds held entirely by v1: B_prev[:, 2] = B_prev[:, 3] = (0, 1).

    B = 0.1·ΔB + 0.9·B_prev: column 2 = (0.08182, 0.01818 + 0.9 = 0.91818), column 3 = (0.06, 0.94).
    Dividends: v0 0.08182·0.6875 + 0.06·0.3125 = 0.05625 + 0.01875 = 0.075, v1 0.925.
    A validator's dividends follow the bonds it built over past epochs, not this epoch alone.
    """
    previous = np.zeros((4, 4))
    previous[1, 2] = previous[1, 3] = 1.0
    result = epoch(_inputs(TWO_VALIDATORS, [60, 40, 0, 0], bonds=previous))
    assert result.bonds[:2, 2] == pytest.approx([0.1 * 0.45 / 0.55, 0.1 * 0.10 / 0.55 + 0.9])
    assert result.bonds[:2, 3] == pytest.approx([0.06, 0.94])
    assert result.dividends[:2] == pytest.approx([0.075, 0.925])
    assert result.incentive[2:] == pytest.approx([0.6875, 0.3125])  # bonds never change incentive


def test_inactive_validator_drops_out():
    """v1 last set weights at block 100, the epoch runs at block 6000 with cutoff 5000: inactive.

    S = (1, 0): consensus is v0's row (0.75, 0.25), so incentive = (0.75, 0.25), v0's trust is 1
    and v1's clipped row is min(0.25, 0.75) + min(0.75, 0.25) = 0.5.
    """
    result = epoch(_inputs(TWO_VALIDATORS, [60, 40, 0, 0], last_update=np.array([5500, 100, 0, 0]), block=6000))
    assert result.stake[:2] == pytest.approx([1.0, 0.0])
    assert result.incentive[2:] == pytest.approx([0.75, 0.25])
    assert result.validator_trust[:2] == pytest.approx([1.0, 0.5])
    assert result.dividends[:2] == pytest.approx([1.0, 0.0])


def test_masks_self_weight_permitless_rows_and_outdated_weights():
    """Three uids, one validator (uid 0, stake 1) whose row is (0.5 self, 0.25, 0.25).

    Self-weight is dropped → row (0, 0.5, 0.5). uid 2 has no permit: its row (1, 0, 0) is
    ignored. uid 1 registered at block 150, after v0's last update at 100: v0's weight on it is
    outdated and dropped → row (0, 0, 1) → incentive (0, 0, 1).
    """
    weights = [[0.5, 0.25, 0.25], [0, 0, 0], [1, 0, 0]]
    result = epoch(_inputs(weights, [1, 0, 0], registered_at=np.array([0, 150, 0])))
    assert result.incentive == pytest.approx([0, 0, 1])
    result = epoch(_inputs(weights, [1, 0, 0]))
    assert result.incentive == pytest.approx([0, 0.5, 0.5])


def test_consensus_is_the_stake_weighted_kappa_quantile():
    """One column, stakes (0.2, 0.3, 0.5), weights (0.9, 0.5, 0.1).

    Descending: 0.9 (cum 0.2), 0.5 (cum 0.5), 0.1 (cum 1.0). κ = 0.5 → 0.5; κ = 0.6 → 0.1;
    κ = 0.2 → 0.9. A majority-stake validator at 0.1 caps everyone at 0.1 once κ > its rivals'.
    """
    w = np.array([[0.9], [0.5], [0.1]])
    s = np.array([0.2, 0.3, 0.5])
    assert consensus(w, s, 0.5)[0] == pytest.approx(0.5)
    assert consensus(w, s, 0.6)[0] == pytest.approx(0.1)
    assert consensus(w, s, 0.2)[0] == pytest.approx(0.9)
    assert consensus(w, np.zeros(3), 0.5)[0] == 0.0


def test_no_weights_no_incentive_and_validators_paid_by_stake():
    result = epoch(_inputs(np.zeros((3, 3)), [3, 1, 0], emission=100.0))
    assert not result.incentive.any() and not result.dividends.any()
    assert result.emission == pytest.approx([41 * 0.75, 41 * 0.25, 0])


def test_rejects_bad_shapes_and_negative_weights():
    with pytest.raises(ValueError, match="shape"):
        epoch(_inputs(np.zeros((2, 3)), [1, 0, 0]))
    with pytest.raises(ValueError, match="non-negative"):
        epoch(_inputs(-np.ones((2, 2)), [1, 0]))


def test_agreement_is_one_minus_total_variation():
    """(0.5, 0.5, 0) vs (0.3, 0.5, 0.2): TV = (0.2 + 0 + 0.2)/2 = 0.2 → agreement 0.8."""
    assert agreement({1: 0.5, 2: 0.5}, {1: 0.3, 2: 0.5, 3: 0.2}) == pytest.approx(0.8)
    assert agreement({1: 2.0}, {1: 5.0}) == pytest.approx(1.0)
    assert agreement({1: 1.0}, {}) == 0.0
