"""One window of the Gauntlet (Algorithm 1 after the evaluations): verdicts and losses in, weights out.

The validator computes a window's fast verdicts and LossScores (its gather, its model, its pages);
what the incentive makes of them is this one function, which the validator's loop and the
subnet simulator (`benchmarks/subnet_sim.py`) both call, so a simulated result is a statement
about the production rules. Like torchtitan's `train_step` against `train()`: the loop does the
I/O and the scheduling, the step is the rule.

The score book is the Gauntlet's state and is updated in place (copying a 256-peer book every
window of a simulation would cost more than the scoring); the rules it is scored by are the run's
(`HParams.gauntlet`, passed in), and everything else the step needs comes in as arguments: no
module constant, no clock, no randomness, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from templar.core.config import GauntletConfig
from templar.core.verdicts import FastVerdict
from templar.gauntlet.book import PrimaryResult, ScoreBook

__all__ = ["WindowScores", "score_window"]


@dataclass(frozen=True)
class WindowScores:
    """What a window's scoring decides: every peer's weight x_p (paper eq. 5) and the top-G."""

    weights: dict[str, float]
    top_g: list[str]


def score_window(book: ScoreBook, rules: GauntletConfig, window: int, miners: Mapping[str, int],
                 verdicts: Mapping[str, FastVerdict], losses: Mapping[str, PrimaryResult]) -> WindowScores:
    """Apply one window's evaluations to `book` and return its weights and top-G.

    In order: each fast verdict (a failure multiplies μ by φ; `Status.passes`), the pools fast
    evaluation found (paid once; forgotten after `pool_memory` windows), the primary evaluation
    of S_t (`losses`: OpenSkill match, μ update, relative LossScores), then x_p and SelectTopG.
    `miners` maps each miner's hotkey to its uid (the registry, `ScoreBook.sync_registry` run
    before the window's draws); every hotkey of `verdicts` must be in it, and every hotkey of
    `losses` must have a verdict that earns (`Status.earns`). A window without evaluations
    (verdicts and losses empty) only recomputes the weights.
    """
    unknown = sorted(set(verdicts) - set(miners))
    if unknown:
        raise ValueError(f"score_window: verdicts for hotkeys that are not miners: {unknown[:3]}")
    unearned = sorted(hk for hk in losses if hk not in verdicts or not verdicts[hk].status.earns)
    if unearned:
        raise ValueError(f"score_window: LossScores for uploads that cannot earn: {unearned[:3]}")
    for hotkey, verdict in verdicts.items():
        book.get_or_create(hotkey, miners[hotkey], window)
        book.record_fast_eval(rules, hotkey, verdict.passed, verdict.label, sync_steps=verdict.sync_steps)
    for pool in sorted({v.pool for v in verdicts.values() if v.pool}):
        book.record_pool(rules, pool, window)
    if verdicts:
        book.expire_pools(rules, window)
    if losses:
        book.record_primary(rules, losses, window=window)
    return WindowScores(weights=book.weights(rules), top_g=book.top_g(rules))
