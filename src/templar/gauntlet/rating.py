"""LossRating: an OpenSkill Plackett–Luce match over S_t ranked by δ_rand (paper §3.1, Algorithm 1).

LossScores are noisy from one window to the next, but the *ranking* within a window tracks
contribution quality, so the paper feeds each window's ranking into a Bayesian rating
(Joshy 2024, OpenSkill) instead of averaging raw losses. A rating is a `(mu, sigma)` pair of
plain floats so it serialises exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from openskill.models import PlackettLuce

Rating = tuple[float, float]
"""An OpenSkill rating as (mu, sigma)."""

DEFAULT_RATING: Rating = (25.0, 25.0 / 3.0)
"""OpenSkill's own prior (mu 25, sigma 25/3): a newcomer is rated as an average peer."""


def loss_rating(rating: Rating) -> float:
    """LossRating_p: the rating's mean skill `mu` (not the ordinal mu − 3σ).

    Why mu: the top-G aggregation takes only peers with x > 0, and the ordinal of every peer
    starts at 0 and goes negative for anyone below the leader while σ is still large. In the
    20-window scenario of tests/gauntlet/test_scenario.py (3 honest peers, one with 2× data,
    G = 4) the ordinal left the top-G under-filled (2-3 of 4 peers) until window 25 and in 33
    of 120 windows; with mu it was full from window 1 in 119 of 120. An under-filled top-G
    means fewer pseudo-gradients in each aggregate and slow onboarding of good new peers.
    The ordinal's virtue, not paying an unproven newcomer, is already provided by μ_p: a fresh
    hotkey has μ_p = 0, so its PeerScore stays 0 until a primary evaluation shows that it
    trained on its assigned data. (The reference implementation scored with the ordinal in
    v0.2.85 and later moved to mu.)
    """
    return rating[0]


def competition_ranks(results: Mapping[str, float]) -> dict[str, int]:
    """0-based competition ranks, higher result first; equal results share a rank ("1224").

    NaN counts as -inf (no usable result): it ties for last, never lands in between.
    """
    def key(hotkey: str) -> float:
        value = results[hotkey]
        return -math.inf if math.isnan(value) else value

    ordered = sorted(results, key=lambda hotkey: (-key(hotkey), hotkey))
    ranks: dict[str, int] = {}
    for position, hotkey in enumerate(ordered):
        if position and key(hotkey) == key(ordered[position - 1]):
            ranks[hotkey] = ranks[ordered[position - 1]]
        else:
            ranks[hotkey] = position
    return ranks


def rate_match(
    ratings: Mapping[str, Rating],
    results: Mapping[str, float],
    *,
    beta: float,
    tau: float,
) -> dict[str, Rating]:
    """OpenSkillMatch(S_t, {δ_rand}): one Plackett–Luce match among the hotkeys in `results`.

    Higher δ_rand ranks first; ties share a rank (and OpenSkill gives them the same mu change).
    A hotkey missing from `ratings` plays with `DEFAULT_RATING`. Returns the new rating of every
    hotkey in `results`; a match with fewer than two players changes nothing. Players are fed
    to OpenSkill in hotkey order, so the floats do not depend on the mappings' order.
    """
    if not beta > 0:
        raise ValueError(f"rate_match: beta must be positive, got {beta!r}")
    if not tau >= 0:
        raise ValueError(f"rate_match: tau must be non-negative, got {tau!r}")
    players = sorted(results)
    current = {hotkey: ratings.get(hotkey, DEFAULT_RATING) for hotkey in players}
    for hotkey, (mu, sigma) in current.items():
        if not (math.isfinite(mu) and math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"rate_match: invalid rating for {hotkey}: ({mu!r}, {sigma!r})")
    if len(players) < 2:
        return current
    model = PlackettLuce(beta=beta, tau=tau)
    ranks = competition_ranks(results)
    teams = [[model.rating(mu=current[hotkey][0], sigma=current[hotkey][1])] for hotkey in players]
    rated = model.rate(teams, ranks=[float(ranks[hotkey]) for hotkey in players])
    return {hotkey: (float(team[0].mu), float(team[0].sigma)) for hotkey, team in zip(players, rated, strict=True)}


# ---- relative LossRating (docs/scoring.md §5; beyond the paper, `gauntlet.loss_rating` = "relative") -------------

def measured(results: Mapping[str, float], *, resolution: float) -> dict[str, float]:
    """The δ_rands that measure a step: finite and farther than `resolution` from 0 (the rules'
    `proof_gap_resolution`; a δ_rand within it is float32 rounding, an upload that did not move the
    loss). Such an upload costs nothing to post (values 10⁻⁶ of an update pass every fast check), so
    no statistic of S_t's δ_rands counts it: hotkeys posting it into half of S_t would set the median
    to rounding, and every peer that did any work, a quarter of an honest miner's or all of it, would
    sit at the upper clip alike (benchmarks/LOG.md §60)."""
    return {hotkey: value for hotkey, value in results.items() if math.isfinite(value) and abs(value) > resolution}


