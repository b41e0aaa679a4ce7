"""Each evaluated peer's trial step, made when the evaluation reaches it, where it is applied.

A trial step is the peer's whole update in dense float32 (`OuterRule.trial`): 4.8 GB at 1.2B. Made for
every peer of S_t before the evaluation, as the validator did, the 8 steps of a production window held
38.5 GB of host memory at once. The evaluation reads each peer's step once under production's baseline
(the other peers' own steps: one pass per peer over every unit) and under none; under the groups' common
steps it reads a group's steps together, then each again. Made on demand and only the latest kept, a
window holds one step (a group's, under "groups") and, under production's baseline, makes each exactly
once, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

TrialStep = dict[str, torch.Tensor]


def trial_device(scorer: Any) -> torch.device:
    """Where the trial steps are made: on the device of a one-process evaluator's model, where they are
    applied (on an H200 a 1.2B step takes 0.29 s there against 2.4 s on its host, and only the payload,
    1/64 of the step's size, crosses to the GPU); on the host for torchrun's sharded evaluator, whose
    rank 0 hands the steps to the ranks."""
    from templar.validator.evaluate import Evaluator

    if isinstance(scorer, Evaluator):
        return next(scorer.model.parameters()).device
    return torch.device("cpu")


class TrialSteps(Mapping[str, TrialStep]):
    """`make(hotkey)` for each of `hotkeys`, computed when read; the latest is kept for a repeated read."""

    def __init__(self, hotkeys: Iterable[str], make: Callable[[str], TrialStep]) -> None:
        self._hotkeys = list(dict.fromkeys(hotkeys))
        self._make = make
        self._latest: tuple[str, TrialStep] | None = None
        self.made = 0
        """Steps computed so far (each read of a step other than the latest computes it)."""

    def __getitem__(self, hotkey: str) -> TrialStep:
        if hotkey not in self._hotkeys:
            raise KeyError(hotkey)
        if self._latest is not None and self._latest[0] == hotkey:
            return self._latest[1]
        self._latest = None  # the previous step is freed before the next is made
        step = self._make(hotkey)
        self.made += 1
        self._latest = (hotkey, step)
        return step

    def __contains__(self, hotkey: object) -> bool:  # Mapping's would make the step to answer
        return hotkey in self._hotkeys

    def __iter__(self) -> Iterator[str]:
        return iter(self._hotkeys)

    def __len__(self) -> int:
        return len(self._hotkeys)
