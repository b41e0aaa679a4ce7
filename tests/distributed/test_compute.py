"""`NodeCompute` as one process (world size 1, the `python neurons/miner.py` case), in-process."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from templar.core.config import load_hparams
from templar.core.model import build_model
from templar.distributed.compute import NodeCompute
from templar.distributed.group import init_group


def test_one_process_node_is_sharded_and_stops_cleanly() -> None:
    hp = load_hparams("tiny")
    compute = NodeCompute.lead(build_model(hp), hp, init_group("cpu"), role="miner")
    assert all(isinstance(p, DTensor) for p in compute.model.parameters())  # FSDP2 with one rank
    batch = torch.randint(0, hp.model.vocab_size, (4, hp.data.sequence_length), generator=torch.Generator().manual_seed(1))
    stats = compute.train(batch, 2, hp.optimizer.grad_clip)
    sent = compute.compress(0.01)
    assert stats.loss > 0 and set(sent) == {n for n, _ in compute.model.named_parameters()}
    assert all(p.grad is None for p in compute.model.parameters())  # compress clears the gradients
    compute.stop()
    compute.stop()  # idempotent
    assert compute._call("ping") is None  # a keepalive racing stop() sends nothing
    with pytest.raises(RuntimeError, match="stopped"):
        compute.train(batch, 2, None)


def test_sharded_state_keeps_the_previous_file_and_falls_back_to_it(tmp_path) -> None:
    """The sharded save goes through `runtime.state.write_state_file` and the load through
    `load_node_state_or_previous`: `.prev` is kept, and a torn newest file falls back to it."""
    from templar.runtime.state import NodeState, previous_path

    hp = load_hparams("tiny")
    compute = NodeCompute.lead(build_model(hp), hp, init_group("cpu"), role="miner")
    path = tmp_path / "state.safetensors"
    first = {n: p.full_tensor().clone() for n, p in compute.model.named_parameters()}
    compute.save_state(path, NodeState(window=3, global_step=2))
    with torch.no_grad():
        for p in compute.model.parameters():
            p.to_local().add_(1.0)
    compute.save_state(path, NodeState(window=4, global_step=3))
    assert previous_path(path).exists()
    path.write_bytes(path.read_bytes()[:100])  # the newest file torn by the disk
    state, source = compute.load_state(path)
    assert (state.window, state.global_step) == (3, 2) and source.startswith("previous state"), source
    assert all(torch.equal(p.full_tensor(), first[n]) for n, p in compute.model.named_parameters())
    compute.stop()


def test_both_node_kinds_score_peers_with_the_same_arguments() -> None:
    """The sharded validator's `score_peers` mirrors the 1-process `Evaluator`'s (page-by-page credit
    added `page_sequences` to one of them; the other raised TypeError at a torchrun validator's first
    evaluation)."""
    import inspect

    from templar.runtime.compute import PeerScorer
    from templar.validator.evaluate import Evaluator

    def arguments(method) -> list[tuple[str, object]]:
        return [(p.name, p.default) for p in inspect.signature(method).parameters.values()]

    assert arguments(NodeCompute.score_peers) == arguments(Evaluator.score_peers) == arguments(PeerScorer.score_peers)
