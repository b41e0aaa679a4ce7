"""The relative LossRating (docs/scoring.md §5): δ_rand over the window's median, a tie band, a power
premium."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError
from tests.rules import gauntlet_rules

from templar.core.config import GauntletConfig, load_hparams
from templar.gauntlet import PrimaryResult, ScoreBook
from templar.gauntlet.rating import (
    effective_evaluations,
    relative_loss_scores,
    relative_rating,
    relative_spread,
    update_relative,
    without_premium,
)

PRODUCTION = load_hparams().gauntlet
CLIP = {"clip": (PRODUCTION.relative_clip_low, PRODUCTION.relative_clip_high),
        "min_players": PRODUCTION.relative_min_players, "resolution": PRODUCTION.proof_gap_resolution}
"""Production's clip of one relative LossScore (−1, 2), its three players and its resolution (1e-5 nats)."""


def test_relative_loss_scores_divide_by_the_median_and_clip() -> None:
    assert CLIP == {"clip": (-1.0, 2.0), "min_players": 3, "resolution": 1e-5}
    # finite values 0.02, 0.03, 0.04, 0.06, 1.0 → median 0.04; −inf and 1.0/0.04 = 25 clip to −1 and 2
    assert relative_loss_scores({"a": 0.02, "b": 0.04, "c": 0.06, "d": -math.inf, "e": 1.0, "f": 0.03}, **CLIP) == \
        pytest.approx({"a": 0.5, "b": 1.0, "c": 1.5, "d": -1.0, "e": 2.0, "f": 0.75})
    # even count: median of 0.01, 0.02, 0.03, 0.05 is 0.025
    assert relative_loss_scores({"a": 0.01, "b": 0.02, "c": 0.03, "d": 0.05}, **CLIP) == pytest.approx(
        {"a": 0.4, "b": 0.8, "c": 1.2, "d": 2.0})
    # the clip is the run's: an older rule's upper clip of 4 lets 1.0/0.04 count 4
    assert relative_loss_scores({"a": 0.02, "b": 0.04, "e": 1.0}, clip=(-1.0, 4.0), min_players=3,
                                resolution=1e-5)["e"] == 4.0


def test_relative_loss_scores_need_three_finite_and_a_positive_median() -> None:
    assert relative_loss_scores({"a": 0.02, "b": 0.04, "c": -math.inf}, **CLIP) == {}
    assert relative_loss_scores({"a": -0.02, "b": -0.01, "c": 0.03}, **CLIP) == {}  # median −0.01: the window hurt
    assert relative_loss_scores({"a": 0.0, "b": 0.0, "c": 0.03}, **CLIP) == {}


def test_uploads_that_did_not_move_the_loss_do_not_set_the_median() -> None:
    """Near-zero uploads (δ_rand float32 rounding, ±1e-8 nats) in most of S_t made the median rounding,
    and every peer that did any work sat at the upper clip: a quarter of an honest miner's work rated as
    all of it (benchmarks/LOG.md §60). The median is read over the δ_rands beyond the resolution."""
    faint = {f"faint{i}": (-1) ** i * 1e-8 * (i + 1) for i in range(5)}
    work = {"honest": 0.02, "quarter": 0.005, "other": 0.018}
    scores = relative_loss_scores({**work, **faint}, **CLIP)
    assert scores["quarter"] == pytest.approx(0.005 / 0.018) and scores["honest"] == pytest.approx(0.02 / 0.018)
    assert all(abs(scores[hk]) < 1e-5 for hk in faint)
    rounding = {**CLIP, "resolution": 0.0}  # the median of the eight was a faint one's
    assert relative_loss_scores({**work, **faint}, **rounding)["quarter"] == 2.0
    assert relative_loss_scores({"honest": 0.02, "quarter": 0.005, **faint}, **CLIP) == {}  # two measured: too few


