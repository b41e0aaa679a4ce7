"""Per-GPU sizing on the meta device (`templar hparams --ranks N`)."""

from __future__ import annotations

import torch

from templar.core.config import load_hparams
from templar.core.model import build_model, parameter_count
from templar.distributed.demo import assign_owners
from templar.distributed.sizing import GIB, size_node


def test_tiny_sizing_matches_the_model_and_shrinks_with_ranks() -> None:
    hp = load_hparams("tiny")
    one, two, many = size_node("tiny", [1, 2, 64], micro_batch=hp.optimizer.micro_batch_size,
                               seq=hp.data.sequence_length, hparams="tiny")
    params = parameter_count(build_model(hp, "meta"))
    assert one.parameters == params
    assert abs(one.theta - 4 * params / GIB) < 1e-12 and one.error_feedback == one.theta
    assert two.theta < 0.51 * one.theta and many.theta < two.theta
    # the owner of the embedding holds its whole buffer, however many ranks
    embed = hp.model.vocab_size * hp.model.hidden_size
    assert many.error_feedback >= 4 * embed / GIB
    assert one.activations == two.activations > one.checkpointed > 0


def test_owners_are_balanced_and_deterministic() -> None:
    shapes = {f"p{i}": torch.Size([i + 1, 7]) for i in range(50)}
    a, b = assign_owners(shapes, 4), assign_owners(dict(reversed(shapes.items())), 4)
    assert a == b and set(a.values()) == {0, 1, 2, 3}
    loads = [sum(shapes[n].numel() for n, r in a.items() if r == rank) for rank in range(4)]
    assert max(loads) - min(loads) <= 50 * 7 // 50 + 7


def test_hparams_ranks_prints_the_table(capsys) -> None:
    from templar.cli import main

    assert main(["hparams", "tiny", "--ranks", "1", "8"]) == 0
    out = capsys.readouterr().out
    assert "| tiny |" in out and "| 8B | 8.03 B | 8 |" in out and "| 70B | 70.55 B | 1 |" in out
    assert main(["hparams", "tiny", "--ranks", "0"]) == 2
