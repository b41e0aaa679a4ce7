"""The stallers benchmark on production's gather: honest peers queued behind stalling buckets are never
penalised for it (`unserved`), where they were `timeout`."""

from __future__ import annotations

from collections import Counter

from benchmarks.incentive.gather_stallers import START, _round
from templar.core.clock import run_virtual


def test_honest_peers_queued_behind_stallers_are_unserved_not_timed_out():
    """48 stalling buckets among 79 peers, 1 s honest transfers, production's 16 slots and 20 s round: every
    shuffle leaves honest peers unasked (before: each a `timeout`, 33 % of them), and none is `timeout`, since
    each one asked had its whole transfer's time."""
    total: Counter[str] = Counter()
    for _ in range(5):
        total += run_virtual(_round(79, 48, 1.0, 20.0), start=START + 30)
    assert total["timeout"] == 0
    assert total["unserved"] > 0 and total["ok"] > 0
    assert sum(total.values()) == 31 * 5
