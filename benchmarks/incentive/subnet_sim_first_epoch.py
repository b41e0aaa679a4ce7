"""What the epoch that first pays a newcomer reads of it, and of the identical incumbents beside it.

At finney's cadence a newcomer that is not at the honest median in the weight vectors its first
epoch reads waits a whole tempo (72 minutes) more, so "paid as the median within the hour" is a
first-epoch event. `book_readings` says, in one validator's own terms, where its book puts a peer:
at the median, or short of it through the proof (μ̃) or the LossRating. The same reading of the 206
identical incumbents in the same submissions is the baseline: a 1-standard-error band below the
rating's median leaves any honest peer short in about 16 % of readings (Φ(−1)), newcomer or not,
so what a newcomer lacks is its difference from the incumbents, not its distance from 100 %.
"""

from __future__ import annotations

import statistics
from collections import Counter

from templar.core.config import GauntletConfig
from templar.gauntlet import ScoreBook

SAME_INCENTIVE = 1e-9
"""Relative tolerance of "at the honest median": identical peers' incentives differ by float rounding
(about 1e-16 relative), which an exact `>=` read as below the median."""

FIRST_EPOCH_READINGS = ("at the median", "proof", "rating", "not evaluated")


def book_readings(book: ScoreBook, rules: GauntletConfig, peers: list[str], honest: list[str]) -> list[str]:
    """Where one validator's book puts each of `peers` against the identical incumbents `honest`: "at
    the median" (PeerScore at least the honest median's), else why not: "not evaluated" yet, "proof"
    (μ̃, the μ PeerScore reads, under the honest median's) or "rating" (LossRating under the honest
    median's). A reading short of both is counted as the proof's."""
    scores, paid = book.scores(rules), book.paid_mus(rules)
    tolerance = 1.0 - SAME_INCENTIVE
    median_score = statistics.median(scores.get(h, 0.0) for h in honest) * tolerance
    median_mu = statistics.median(paid.get(h, 0.0) for h in honest) * tolerance
    readings = []
    for hotkey in peers:
        record = book.peers.get(hotkey)
        if record is None or record.primary_evals == 0:
            readings.append("not evaluated")
        elif scores.get(hotkey, 0.0) >= median_score:
            readings.append("at the median")
        else:
            readings.append("proof" if paid[hotkey] < median_mu else "rating")
    return readings


def first_epoch_metrics(first_epoch: dict[str, tuple[str, ...]], incumbents: Counter[str] | None = None) -> dict:
    """What each newcomer's first epoch read of it (`book_readings`, one per validator): how many
    (newcomer, validator) readings were of each kind, and how many newcomers every validator read at
    the median; `incumbents`: the (incumbent, validator) readings of the same submissions, by kind."""
    readings = [r for per_book in first_epoch.values() for r in per_book]
    incumbents = incumbents or Counter()
    return {"newcomer_first_epoch_readings": {kind: readings.count(kind) for kind in FIRST_EPOCH_READINGS},
            "incumbent_first_epoch_readings": {kind: incumbents[kind] for kind in FIRST_EPOCH_READINGS},
            "newcomers_at_median_first_epoch": sum(all(r == "at the median" for r in per_book)
                                                   for per_book in first_epoch.values()),
            "newcomers_with_first_epoch": len(first_epoch)}


def at_median_share(readings: dict[str, int]) -> float:
    """The share of book readings at the median (NaN with none): per (peer, validator), where the
    counts of `newcomers_at_median_first_epoch` need every validator's."""
    total = sum(readings.values())
    return readings.get("at the median", 0) / total if total else float("nan")