def window_median(results: Mapping[str, float], *, resolution: float) -> float | None:
    """S_t's median δ_rand over the ones that measure a step (`measured`); None when none does."""
    counted = sorted(measured(results, resolution=resolution).values())
    return _median(counted) if counted else None


def relative_loss_scores(results: Mapping[str, float], *, clip: tuple[float, float],
                         min_players: int, resolution: float) -> dict[str, float]:
    """Each peer's δ_rand divided by the median δ_rand of the window's S_t (`window_median`, which
    leaves out δ_rands within `resolution` of 0), clipped to `clip` (the rules' `relative_clip_low`,
    `_high`: a δ_rand of −∞, the update broke the model, or far below the median counts as the low
    end; the high end bounds what one freak evaluation moves a peer's mean, benchmarks/LOG.md §3, §5).

    Why relative: the loss scale falls as the model trains and differs from window to window,
    so raw LossScores are not comparable across windows, while the ratio to the same window's
    median is (1.0 = a typical peer of S_t). Unlike a rank, the ratio keeps the size of the
    difference: two identical peers score 1 ± noise and the noise averages out over their
    evaluations, where their OpenSkill ranks are coin flips whose ratings random-walk apart.
    Returns {} (nothing to learn) when fewer than `min_players` results are finite and beyond
    `resolution` (a median of two is one of the peers' own) or the median is not positive (most of
    S_t made the loss worse: no scale to compare against).
    """
    median = window_median(results, resolution=resolution)
    if len(measured(results, resolution=resolution)) < min_players or median is None or not median > 0:
        return {}
    low, high = clip
    return {hotkey: low if math.isnan(value) else min(high, max(low, value / median))
            for hotkey, value in results.items()}


def without_premium(results: Mapping[str, float], *, resolution: float) -> dict[str, float]:
    """Each δ_rand, at most S_t's median (`window_median`; as they are when there is none): what a
    window whose trial steps were not held to a typical size (`premium` False in
    `ScoreBook.record_primary`) rates. There a trial step is the upload as it is, so a δ_rand above
    the median may be a louder upload rather than a better one: an honest update ×3 gained 3× the
    median and was rated as the best peer, after which its pay set the next windows' typical size
    (benchmarks/LOG.md §60). Below the median, a δ_rand still rates as measured."""
    median = window_median(results, resolution=resolution)
    if median is None:
        return dict(results)
    return {hotkey: min(value, median) if math.isfinite(value) else value for hotkey, value in results.items()}


def update_relative(mean: float, evaluations: int, x: float, gamma: float) -> float:
    """The peer's relative LossScore averaged as a bias-corrected EMA: after n+1 evaluations
    mean ← mean + (x − mean)·(1 − γ)/(1 − γ^(n+1)).

    The first evaluation sets the mean to x (no pull towards an arbitrary start); later ones
    weigh recent evaluations more (memory about 1/(1 − γ) evaluations) so a peer that changes
    its hardware or data is re-rated, as OpenSkill's τ allows.
    """
    if not 0.0 <= gamma < 1.0 or evaluations < 0:
        raise ValueError(f"update_relative: need 0 <= gamma < 1 and evaluations >= 0, got {gamma!r}, {evaluations!r}")
    if not (math.isfinite(mean) and math.isfinite(x)):
        raise ValueError(f"update_relative: non-finite input mean={mean!r} x={x!r}")
    return mean + (x - mean) * (1.0 - gamma) / (1.0 - gamma ** (evaluations + 1))


def effective_evaluations(evaluations: int, gamma: float) -> float:
    """n_eff = (Σ w)² / Σ w² of the EMA's weights γ^i over `evaluations` terms (1 when γ = 0).

    The standard error of the EMA is σ/√n_eff; n_eff grows like n at first and saturates at
    (1 + γ)/(1 − γ).
    """
    if evaluations <= 0:
        return 0.0
    if gamma == 0.0:
        return 1.0
    total = (1.0 - gamma**evaluations) / (1.0 - gamma)
    squares = (1.0 - gamma ** (2 * evaluations)) / (1.0 - gamma * gamma)
    return total * total / squares


