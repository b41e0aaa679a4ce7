"""Trial steps made when the evaluation reaches them (`templar.validator.trial_steps`): the same LossScores as
steps made up front, each step made once under production's baseline, and one step held at a time."""

from __future__ import annotations

import pytest
import torch

from templar.core.config import REPO_ROOT, load_hparams
from templar.core.model import build_model
from templar.runtime.train import accumulate_gradients, gradients
from templar.validator.evaluate import Evaluator
from templar.validator.trial_steps import TrialSteps

MICRO = REPO_ROOT / "tests" / "presets" / "micro.json"
"""tiny's pages on a 4x narrower model (tests/integration/harness.py's `micro`)."""


class _Step(dict):
    """A trial step that counts how many of its kind are alive."""

    alive = 0
    most_alive = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _Step.alive += 1
        _Step.most_alive = max(_Step.most_alive, _Step.alive)

    def __del__(self) -> None:
        _Step.alive -= 1


def test_a_step_is_made_when_read_and_only_the_latest_is_kept() -> None:
    made = []
    steps = TrialSteps(["a", "b", "a"], lambda hk: made.append(hk) or {"w": torch.full((2,), float(len(made)))})
    assert list(steps) == ["a", "b"] and len(steps) == 2 and "b" in steps and made == []
    first = steps["a"]
    assert steps["a"] is first and made == ["a"]  # the latest is kept for a repeated read
    steps["b"]
    assert steps["a"] is not first and made == ["a", "b", "a"] and steps.made == 3
    with pytest.raises(KeyError):
        steps["c"]


@pytest.mark.parametrize("baseline", ["others", "random", "groups"])
def test_the_evaluation_scores_the_same_and_makes_each_step_once_under_production_s_baseline(tiny_pages,
                                                                                              baseline) -> None:
    hp = load_hparams(MICRO)  # what is compared is the scores' equality and the steps' count, not their size
    model = build_model(hp)
    made_up_front, assigned = {}, {}
    for i, pages in enumerate(([10], [20], [30], [40])):
        assigned[f"p{i}"] = tiny_pages.batch(pages)
        accumulate_gradients(model, assigned[f"p{i}"], 8)
        made_up_front[f"p{i}"] = {n: torch.sign(g) for n, g in gradients(model).items()}
        model.zero_grad(set_to_none=True)
    random_data = tiny_pages.batch([500, 501])
    rules = {"baseline": baseline, "baseline_groups": 2 if baseline == "groups" else 0}

    def score(steps):
        return Evaluator(model, micro_batch_size=8, position_ranges=4, **rules).score_peers(
            steps, assigned, random_data, 2e-3, hp.data.sequences_per_page)

    up_front = score(made_up_front)
    _Step.alive = _Step.most_alive = 0
    on_demand = TrialSteps(made_up_front, lambda hk: _Step({n: t.clone() for n, t in made_up_front[hk].items()}))
    assert score(on_demand) == up_front
    if baseline == "groups":  # a group's steps are read together, then each again
        assert on_demand.made > len(made_up_front) and _Step.most_alive <= 2
    else:  # production's ("others") and the paper's: each step made once, one alive at a time
        assert on_demand.made == len(made_up_front) and _Step.most_alive == 1


def test_the_steps_are_made_where_a_one_process_evaluator_applies_them() -> None:
    """On the evaluator's model's device (a GPU's: 0.29 s a 1.2B step on an H200 against 2.4 s on its host);
    torchrun's sharded scorer, whose rank 0 hands the steps to the ranks, gets them on the host."""
    from templar.validator.trial_steps import trial_device

    on_meta = Evaluator(torch.nn.Linear(2, 2, device="meta"), micro_batch_size=1, position_ranges=1)
    assert trial_device(on_meta) == torch.device("meta")
    assert trial_device(Evaluator(torch.nn.Linear(2, 2), micro_batch_size=1, position_ranges=1)) == torch.device("cpu")
    assert trial_device(object()) == torch.device("cpu")
