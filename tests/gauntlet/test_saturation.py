"""μ saturates at the run's paid level (`templar.gauntlet.saturation`, `gauntlet.mu_tie_band`): identical
honest miners read the same μ whatever their evaluations drew, a fraction of the work stays far below a
fraction of the pay, hotkeys that earn little cannot pull the level down, and a failed fast evaluation
bites as it did without the band."""

from __future__ import annotations

import math
import random

import pytest

from templar.core.config import load_hparams
from templar.gauntlet import PrimaryResult, ScoreBook
from templar.gauntlet.saturation import penalised_read, saturated_mu, unramped_mu
from templar.gauntlet.scores import ramped_mu

RULES = load_hparams().gauntlet
BAND = RULES.mu_tie_band
K = RULES.mu_exponent
UNITS = 64
RAND = 0.05
GAP = 0.02
"""δ_rand and an honest unit's gap over it."""


def test_production_saturates_mu_below_its_paid_level() -> None:
    assert (BAND, K) == (0.2, 3.0)  # docs/scoring.md §4, benchmarks/LOG.md §38


def test_mu_within_the_band_reads_the_level_and_below_it_falls_as_a_power() -> None:
    level = 0.6
    edge = (1 - BAND) * level
    assert saturated_mu(level, level, BAND, K) == level
    assert saturated_mu(0.9, level, BAND, K) == level  # above the level: a proof proves no more than the work
    assert saturated_mu(edge, level, BAND, K) == level
    assert saturated_mu(edge / 2, level, BAND, K) == pytest.approx(level / 2**K)
    assert saturated_mu(edge * (1 - 1e-9), level, BAND, K) == pytest.approx(level)  # continuous at the edge
    xs = [i / 200 for i in range(201)]
    paid = [saturated_mu(x, level, BAND, K) for x in xs]
    assert paid == sorted(paid)  # more proof never reads less
    for mu in (-0.3, 0.0, 0.2, 0.7):  # off without a band or a level; a μ ≤ 0 is PeerScore's to floor
        assert saturated_mu(mu, level, 0.0, K) == mu
        assert saturated_mu(mu, None, BAND, K) == mu
    assert saturated_mu(-0.3, level, BAND, K) == -0.3


def test_a_failed_fast_evaluation_costs_the_paid_mu_the_same_share_with_or_without_the_band() -> None:
    level, phi = 0.6, RULES.fast_eval_penalty
    for mu in (0.2, 0.45, 0.5, 0.6, 0.9):
        after = penalised_read(mu, level, BAND, K, phi)
        assert saturated_mu(after, level, BAND, K) == pytest.approx(phi * saturated_mu(mu, level, BAND, K))
        assert after < mu
    assert penalised_read(0.5, level, 0.0, K, phi) == phi * 0.5
    assert penalised_read(-0.4, level, BAND, K, phi) == phi * -0.4


@pytest.mark.parametrize("prior", [0.0, 1.0, None])
def test_unramped_mu_is_the_stored_mu_that_reads_as_given(prior: float | None) -> None:
    gamma = RULES.mu_gamma
    for n in (1, 3, 10, 40):
        for read in (0.05, 0.4, 0.93):
            assert ramped_mu(unramped_mu(read, n, gamma, prior), n, gamma, prior) == pytest.approx(read)


def _evaluation(rng: random.Random, share: float, noise: float) -> PrimaryResult:
    """One evaluation of `UNITS` units of which a `share` was trained (the gap), each with noise."""
    units = tuple(RAND + (GAP if i < share * UNITS else 0.0) + rng.gauss(0.0, noise) for i in range(UNITS))
    mean = sum(units) / len(units)
    return PrimaryResult(mean, RAND + rng.gauss(0.0, 0.002), (mean,), units)


def _book(rules, miners: dict[str, float], windows: int, noise: float, seed: int = 0,
          evaluated: int | None = None) -> ScoreBook:
    """`windows` windows of primary evaluations of `miners` (hotkey: share of the work done), `evaluated`
    of them each window (all when None), drawn by a seeded shuffle."""
    rng = random.Random(seed)
    book = ScoreBook()
    for uid, hotkey in enumerate(miners):
        book.get_or_create(hotkey, uid, window=0)
    for window in range(windows):
        chosen = list(miners)
        rng.shuffle(chosen)
        chosen = chosen[:evaluated or len(chosen)]
        book.record_primary(rules, {h: _evaluation(rng, miners[h], noise) for h in chosen}, window=window)
    return book


def test_identical_miners_read_the_same_mu_and_a_quarter_of_the_work_far_less_than_a_quarter_of_the_pay() -> None:
    """Eight identical honest miners, each evaluated in about half the windows with a noisy proof: without
    the band their weights scatter with their μs (PeerScore² squares it); with it they are equal but for
    their ratings. A quarter of the work (`thin`) is paid well under a quarter of an honest miner's."""
    miners = {**{f"honest{i}": 1.0 for i in range(8)}, "thin": 0.25}
    spread, thin = {}, {}
    for band in (0.0, BAND):
        rules = RULES.model_copy(update={"mu_tie_band": band})
        book = _book(rules, miners, windows=24, noise=3 * GAP, evaluated=5)
        w = book.weights(rules)
        honest = [w[f"honest{i}"] for i in range(8)]
        spread[band], thin[band] = max(honest) / min(honest), w["thin"] / min(honest)
    assert spread[0.0] > 1.3 and spread[BAND] < 1.1, spread
    assert thin[BAND] < 0.25 / 4, thin


