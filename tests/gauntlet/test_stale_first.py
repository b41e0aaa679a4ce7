"""The levers of docs/scoring.md §1 and §4: the stale-first draw of F_t / S_t and the μ start-up ramp."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from tests.rules import gauntlet_rules

from templar.core.config import load_hparams
from templar.gauntlet import PrimaryResult, ScoreBook, select_eval_peers
from templar.gauntlet.scores import ramped_mu
from templar.gauntlet.selection import stale_first_priority

PEERS = [f"hk{i:03d}" for i in range(64)]


def test_no_staleness_or_zero_sharpness_is_the_uniform_draw() -> None:
    plain = select_eval_peers(7, 100, PEERS, 8, purpose="primary")
    assert select_eval_peers(7, 100, PEERS, 8, purpose="primary", staleness={"hk000": 50.0}) == plain
    assert select_eval_peers(7, 100, PEERS, 8, purpose="primary", staleness={"hk000": 50.0}, sharpness=0.0) == plain


def test_stale_peers_are_drawn_more_often_but_not_always() -> None:
    """Half the peers were evaluated 1 window ago, half 8 windows ago; sharpness 1 → odds ∝ 1 : 8.

    Over 400 windows the stale half should take most of the 8 places, yet a fresh peer still
    appears: the draw stays random, keyed by the validator's seed.
    """
    staleness = {h: (8.0 if i % 2 else 1.0) for i, h in enumerate(PEERS)}
    counts: Counter[str] = Counter()
    for window in range(400):
        counts.update(select_eval_peers(3, window, PEERS, 8, purpose="primary", staleness=staleness, sharpness=1.0))
    stale = sum(c for h, c in counts.items() if staleness[h] == 8.0)
    fresh = sum(c for h, c in counts.items() if staleness[h] == 1.0)
    assert stale + fresh == 400 * 8
    assert stale > 5 * fresh and fresh > 0


def test_never_evaluated_peers_count_as_twice_the_stalest() -> None:
    """63 known peers at staleness 10, one newcomer absent from the map: it counts as 20.

    At sharpness 4 its weight is 2⁴ = 16 times each other's, so it is drawn first with
    P = 16 / (16 + 63) ≈ 0.2 per window (40 of 200), against 1/64 (3 of 200) uniformly.
    """
    staleness = {h: 10.0 for h in PEERS[1:]}
    first = sum(select_eval_peers(5, w, PEERS, 1, staleness=staleness, sharpness=4.0) == ["hk000"]
                for w in range(200))
    assert 20 < first < 70


def test_exponential_race_hand_values() -> None:
    """u = (top 8 bytes + 0.5) / 2^64; all-0x80 bytes give u ≈ 0.5, so the key is ln 2 / weight."""
    digest = bytes([0x80] + [0] * 15)
    assert stale_first_priority(digest, 1.0) == pytest.approx(math.log(2))
    assert stale_first_priority(digest, 4.0) == pytest.approx(math.log(2) / 4)


def test_selection_rejects_bad_sharpness() -> None:
    with pytest.raises(ValueError, match="sharpness"):
        select_eval_peers(1, 1, PEERS, 2, staleness={}, sharpness=-1.0)


def test_ramped_mu_hand_values() -> None:
    """γ = 0.9. One +1 evaluation: μ = 0.1. Full correction (k = 0): 0.1 / (1 − 0.9) = 1.0.
    k = 2: 0.1 / (1 − 0.9³) = 0.1 / 0.271 = 0.369. None: 0.1 (the paper). Never above 1.
    """
    assert ramped_mu(0.1, 1, 0.9, 0.0) == pytest.approx(1.0)
    assert ramped_mu(0.1, 1, 0.9, 2.0) == pytest.approx(0.1 / 0.271)
    assert ramped_mu(0.1, 1, 0.9, None) == 0.1
    assert ramped_mu(0.0, 0, 0.9, 0.0) == 0.0
    assert ramped_mu(0.3, 1, 0.9, 0.0) == 1.0
    with pytest.raises(ValueError):
        ramped_mu(0.1, 1, 1.0, 2.0)


def test_book_staleness_ramp_and_newcomer_boost() -> None:
    """Two peers evaluated at window 10; one of them again at 20. At window 30:
    a: 2 evaluations, last at 20 → staleness 10; b: 1 evaluation, last at 10 → 20.
    With newcomer_evals 8: a counts 8/3 × 10 = 26.67, b 8/2 × 20 = 80.
    """
    rules = gauntlet_rules(mu_gamma=0.9, openskill_beta=4.1667, openskill_tau=0.0833)
    ramped = rules.model_copy(update={"mu_prior_evals": 0.0})
    book = ScoreBook()
    for hk, uid in (("a", 1), ("b", 2)):
        book.get_or_create(hk, uid, 10)
    good = PrimaryResult(0.2, 0.1)
    book.record_primary(rules, {"a": good, "b": PrimaryResult(0.05, 0.1)}, window=10)
    book.record_primary(rules, {"a": good}, window=20)
    book.get_or_create("c", 3, 25)  # seen, never evaluated: absent
    assert book.staleness(30) == {"a": 10.0, "b": 20.0}
    assert book.staleness(30, newcomer_evals=8) == pytest.approx({"a": 80 / 3, "b": 80.0})
    # drawn first until 2 evaluations: b (1) is a newcomer again, a (2) is not; 0 is the rule without it
    assert book.staleness(30, first_evals=2) == {"a": 10.0}
    assert book.staleness(30, first_evals=3) == {} and book.staleness(30, first_evals=0) == book.staleness(30)
    with pytest.raises(ValueError, match="first_evals"):
        book.staleness(30, first_evals=-1)
    plain = book.scores(rules)["a"]
    # a: μ = 0.19 after two +1s; corrected 0.19 / (1 − 0.81) = 1.0, so its score is its rating
    assert book.scores(ramped)["a"] == pytest.approx(book.peers["a"].loss_rating)
    assert book.scores(ramped)["a"] > plain
    assert book.scores(ramped)["b"] == 0.0  # a −1 stays ≤ 0 however it is scaled
    assert book.scores(rules)["a"] == pytest.approx(plain)  # the rules are the run's, not the book's


def test_presets_accept_the_new_gauntlet_fields() -> None:
    for name in ("tiny", None):
        g = load_hparams(name).gauntlet
        assert g.selection_sharpness >= 0 and g.newcomer_evals >= 0
        assert g.mu_prior_evals is None or g.mu_prior_evals >= 0


def test_a_peer_is_drawn_first_until_its_first_evaluations() -> None:
    """`newcomer_first_evals` through `draw_window`: 63 incumbents with 20 evaluations each, last at
    windows 0-62, and a newcomer with one evaluation, last a window ago. Stale first alone, the
    newcomer's weight is (1 x 32/2)^2 = 256 against the incumbents' ((w - last) x 32/21)^2, so it is
    rarely in F_t (1 of 200 validator seeds); drawn first until 3 evaluations it counts as twice the
    stalest (its weight 4 times the stalest's), so it is in most seeds' F_t (130 of 200), yet not in
    every one: the draw stays keyed by the validator's secret."""
    from templar.gauntlet import draw_window

    base = gauntlet_rules(selection_sharpness=2.0, newcomer_evals=32, fast_eval_uids=8, uids_per_window=4)
    book = ScoreBook()
    for i, hotkey in enumerate(PEERS):
        record = book.get_or_create(hotkey, i, 0)
        record.primary_evals, record.last_primary_window = (1, 99) if hotkey == "hk000" else (20, i)
    miners = {hotkey: i for i, hotkey in enumerate(PEERS)}

    def drawn(rules) -> int:
        return sum("hk000" in draw_window(book, rules, seed, 100, miners, []).fast for seed in range(200))

    plain, first = drawn(base), drawn(base.model_copy(update={"newcomer_first_evals": 3}))
    assert plain <= 5 and 100 < first < 190, (plain, first)
    assert drawn(base.model_copy(update={"newcomer_first_evals": 1})) == plain  # it has 1: no longer a newcomer


def test_a_window_with_a_place_for_every_peer_evaluates_them_all_whatever_the_newcomer_rule() -> None:
    """Where a run has at most `fast_eval_uids` miners and `uids_per_window` places for them all (the
    README's localnet: 7 miners, 16 and 8), F_t and S_t hold every miner, so drawing newcomers first
    changes no one's evaluations there: only a crowded run (more miners than places) feels it."""
    from templar.gauntlet import FastVerdict, Status, draw_window

    book = ScoreBook()
    miners = {hotkey: i for i, hotkey in enumerate(PEERS[:7])}
    for i, hotkey in enumerate(miners):
        record = book.get_or_create(hotkey, i, 0)
        record.primary_evals, record.last_primary_window = (i, 90 + i) if i else (0, None)
    for first_evals in (0, 5):
        rules = gauntlet_rules(selection_sharpness=2.0, newcomer_evals=32, newcomer_first_evals=first_evals,
                               fast_eval_uids=16, uids_per_window=8)
        for seed in range(20):
            draw = draw_window(book, rules, seed, 100, miners, [])
            assert sorted(draw.fast) == sorted(miners)
            verdicts = {hotkey: FastVerdict(Status.OK) for hotkey in miners}
            assert sorted(draw.primary(verdicts)) == sorted(miners)
