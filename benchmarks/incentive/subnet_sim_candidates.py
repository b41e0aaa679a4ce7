"""Simulator-only LossRating candidates for `subnet_sim.py`: not production code.

Each is a `ScoreBook` that changes one thing about the relative or OpenSkill LossRating, so the
simulator can compare it with production on the same draws (benchmarks/LOG.md §2 and §6).
"""

from __future__ import annotations

import math
import statistics

from templar.core.config import GauntletConfig
from templar.gauntlet import PrimaryResult, ScoreBook
from templar.gauntlet import rating as rating_module


class TiedOpenSkillBook(ScoreBook):
    """Simulator-only candidate, not production code: OpenSkill with ties for indistinguishable LossScores.

    Before the match, δ_rand is sorted and cut into groups: a peer joins the group of the best
    peer above it while within `band` × the window's median δ_rand of that group's best, and
    every peer of a group gets the group's best value (a tie). Identical peers then mostly tie
    instead of being ranked at random.
    """

    def __init__(self, band: float) -> None:
        super().__init__()
        self.band = band

    def record_primary(self, rules: GauntletConfig, results, **kwargs) -> None:  # type: ignore[override]
        finite = sorted(r.delta_rand for r in results.values() if math.isfinite(r.delta_rand))
        median = statistics.median(finite) if finite else 0.0
        width = self.band * abs(median)
        tied, head = {}, None
        for hotkey in sorted(results, key=lambda h: -results[h].delta_rand):
            value = results[hotkey].delta_rand
            if head is None or not math.isfinite(value) or head - value > width:
                head = value
            tied[hotkey] = PrimaryResult(results[hotkey].delta_assigned, head)
        super().record_primary(rules, tied, **kwargs)


class WeighedWindowsBook(ScoreBook):
    """Simulator-only candidate, not production code: the relative LossRating with each window weighed
    by its own noise (benchmarks/LOG.md §6).

    Production averages a peer's relative LossScores with equal weights and takes the standard
    error as the book's running spread / √n_eff. Here window w counts 1/σ_w² with σ_w = max(the
    window's spread, the running spread, `MIN_SPREAD`): a window noisier than usual counts less,
    none counts more (up-weighting the windows whose 8-value spread came out small by chance made
    identical peers 1.8–2.9× apart at 256 uids). Mean = Σ w x / W and standard error √Q / W over
    the γ-decayed sums W = Σ γ^age w, Q = Σ γ^(2·age) w; with equal spreads this is production.
    """

    MIN_SPREAD = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.weighed: dict[int, tuple[float, float, float]] = {}
        """uid → (weighted mean, W, Q)"""

    def record_primary(self, rules: GauntletConfig, results, **kwargs) -> None:  # type: ignore[override]
        relative = rating_module.relative_loss_scores({hk: r.delta_rand for hk, r in results.items()},
                                                      clip=(rules.relative_clip_low, rules.relative_clip_high),
                                                      min_players=rules.relative_min_players,
                                                      resolution=rules.proof_gap_resolution)
        spread = rating_module.relative_spread(relative, {hk: r.delta_rand for hk, r in results.items()},
                                               min_players=rules.relative_min_players,
                                               resolution=rules.proof_gap_resolution)
        if rules.loss_rating == "relative" and spread is not None:  # before super(): its rescoring reads these
            gamma = rules.rating_gamma
            precision = 1.0 / max(spread, self.relative_noise[0], self.MIN_SPREAD) ** 2
            for hotkey, x in relative.items():
                uid = self.peers[hotkey].uid
                mean, weight, weight_sq = self.weighed.get(uid, (1.0, 0.0, 0.0))
                weight = gamma * weight + precision
                self.weighed[uid] = (mean + (x - mean) * precision / weight, weight,
                                     gamma * gamma * weight_sq + precision)
        super().record_primary(rules, results, **kwargs)

    def _loss_rating(self, rules: GauntletConfig, record):  # type: ignore[override]
        if rules.loss_rating != "relative" or record.uid not in self.weighed:
            return super()._loss_rating(rules, record)
        mean, weight, weight_sq = self.weighed[record.uid]
        # one "evaluation" whose noise is the standard error: the production formula, band × √Q / W
        return rating_module.relative_rating(mean, 1, gamma=rules.rating_gamma, tie_band=rules.rating_tie_band,
                                             exponent=rules.rating_exponent, noise=math.sqrt(weight_sq) / weight,
                                             cap=rules.rating_cap)
