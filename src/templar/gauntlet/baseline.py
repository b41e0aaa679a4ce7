"""Each unit's own baseline for the proof of computation (beyond the paper; `gauntlet.proof_baseline_groups`).

The proof asks whether a peer's trial step helped its pages more than it would have helped them
had the peer not trained on them. The paper's answer is δ_rand, the step's mean gain on random
pages, one number for every unit. But most of a step's gain on any unit is generic (the model
getting better at text), and how much generic gain a unit takes varies widely from unit to unit:
on the `micro` test model a step gains 3-20 times more on random pages than its peer's assigned
pages gain beyond that, and the mean of 32 random sequences scatters by 0.3-0.9 of that typical
gap. That scatter, shared by every peer evaluated in the window, set most of the spread between
identical honest miners (benchmarks/LOG.md §24).

How much generic gain a unit takes is much the same under any peer's step: two peers' per-unit
gains on random pages correlate at 0.97. So the unit's expected gain is read from *common steps*:
S_t's peers (sorted by hotkey) are dealt into `groups` groups, each group's mean trial step is
applied once, and a unit's common gain c_u is the median over the groups of its gain under them.
A peer's baseline for its unit u is then b·c_u, with b = (its mean gain on the random units) /
(the common steps' mean gain c̄ on them): the peer's own generic strength, placed unit by unit.
The evaluator reports each unit's δ_u − b·(c_u − c̄), so that the Gauntlet's formulas, which
subtract δ_rand (≈ b·c̄), subtract b·c_u.

Why a median of groups. A peer's step enters the common steps, so a colluder evaluated in the
same window could lower the common gain on a partner's pages (a step that unlearns them) and
lift the partner's gaps, or raise it on a competitor's (a step trained on them) and cut theirs.
With one group that is 1/|S_t| of the common step; with three, a single colluder moves one of the
three per-unit gains and the median ignores it. Two colluders in different groups of the same
S_t are not stopped (docs/scoring.md §4).

Hence a second form, `proof_baseline` "others": no groups; every evaluated peer's own trial step is
applied over every unit of the window, and a peer's common gain on each unit is read from the
*other* peers' gains there, each peer's gains first divided by its own mean gain on the random
units: their mean after clipping each to the median ± `proof_baseline_clip` MADs (`others_gains`,
`clipped_mean`). A peer's own step is never part of its baseline. Colluders move the median and
the MAD only by as many ranks as they hold among the others, and each clipped value only within
them: while they are a minority of the others, what they can move the baseline by is bounded by
the honest peers' own spread. It costs P passes over every unit where the groups cost k more
besides the peers' own (each peer's own pass is part of its pass over every unit).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

__all__ = ["baseline_groups", "clipped_mean", "common_gains", "others_gains", "unit_adjustments"]


def baseline_groups(peers: Sequence[str], groups: int) -> list[list[str]]:
    """S_t's peers, sorted, dealt round-robin into `groups` groups (fewer when S_t is smaller);
    [] when the baseline is off (`groups` 0) or S_t has fewer than two peers: a lone peer's common
    step would be its own, and every gap would read 0."""
    ordered = sorted(peers)
    if groups <= 0 or len(ordered) < 2:
        return []
    count = min(groups, len(ordered))
    return [ordered[i::count] for i in range(count)]


def common_gains(group_gains: Sequence[Sequence[float]]) -> list[float]:
    """Each unit's gain under the common steps: the median over the groups (the mean of the two
    middle values for an even count); a unit some group broke (non-finite) takes the median of
    the others, and NaN when none is finite."""
    if not group_gains:
        raise ValueError("common_gains: no groups")
    units = len(group_gains[0])
    if any(len(gains) != units for gains in group_gains):
        raise ValueError("common_gains: groups measured different units")
    out = []
    for u in range(units):
        finite = [gains[u] for gains in group_gains if math.isfinite(gains[u])]
        out.append(statistics.median(finite) if finite else math.nan)
    return out


def clipped_mean(values: Sequence[float], clip: float) -> float:
    """The mean of the finite `values` after each is clipped to their median ± `clip` median absolute
    deviations (NaN when none is finite). 0 is the median; a large `clip` the mean. A minority of
    values, however extreme, moves it by a bounded amount: as far as they move the median and the
    MAD (both stay among the other values while those are a majority), plus their share of the
    clipped range. Inside that range each value counts in full, so it scatters nearly as little
    as the mean."""
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return math.nan
    centre = statistics.median(finite)
    spread = clip * statistics.median(abs(v - centre) for v in finite)
    return math.fsum(min(max(v, centre - spread), centre + spread) for v in finite) / len(finite)


def others_gains(gains_by_peer: Mapping[str, Sequence[float]], peer: str, random_units: int,
                 min_others: int, clip: float, resolution: float) -> list[float] | None:
    """`peer`'s common gain on each unit, in units of a step's mean gain on the random units: over
    the *other* peers, their gains there, each divided by that peer's own mean gain on the first
    `random_units` units (the random ones), and of those the `clipped_mean` (`clip`:
    `gauntlet.proof_baseline_clip`). Every peer's gains are measured on the same units in the same
    order; a non-finite gain is left out of its unit's mean.

    Dividing first makes it a mean of unit susceptibilities, not of step sizes: S_t mixes strong
    and weak steps. A peer whose step did not help the random units (mean ≤ `resolution`, the rules'
    `proof_gap_resolution`: no step, a step too small to move a float32 loss, noise, a broken model)
    has no scale and says nothing of a unit's generic gain; it is left out. Dividing by a mean of
    rounding (±10⁻⁸ nats) made such a peer's profile rounding noise magnified 10⁵ times, which the
    clipped mean then took as others' gains. None
    (judge against δ_rand) when fewer than `min_others` others are left
    (`gauntlet.proof_baseline_min_others`): a median of two is their mean, which either one sets."""
    profiles = []
    for name, gains in sorted(gains_by_peer.items()):
        finite = [g for g in gains[:random_units] if math.isfinite(g)]
        scale = math.fsum(finite) / len(finite) if finite else math.nan
        if name != peer and scale > resolution:
            profiles.append([g / scale for g in gains])
    if len(profiles) < min_others:
        return None
    return [clipped_mean([profile[u] for profile in profiles], clip) for u in range(len(profiles[0]))]


def unit_adjustments(random_gains: Sequence[float], random_common: Sequence[float],
                     unit_common: Sequence[float]) -> list[float] | None:
    """b·(c_u − c̄) for each of a peer's units: what its δ_u is reduced by so that δ_u − δ_rand
    becomes δ_u − b·c_u (module docstring). `random_gains`: the peer's δ on each random unit;
    `random_common`: the common gain on each; `unit_common`: the common gain on each of its units.

    None (judge against δ_rand as the paper does) when the common steps did not help the random
    units (c̄ ≤ 0, or nothing finite to read): dividing by a common gain that is noise would turn
    noise into baselines. A unit whose common gain is not finite is not adjusted."""
    if len(random_gains) != len(random_common):
        raise ValueError("unit_adjustments: random gains and common gains differ in length")
    pairs = [(g, c) for g, c in zip(random_gains, random_common, strict=True) if math.isfinite(g) and math.isfinite(c)]
    if not pairs:
        return None
    mean_common = math.fsum(c for _, c in pairs) / len(pairs)
    if not mean_common > 0:
        return None
    strength = math.fsum(g for g, _ in pairs) / len(pairs) / mean_common
    return [strength * (c - mean_common) if math.isfinite(c) else 0.0 for c in unit_common]
