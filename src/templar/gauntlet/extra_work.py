"""Declared extra work: how pages beyond the assigned ones are proven and paid (docs/scoring.md §4).

A miner may train on `K` pages beyond its `A` assigned ones (`--extra-pages`, at most the run's
`data.max_extra_pages`), declared in its signed payload; which pages those are is public
(`templar.data.PagePlan.declared_pages`), and validators draw the pages they evaluate from
assigned and declared pages in proportion, each class in every evaluation (`selection.evaluated_pages`).

**Why the proof cannot simply be read as before.** A trial step has a bounded size (the sign, or
the window's median norm), so an update's gains are a budget spread over the pages it was trained
on: an honest miner on 2A pages shows each page half the gap of a miner on A pages, and so does a
miner that declared 2A pages but trained only its A assigned ones, measured over all of them (full
gaps on half the units, none on the rest). Where each unit's gap is small against its noise (the
`micro` test model: honest credit about 0.3 of full) the mean credit is proportional to that gap,
and the two cannot be told apart by the mean. They are told apart class by class:

- `class_credits`: each evaluation's credit on its assigned units and on its declared units
  separately (`size_credit`, the window's full-credit gap). The book keeps an EMA of each.
- `trained_multiple`: the work the classes prove, in units of the assigned work:
  ρ_a + (w − 1)·ρ_d, ρ_x = clip((credit_x / the larger class credit − f) / (τ − f), 0, 1), w the
  declared multiple (A + K) / A, τ = `extra_work_tolerance` and f = `extra_work_floor`. Honest work
  shows the same gain per page on both classes (ρ ≈ 1 each: w); pages declared and left untrained
  show none (ρ_d ≈ 0: 1), and so do skipped assigned pages (ρ_a ≈ 0). τ < 1 forgives a trained
  class's evaluation noise downwards, f > 0 an untrained class's upwards.
- `dilution_multiple`: the proof credit of the evaluation (μ's input) is the size credit over all
  its units times what the typical gap earns under this evaluation's noise over what 1/m of it earns
  (between 1 and m; the noise read from the random pages' units), at most 1 in all: the budget a
  trained page shares with the others is given back to it, and only for the pages the classes show
  trained.
- `paid_level` (`extra_work_paid_cap`): the μ and the LossRating PeerScore reads for a peer that
  declared pages are each at most the level of the work the run pays (the pay-weighted median of the
  peers that declared nothing). The give-back above assumes each of m times the pages shows 1/m of
  the gap, but pages are alike: a bounded step spread over twice the pages shows each of them more
  than half the gap (0.73–0.87 of an honest miner's credit on the `micro` model), so the give-back
  lifted twice the pages' μ 1.3–1.5× above an honest miner's. Twice the data also gains more on the
  random pages, which the LossRating pays again. Before the cap the crowded localnet paid twice the
  pages 2.05–3.39× the honest median and the 256-uid simulator 5.22–6.39×. Capped, the same work per
  page reads the same μ and rating and `work_factor` alone pays the pages. A cap can only lower a
  score, so no declaration gains by it; a declaring peer doing better work than the run's paid
  median is paid as that median (the price of not trusting the model's 1/m). `floored_level`
  (`extra_work_level_floor`): the level is at least a share of the declaring peers' own, so where
  every honest miner declares, one weak hotkey that declares nothing does not set it alone.
- `work_factor`: proven work is paid as a power of its size: PeerScore × m^(q/c), so the weight
  grows as m^q (q = `extra_work_exponent` 0.5: twice the pages, trained, earn about 1.41×). With
  q < 1 pages are worth more under their own hotkeys than stacked on one.

A miner that declared pages it did not train earns its assigned work's credit diluted over the
declared pages (half, at twice the pages) and no premium: less than not declaring
(`tests/gauntlet/test_extra_work.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from templar.core.config import DataConfig, GauntletConfig
from templar.gauntlet.scores import size_credit


def declared_work(data: DataConfig, extra_pages: int) -> float:
    """w = (A + K) / A: the work a payload declares (its assigned pages plus `extra_pages`) in units
    of the assigned work. A count outside the run's bound never reaches here (`read_gradient`
    refuses it); it is clipped all the same."""
    extra = min(max(0, extra_pages), data.max_extra_pages)
    return (data.pages_per_window + extra) / data.pages_per_window


def update_declared(ema: float, work: float, gamma: float) -> float:
    """The EMA of (w − 1) over a peer's evaluations, w its payload's `declared_work` (starts at 0)."""
    return gamma * ema + (1.0 - gamma) * (max(1.0, work) - 1.0)


def declared_share(work: float, rules: GauntletConfig) -> float | None:
    """The declared pages' share of an evaluation's proof credit under `gauntlet.class_credit_weights`
    "work": K / (A + K) for `work` = (A + K) / A (`declared_work`); None (each unit alike) under "units"
    or for a peer that declared nothing (`scores.evaluation_credit`)."""
    if rules.class_credit_weights == "units" or not work > 1.0:
        return None
    return (work - 1.0) / work


def class_credits(units: Sequence[float], declared_units: int, delta_rand: float,
                  full_gap: float) -> tuple[float | None, float | None]:
    """(assigned, declared): the size credit of an evaluation's units from assigned pages and from
    declared pages (the last `declared_units` of `units`, which lists the evaluated pages in
    assignment order, assigned first); None for a class with no unit in this evaluation."""
    split = len(units) - max(0, min(declared_units, len(units)))
    assigned, declared = units[:split], units[split:]
    return (size_credit(assigned, delta_rand, full_gap) if assigned else None,
            size_credit(declared, delta_rand, full_gap) if declared else None)


def update_class(ema: float, evaluations: int, credit: float | None, gamma: float) -> tuple[float, int]:
    """One class's credit EMA and its count after an evaluation (unchanged when the class had no unit)."""
    if credit is None:
        return ema, evaluations
    return gamma * ema + (1.0 - gamma) * credit, evaluations + 1


