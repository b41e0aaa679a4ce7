"""Which θ a window's updates are evaluated against (`templar.validator.base`): the live θ for blocking
and eager runs, the kept model one window older for delayed ones, and nothing a validator did not hold."""

from __future__ import annotations

from templar.core.config import InnerConfig
from templar.runtime.state import NodeState
from templar.validator.base import Base, BaseKeeper
from templar.validator.fast_eval import OtherBase


class _Compute:
    def __init__(self) -> None:
        self.kept = 0

    def keep_base(self) -> None:
        self.kept += 1


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
