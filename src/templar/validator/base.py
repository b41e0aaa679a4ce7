"""Which θ a window's updates are evaluated against: their base (docs/scoring.md §2).

The run computes window w's update from θ after window w − `base_lag` (`HParams.inner.overlap`):
after w−1 for blocking and eager, the model a validator holds when it evaluates w; after w−2 for
delayed, one window older. Every check that compares an update with a model (the claimed step, the
sync score from probes, LossScore and the proof of computation) compares it with that base, so an
overlapped miner is judged on what it computed and one that computed from another model is told so
(`wrong_base`), never scored as noise.

A delayed run's validator therefore keeps θ as it was before its latest window's step
(`Compute.keep_base`: one more copy of θ, counted in `tools/sizing.py`). It holds the base of
window w only when it took window w−1's step itself (or θ is θ_0, or that step left θ as it was): a
validator's first window after a start or a catch-up is stepped, not scored.
"""

from __future__ import annotations

from dataclasses import dataclass

from templar.core.config import InnerConfig, base_lag
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


class BaseKeeper:
    """What a validator remembers of θ before its latest window's step: that window and global_step
    (every run: the other candidate base's step, for `wrong_base`) and, in a delayed run, the model
    itself (`Compute.keep_base`)."""

    def __init__(self, compute: Compute, inner: InnerConfig) -> None:
        self.compute = compute
        self.lag = base_lag(inner)
        self.before: tuple[int, int] | None = None
        """(window, global_step) of θ before the latest window's step (the kept model's, delayed)."""

    def before_step(self, state: NodeState) -> None:
        """Call right before the validator takes a window's step (θ still holds `state`)."""
        if self.lag == 2:
            self.compute.keep_base()
        self.before = (state.window, state.global_step)

    def of(self, window: int, state: NodeState) -> Base | None:
        """The base of `window`'s updates, θ holding `state` (window − 1): None when this validator
        does not hold it (a delayed run's first window after a start)."""
        if state.window != window - 1:
            return None
        before = self.before if self.before is not None and self.before[0] == window - 2 else None
        if self.lag == 1:
            other = OtherBase(before[1]) if before is not None and before[1] != state.global_step else None
            return Base(state.global_step, kept=False, other=other)
        if state.global_step == 0:  # no step ever applied: θ after any earlier window is θ_0, the live θ
            return Base(0, kept=False, other=None)
        if before is None:
            return None
        if before[1] == state.global_step:  # window w−1 had no step: θ after w−2 is the live θ
            return Base(state.global_step, kept=False, other=None)
        return Base(before[1], kept=True, other=OtherBase(state.global_step))
