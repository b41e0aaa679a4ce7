"""The suite's own schedule (tests/conftest.py `long_tests_order`): the long tests longest first, no more
of those that wait on real time in flight at once than the lanes allow, and every test once."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import pytest
from tests.conftest import QUICK_TEST_SECONDS, long_tests_order


@dataclass
class FakeItem:
    name: str
    seconds: float
    waits: bool = False
    slow: bool = True
    marker: pytest.Mark | None = field(init=False)

    def __post_init__(self) -> None:
        self.marker = pytest.mark.slow(seconds=self.seconds, waits=self.waits).mark if self.slow else None

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marker if name == "slow" else None


SUITE = [FakeItem("e2e", 100, True), FakeItem("failover", 95, True), FakeItem("launch", 80, True),
         FakeItem("kill-1", 45, True), FakeItem("kill-2", 45, True), FakeItem("pay", 45),
         FakeItem("two-rank", 30), *(FakeItem(f"partial-{i}", 20) for i in range(7)),
         FakeItem("flood", 15), FakeItem("smoke", 15), FakeItem("validator", 12)]
QUICK = [FakeItem(f"quick-{i}", QUICK_TEST_SECONDS, slow=False) for i in range(2000)]
"""Enough quick tests to fill a lane's wait on every worker count below (the suite has about 1,300)."""


def most_waiting_at_once(order: list[FakeItem], workers: int) -> int:
    """Replay the order as xdist hands it out (the next test to the first worker free)."""
    free = [(0.0, w) for w in range(workers)]
    running: list[tuple[float, bool]] = []
    most = 0
    for item in order:
        at, worker = heapq.heappop(free)
        running = [(end, waits) for end, waits in running if end > at] + [(at + item.seconds, item.waits)]
        most = max(most, sum(waits for _, waits in running))
        heapq.heappush(free, (at + item.seconds, worker))
    return most


@pytest.mark.parametrize(("workers", "cores", "lanes"), [(4, 2, 2), (3, 2, 2), (6, 4, 2), (8, 2, 6), (1, 2, 1)])
def test_the_waiting_tests_run_in_lanes_and_the_rest_longest_first(workers, cores, lanes):
    order = long_tests_order(list(SUITE), list(QUICK), workers, cores)
    assert sorted(i.name for i in order) == sorted(i.name for i in SUITE + QUICK)  # each test once
    assert most_waiting_at_once(order, workers) == min(lanes, 5)
    assert [i.name for i in order if not i.slow] == [i.name for i in QUICK]  # the quick ones in their order
    computing = [i.seconds for i in order if i.slow and not i.waits]
    waiting = [i.seconds for i in order if i.waits]
    assert computing == sorted(computing, reverse=True) and waiting == sorted(waiting, reverse=True)
    assert order[0].name == "e2e"  # the longest starts first


def test_without_quick_tests_to_wait_on_the_waiting_tests_still_all_run():
    """Once nothing else is left, a waiting test starts even with its lanes full."""
    order = long_tests_order(list(SUITE), [], 4, 2)
    assert sorted(i.name for i in order) == sorted(i.name for i in SUITE)