def test_without_premium_no_delta_rates_above_the_median() -> None:
    """A window whose trial steps were not held to a typical size: an upload ×3 gains 3× as much, so
    nothing rates above the median; below it, as measured."""
    deltas = {"loud": 0.06, "a": 0.02, "b": 0.018, "c": 0.01, "broke": -math.inf, "faint": 1e-8}
    capped = without_premium(deltas, resolution=1e-5)
    # the median of the measured four (0.01, 0.018, 0.02, 0.06; neither −∞ nor rounding) is 0.019
    assert capped == pytest.approx({"loud": 0.019, "a": 0.019, "b": 0.018, "c": 0.01, "broke": -math.inf, "faint": 1e-8})
    assert without_premium({"a": 1e-9, "b": -math.inf}, resolution=1e-5) == {"a": 1e-9, "b": -math.inf}


def test_update_relative_is_a_bias_corrected_ema() -> None:
    # first evaluation: weight (1 − γ)/(1 − γ) = 1, the mean becomes x
    assert update_relative(1.0, 0, 1.2, 0.9) == pytest.approx(1.2)
    # second: weight 0.1/(1 − 0.81) = 0.526316 → 1.2 − 0.4·0.526316 = 0.989474
    #        = (0.1·0.8 + 0.09·1.2)/(0.1 + 0.09), the EMA divided by the weight it holds
    assert update_relative(1.2, 1, 0.8, 0.9) == pytest.approx(0.989474, abs=1e-6)
    with pytest.raises(ValueError):
        update_relative(1.0, 0, math.inf, 0.9)
    with pytest.raises(ValueError):
        update_relative(1.0, 0, 1.0, 1.0)


def test_effective_evaluations() -> None:
    assert effective_evaluations(0, 0.9) == 0.0
    assert effective_evaluations(1, 0.9) == pytest.approx(1.0)
    assert effective_evaluations(5, 0.0) == 1.0  # γ = 0 keeps only the last evaluation
    # γ 0.9, n 2: (1.9)² / (1 + 0.81) = 1.994475
    assert effective_evaluations(2, 0.9) == pytest.approx(3.61 / 1.81)
    assert effective_evaluations(10_000, 0.95) == pytest.approx(1.95 / 0.05)  # saturates at (1+γ)/(1−γ)


def test_relative_spread_is_a_robust_sigma() -> None:
    # x 0.5, 0.9, 1.0, 1.1, 3.0: median 1.0, |deviations| 0, 0.1, 0.1, 0.5, 2.0 → median 0.1 → 0.14826;
    # the two outliers (a cheat near 0, a freak high) do not move it
    xs = {"a": 0.5, "b": 0.9, "c": 1.0, "d": 1.1, "e": 3.0}
    deltas = {hk: 0.04 * x for hk, x in xs.items()}
    assert relative_spread(xs, deltas, min_players=3, resolution=1e-5) == pytest.approx(0.14826)
    assert relative_spread({"a": 1.0, "b": 1.0}, {"a": 0.04, "b": 0.04}, min_players=3, resolution=1e-5) is None
    # uploads that did not move the loss are no measurement of the noise: six of them made the median x 0
    # and the spread 0, and the tie band closed on identical honest miners
    faint = {f"f{i}": 1e-8 for i in range(6)}
    with_faint = {**xs, **{hk: 0.0 for hk in faint}}
    assert relative_spread(with_faint, {**deltas, **faint}, min_players=3, resolution=1e-5) == pytest.approx(0.14826)
    assert relative_spread(with_faint, {**deltas, **faint}, min_players=3, resolution=0.0) < 0.01


def test_relative_rating_hand_computed() -> None:
    # γ 0.5, n 2: n_eff = 1.5²/1.25 = 1.8; band 3 × 0.1/√1.8 = 0.223607; mean 1.4 → 1 + 0.176393;
    # squared: 1.383901 × 25 = 34.597524
    assert relative_rating(1.4, 2, gamma=0.5, tie_band=3.0, exponent=2.0, noise=0.1) == pytest.approx(
        34.597524, abs=1e-6)
    # one evaluation (n_eff 1), band 2.5 × 0.1: 1.3 → 1.05^10 × 25 = 40.722366; 0.5 → 0.5 × 25 = 12.5 (below
    # the median the mean itself, no band, no exponent)
    assert relative_rating(1.3, 1, gamma=0.9, tie_band=2.5, exponent=10.0, noise=0.1) == pytest.approx(
        40.722366, abs=1e-6)
    assert relative_rating(0.5, 1, gamma=0.9, tie_band=2.5, exponent=2.0, noise=0.1) == pytest.approx(12.5)