def ema_mean(ema: float, evaluations: int, gamma: float, empty: float) -> float:
    """An EMA started at 0 with its start-up bias removed (`empty` before any evaluation)."""
    accumulated = 1.0 - gamma ** evaluations
    return ema / accumulated if evaluations > 0 and accumulated > 0 else empty


def trained_multiple(declared: float, assigned_credit: float | None, declared_credit: float | None,
                     tolerance: float, floor: float = 0.0) -> float:
    """The work the classes prove, in units of the assigned work (see the module's docstring):
    ρ_a + (declared − 1)·ρ_d. 1.0 for a peer that declared nothing; for a peer that declared pages
    none of which was evaluated yet, 1.0 (nothing beyond the assigned work is proven).

    `floor` (`extra_work_floor`, below `tolerance`): a class at most that share of the larger one
    proves nothing, ρ = (share − floor) / (tolerance − floor) in between. An untrained class's
    credit is 0 plus the noise of the evaluations it rests on, and without a floor every bit of
    that noise above 0 counted as declared work: 0.19 of the full credit over 9 evaluations, 0.3 of
    the assigned class, proved 1.43× the work in a crowded localnet (benchmarks/LOG.md §37)."""
    if not 0.0 <= floor < tolerance:
        raise ValueError(f"trained_multiple: need 0 <= floor < tolerance, got {floor!r}, {tolerance!r}")
    if declared <= 1.0 or declared_credit is None or assigned_credit is None:
        return 1.0
    top = max(assigned_credit, declared_credit)
    if not top > 0.0 or not math.isfinite(top):
        return 1.0  # no class shows work: μ says so, this multiple does not have to

    def share(credit: float) -> float:  # written so that floor 0 is the rule before the floor, to the bit
        return min(1.0, max(0.0, (credit - floor * top) / ((tolerance - floor) * top)))

    return share(assigned_credit) + (declared - 1.0) * share(declared_credit)


def expected_credit(gap: float, random_units: Sequence[float], delta_rand: float, full_gap: float) -> float:
    """The size credit a unit showing `gap` earns on average under an evaluation's own noise: the mean
    over the random pages' units u of clip((gap + u − δ_rand) / full_gap, −1, 1). The random units are
    what nobody trained, so their scatter around δ_rand is the noise every unit of this evaluation
    carries."""
    credits = [max(-1.0, min(1.0, (gap + u - delta_rand) / full_gap)) for u in random_units if math.isfinite(u)]
    return math.fsum(credits) / len(credits) if credits else math.nan


