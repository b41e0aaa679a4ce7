"""Deterministic S_t / F_t selection: same inputs → same subset everywhere, order-free."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from templar.gauntlet import (
    evaluated_pages,
    select_eval_pages,
    select_eval_peers,
    select_eval_sequences,
    selection_priority,
)

CANDIDATES = [f"5Hotkey{i:02d}" for i in range(10)]


def test_golden_output_pins_cross_machine_determinism() -> None:
    # blake2b is specified bit for bit; if this changes, validators on different versions
    # would evaluate different peers. Recorded once from this implementation.
    assert select_eval_peers(7, 100, [f"hk{i}" for i in range(10)], 4) == ["hk4", "hk0", "hk9", "hk5"]
    assert select_eval_peers(7, 100, [f"hk{i}" for i in range(10)], 4, always=["hk0", "hk1"]) == [
        "hk4", "hk0", "hk9", "hk1",
    ]


@given(st.permutations(CANDIDATES), st.integers(min_value=0, max_value=10))
def test_input_order_and_duplicates_do_not_matter(order: list[str], n: int) -> None:
    expected = select_eval_peers(1, 55, CANDIDATES, n)
    assert select_eval_peers(1, 55, order, n) == expected
    assert select_eval_peers(1, 55, order + order[:3], n) == expected
    assert len(expected) == min(n, len(CANDIDATES))
    assert len(set(expected)) == len(expected)


def test_always_peers_are_included_within_the_budget() -> None:
    always = CANDIDATES[:3]
    for window in range(20):
        chosen = select_eval_peers(3, window, CANDIDATES, 5, always=always)
        assert set(always) <= set(chosen)
        assert len(chosen) == 5
    # the budget never drops a forced peer
    assert set(select_eval_peers(3, 0, CANDIDATES, 1, always=always)) == set(always)
    # a forced hotkey that is no longer a candidate (deregistered) is ignored
    assert "gone" not in select_eval_peers(3, 0, CANDIDATES, 5, always=["gone"])


def test_subset_changes_with_window_seed_and_purpose() -> None:
    by_window = {tuple(select_eval_peers(9, w, CANDIDATES, 3)) for w in range(30)}
    assert len(by_window) > 10
    seed_differs = sum(
        select_eval_peers(9, w, CANDIDATES, 3) != select_eval_peers(10, w, CANDIDATES, 3) for w in range(30)
    )
    assert seed_differs > 20
    differs = sum(
        select_eval_peers(9, w, CANDIDATES, 3, purpose="primary")
        != select_eval_peers(9, w, CANDIDATES, 3, purpose="fast")
        for w in range(30)
    )
    assert differs > 20


def test_selection_is_fair_over_many_windows() -> None:
    # 10 candidates, 3 per window, 3000 windows: each expected 900 times (sd ≈ 25)
    counts: Counter[str] = Counter()
    for window in range(3000):
        counts.update(select_eval_peers(42, window, CANDIDATES, 3))
    assert set(counts) == set(CANDIDATES)
    assert all(780 < count < 1020 for count in counts.values()), counts


def test_result_is_in_priority_order_and_edge_sizes() -> None:
    chosen = select_eval_peers(5, 8, CANDIDATES, 10)
    assert sorted(chosen) == sorted(CANDIDATES)
    assert chosen == sorted(chosen, key=lambda hk: selection_priority(5, 8, hk))
    assert select_eval_peers(5, 8, CANDIDATES, 0) == []
    assert select_eval_peers(5, 8, [], 4) == []
    with pytest.raises(ValueError):
        select_eval_peers(5, 8, CANDIDATES, -1)
    shuffled = CANDIDATES[:]
    random.Random(0).shuffle(shuffled)
    assert select_eval_peers(5, 8, shuffled, 50) == chosen


def test_evaluated_pages_are_a_secret_keyed_subset_of_the_assignment() -> None:
    pages = [40, 7, 1999, 321]
    picked = {tuple(select_eval_pages(seed, 12, uid=3, pages=pages, n=1)) for seed in range(64)}
    # every assigned page is sometimes the one that counts: a miner cannot skip any of them
    assert picked == {(p,) for p in pages}
    two = select_eval_pages(99, 12, 3, pages, 2)
    assert len(two) == 2 and set(two) <= set(pages)
    assert two == [p for p in pages if p in two]  # assignment order
    assert select_eval_pages(99, 12, 3, pages, 2) == two  # deterministic for one validator
    assert select_eval_pages(99, 12, 3, pages, 4) == pages
    assert select_eval_pages(99, 12, 3, pages, 9) == pages
    assert select_eval_pages(99, 12, 3, pages, 0) == []
    with pytest.raises(ValueError):
        select_eval_pages(99, 12, 3, pages, -1)


def test_the_sequences_read_of_a_page_are_secret_and_cover_the_page_over_windows():
    """`gauntlet.proof_sequences`: n of a page's sequences, keyed by the validator's secret seed, the
    window, the uid and the page, so a miner cannot tell which count; over windows every one does."""
    picked = select_eval_sequences(7, 12, uid=3, page=40, per_page=64, n=16)
    assert len(picked) == 16 and picked == sorted(picked) and set(picked) <= set(range(64))
    assert select_eval_sequences(7, 12, 3, 40, 64, 16) == picked                      # deterministic
    assert select_eval_sequences(8, 12, 3, 40, 64, 16) != picked                      # another validator's
    assert select_eval_sequences(7, 12, 3, 41, 64, 16) != picked                      # another page
    assert select_eval_sequences(7, 13, 3, 40, 64, 16) != picked                      # another window
    seen = {i for window in range(40) for i in select_eval_sequences(7, window, 3, 40, 64, 16)}
    assert seen == set(range(64))
    assert select_eval_sequences(7, 12, 3, 40, 4, 0) == [0, 1, 2, 3]                  # 0: all of them
    assert select_eval_sequences(7, 12, 3, 40, 4, 9) == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        select_eval_sequences(7, 12, 3, 40, 4, -1)



def test_a_declaring_peer_is_evaluated_on_each_class_in_proportion() -> None:
    """`declared_pages_evaluated`: shared draws n across both classes (an evaluation may read one class
    only); in_proportion reads n assigned pages and n·K/A declared ones, each drawn apart with the
    validator's secret, assigned first; a peer that declared nothing is read as before under either."""
    assigned, declared = list(range(100, 116)), list(range(900, 916))
    one_class = 0
    for seed in range(64):
        shared = evaluated_pages(seed, 12, 3, assigned, declared, 2, "shared")
        both = evaluated_pages(seed, 12, 3, assigned, declared, 2, "in_proportion")
        assert len(shared) == 2 and len(both) == 4
        assert sum(p in assigned for p in both) == 2 and both[:2] == sorted(both[:2], key=assigned.index)
        one_class += len({p in assigned for p in shared}) == 1
        assert evaluated_pages(seed, 12, 3, assigned, [], 2, "in_proportion") == select_eval_pages(
            seed, 12, 3, assigned, 2) == evaluated_pages(seed, 12, 3, assigned, [], 2, "shared")
    assert 10 < one_class < 54  # shared: about half the evaluations read one class only
    assert len({tuple(evaluated_pages(s, 12, 3, assigned, declared, 2, "in_proportion")[2:]) for s in range(64)}) > 30
    few = evaluated_pages(5, 12, 3, assigned, declared[:3], 8, "in_proportion")[8:]
    assert len(few) == 2 and set(few) <= set(declared[:3])  # ⌈8·3/16⌉
    assert evaluated_pages(5, 12, 3, assigned[:2], declared[:3], 8, "in_proportion") == assigned[:2] + declared[:3]
    with pytest.raises(ValueError, match="unknown rule"):
        evaluated_pages(5, 12, 3, assigned, declared, 2, "all")