def test_relative_rating_ties_inside_the_band_and_floors_at_zero() -> None:
    # inside the band above the median every peer is rated exactly as the median: 25, whatever the exponent
    for mean in (1.0, 1.1, 1.2):
        assert relative_rating(mean, 1, gamma=0.9, tie_band=2.5, exponent=10.0, noise=0.1) == 25.0
    # below the median the band forgives nothing: less measured work, proportionally less rating
    for mean in (0.25, 0.8, 0.99):
        assert relative_rating(mean, 1, gamma=0.9, tie_band=2.5, exponent=10.0, noise=0.1) == pytest.approx(25 * mean)
    plain = {"gamma": 0.9, "tie_band": 0.0, "noise": 0.1}
    assert relative_rating(1.0, 0, exponent=10.0, **plain) == 25.0  # never rated: the prior
    assert relative_rating(3.0, 0, exponent=10.0, **plain) == 25.0
    assert relative_rating(-0.5, 4, exponent=3.0, **plain) == 0.0  # made the loss worse
    assert relative_rating(1.1, 4, exponent=1.0, **plain) == pytest.approx(27.5)
    # more evaluations narrow the band: the same mean earns more once it is clear of the noise
    few = relative_rating(1.2, 2, gamma=0.95, tie_band=3.0, exponent=10.0, noise=0.084)
    many = relative_rating(1.2, 30, gamma=0.95, tie_band=3.0, exponent=10.0, noise=0.084)
    assert 25.0 < few < many
    # noisier evaluations widen it: the same mean is a tie
    assert relative_rating(1.2, 30, gamma=0.95, tie_band=3.0, exponent=10.0, noise=0.5) == 25.0
    with pytest.raises(ValueError):
        relative_rating(1.0, 1, gamma=0.9, tie_band=-0.1, exponent=1.0, noise=0.1)
    with pytest.raises(ValueError):
        relative_rating(1.0, 1, gamma=0.9, tie_band=0.1, exponent=0.0, noise=0.1)
    with pytest.raises(ValueError):
        relative_rating(1.0, 1, gamma=0.9, tie_band=0.1, exponent=1.0, noise=math.inf)


def test_the_band_below_the_median_lifts_a_short_mean_by_its_standard_errors_never_past_the_median() -> None:
    below = {"gamma": 0.9, "tie_band": 2.5, "exponent": 10.0, "noise": 0.2}
    # one evaluation (n_eff 1): a band of 1 standard error is 0.2; 0.85 + 0.2 passes the median: 25
    assert relative_rating(0.85, 1, tie_band_below=1.0, **below) == 25.0
    # 0.7 + 0.2 = 0.9 of the median; without the band the mean itself (0.7)
    assert relative_rating(0.7, 1, tie_band_below=1.0, **below) == pytest.approx(0.9 * 25)
    assert relative_rating(0.7, 1, tie_band_below=0.0, **below) == pytest.approx(0.7 * 25)
    # more evaluations narrow it: the same short mean is lifted less (n 30 at γ 0.9: n_eff 17.4, band 0.048;
    # n 2: n_eff 1.99, band 0.142)
    lifted_few = relative_rating(0.85, 2, tie_band_below=1.0, **below)
    lifted_many = relative_rating(0.85, 30, tie_band_below=1.0, **below)
    n_eff = effective_evaluations(30, 0.9)
    assert lifted_many == pytest.approx(25 * (0.85 + 0.2 / math.sqrt(n_eff)))
    assert 0.85 * 25 < lifted_many < lifted_few == pytest.approx(25 * (0.85 + 0.2 / math.sqrt(1.9**2 / 1.81)))
    # a quarter of the work stays about a quarter: the band is additive, never a multiple
    assert relative_rating(0.25, 30, tie_band_below=1.0, **below) == pytest.approx(25 * (0.25 + 0.2 / math.sqrt(n_eff)))
    # above the median and for a peer that made the loss worse the band below changes nothing
    assert relative_rating(1.6, 30, tie_band_below=1.0, **below) == relative_rating(1.6, 30, **below)
    assert relative_rating(-0.5, 30, tie_band_below=1.0, **below) == 0.0
    with pytest.raises(ValueError):
        relative_rating(0.9, 1, tie_band_below=-1.0, **below)
    # 0 is the rule before it to the bit
    for mean in (0.1, 0.3, 0.77, 0.999):
        assert relative_rating(mean, 7, tie_band_below=0.0, **below) == 25.0 * mean


