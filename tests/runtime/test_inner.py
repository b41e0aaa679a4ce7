"""A miner's inner steps (`runtime.train.inner_steps`): the paper's window bit for bit at H = 1 with
SGD, AdamW's pseudo-gradient θ_t − θ_H with θ_t put back, and the inner optimizer's state kept
with the node's state across a restart."""

from __future__ import annotations

import torch

from templar.compress import DCTCompressor, DeMo
from templar.core.config import HParams, InnerConfig, load_hparams
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.runtime.compute import LocalCompute
from templar.runtime.consensus.outer import apply_update
from templar.runtime.state import NodeState
from templar.runtime.train import accumulate_gradients, gradients, inner_lr, inner_parts, window_parts


def _batch(hp: HParams, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, hp.model.vocab_size, (n, hp.data.sequence_length), generator=torch.Generator().manual_seed(seed))


def _with_inner(hp: HParams, **inner) -> HParams:
    return hp.model_copy(update={"inner": InnerConfig(**inner)})


def test_one_sgd_step_is_the_papers_window_bit_for_bit(hp):
    """H = 1 with SGD (the settings' default, the paper's and `tiny-paper`'s window) sends exactly what
    a miner sent before inner steps existed: the window's mean gradient folded into the error
    feedback at the outer learning rate."""
    hp = _with_inner(hp)
    assert (hp.inner.steps, hp.inner.optimizer) == (1, "sgd")
    batch, step = _batch(hp, 8), hp.optimizer.warmup_steps
    lr = learning_rate(step, hp.optimizer)
    compute = LocalCompute(build_model(hp), hp)
    compute.enable_error_feedback()
    reference = build_model(hp)
    demo = DeMo(reference, compressor=DCTCompressor(hp.demo.target_chunk, hp.demo.topk), decay=hp.demo.momentum_decay)
    for _ in range(2):  # twice: the error feedback carries over
        stats = compute.train(batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                              inner_lr(hp.inner, step, hp.optimizer))
        sent = compute.compress(stats.scale)
        accumulate_gradients(reference, batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip)
        expected = demo.step(gradients(reference), lr)
        reference.zero_grad(set_to_none=True)
        assert stats.scale == lr
        for name, c in expected.items():
            assert torch.equal(sent[name].indices, c.indices) and torch.equal(sent[name].values, c.values), name
    for p, q in zip(compute.model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)  # θ untouched by training: only the outer step moves it


def test_every_inner_step_sees_every_page():
    """Pages lie one after another in a window's batch; each of the H steps gets sequences of each
    page (contiguous parts left a miner's extra pages, laid last, to its last steps alone)."""
    pages, per_page, steps = 4, 6, 3
    batch = torch.arange(pages * per_page).reshape(-1, 1)  # row r belongs to page r // per_page
    parts = inner_parts(batch, steps)
    assert sorted(int(r) for part in parts for r in part) == list(range(pages * per_page))
    for part in parts:
        assert {int(r) // per_page for r in part} == set(range(pages))


def test_adamw_sends_theta_t_minus_theta_h_and_puts_theta_t_back(hp):
    hp = _with_inner(hp, steps=4, optimizer="adamw", learning_rate=1e-3)
    batch = _batch(hp, 8)
    compute = LocalCompute(build_model(hp), hp)
    compute.enable_error_feedback()
    before = {n: p.detach().clone() for n, p in compute.model.named_parameters()}
    stats = compute.train(batch, 2, hp.optimizer.grad_clip, 1e-3)
    delta = {n: p.grad.detach().clone() for n, p in compute.model.named_parameters()}

    reference = build_model(hp)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            foreach=False)
    for part in inner_parts(batch, 4):
        accumulate_gradients(reference, part, 2, hp.optimizer.grad_clip)
        opt.step()
    assert stats.scale == 1.0 and stats.tokens == batch.numel()
    for name, p in reference.named_parameters():
        assert torch.equal(delta[name], (before[name] - p.detach()).float()), name
    assert all(torch.equal(p, before[n]) for n, p in compute.model.named_parameters())
    assert sum(float(d.abs().sum()) for d in delta.values()) > 0


def test_the_inner_optimizer_survives_a_restart_exactly(hp, tmp_path):
    """The AdamW moments and step count are saved with θ and the error feedback in the one state
    file, and a node restarted from it sends bit for bit what the uninterrupted node sends."""
    hp = _with_inner(hp, steps=2, optimizer="adamw", learning_rate=1e-3)
    path = tmp_path / "state.safetensors"

    def node() -> LocalCompute:
        c = LocalCompute(build_model(hp), hp)
        c.enable_error_feedback()
        return c

    def window(c: LocalCompute, seed: int) -> dict:
        stats = c.train(_batch(hp, 4, seed), 2, hp.optimizer.grad_clip, 1e-3)
        return c.compress(stats.scale)

    running = node()
    window(running, 1)
    running.save_state(path, NodeState(window=1, global_step=0))
    restarted = node()
    state, _ = restarted.load_state(path)
    assert state.window == 1
    assert running.inner_optimizer.state_dict()["state"].keys() == restarted.inner_optimizer.state_dict()["state"].keys()
    a, b = window(running, 2), window(restarted, 2)
    for name in a:
        assert torch.equal(a[name].values, b[name].values) and torch.equal(a[name].indices, b[name].indices), name


