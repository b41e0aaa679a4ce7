"""One window of the Gauntlet (Algorithm 1): who is evaluated, then verdicts and losses in, weights out.

The validator computes a window's fast verdicts and LossScores (its gather, its model, its pages);
who is evaluated (`draw_window`: F_t, then S_t) and what the incentive makes of the evaluations
(`score_window`) are the two functions here, which the validator's loop and the subnet simulator
(`benchmarks/incentive/subnet_sim.py`) both call, so a simulated result is a statement about the production
rules. Like torchtitan's `train_step` against `train()`: the loop does the
I/O and the scheduling, the step is the rule.

The score book is the Gauntlet's state and is updated in place (copying a 256-peer book every
window of a simulation would cost more than the scoring); the rules it is scored by are the run's
(`HParams.gauntlet`, passed in), and everything else the step needs comes in as arguments: no
module constant, no clock, no randomness, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from templar.core.config import GauntletConfig
from templar.core.verdicts import FastVerdict, Status
from templar.gauntlet.book import PrimaryResult, ScoreBook
from templar.gauntlet.selection import select_eval_peers, selection_priority

__all__ = ["WindowDraw", "WindowScores", "draw_window", "score_window"]


@dataclass(frozen=True)
class WindowDraw:
    """One validator's draws of one window: F_t (`fast`), and S_t once F_t's verdicts are known
    (`primary`). Both are keyed by the validator's private `seed` and tilted alike (stale first)."""

    seed: int
    window: int
    fast: list[str]
    """F_t, in priority order."""
    primary_size: int
    staleness: Mapping[str, float] | None
    sharpness: float

    def primary(self, verdicts: Mapping[str, FastVerdict]) -> list[str]:
        """S_t (paper §3.1): `uids_per_window` of the uploads whose verdict earns, drawn with the
        same seed (another purpose, so independent of F_t's draw)."""
        eligible = sorted(hotkey for hotkey, verdict in verdicts.items() if verdict.status.earns)
        return select_eval_peers(self.seed, self.window, eligible, self.primary_size, purpose="primary",
                                 staleness=self.staleness, sharpness=self.sharpness)


def draw_window(book: ScoreBook, rules: GauntletConfig, seed: int, window: int, miners: Mapping[str, int],
                peer_list: Sequence[str]) -> WindowDraw:
    """Who a validator evaluates in `window` (docs/scoring.md §1): F_t is `fast_eval_uids` of
    `miners` drawn with its private `seed`, the peer list in effect always in (a failing aggregator
    is caught at once); S_t follows from F_t's verdicts (`WindowDraw.primary`). With
    `selection_sharpness` > 0 both draws favour peers the book has not evaluated for long
    (`ScoreBook.staleness`, newcomers boosted by `newcomer_evals` and drawn first until
    `newcomer_first_evals`); 0 is the paper's uniform draw.
    The book is read once, before the window's scoring changes it."""
    tilted = rules.selection_sharpness > 0
    staleness = book.staleness(window, rules.newcomer_evals, rules.newcomer_first_evals) if tilted else None
    sharpness = rules.selection_sharpness if tilted else 0.0
    fast = select_eval_peers(seed, window, sorted(miners), rules.fast_eval_uids,
                             always=[hotkey for hotkey in peer_list if hotkey in miners], purpose="fast",
                             staleness=staleness, sharpness=sharpness)
    return WindowDraw(seed, window, fast, rules.uids_per_window, staleness, sharpness)


@dataclass(frozen=True)
class WindowScores:
    """What a window's scoring decides: every peer's weight x_p (paper eq. 5) and the top-G."""

    weights: dict[str, float]
    top_g: list[str]


def score_window(book: ScoreBook, rules: GauntletConfig, window: int, miners: Mapping[str, int],
                 verdicts: Mapping[str, FastVerdict], losses: Mapping[str, PrimaryResult], *,
                 premium: bool = True, seed: int | None = None) -> WindowScores:
    """Apply one window's evaluations to `book` and return its weights and top-G.

    In order: each fast verdict that judges the peer (`Status.judges`: an `unserved` peer's upload was
    never read, and is skipped as an undrawn one is; a failure multiplies μ by φ, read at the paid levels
    before the window's first verdict, so the verdicts' order does not matter; `Status.passes`; a warm-up upload
    `warmup_overdue_windows` windows or more into the peer's warm-up fails as `warmup_overdue`,
    `ScoreBook.warmup_overdue`), the pools fast
    evaluation found (paid once; forgotten after `pool_memory` windows), the primary evaluation
    of S_t (`losses`: OpenSkill match, μ update, relative LossScores), then x_p and SelectTopG.
    `miners` maps each miner's hotkey to its uid (the registry, `ScoreBook.sync_registry` run
    before the window's draws); every hotkey of `verdicts` must be in it, and every hotkey of
    `losses` must have a verdict that earns (`Status.earns`). A window without evaluations
    (verdicts and losses empty) only recomputes the weights. `premium` False: the window's trial
    steps were not held to a typical size, and no δ_rand rates above S_t's median
    (`ScoreBook.record_primary`). `seed`: the validator's private seed, which draws the order of equal
    PeerScores in the top-G (`selection_priority`, purpose "top_g"); None: by hotkey string.
    """
    verdicts = {hotkey: verdict for hotkey, verdict in verdicts.items() if verdict.status.judges}
    unknown = sorted(set(verdicts) - set(miners))
    if unknown:
        raise ValueError(f"score_window: verdicts for hotkeys that are not miners: {unknown[:3]}")
    unearned = sorted(hk for hk in losses if hk not in verdicts or not verdicts[hk].status.earns)
    if unearned:
        raise ValueError(f"score_window: LossScores for uploads that cannot earn: {unearned[:3]}")
    for hotkey in verdicts:
        book.get_or_create(hotkey, miners[hotkey], window)
    levels = book.paid_levels(rules)  # every failure of the window is read at the levels before it
    for hotkey, verdict in verdicts.items():
        overdue = book.warmup_overdue(hotkey, window, verdict.status is Status.WARMUP, rules.warmup_overdue_windows,
                                      rules.warmup_overdue_horizon)
        book.record_fast_eval(rules, hotkey, verdict.passed and not overdue,
                              Status.WARMUP_OVERDUE.value if overdue else verdict.label, sync_steps=verdict.sync_steps,
                              levels=levels)
    for pool in sorted({v.pool for v in verdicts.values() if v.pool}):
        book.record_pool(rules, pool, window)
    if verdicts:
        book.expire_pools(rules, window)
    if losses:
        book.record_primary(rules, losses, window=window, premium=premium)

    def ties(hotkey: str) -> bytes:  # keyed by the validator's private seed: no miner can grind a key for it
        return selection_priority(seed, window, hotkey, purpose="top_g")

    return WindowScores(weights=book.weights(rules), top_g=book.top_g(rules, ties if seed is not None else None))