def test_the_book_reads_the_band_below_from_its_rules() -> None:
    """Production lifts a short mean by one standard error (docs/scoring.md §5, benchmarks/LOG.md §39): a
    newcomer whose single evaluation read 0.8 of the median, at a noise of 0.3, is rated as the median."""
    assert PRODUCTION.rating_tie_band_below == 1.0
    book = _book()
    record = book.peers["a"]
    record.relative_delta, record.relative_evals = 0.8, 1
    book.relative_noise = (0.3, book.relative_noise[1])
    assert book.loss_rating(_rules(rating_tie_band_below=0.0), "a") == pytest.approx(0.8 * 25)
    assert book.loss_rating(_rules(rating_tie_band_below=1.0), "a") == 25.0
    with pytest.raises(ValidationError):
        GauntletConfig.model_validate({**PRODUCTION.model_dump(), "rating_tie_band_below": -0.5})


def test_below_the_median_a_peer_is_rated_as_it_only_after_its_first_evaluations() -> None:
    """`rating_below_after` m: with fewer than m evaluations a mean below the median is rated as the
    median (one to a few heavy-tailed draws cannot tell an unlucky evaluation from less useful work);
    from the m-th on, the band's reading as before. Above the median nothing changes, and 0 is the
    rule before it to the bit."""
    below = {"gamma": 0.9, "tie_band": 3.0, "exponent": 10.0, "noise": 0.2, "tie_band_below": 1.0}
    for evaluations in (1, 2):
        assert relative_rating(0.3, evaluations, below_after=3, **below) == 25.0
    assert relative_rating(0.3, 3, below_after=3, **below) == relative_rating(0.3, 3, **below) < 25.0
    assert relative_rating(1.9, 1, below_after=3, **below) == relative_rating(1.9, 1, **below) > 25.0
    for mean in (0.1, 0.77, 0.999):
        for evaluations in (1, 4, 30):
            assert relative_rating(mean, evaluations, below_after=0, **below) == relative_rating(mean, evaluations, **below)
    with pytest.raises(ValueError):
        relative_rating(0.9, 1, below_after=-1, **below)
    book = _book()
    record = book.peers["a"]
    record.relative_delta, record.relative_evals = 0.5, 2
    assert book.loss_rating(_rules(rating_below_after=3), "a") == 25.0
    assert book.loss_rating(_rules(rating_below_after=2), "a") < 25.0
    with pytest.raises(ValidationError):
        GauntletConfig.model_validate({**PRODUCTION.model_dump(), "rating_below_after": -1})


def _rules(**overrides: object) -> GauntletConfig:
    """The relative rating with these settings, OpenSkill's default β and τ and μ's γ 0.9."""
    return gauntlet_rules(**{"loss_rating": "relative", "rating_gamma": 0.9, "rating_cap": None, "mu_gamma": 0.9,
                             "openskill_beta": 25 / 6, "openskill_tau": 25 / 300, "power": 2.0, **overrides})


def _book() -> ScoreBook:
    book = ScoreBook()
    for uid, hotkey in enumerate(("a", "b", "c")):
        book.get_or_create(hotkey, uid, window=0)
    return book


def test_the_premium_is_capped() -> None:
    plain = {"gamma": 0.9, "tie_band": 0.0, "noise": 0.1, "exponent": 10.0}
    assert relative_rating(1.3, 4, **plain) == pytest.approx(25 * 1.3**10)  # 344.6: 13.8x the median peer
    assert relative_rating(1.3, 4, cap=2.0, **plain) == 50.0
    assert relative_rating(1.05, 4, cap=2.0, **plain) == pytest.approx(25 * 1.05**10)  # 40.7: below the cap
    assert relative_rating(0.9, 4, cap=2.0, **plain) == pytest.approx(25 * 0.9)  # a cap bounds only the top
    for bad in (0.5, math.inf, math.nan):
        with pytest.raises(ValueError):
            relative_rating(1.0, 1, cap=bad, **plain)


