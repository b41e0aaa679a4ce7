"""Which θ a window's updates are evaluated against: their base (docs/scoring.md §2).

The run computes window w's update from θ after window w − `base_lag` (`HParams.inner.overlap`):
after w−1 for blocking and eager, the model a validator holds when it evaluates w; after w−2 for
delayed, one window older. Every check that compares an update with a model (the claimed step, the
sync score from probes, LossScore and the proof of computation) compares it with that base, so an
overlapped miner is judged on what it computed and one that computed from another model is told so
(`wrong_base`), never scored as noise.

The sync score counts how many outer steps a peer's model is from the base (docs/scoring.md §2).
Under a rule whose step moves every coordinate by α that is a distance over α; under one that moves
a sparse set of coordinates by less (SparseLoCo) the keeper measures, at each step it takes, how far
that step moved θ at the probe positions of the window the new θ is the base of (`StepUnits`), and
that movement is the unit.

A delayed run's validator therefore keeps θ as it was before its latest window's step
(`Compute.keep_base`: one more copy of θ, counted in `tools/sizing.py`). It holds the base of
window w only when it took window w−1's step itself (or θ is θ_0, or that step left θ as it was): a
validator's first window after a start or a catch-up is stepped, not scored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from templar.core.config import InnerConfig, base_lag
from templar.gauntlet.scores import step_movement
from templar.runtime.compute import Compute
from templar.runtime.state import NodeState
from templar.validator.fast_eval import OtherBase


@dataclass(frozen=True)
class Base:
    """The base of one window's updates as this validator holds it."""

    global_step: int
    """The base's global_step: what an update computed from it declares."""
    kept: bool
    """True: the kept model (`Compute.keep_base`); False: the live θ."""
    other: OtherBase | None
    """The run's other candidate base (one window newer or older), when it differs from this one."""
    step_unit: float | None = None
    """How far the step that made this base moved θ at the window's probe positions (measured only
    under a rule that does not move every coordinate by α; None when this validator did not see
    that step taken: its first windows after a start or a catch-up)."""

    def sync_unit(self, lr: float, *, moves_every_coordinate: bool, ulp_slack: float) -> tuple[float, float]:
        """(unit, ulp_slack) of the sync score against this base: α for a rule that moves every
        coordinate by it; else the measured step with the run's rounding slack, or α (the lenient
        unit, for the windows in which this validator has no measurement) when there is none."""
        if moves_every_coordinate or self.step_unit is None:
            return lr, 0.0
        return self.step_unit, ulp_slack


class BaseKeeper:
    """What a validator remembers of θ before its latest window's step: that window and global_step
    (every run: the other candidate base's step, for `wrong_base`) and, in a delayed run, the model
    itself (`Compute.keep_base`)."""

    KEEP = 4
    """Measured steps remembered: a base is at most two windows old."""

    def __init__(self, compute: Compute, inner: InnerConfig, *, measure_steps: bool = False) -> None:
        self.compute = compute
        self.lag = base_lag(inner)
        self.before: tuple[int, int] | None = None
        """(window, global_step) of θ before the latest window's step (the kept model's, delayed)."""
        self.measure_steps = measure_steps
        """Measure each step's movement at the probe positions (a rule that does not move every
        coordinate by α: `OuterRule.moves_every_coordinate`)."""
        self.step_units: dict[tuple[int, int], float] = {}
        """(window, global_step of its base) → how far the step that made that base moved θ at the
        window's probe positions."""
        self._pending: tuple[int, int, dict[str, torch.Tensor]] | None = None

    def before_step(self, state: NodeState, window: int | None = None) -> None:
        """Call right before the validator takes `window`'s step (θ still holds `state`)."""
        if self.lag == 2:
            self.compute.keep_base()
        self.before = (state.window, state.global_step)
        if self.measure_steps:
            stepped = state.window + 1 if window is None else window
            evaluated = stepped + self.lag  # the window whose updates are computed from θ after this step
            self._pending = (evaluated, state.global_step, self.compute.probes(evaluated))

    def after_step(self, state: NodeState) -> None:
        """Call right after the step (θ holds `state`): its movement at the probe positions of the
        window it is the base of, when θ moved by exactly one step."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        evaluated, global_step, before = pending
        if state.global_step != global_step + 1:  # no step, or a catch-up over several: nothing to measure
            return
        self.step_units[(evaluated, state.global_step)] = step_movement(before, self.compute.probes(evaluated))
        for old in sorted(self.step_units)[: max(0, len(self.step_units) - self.KEEP)]:
            del self.step_units[old]

    def of(self, window: int, state: NodeState) -> Base | None:
        """The base of `window`'s updates, θ holding `state` (window − 1): None when this validator
        does not hold it (a delayed run's first window after a start)."""
        if state.window != window - 1:
            return None
        before = self.before if self.before is not None and self.before[0] == window - 2 else None
        if self.lag == 1:
            other = OtherBase(before[1]) if before is not None and before[1] != state.global_step else None
            return self._measured(window, Base(state.global_step, kept=False, other=other))
        if state.global_step == 0:  # no step ever applied: θ after any earlier window is θ_0, the live θ
            return Base(0, kept=False, other=None)
        if before is None:
            return None
        if before[1] == state.global_step:  # window w−1 had no step: θ after w−2 is the live θ
            return self._measured(window, Base(state.global_step, kept=False, other=None))
        return self._measured(window, Base(before[1], kept=True, other=OtherBase(state.global_step)))

    def _measured(self, window: int, base: Base) -> Base:
        unit = self.step_units.get((window, base.global_step))
        return base if unit is None else dataclasses.replace(base, step_unit=unit)
