"""Which θ a window's updates are evaluated against (`templar.validator.base`): the live θ for blocking
and eager runs, the kept model one window older for delayed ones, and nothing a validator did not hold."""

from __future__ import annotations

import pytest
import torch

from templar.core.config import InnerConfig
from templar.runtime.state import NodeState
from templar.validator.base import Base, BaseKeeper
from templar.validator.fast_eval import OtherBase


class _Compute:
    def __init__(self) -> None:
        self.kept = 0
        self.theta = torch.zeros(64, dtype=torch.float64)
        self.asked: list[int] = []

    def keep_base(self) -> None:
        self.kept += 1

    def probes(self, window: int) -> dict[str, torch.Tensor]:
        """θ at 8 positions that depend on the window, as `collect_probes` draws them."""
        self.asked.append(window)
        return {"w": self.theta[torch.arange(8) * 8 + window % 8].clone()}


def test_the_base_of_each_mode() -> None:
    for mode in ("blocking", "eager"):
        compute = _Compute()
        keeper = BaseKeeper(compute, InnerConfig(overlap=mode))
        assert keeper.of(5, NodeState(4, 7)) == Base(7, kept=False, other=None)  # nothing known of θ after 3
        keeper.before_step(NodeState(4, 7))
        assert compute.kept == 0, "only a delayed run keeps a model"
        # window 5 stepped (7 → 8): window 6's base is θ after 5, the older θ its other candidate
        assert keeper.of(6, NodeState(5, 8)) == Base(8, kept=False, other=OtherBase(7))

    compute = _Compute()
    keeper = BaseKeeper(compute, InnerConfig(overlap="delayed"))
    assert keeper.of(1, NodeState(0, 0)) == Base(0, kept=False, other=None)  # θ_0: every earlier θ is it
    assert keeper.of(5, NodeState(4, 7)) is None, "a validator that did not take window 4's step lacks θ after 3"
    keeper.before_step(NodeState(4, 7))
    assert compute.kept == 1
    assert keeper.of(6, NodeState(5, 8)) == Base(7, kept=True, other=OtherBase(8))
    assert keeper.of(6, NodeState(5, 7)) == Base(7, kept=False, other=None)  # window 5 had no step
    assert keeper.of(7, NodeState(6, 9)) is None  # the kept θ is two windows old now


@pytest.mark.parametrize(("mode", "lag"), [("eager", 1), ("delayed", 2)])
def test_a_sparse_rule_measures_each_step_where_the_window_it_is_the_base_of_probes(mode: str, lag: int) -> None:
    """Under a rule that does not move every coordinate by α the keeper measures, at each step, how far
    θ moved at the probe positions of the window evaluated against the new θ; a window whose base's
    step it did not see (a catch-up over two steps, or a start) gets none, and its score falls back to α."""
    compute = _Compute()
    keeper = BaseKeeper(compute, InnerConfig(overlap=mode), measure_steps=True)
    keeper.before_step(NodeState(4, 7), window=5)
    assert compute.asked == [5 + lag]  # the window whose updates are computed from θ after window 5
    compute.theta[(5 + lag) % 8] += 0.25  # the step moves one of that window's 8 probed values (and others)
    compute.theta[1::8] += 5.0
    keeper.after_step(NodeState(5, 8))
    assert keeper.step_units == {(5 + lag, 8): 0.25 / 8}
    keeper.before_step(NodeState(5, 8), window=6)
    keeper.after_step(NodeState(6, 10))  # caught up over two steps: nothing measured
    assert set(keeper.step_units) == {(5 + lag, 8)}
    if lag == 1:
        base = keeper.of(6, NodeState(5, 8))
    else:
        keeper.before = (5, 8)  # θ after window 5 is the kept model of window 7 (delayed)
        base = keeper.of(7, NodeState(6, 9))
    assert base is not None and base.step_unit == 0.25 / 8
    assert base.sync_unit(0.5, moves_every_coordinate=False, ulp_slack=1e-6) == (0.25 / 8, 1e-6)
    assert base.sync_unit(0.5, moves_every_coordinate=True, ulp_slack=1e-6) == (0.5, 0.0)
    unmeasured = keeper.of(7 if lag == 1 else 8, NodeState(6 if lag == 1 else 7, 10))
    assert unmeasured is None or unmeasured.sync_unit(0.5, moves_every_coordinate=False, ulp_slack=1e-6) == (0.5, 0.0)