def test_one_freak_evaluation_moves_a_capped_rating_by_at_most_the_cap() -> None:
    """The localnet's step (docs/scoring.md §12, benchmarks/LOG.md §3): a peer level with the median for 9
    evaluations, then one evaluation at 3.66x the window's median. It enters at 2 (the clip), and the
    capped rating goes from 25 to at most 50, where the uncapped one went to 25 · 1.11^10 ≈ 71 with the
    clip (and 25 · 1.31^10 ≈ 370 with the old clip of 4)."""
    rules = _rules(rating_gamma=0.95, rating_tie_band=0.0, rating_exponent=10.0, rating_cap=2.0)
    book = ScoreBook()
    for uid, hotkey in enumerate(("p", "m1", "m2", "m3")):
        book.get_or_create(hotkey, uid, window=0)
    for window in range(10):
        freak = 3.66 if window == 9 else 1.0
        book.record_primary(rules, {"p": PrimaryResult(0.05 * freak + 0.01, 0.05 * freak),
                                    **{m: PrimaryResult(0.06, 0.05) for m in ("m1", "m2", "m3")}}, window=window)
    mean = book.peers["p"].relative_delta
    weight = (1 - 0.95) / (1 - 0.95**10)  # the bias-corrected EMA's weight on the 10th evaluation
    assert mean == pytest.approx(1.0 + (2.0 - 1.0) * weight)  # the freak enters clipped at 2
    assert 25.0 < book.loss_rating(rules, "p") <= 50.0
    assert book.loss_rating(rules, "m1") == 25.0


def test_book_scores_with_the_relative_rating() -> None:
    rules, book = _rules(rating_tie_band=0.0, rating_exponent=1.0), _book()
    # δ_rand 0.02 / 0.04 / 0.08 → relative 0.5 / 1 / 2 → ratings 12.5 / 25 / 50;
    # δ_assigned > δ_rand for all: μ = 0.1 after one evaluation (γ 0.9), so scores 1.25 / 2.5 / 5
    book.record_primary(rules, {"a": PrimaryResult(0.03, 0.02), "b": PrimaryResult(0.05, 0.04),
                                "c": PrimaryResult(0.09, 0.08)}, window=0)
    assert {hk: book.loss_rating(rules, hk) for hk in book} == pytest.approx({"a": 12.5, "b": 25.0, "c": 50.0})
    assert book.scores(rules) == pytest.approx({"a": 1.25, "b": 2.5, "c": 5.0})
    assert book.peers["c"].relative_evals == 1 and book.peers["c"].relative_delta == pytest.approx(2.0)
    # spread of 0.5, 1, 2 around 1: |dev| 0.5, 0, 1 → median 0.5 → 0.7413, the first window's noise
    assert book.relative_noise == (pytest.approx(0.7413), 1)
    # x = s² / Σ s²: 1.5625, 6.25, 25 over 32.8125
    assert book.weights(rules) == pytest.approx({"a": 1.5625 / 32.8125, "b": 6.25 / 32.8125, "c": 25 / 32.8125})


def test_a_window_without_a_typical_size_rates_no_one_above_the_median() -> None:
    """The same evaluations as above in a window whose trial steps were the uploads as they are (no peer
    list yet): c's δ_rand twice the median may be an upload twice as loud, so it rates as the median,
    under either rating; below the median a is rated as measured; the spread measures no noise."""
    for loss_rating in ("relative", "openskill"):
        rules, book = _rules(rating_tie_band=0.0, rating_exponent=1.0, loss_rating=loss_rating), _book()
        book.record_primary(rules, {"a": PrimaryResult(0.03, 0.02), "b": PrimaryResult(0.05, 0.04),
                                    "c": PrimaryResult(0.09, 0.08)}, window=0, premium=False)
        ratings = {hk: book.loss_rating(rules, hk) for hk in book}
        assert ratings["c"] == pytest.approx(ratings["b"]) and ratings["a"] < ratings["b"]
    assert book.peers["c"].rating == book.peers["b"].rating  # OpenSkill: c and b tie at the top
    rules, book = _rules(rating_tie_band=0.0, rating_exponent=1.0), _book()
    book.record_primary(rules, {"a": PrimaryResult(0.03, 0.02), "b": PrimaryResult(0.05, 0.04),
                                "c": PrimaryResult(0.09, 0.08)}, window=0, premium=False)
    assert {hk: book.peers[hk].relative_delta for hk in book} == pytest.approx({"a": 0.5, "b": 1.0, "c": 1.0})
    assert book.relative_noise == (0.0, 0)  # as before any window


