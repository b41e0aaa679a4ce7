"""LossRating: the OpenSkill Plackett–Luce match over S_t ranked by δ_rand."""

from __future__ import annotations

import math

import pytest

from templar.gauntlet import DEFAULT_RATING, competition_ranks, loss_rating, rate_match

BETA = 25.0 / 6.0
TAU = 25.0 / 300.0


def test_two_player_match_hand_computed() -> None:
    # Weng–Lin Algorithm 4 with both players at the prior (μ=25, σ=25/3):
    #   σ'² = σ² + τ² = 69.444444 + 0.006944 = 69.451389
    #   c   = sqrt(Σ (σ'² + β²)) = sqrt(2·(69.451389 + 17.361111)) = sqrt(173.625) = 13.176684
    #   equal μ → p = exp(μ/c)/Σ = 0.5
    #   winner Ω = (1 − 0.5)·σ'²/c = 0.5·69.451389/13.176684 = 2.635389 → μ = 27.635389
    #   loser  Ω = −0.5·σ'²/c = −2.635389                         → μ = 22.364611
    #   Δ = 0.5·0.5·σ'²/c² = 0.25·0.400002 = 0.100000; γ = σ'/c = 8.333750/13.176684 = 0.632462
    #   σ_new = σ'·sqrt(1 − γΔ) = 8.333750·sqrt(1 − 0.063246) = 8.065901 (both players)
    new = rate_match({}, {"win": 0.02, "lose": 0.01}, beta=BETA, tau=TAU)
    assert new["win"][0] == pytest.approx(27.635389, abs=1e-6)
    assert new["lose"][0] == pytest.approx(22.364611, abs=1e-6)
    assert new["win"][1] == pytest.approx(8.065901, abs=1e-6)
    assert new["lose"][1] == pytest.approx(8.065901, abs=1e-6)


def test_loss_rating_is_the_mean_skill() -> None:
    assert loss_rating(DEFAULT_RATING) == 25.0  # a newcomer rates as average
    assert loss_rating((30.0, 2.0)) == 30.0
    assert loss_rating((-3.0, 1.0)) == -3.0


def test_ties_share_a_rank_and_the_same_change() -> None:
    assert competition_ranks({"a": 1.0, "b": 1.0, "c": 0.0, "d": -2.0}) == {"a": 0, "b": 0, "c": 2, "d": 3}
    new = rate_match({}, {"a": 1.0, "b": 1.0, "c": 0.0}, beta=BETA, tau=TAU)
    assert new["a"] == new["b"]
    assert new["a"][0] > 25.0 > new["c"][0]
    all_tied = rate_match({}, {"a": 0.5, "b": 0.5}, beta=BETA, tau=TAU)
    assert all_tied["a"][0] == pytest.approx(25.0) and all_tied["b"][0] == pytest.approx(25.0)


def test_nan_and_minus_inf_rank_last() -> None:
    ranks = competition_ranks({"good": 0.1, "broken": -math.inf, "garbage": math.nan})
    assert ranks == {"good": 0, "broken": 1, "garbage": 1}


def test_match_with_fewer_than_two_players_changes_nothing() -> None:
    assert rate_match({"a": (30.0, 5.0)}, {"a": 1.0}, beta=BETA, tau=TAU) == {"a": (30.0, 5.0)}
    assert rate_match({}, {"new": 1.0}, beta=BETA, tau=TAU) == {"new": DEFAULT_RATING}
    assert rate_match({"a": (30.0, 5.0)}, {}, beta=BETA, tau=TAU) == {}


def test_result_does_not_depend_on_mapping_order() -> None:
    ratings = {"a": (27.0, 6.0), "b": (24.0, 7.5), "c": (25.0, 8.0)}
    results = {"a": 0.3, "b": 0.1, "c": 0.2}
    forward = rate_match(ratings, results, beta=BETA, tau=TAU)
    backward = rate_match(dict(reversed(ratings.items())), dict(reversed(results.items())), beta=BETA, tau=TAU)
    assert forward == backward


def test_best_gains_and_worst_loses_over_matches() -> None:
    ratings = {hotkey: DEFAULT_RATING for hotkey in ("best", "mid", "worst")}
    for _ in range(5):
        ratings.update(rate_match(ratings, {"best": 0.03, "mid": 0.02, "worst": 0.01}, beta=BETA, tau=TAU))
    assert ratings["best"][0] > ratings["mid"][0] > ratings["worst"][0]
    assert ratings["best"][0] > 30.0 and ratings["worst"][0] < 20.0
    assert loss_rating(ratings["best"]) > loss_rating(ratings["mid"]) > loss_rating(ratings["worst"])
    assert all(sigma < DEFAULT_RATING[1] for _, sigma in ratings.values())


def test_rejects_invalid_settings_and_ratings() -> None:
    with pytest.raises(ValueError, match="beta"):
        rate_match({}, {"a": 1.0, "b": 0.0}, beta=0.0, tau=TAU)
    with pytest.raises(ValueError, match="invalid rating"):
        rate_match({"a": (25.0, 0.0)}, {"a": 1.0, "b": 0.0}, beta=BETA, tau=TAU)