def test_hotkeys_that_earn_little_cannot_pull_the_level_down() -> None:
    """The level is weighted by pay: forty thin hotkeys beside four honest miners leave it at the honest
    miners' μ, so the thin ones stay below the band and the honest ones inside it."""
    miners = {**{f"honest{i}": 1.0 for i in range(4)}, **{f"thin{i:02d}": 0.25 for i in range(40)}}
    book = _book(RULES, miners, windows=12, noise=GAP)
    w = book.weights(RULES)
    honest = [w[f"honest{i}"] for i in range(4)]
    assert max(honest) / min(honest) < 1.1
    assert max(w[f"thin{i:02d}"] for i in range(40)) < 0.1 * min(honest)


def test_a_failed_fast_evaluation_bites_a_peer_inside_the_band() -> None:
    """A peer inside the band loses φ of its paid μ on a failed fast evaluation, as without the band
    (where it would otherwise stay inside the band and lose nothing), and earns it back by evaluations.
    The level is the pay-weighted median, and the penalty moves the peer's pay, so the level itself
    moves a little (here by 0.13 %: four tied peers, one of whose weight drops): φ holds to that much."""
    miners = {f"honest{i}": 1.0 for i in range(4)}
    book = _book(RULES, miners, windows=10, noise=GAP / 4)
    before = book.scores(RULES)
    level_before, _ = book._paid_levels(RULES)
    book.record_fast_eval(RULES, "honest0", passed=False, status="desync")
    after = book.scores(RULES)
    level_after, _ = book._paid_levels(RULES)
    assert abs(level_after / level_before - 1.0) < 0.005
    assert after["honest0"] == pytest.approx(RULES.fast_eval_penalty * before["honest0"], rel=0.005)
    assert after["honest1"] == pytest.approx(before["honest1"], rel=0.005)
    off = RULES.model_copy(update={"mu_tie_band": 0.0})
    plain = _book(off, miners, windows=10, noise=GAP / 4)
    mu = plain.peers["honest0"].mu
    plain.record_fast_eval(off, "honest0", passed=False, status="desync")
    assert plain.peers["honest0"].mu == RULES.fast_eval_penalty * mu  # without the band: φ·μ, as always
    assert math.isfinite(book.peers["honest0"].mu)


def test_the_paid_mu_an_operator_reads_is_the_one_the_score_reads() -> None:
    """`ScoreBook.paid_mus` (μ̃, the records' `paid_mu`): identical miners with different stored μs read the
    paid level, a quarter of the work reads far less, and each peer's score is PeerScore of its μ̃."""
    from templar.gauntlet.scores import peer_score

    miners = {**{f"honest{i}": 1.0 for i in range(8)}, "thin": 0.25}
    book = _book(RULES, miners, windows=24, noise=3 * GAP, evaluated=5)
    paid = book.paid_mus(RULES)
    level, _ = book._paid_levels(RULES)
    stored = {book.peers[f"honest{i}"].mu for i in range(8)}
    assert len(stored) > 1 and {paid[f"honest{i}"] for i in range(8)} == {level}
    assert paid["thin"] < 0.25 * level
    for hotkey, record in book.peers.items():
        assert record.score == pytest.approx(peer_score(paid[hotkey], book.loss_rating(RULES, hotkey)))
    off = RULES.model_copy(update={"mu_tie_band": 0.0})  # no band: the μ read, start-up bias removed
    assert book.paid_mus(off) == {hk: ramped_mu(r.mu, r.primary_evals, off.mu_gamma, off.mu_prior_evals)
                                  for hk, r in book.peers.items()}


def test_a_widening_band_lowers_the_edge_of_a_peer_of_few_evaluations_as_a_standard_error_grows() -> None:
    """`mu_tie_band_widens`: the band is an incumbent's (n_eff at the EMA's saturation keeps it), and a peer
    of fewer evaluations gets the edge (1 − b)^s · ℓ, s = √(n_sat / n_eff): lower the fewer its
    evaluations, above 0 always, never higher than the incumbents'."""
    from templar.gauntlet.rating import effective_evaluations
    from templar.gauntlet.saturation import evaluated_band

    gamma = RULES.mu_gamma
    edges = [1.0 - evaluated_band(BAND, n, gamma) for n in (1, 2, 3, 5, 10, 20, 40, 400)]
    assert edges == sorted(edges) and edges[0] > 0.0 and edges[-1] == pytest.approx(1.0 - BAND)
    assert edges[0] == pytest.approx((1.0 - BAND) ** math.sqrt((1 + gamma) / (1 - gamma)))  # n_eff 1
    two = math.sqrt((1 + gamma) / (1 - gamma) / effective_evaluations(2, gamma))
    assert edges[1] == pytest.approx((1.0 - BAND) ** two)
    assert evaluated_band(0.0, 1, gamma) == 0.0 and evaluated_band(BAND, 0, gamma) == BAND
    # the book reads it: a newcomer whose one evaluation drew μ̂ at half the level reads the level
    # when the band widens and far less when it does not
    miners = {f"honest{i}": 1.0 for i in range(8)}
    book = _book(RULES, miners, windows=24, noise=3 * GAP, evaluated=5)
    record = book.get_or_create("newcomer", 99, 24)
    level, _ = book._paid_levels(RULES)
    record.mu, record.primary_evals = unramped_mu(0.5 * level, 1, gamma, RULES.mu_prior_evals), 1
    widens = RULES.model_copy(update={"mu_tie_band_widens": True})
    assert book.paid_mus(widens)["newcomer"] == pytest.approx(level)
    assert book.paid_mus(RULES)["newcomer"] < 0.5 * level
    assert book.paid_mus(widens)["honest0"] == book.paid_mus(RULES)["honest0"]