def test_identical_peers_are_paid_alike_up_to_their_measured_difference() -> None:
    """Above the median the band pays identical peers exactly alike; below it a peer is paid its
    measured share, which for identical peers is within a few per cent of the median's."""
    rules, book = _rules(rating_tie_band=3.0, rating_exponent=10.0), _book()
    for window, values in enumerate(((0.040, 0.044, 0.037), (0.041, 0.038, 0.043))):
        book.record_primary(rules, {hk: PrimaryResult(v + 0.01, v) for hk, v in zip("abc", values, strict=True)},
                            window=window)
    weights = book.weights(rules)
    assert max(weights.values()) / min(weights.values()) < 1.05
    means = {hk: book.peers[hk].relative_delta for hk in "abc"}
    above = [hk for hk in "abc" if means[hk] >= 1.0]
    assert above and len({weights[hk] for hk in above}) == 1  # the band holds the premium back alike
    for hk in set("abc") - set(above):
        assert book.loss_rating(rules, hk) == pytest.approx(25 * means[hk])
    # under OpenSkill the same evaluations rank them apart
    assert len(set(book.weights(rules.model_copy(update={"loss_rating": "openskill"})).values())) == 3


def test_openskill_setting_leaves_the_relative_state_alone_and_bad_kinds_raise() -> None:
    rules, book = _rules(loss_rating="openskill"), _book()
    book.record_primary(rules, {hk: PrimaryResult(0.05, v) for hk, v in zip("abc", (0.02, 0.04, 0.08), strict=True)})
    assert book.peers["c"].relative_evals == 0 and book.loss_rating(rules, "c") == book.peers["c"].rating[0]
    for bad in ({"loss_rating": "elo"}, {"rating_gamma": 1.0}):  # the run's config refuses them at start
        with pytest.raises(ValidationError):
            GauntletConfig.model_validate({**PRODUCTION.model_dump(), **bad})


def test_saved_book_keeps_the_relative_state_and_old_books_load() -> None:
    rules, book = _rules(rating_tie_band=0.0, rating_exponent=1.0), _book()
    book.record_primary(rules, {hk: PrimaryResult(0.05, v) for hk, v in zip("abc", (0.02, 0.04, 0.08), strict=True)})
    again = ScoreBook.from_json(book.to_json())
    assert again == book and again.peers["a"].relative_delta == pytest.approx(0.5)
    assert again.relative_noise == book.relative_noise and book.relative_noise[1] == 1
    old = json.loads(book.to_json())  # a book written before the fields existed
    for record in old["peers"].values():
        del record["relative_delta"], record["relative_evals"]
    del old["relative_noise"], old["relative_noise_windows"]
    restored = ScoreBook.from_json(json.dumps(old))
    assert restored.peers["a"].relative_delta == 1.0 and restored.peers["a"].relative_evals == 0
    assert restored.relative_noise == (0.0, 0)


def test_the_book_scores_by_the_production_hparams_it_is_given() -> None:
    g = PRODUCTION
    book = ScoreBook()
    book.get_or_create("a", 0, window=0)
    expected = 25.0 if g.loss_rating == "relative" else book.peers["a"].rating[0]
    assert book.loss_rating(g, "a") == expected
    # the production cap reaches the book: a peer far ahead after many evaluations is rated at the cap
    record = book.peers["a"]
    record.relative_delta, record.relative_evals = 1.9, 200
    assert g.rating_cap is not None and book.loss_rating(g, "a") == pytest.approx(25.0 * g.rating_cap)