def dilution_multiple(trained: float, random_units: Sequence[float], delta_rand: float, full_gap: float,
                      full_share: float) -> float:
    """What an evaluation's size credit is multiplied by for a peer whose classes prove `trained` times
    the assigned work (`trained_multiple`): the credit the window's typical gap earns under this
    evaluation's noise over the credit 1/`trained` of it earns, between 1 and `trained`.

    Each trained page's gap is 1/trained of an assigned-only miner's (the trial step is bounded).
    Where units are exact the smaller gap still clears the full-credit gap (multiple 1: nothing to
    give back); where noise dominates, credit is proportional to the gap (multiple `trained`); in
    between the noise decides, and the random units measure it. `full_gap` is the full-credit gap
    (`proof_full_gap` × the typical gap, so the typical gap is `full_gap` / `full_share`)."""
    if trained <= 1.0 or not full_gap > 0.0 or not math.isfinite(delta_rand):
        return max(1.0, trained) if math.isfinite(trained) else 1.0
    typical = full_gap / full_share
    whole = expected_credit(typical, random_units, delta_rand, full_gap)
    diluted = expected_credit(typical / trained, random_units, delta_rand, full_gap)
    if not (math.isfinite(whole) and math.isfinite(diluted)) or diluted <= 0.0:
        return trained  # no noise measured (or no credit left): the proportional limit
    return max(1.0, min(trained, whole / diluted))


def paid_level(peers: Iterable[tuple[float, float]], power: float) -> float | None:
    """The level of the work the run pays: the median of the values of (PeerScore, value) pairs, each
    weighted by PeerScore^`power`, its share of the pay. Weighting by pay leaves out whoever earns
    nothing (copies, noise, lazy hotkeys) and lets a tail of poorly paid peers count little, so a crowd
    of them cannot pull the level down; None while no peer has a score. The paid cap reads it, and μ's
    tie band (`saturation.saturated_mu`) saturates every peer's μ at it."""
    pairs = sorted((value, score ** power) for score, value in peers
                   if score > 0.0 and math.isfinite(score) and math.isfinite(value))
    half = math.fsum(weight for _, weight in pairs) / 2.0
    if not half > 0.0:
        return None
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= half:
            return value
    return pairs[-1][0]


def floored_level(level: float | None, declaring_level: float | None, floor: float) -> float | None:
    """The paid level read at least `floor` times the declaring peers' own (`extra_work_level_floor`).

    `level` is the non-declaring peers' (`paid_level`), which caps every declaring peer. Where every
    honest miner declares pages, whoever declares none sets it alone: one hotkey doing a quarter of the
    work capped ten honest declarers at its own μ and rating and took 0.066 of the weight. The give-back
    of the dilution lifts a declaring peer's μ at most m times, m the largest declared multiple (2 in
    production; 1.3-1.5x measured for twice the pages), so a floor of at most 1/m leaves a run with
    honest non-declaring miners as it was (in the whole suite it engaged only where a test made every
    declared page show an assigned page's full gap, and lifted the level by 3-5 %). The floor only
    rises with the declaring peers' pay-weighted median: hotkeys that the pay weights little cannot
    lift it. What remains: a non-declaring hotkey can still hold the level at the floor, half the
    declaring peers' own, and be paid at it.
    None while no peer that declared nothing is paid: the declaring peers are then paid alike without a
    level (docs/scoring.md §4)."""
    if level is None or declaring_level is None or not floor > 0.0:
        return level
    return max(level, floor * declaring_level)


def work_factor(rules: GauntletConfig, multiple: float) -> float:
    """What PeerScore is multiplied by for a proven multiple m of the assigned work: m^(q / c), so
    that the weight, PeerScore^c, grows as m^q (q = `extra_work_exponent`, c = `power`); never below 1
    (less work than assigned is μ's to show)."""
    return max(1.0, multiple) ** (rules.extra_work_exponent / rules.power)
