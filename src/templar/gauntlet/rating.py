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
