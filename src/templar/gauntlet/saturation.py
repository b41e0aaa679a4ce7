"""The proof of computation saturates at the level of work the run pays (`gauntlet.mu_tie_band`).

μ is a proof that a peer trained on its assigned pages, not a measure of how well: how much its
update teaches is the LossRating's to say. Read as a number, μ carries the sampling of the few
evaluations behind it (an honest evaluation's credit scatters by about a quarter of its mean), and
PeerScore^c squares that scatter into pay: identical miners were paid up to 1.55× apart over 16
windows. So μ as PeerScore reads it stops at the run's paid level ℓ (`extra_work.paid_level`, the
pay-weighted median μ of the peers that declared nothing): every μ within the tie band below ℓ
reads exactly ℓ, and below the band it falls as a power, so a quarter of the work stays well under
a quarter of the pay:

    paid μ = ℓ                              when μ ≥ (1 − b)·ℓ
    paid μ = ℓ · (μ / ((1 − b)·ℓ))^k        below it   (b: `mu_tie_band`, k: `mu_exponent`)

ℓ is weighted by pay, so hotkeys that earn little (copies, lazy or thin work) cannot pull it down
however many there are; lowering it takes paid peers with a low μ, i.e. a large LossRating earned
on the random pages, which is work the run wants. A failed fast evaluation costs the paid μ the
same share φ as without the band (`penalised_read`): a peer above the band would otherwise absorb
it. b = 0 turns the saturation off (the rule before it, to the bit).
"""

from __future__ import annotations

import math

from templar.gauntlet.rating import effective_evaluations


def _saturates(mu: float, level: float, band: float) -> bool:
    return band > 0.0 and level > 0.0 and mu > 0.0


def saturated_mu(mu: float, level: float | None, band: float, exponent: float) -> float:
    """μ as PeerScore reads it under a tie band `band` below the paid `level` (module docstring);
    `mu` itself when the band is 0, no level is known yet or μ ≤ 0 (which PeerScore floors)."""
    if level is None or not _saturates(mu, level, band):
        return mu
    edge = (1.0 - band) * level
    if mu >= edge:
        return level
    return level * (mu / edge) ** exponent


def penalised_read(mu: float, level: float | None, band: float, exponent: float, phi: float) -> float:
    """The μ read after a failed fast evaluation: the one whose `saturated_mu` is φ times `mu`'s, so the
    penalty bites a peer inside the band as it bites without one (φ·μ when the saturation is off)."""
    if level is None or not _saturates(mu, level, band):
        return phi * mu
    paid = saturated_mu(mu, level, band, exponent)
    edge = (1.0 - band) * level
    return edge * (phi * paid / level) ** (1.0 / exponent)


def evaluated_band(band: float, evaluations: int, gamma: float) -> float:
    """μ's tie band for a peer of `evaluations` primary evaluations when the band widens as a standard
    error does (`gauntlet.mu_tie_band_widens`): the edge (1 − b)·ℓ holds for a peer whose μ̂ carries the
    EMA's saturated n_sat = (1 + γ)/(1 − γ) effective evaluations, and a peer of fewer, whose μ̂ scatters
    by s = √(n_sat / n_eff) times as much, gets the edge (1 − b)^s · ℓ: one more factor (1 − b) per
    incumbent's standard error, never reaching 0. With b 0.2 and γ 0.9 the edge is 0.38 ℓ after one
    evaluation, 0.50 ℓ after two and 0.73 ℓ after ten. 0 evaluations or b 0 keep `band`."""
    if band <= 0.0 or evaluations <= 0 or not 0.0 < gamma < 1.0:
        return band
    saturated = (1.0 + gamma) / (1.0 - gamma)
    widening = max(1.0, math.sqrt(saturated / effective_evaluations(evaluations, gamma)))
    return 1.0 - (1.0 - band) ** widening


def unramped_mu(read: float, evaluations: int, gamma: float, prior_evals: float | None) -> float:
    """The stored μ (eq. 3's EMA) that `scores.ramped_mu` reads as `read`: its inverse below the clip."""
    if prior_evals is None:
        return read
    accumulated = 1.0 - gamma ** (evaluations + prior_evals)
    return read * accumulated if accumulated > 0.0 and math.isfinite(read) else 0.0
