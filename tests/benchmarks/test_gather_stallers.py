"""The stallers benchmark on production's gather: honest peers queued behind stalling buckets are never
penalised for it (`unserved`), where they were `timeout`, whether the stallers hold their slots to the end of
their budgets or free them just before the round's deadline."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.incentive.gather_stallers import START, _round
from templar.comms.gather import LONGEST_MARGIN
from templar.core.clock import run_virtual


@pytest.mark.parametrize(("seconds", "lead"), [(1.0, None), (3.0, 2.7), (3.0, LONGEST_MARGIN * 3.0 + 0.01)],
                         ids=["naive", "timed-under-a-transfer", "timed-over-the-least-budget"])
def test_honest_peers_queued_behind_stallers_are_never_timed_out(seconds, lead):
    """48 stalling buckets among 79 peers, production's 16 slots, 10 s per peer and 20 s round. Naive stallers
    (1 s honest transfers) left 33 % of honest peers `timeout` when a queued peer was; timed ones, freeing
    their slots just before the deadline, still left some once queued peers were `unserved` (a review: a peer
    whose slot came free too late to finish was asked, and timed out). No transfer starts with less time left
    than half its budget or, when valid payloads came faster, `LONGEST_MARGIN` times the longest of them, and
    every honest peer is `ok` or `unserved` (LOG §57)."""
    total: Counter[str] = Counter()
    for _ in range(5):
        total += run_virtual(_round(79, 48, seconds, 20.0, lead), start=START + 30)
    assert total["timeout"] == 0
    assert total["unserved"] > 0 and total["ok"] > 0
    assert sum(total.values()) == 31 * 5
