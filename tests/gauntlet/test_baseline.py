"""Each unit's own baseline (`templar.gauntlet.baseline`, docs/scoring.md §4): the pure rule."""

import math

import pytest

from templar.gauntlet.baseline import baseline_groups, common_gains, unit_adjustments
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