def test_one_declared_page_is_read_in_proportion_to_its_work_on_average() -> None:
    """Production's pages (29 assigned, one evaluated): rounded up, a peer declaring one page was read on a
    declared page in every evaluation, which made it 1.5× as long for a thirtieth more work, and a validator
    whose evaluated peers all declared one page overran its evaluation time. On average (the rounding drawn
    with the secret), one evaluation in 29 reads it; twice the pages is read exactly as before, and which
    evaluations read the declared page is the validator's secret."""
    assigned, rule = list(range(100, 129)), "in_proportion_on_average"
    reads = [evaluated_pages(seed, window, 3, assigned, [900], 1, rule) for seed in range(40) for window in range(73)]
    declared_read = sum(len(pages) == 2 and pages[1] == 900 for pages in reads)
    assert all(len(pages) in (1, 2) and pages[0] in assigned for pages in reads)
    assert 2920 / 29 * 0.7 < declared_read < 2920 / 29 * 1.3, declared_read  # 1 in 29 (100.7 expected)
    twice = list(range(900, 929))
    for seed in range(16):
        assert (evaluated_pages(seed, 12, 3, assigned, twice, 1, rule)
                == evaluated_pages(seed, 12, 3, assigned, twice, 1, "in_proportion"))
    assert len(evaluated_pages(0, 12, 3, assigned, twice[:15], 2, rule)) in (3, 4)  # 2·15/29 = 1.03: 1 or 2