def test_inner_steps_cannot_outnumber_the_windows_sequences(tmp_path):
    import json

    import pytest

    from templar.core.config import HParamsError

    hp = load_hparams("tiny")
    sequences = hp.data.pages_per_window * hp.data.sequences_per_page
    preset = tmp_path / "too-many.json"
    preset.write_text(json.dumps({"base": str(load_hparams.__globals__["PRESETS_DIR"] / "tiny.json"),
                                  "inner": {"steps": sequences + 1}}))
    with pytest.raises(HParamsError, match=r"inner\.steps \(9\) exceeds the window's sequences \(8"):
        load_hparams(preset)


def _signs(hp: HParams, seed: int) -> dict[str, torch.Tensor]:
    """A made-up outer update: ±1 on every coordinate (what the signed rule applies)."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randint(0, 2, s, generator=g).float() * 2 - 1 for n, s in
            ((n, p.shape) for n, p in build_model(hp).named_parameters())}


def test_an_overlapped_window_trains_a_working_model_while_theta_takes_its_step(hp):
    """Delayed: the window's inner steps run on a working copy of θ, so the outer step of the window
    before can land on θ between two of them. The pseudo-gradient is the one a blocking node computes
    from the same θ, bit for bit, and θ holds exactly that outer step."""
    hp = _with_inner(hp, steps=2, optimizer="adamw", learning_rate=1e-3, overlap="delayed")
    blocking = _with_inner(hp, steps=2, optimizer="adamw", learning_rate=1e-3)
    batch, signs = _batch(hp, 4), _signs(hp, 5)
    overlapped = LocalCompute(build_model(hp), hp)
    overlapped.enable_error_feedback()
    assert overlapped.work is not overlapped.model
    reference = LocalCompute(build_model(blocking), blocking)
    reference.enable_error_feedback()
    overlapped.begin_window(1e-3, 2, hp.optimizer.grad_clip)
    first, second = window_parts(batch, hp.inner)
    overlapped.inner_step(first)
    overlapped.apply_update(signs, 0)  # the previous window's step lands mid-window, on θ alone
    overlapped.inner_step(second)
    sent = overlapped.compress(overlapped.end_window().scale)
    expected = reference.compress(reference.train(batch, 2, hp.optimizer.grad_clip, 1e-3).scale)
    for name, c in expected.items():
        assert torch.equal(sent[name].indices, c.indices) and torch.equal(sent[name].values, c.values), name
    reference.apply_update(signs, 0)
    assert all(torch.equal(p, q) for p, q in zip(overlapped.model.parameters(), reference.model.parameters(),
                                                 strict=True))


def test_eager_swaps_its_proxy_for_the_step_that_lands(hp):
    """Eager (arXiv 2502.12996): the inner steps start from θ with the node's own last update applied
    as a proxy; when the real step lands on θ the working model moves by θ − its start (its progress
    kept), and the pseudo-gradient is formed against θ: the base a blocking node computes from."""
    hp = _with_inner(hp, steps=2, optimizer="adamw", learning_rate=1e-3, overlap="eager")
    batch, proxy, real = _batch(hp, 4), _signs(hp, 5), _signs(hp, 6)
    compute = LocalCompute(build_model(hp), hp)
    compute.enable_error_feedback()
    theta = {n: p.detach().clone() for n, p in compute.model.named_parameters()}
    compute.begin_window(1e-3, 2, None, proxy=proxy, proxy_step=0)
    first, second = window_parts(batch, hp.inner)
    compute.inner_step(first)
    before_landing = {n: p.detach().clone() for n, p in compute.work.named_parameters()}
    compute.apply_update(real, 0)
    compute.land()
    # the same by hand: the proxy's start, one step, then the shift of the landing
    start = {n: t.clone() for n, t in theta.items()}
    apply_update(start, proxy, 0, hp)
    landed = {n: t.clone() for n, t in theta.items()}
    apply_update(landed, real, 0, hp)
    for n, p in compute.work.named_parameters():
        assert torch.allclose(p, before_landing[n] + (landed[n] - start[n]), atol=1e-6), n
    compute.inner_step(second)
    final = {n: p.detach().clone() for n, p in compute.work.named_parameters()}
    stats = compute.end_window()
    assert stats.scale == 1.0 and stats.tokens == batch.numel()
    for n, p in compute.work.named_parameters():
        assert torch.equal(p.grad, landed[n] - final[n]), n
        assert torch.equal(p, landed[n]), n  # the working model ends at its base
    assert all(torch.equal(p, landed[n]) for n, p in compute.model.named_parameters())  # θ: the real step only


def test_eager_needs_inner_adamw(tmp_path):
    import json

    import pytest

    from templar.core.config import PRESETS_DIR, HParamsError, base_lag

    preset = tmp_path / "eager-sgd.json"
    preset.write_text(json.dumps({"base": str(PRESETS_DIR / "tiny-paper.json"), "inner": {"overlap": "eager"}}))
    with pytest.raises(HParamsError, match="eager"):
        load_hparams(preset)
    assert [base_lag(InnerConfig(overlap=mode)) for mode in ("blocking", "delayed", "eager")] == [1, 2, 1]
