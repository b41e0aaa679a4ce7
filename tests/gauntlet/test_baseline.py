"""Each unit's own baseline (`templar.gauntlet.baseline`, docs/scoring.md §4): the pure rule."""

import math

import pytest

from templar.gauntlet.baseline import (
    baseline_groups,
    clipped_mean,
    common_gains,
    others_gains,
    unit_adjustments,
)
from templar.gauntlet.scores import size_credit


def test_groups_deal_the_sorted_peers_round_robin_and_need_two_peers():
    assert baseline_groups(["e", "a", "d", "b", "c"], 3) == [["a", "d"], ["b", "e"], ["c"]]
    assert baseline_groups(["b", "a"], 3) == [["a"], ["b"]]      # fewer groups than asked: one peer each
    assert baseline_groups(["a"], 3) == []                       # a lone peer's common step is its own
    assert baseline_groups(["a", "b", "c"], 0) == []             # off


def test_common_gain_is_the_median_over_groups_of_the_finite_ones():
    assert common_gains([[1.0, 5.0], [2.0, 6.0], [9.0, -math.inf]]) == [2.0, 5.5]
    assert common_gains([[1.0], [3.0]]) == [2.0]
    assert math.isnan(common_gains([[math.nan], [math.inf]])[0])
    with pytest.raises(ValueError):
        common_gains([[1.0], [1.0, 2.0]])


def test_a_unit_that_any_step_improves_much_is_judged_against_that():
    """An untrained unit gains b·c_u under the peer's step: adjusted, its gap over δ_rand is 0,
    whatever its susceptibility; measured against δ_rand alone it would read ±(b·(c_u − c̄))."""
    random_common = [1.0, 2.0, 3.0, 2.0]
    strength = 1.5                                  # this peer's step is 1.5× the common steps, generically
    random_gains = [strength * c for c in random_common]
    delta_rand = sum(random_gains) / len(random_gains)
    unit_common = [0.5, 4.0, 2.0]                   # one barely moved by any step, one moved twice as much
    untrained = [strength * c for c in unit_common]
    adjust = unit_adjustments(random_gains, random_common, unit_common)
    assert adjust == pytest.approx([strength * (c - 2.0) for c in unit_common])
    assert [u - a - delta_rand for u, a in zip(untrained, adjust, strict=True)] == pytest.approx([0.0] * 3)
    # flat susceptibility: nothing changes, the paper's δ_rand baseline
    assert unit_adjustments(random_gains, [2.0] * 4, [2.0] * 3) == pytest.approx([0.0] * 3)
    # a unit the common steps broke is not adjusted
    assert unit_adjustments(random_gains, random_common, [math.inf]) == [0.0]


def test_common_steps_that_do_not_help_the_random_pages_leave_the_paper_baseline():
    assert unit_adjustments([1.0, 2.0], [-1.0, 0.5], [3.0]) is None     # c̄ ≤ 0: noise, not a scale
    assert unit_adjustments([math.nan], [1.0], [1.0]) is None            # nothing finite to read
    with pytest.raises(ValueError):
        unit_adjustments([1.0], [1.0, 2.0], [1.0])


def _lazy_credit(groups: int, damage: float) -> float:
    """A lazy peer (its step gains only what any step gains) in a window of 6 peers, one of them a
    colluder whose step unlearns the lazy peer's pages by `damage` per unit, lowering the common
    gain on them in the colluder's group: the lazy peer's proof credit by size."""
    random_common = [1.0, 2.0, 3.0, 2.0]
    lazy_units_common = [1.0, 3.0, 2.0, 2.0]
    # each group's mean step: the colluder sits in group 0, diluted by its group's size
    size = 6 // groups
    per_group = [[c - (damage / size if g == 0 else 0.0) for c in lazy_units_common] for g in range(groups)]
    common_units = common_gains(per_group)
    random_gains = list(random_common)                       # the lazy step: generic gains only
    delta_rand = sum(random_gains) / len(random_gains)
    adjust = unit_adjustments(random_gains, [*random_common], common_units)
    assert adjust is not None
    units = [c - a for c, a in zip(lazy_units_common, adjust, strict=True)]
    return size_credit(units, delta_rand, typical=0.2)


def test_one_colluder_cannot_lift_a_lazy_partner_through_the_median_of_three_groups():
    """With one group the colluder's unlearning step lowers the common gain on its partner's units
    and turns them into gaps (full credit); with three, the median ignores the colluder's group."""
    assert _lazy_credit(groups=3, damage=0.0) == pytest.approx(0.0)
    assert _lazy_credit(groups=3, damage=30.0) == pytest.approx(0.0)
    assert _lazy_credit(groups=1, damage=0.0) == pytest.approx(0.0)
    assert _lazy_credit(groups=1, damage=30.0) == pytest.approx(1.0)