def relative_spread(relative: Mapping[str, float], deltas: Mapping[str, float], *, min_players: int,
                    resolution: float) -> float | None:
    """One window's spread of relative LossScores: 1.4826 × the median |x − median x| (a robust σ),
    over the peers whose δ_rand (`deltas`) measured a step (`measured`, as the median does).

    The tie band is a multiple of this, so it follows the evaluation noise of the deployment
    (pages per evaluation, model size) instead of a constant tuned on one preset. The median
    absolute deviation ignores the few peers that differ for real (cheats near 0, a strong peer):
    it only moves when most of S_t is spread out. Uploads that did not move the loss are no
    measurement of that noise: four `faint` hotkeys beside three working peers made the median x 0
    and the spread 4e-6, the tie band closed, and two identical honest miners were paid 0.38 and 0.61
    (benchmarks/LOG.md §60). None with fewer than `min_players`.
    """
    counted = measured(deltas, resolution=resolution)
    values = sorted(x for hotkey, x in relative.items() if hotkey in counted)
    if len(values) < min_players:
        return None
    deviations = sorted(abs(v - _median(values)) for v in values)
    return 1.4826 * _median(deviations)


def _median(ordered: list[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def relative_rating(
    mean: float, evaluations: int, *, gamma: float, tie_band: float, exponent: float, noise: float,
    cap: float | None = None, tie_band_below: float = 0.0, below_after: int = 0,
) -> float:
    """LossRating from the relative LossScores: 25 · max(0, min(1, mean + band_below)) at or below the
    median (mean ≤ 1), 25 · min(cap, (1 + shrink(mean − 1))^exponent) above it.

    Below the median the mean moves up by at most `tie_band_below` standard errors
    (band_below = tie_band_below · noise/√n_eff), never past the median. Beyond that the rating
    follows the mean in proportion: work that is measurably less than a typical peer's is paid
    measurably less (a peer at 0.9 of the median is rated 0.9 × 25 plus the band), so an update that
    helps the model a quarter as much earns about a quarter. Within it a peer is not yet shown to do
    less than a typical peer: a newcomer rated on two evaluations, whose mean scatters by σ/√2, is
    rated 25 unless its mean lies more than `tie_band_below` of those standard errors under the
    median, instead of sitting below the tied incumbents for as long as the EMA remembers one
    unlucky evaluation (`below_after` m > 0: with fewer than m evaluations a mean below the median is
    not read at all, the rating is 25; production reads it from the first). The band is absolute and shrinks as evaluations
    accumulate, so it forgives at most that much of a persistent shortfall (0, the default, is the
    rule before it: the mean itself; a band of three standard errors once rated a miner training on
    a quarter of each page's sequences exactly 25, which is why it is small and additive).

    Above it, shrink(d) = max(0, d − tie_band · noise/√n_eff): a peer whose mean is within
    `tie_band` standard errors above the median (1.0) is not yet shown to do more than a typical
    peer and is rated exactly 25, so identical peers are paid alike and two validators, whose
    books hold different evaluations, rate them alike.
    `noise` is one evaluation's spread (the book's running `relative_spread`); `tie_band` 3 keeps
    the extreme of a few hundred identical peers (about 2.8 standard errors out) inside the band.
    Beyond the band the rating grows as a power `exponent` of the relative LossScore, the premium
    for more useful work: with exponent 10 a peer 5 % clear of the band is rated 1.6× (before
    the normalisation's power c). A peer never rated gets 25, OpenSkill's prior: the score of a
    newcomer is held back by μ, not by its rating.

    `cap` (None: no cap) bounds the premium at `cap` × 25. With the exponent the premium rises
    steeply just beyond the band, and the band is crossed at a different window by each validator
    (their books hold different evaluations), so an unbounded premium turns the moment one strong
    peer crosses into a disagreement between validators as large as the premium. Capped at 2, a
    peer doing clearly more useful work is paid up to 4× an honest peer (with c = 2), never more.
    """
    if below_after < 0:
        raise ValueError(f"relative_rating: below_after must be >= 0, got {below_after!r}")
    if cap is not None and not (math.isfinite(cap) and cap >= 1.0):
        raise ValueError(f"relative_rating: cap must be a finite number >= 1 (or None), got {cap!r}")
    if (not 0.0 <= gamma < 1.0 or not tie_band >= 0 or not 0 <= tie_band_below < math.inf or not exponent > 0
            or not math.isfinite(exponent)):
        raise ValueError(f"relative_rating: need 0 <= gamma < 1, tie bands >= 0 and a finite exponent > 0, got "
                         f"{gamma!r}, {tie_band!r}, {tie_band_below!r}, {exponent!r}")
    if not math.isfinite(mean) or not 0.0 <= noise < math.inf:
        raise ValueError(f"relative_rating: mean and noise must be finite (noise >= 0), got {mean!r}, {noise!r}")
    prior = DEFAULT_RATING[0]
    n_eff = effective_evaluations(evaluations, gamma)
    if n_eff <= 0:
        return prior
    if mean <= 1.0:
        if evaluations < below_after:
            return prior
        return prior * max(0.0, min(1.0, mean + tie_band_below * noise / math.sqrt(n_eff)))
    excess = mean - 1.0 - tie_band * noise / math.sqrt(n_eff)
    premium = (1.0 + excess) ** exponent if excess > 0 else 1.0
    return prior * (premium if cap is None else min(cap, premium))
