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
    stats = compute.train(batch, 2, hp.optimizer.grad_clip, 0.01)
    sent = compute.compress(stats.scale)
    assert stats.loss > 0 and set(sent) == {n for n, _ in compute.model.named_parameters()}
    assert all(p.grad is None for p in compute.model.parameters())  # compress clears the gradients
    assert compute.stop() is None  # the followers (none here) released
    assert compute.stop() is None  # idempotent
    assert compute._call("ping") is None  # a keepalive racing stop() sends nothing
    with pytest.raises(RuntimeError, match="stopped"):
        compute.train(batch, 2, None, 0.01)


def test_a_collective_failing_inside_training_stops_the_node_with_the_rank_lost_code(monkeypatch) -> None:
    """FSDP's own collectives (its gathers in the forward pass, its reductions in the backward one) raise
    gloo's or nccl's RuntimeError, which `Group` never sees: a rank killed while the others trained ended
    the node with exit 1 and a traceback (2 ranks on gloo, a review). Any RuntimeError out of an op is now
    the node's `DistError`: one line and `EXIT_RANK_LOST`, as docs/mining.md §12 says."""
    import templar.distributed.compute as compute_module
    from templar.distributed.group import EXIT_RANK_LOST, DistError

    hp = load_hparams("tiny")
    compute = NodeCompute.lead(build_model(hp), hp, init_group("cpu"), role="miner")
    batch = torch.randint(0, hp.model.vocab_size, (4, hp.data.sequence_length), generator=torch.Generator().manual_seed(1))

    def peer_gone(*args, **kwargs):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:40412: Connection reset by peer")

    monkeypatch.setattr(compute_module, "accumulate_sharded", peer_gone)
    with pytest.raises(DistError, match=r"rank 0: train failed .*Connection reset by peer") as info:
        compute.train(batch, 2, hp.optimizer.grad_clip, 0.01)
    assert info.value.exit_code == EXIT_RANK_LOST
    assert all(isinstance(p, DTensor) for p in compute.model.parameters())  # left resharded
    compute.stop()


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


def test_inner_adamw_over_the_ranks_matches_one_process_and_survives_a_restart(tmp_path) -> None:
    """H inner AdamW steps on the sharded model: the same pseudo-gradient as the 1-process node (up
    to float summation order), θ_t put back, and the optimizer's moments saved in the state file
    (gathered like θ's rows) so a restarted node sends bit for bit what the running one sends."""
    from templar.core.config import InnerConfig
    from templar.runtime.compute import LocalCompute
    from templar.runtime.state import NodeState

    hp = load_hparams("tiny")
    hp = hp.model_copy(update={"inner": InnerConfig(steps=2, optimizer="adamw", learning_rate=1e-3)})
    batch = torch.randint(0, hp.model.vocab_size, (4, hp.data.sequence_length), generator=torch.Generator().manual_seed(3))
    group = init_group("cpu")
    sharded = NodeCompute.lead(build_model(hp), hp, group, role="miner")
    plain = LocalCompute(build_model(hp), hp)
    plain.enable_error_feedback()
    before = {n: p.full_tensor().clone() for n, p in sharded.model.named_parameters()}
    stats = sharded.train(batch, 2, hp.optimizer.grad_clip, 1e-3)
    delta = {n: p.grad.full_tensor().clone() for n, p in sharded.model.named_parameters()}
    plain.train(batch, 2, hp.optimizer.grad_clip, 1e-3)
    assert stats.scale == 1.0
    for name, p in plain.model.named_parameters():
        assert torch.allclose(delta[name], p.grad, rtol=1e-4, atol=1e-7), name
    assert all(torch.equal(p.full_tensor(), before[n]) for n, p in sharded.model.named_parameters())
    sharded.compress(stats.scale)

    path = tmp_path / "state.safetensors"
    sharded.save_state(path, NodeState(window=1, global_step=0))
    restarted = NodeCompute.lead(build_model(hp), hp, group, role="miner")
    state, _ = restarted.load_state(path)
    assert state.window == 1 and len(restarted.inner_optimizer.state) == len(list(restarted.model.parameters()))
    a = sharded.compress(sharded.train(batch, 2, None, 1e-3).scale)
    b = restarted.compress(restarted.train(batch, 2, None, 1e-3).scale)
    assert all(torch.equal(a[n].values, b[n].values) and torch.equal(a[n].indices, b[n].indices) for n in a)
    sharded.stop()
    restarted.stop()


