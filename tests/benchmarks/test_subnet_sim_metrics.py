"""`subnet_sim.metrics` (benchmarks/incentive/subnet_sim.py): when a newcomer counts as paid like the identical
incumbents, read from a hand-made incentive history (no simulation)."""

from __future__ import annotations

import numpy as np

from benchmarks.incentive.subnet_sim import Peer, SimConfig, metrics


def test_a_newcomer_inside_the_incumbents_spread_counts_before_it_reaches_their_plateau() -> None:
    """Twenty identical incumbents: sixteen on the saturated median, four a per cent under it. The
    newcomer joins at window 4, is first paid at window 6 just under the plateau (at least the
    incumbents' 10th percentile, under their median) and reaches the plateau at window 9: the strict count
    says 5 windows, the count against the incumbents' spread 2, and the first pay is 0.995x the median."""
    cfg = SimConfig(uids=21, validators=1, windows=12, join_window=4)
    peers = [Peer(f"h{uid}", uid, "honest") for uid in range(20)] + [Peer("n", 20, "newcomer", joins=4)]
    inc = np.zeros((cfg.windows, cfg.uids))
    inc[:, :16] = 1.0
    inc[:, 16:20] = 0.99
    inc[6:9, 20] = 0.995
    inc[9:, 20] = 1.0
    m = metrics(cfg, peers, inc / inc.sum(axis=1, keepdims=True), [1.0] * cfg.windows,
                np.ones((cfg.windows, cfg.validators)), np.ones((cfg.windows, cfg.uids)))
    assert m["newcomer_first_weight_windows"] == 2
    assert m["newcomer_honest_median_windows"] == 5
    assert m["newcomer_honest_spread_windows"] == 2
    assert abs(m["newcomer_first_pay_over_median"] - 0.995) < 1e-12
    assert m["newcomers_at_median_first_pay"] == 0.0 and m["incumbents_at_median_at_newcomers_first_pay"] == 0.8


def test_a_newcomer_under_every_incumbent_is_never_inside_their_spread() -> None:
    cfg = SimConfig(uids=11, validators=1, windows=8, join_window=2)
    peers = [Peer(f"h{uid}", uid, "honest") for uid in range(10)] + [Peer("n", 10, "newcomer", joins=2)]
    inc = np.ones((cfg.windows, cfg.uids))
    inc[:, 10] = 0.5
    m = metrics(cfg, peers, inc, [1.0] * cfg.windows, np.ones((cfg.windows, 1)), np.ones((cfg.windows, cfg.uids)))
    horizon = cfg.windows - cfg.join_window  # never: counted as the rest of the run
    assert m["newcomer_honest_spread_windows"] == horizon == m["newcomer_honest_median_windows"]
    assert m["newcomers_never_at_median"] == 1