def test_others_are_the_median_of_every_other_peers_gain_over_its_own_random_mean_and_need_enough_of_them():
    """Unit 0 is the random one: each other peer's gains are divided by its gain there first, so a
    step twice as strong says the same of a unit; a step that did not help the random unit is left out."""
    gains = {"a": [9.0, 9.0, 9.0], "b": [1.0, 4.0, 1.0], "c": [2.0, -math.inf, 2.0], "d": [3.0, 6.0, 9.0],
             "idle": [0.0, 5.0, 5.0], "broken": [-1.0, -7.0, 2.0]}
    assert others_gains(gains, "a", 1, 3, 0.0, 0.0) == [1.0, 3.0, 1.0]      # a's own step is never its baseline
    assert others_gains(gains, "b", 1, 3, 0.0, 0.0) == [1.0, 1.5, 1.0]      # a non-finite gain is left out
    assert others_gains(gains, "a", 1, 4, 0.0, 0.0) is None                 # too few others that helped: δ_rand
    assert others_gains({"a": [1.0], "b": [2.0], "c": [3.0]}, "a", 1, 3, 4.0, 0.0) is None


def test_others_whose_step_moved_the_random_units_by_rounding_say_nothing_of_a_units_gain():
    """A near-zero upload's gains are float32 rounding (±1e-8 nats); divided by their own mean (rounding
    too), the profile is noise magnified 10⁵ times. Half the time the mean came out positive and the
    peer was one of the others: a lazy peer's baseline on its units then read as noise, and lazy + faint
    hotkeys earned 0.13 of the weight (benchmarks/LOG.md §60). Within the rules' resolution: left out."""
    honest = {"h1": [1e-3, 2e-3, 1e-3], "h2": [2e-3, 4e-3, 2e-3], "h3": [1e-3, 2e-3, 1e-3]}
    faint = {f"faint{i}": [3e-9, -8e-9 * (i + 1), 5e-9 * (i + 1)] for i in range(4)}
    gains = {"lazy": [1e-3, 1e-3, 1e-3], **honest, **faint}
    assert others_gains(gains, "lazy", 1, 3, 4.0, 1e-5) == pytest.approx([1.0, 2.0, 1.0])  # the honest three
    assert others_gains(gains, "lazy", 1, 3, 4.0, 0.0) != pytest.approx([1.0, 2.0, 1.0])  # rounding took part
    assert others_gains({"lazy": gains["lazy"], "h1": honest["h1"], **faint}, "lazy", 1, 3, 4.0, 1e-5) is None


def test_the_clipped_mean_runs_from_the_median_to_the_mean_and_bounds_a_minority():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]                  # median 3, MAD 1
    assert clipped_mean(values, 0.0) == pytest.approx(3.0)
    assert clipped_mean(values, 1e9) == pytest.approx(22.0)
    assert clipped_mean(values, 2.0) == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)   # 100 counts as 3 + 2·1
    assert clipped_mean([1.0, 2.0, 3.0, 4.0, math.inf], 2.0) == pytest.approx(2.5)  # left out, not clipped
    assert math.isnan(clipped_mean([math.nan], 2.0))
    # two values of seven, however extreme, move it by a bounded amount: at most their share of the clipped
    # range (2/7 of clip MADs each side) beyond where the median and the MAD went (here 1.5-2.5 and 1)
    for extreme in (-1e12, 1e12):
        assert 1.0 <= clipped_mean([1.0, 1.5, 2.0, 2.5, 3.0, extreme, extreme], 2.0) <= 3.0
        assert 0.7 <= clipped_mean([1.0, 1.5, 2.0, 2.5, 3.0, extreme, extreme], 4.0) <= 3.3


def _lazy_credit_against_others(others: int, colluders: int, damage: float) -> float:
    """A lazy peer (generic gains only) judged against `others` other peers' gains on its units (their
    clipped mean at the default clip, 4), `colluders` of which unlearn its pages by `damage` per unit:
    its proof credit by size."""
    random_common = [1.0, 2.0, 3.0, 2.0]
    lazy_units_common = [1.0, 3.0, 2.0, 2.0]
    honest = [*random_common, *lazy_units_common]
    gains = {"lazy": honest}
    for i in range(others):
        unlearned = damage if i < colluders else 0.0          # on the partner's units only
        gains[f"o{i}"] = [*random_common, *(g - unlearned for g in lazy_units_common)]
    common = others_gains(gains, "lazy", len(random_common), 3, 4.0, 0.0)
    assert common is not None
    adjust = unit_adjustments(random_common, common[:len(random_common)], common)
    assert adjust is not None
    delta_rand = sum(random_common) / len(random_common)
    adjusted = [g - a for g, a in zip(honest, adjust, strict=True)][len(random_common):]
    return size_credit(adjusted, delta_rand, typical=0.2)


def test_colluders_short_of_half_the_others_cannot_lift_a_lazy_partner():
    """7 others: 3 colluders unlearning the partner's pages leave the median and the MAD, so the
    clipped mean, at the honest peers' gain (no credit); 4, a majority of the others, set them (full
    credit). The groups rule gives way to 2 (`test_one_colluder_cannot_lift…`: one per group)."""
    assert _lazy_credit_against_others(7, 0, 0.0) == pytest.approx(0.0)
    assert _lazy_credit_against_others(7, 3, 30.0) == pytest.approx(0.0)
    assert _lazy_credit_against_others(7, 4, 30.0) == pytest.approx(1.0)
    assert _lazy_credit_against_others(3, 1, 30.0) == pytest.approx(0.0)