def test_an_overlapped_window_over_the_ranks_matches_one_process() -> None:
    """Eager over the ranks: the working model is sharded as θ, the proxy and the landing reach each
    rank's rows, and the payload matches the 1-process node's; a delayed validator's kept base gives
    the 1-process probes."""
    from templar.core.config import InnerConfig
    from templar.runtime.compute import LocalCompute
    from templar.runtime.train import window_parts

    hp = load_hparams("tiny")
    hp = hp.model_copy(update={"inner": InnerConfig(steps=2, optimizer="adamw", learning_rate=1e-3,
                                                    overlap="eager")})
    batch = torch.randint(0, hp.model.vocab_size, (4, hp.data.sequence_length), generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(4)
    proxy, real = ({n: torch.randint(0, 2, p.shape, generator=g).float() * 2 - 1
                    for n, p in build_model(hp).named_parameters()} for _ in range(2))
    sharded = NodeCompute.lead(build_model(hp), hp, init_group("cpu"), role="miner")
    plain = LocalCompute(build_model(hp), hp)
    plain.enable_error_feedback()
    assert sharded.work is not sharded.model
    sent = []
    for compute in (sharded, plain):
        compute.begin_window(1e-3, 2, hp.optimizer.grad_clip, proxy=proxy, proxy_step=0)
        first, second = window_parts(batch, hp.inner)
        compute.inner_step(first)
        compute.apply_update(real, 0)
        compute.land()
        compute.inner_step(second)
        sent.append(compute.compress(compute.end_window().scale))
    a, b = sent
    for n in a:
        assert torch.equal(a[n].indices, b[n].indices) and torch.allclose(a[n].values, b[n].values, atol=1e-6), n
    for n, p in sharded.model.named_parameters():
        assert torch.equal(p.full_tensor(), dict(plain.model.named_parameters())[n]), n
    sharded.keep_base()
    plain.keep_base()
    sharded.apply_update(proxy, 1)
    base_probes, own = sharded.base_probes(9), plain.base_probes(9)
    assert all(torch.equal(base_probes[n], own[n]) for n in own)
    assert not all(torch.equal(sharded.probes(9)[n], own[n]) for n in own)  # θ moved on, its base did not
    sharded.stop()


def test_a_window_with_no_usable_page_trains_nothing_over_the_ranks_as_in_one_process() -> None:
    """The data bucket down (`PageReader.fetch` returned no page): the paper's window (H = 1 SGD) hands
    the whole, empty batch to the sharded accumulation, which divided by its zero sequences
    (ZeroDivisionError on every rank: the torchrun node stopped where the 1-process node sends a zero
    update). Now both leave no gradient, an unknown loss and the same payload."""
    import math

    from templar.runtime.compute import LocalCompute

    hp = load_hparams("tiny-paper")
    empty = torch.zeros((0, hp.data.sequence_length), dtype=torch.int64)
    sharded = NodeCompute.lead(build_model(hp), hp, init_group("cpu"), role="miner")
    plain = LocalCompute(build_model(hp), hp)
    plain.enable_error_feedback()
    sent, stats = [], []
    for compute in (sharded, plain):
        stats.append(compute.train(empty, 2, hp.optimizer.grad_clip, 0.01))
        sent.append(compute.compress(stats[-1].scale))
    assert all(s.tokens == 0 and math.isnan(s.loss) and s.scale == 0.01 for s in stats), stats
    a, b = sent
    assert all(torch.equal(a[n].indices, b[n].indices) and torch.equal(a[n].values, b[n].values) for n in b)
    assert all(not a[n].values.any() for n in a)  # nothing trained: a zero update
    sharded.stop()
