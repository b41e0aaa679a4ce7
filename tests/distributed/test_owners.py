"""Each parameter's error-feedback owner rank (`templar.distributed.demo.assign_owners`)."""

from __future__ import annotations

import torch

from templar.distributed.demo import assign_owners


def test_owners_are_balanced_and_deterministic() -> None:
    shapes = {f"p{i}": torch.Size([i + 1, 7]) for i in range(50)}
    a, b = assign_owners(shapes, 4), assign_owners(dict(reversed(shapes.items())), 4)
    assert a == b and set(a.values()) == {0, 1, 2, 3}
    loads = [sum(shapes[n].numel() for n, r in a.items() if r == rank) for rank in range(4)]
    assert max(loads) - min(loads) <= 50 * 7 // 50 + 7
