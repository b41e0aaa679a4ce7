"""The miner's memory settings (`--memory.offload`, `--memory.checkpoint_activations`) change where
state lives and what is recomputed, never a result: over several windows of inner AdamW steps, every
setting sends the default's payload bytes and holds its θ bit for bit, and its state file is the
default's. On the CPU the "device" copy of each streamed tensor is a separate tensor, so the streamed
path runs here; the last tests show the comparison would catch a group streamed into the wrong place.
The rules are `tiny-signed`'s on the micro model (the same groups streamed as on tiny's layers: the
module took 5 CPU-s, 12 on tiny's)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from templar.compress.methods import rule_of
from templar.core.config import HParams, load_hparams
from templar.core.memory import SETTINGS, MemorySettings
from templar.core.model import build_model
from templar.runtime.compute import LocalCompute
from templar.runtime.flags import add_memory_args, memory_settings
from templar.runtime.state import NodeState
from templar.runtime.train import inner_lr
from templar.wire import Run, write_gradient

RUN = Run(netuid=0, digest="0" * 64)
ALL = (*SETTINGS, MemorySettings(checkpoint_activations=True))
WINDOWS = 3
PRESET = Path(__file__).resolve().parents[1] / "presets" / "micro-signed-1k.json"


@pytest.fixture(scope="module")
def hp() -> HParams:
    """`tiny-signed` on the micro model (tests/presets/micro-signed-1k.json): every memory setting streams
    the same groups (each layer, the embedding, the final norm, the output layer) as on tiny's layers."""
    return load_hparams(PRESET)


def batch(hp: HParams, window: int) -> torch.Tensor:
    n = hp.data.pages_per_window * hp.data.sequences_per_page
    gen = torch.Generator().manual_seed(100 + window)
    return torch.randint(0, hp.model.vocab_size, (n, hp.data.sequence_length), generator=gen)


def window(compute: LocalCompute, hp: HParams, w: int) -> tuple[dict, bytes]:
    """A miner's window on `compute`: inner steps, the DeMo step, the payload, then the outer step
    with its own update (what every node applies). Returns the payload (`encoded`)."""
    stats = compute.train(batch(hp, w), hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                          inner_lr(hp.inner, w, hp.optimizer))
    sent = compute.compress(stats.scale)
    payload = write_gradient(sent, compute.probes(w), window=w, global_step=w, hotkey="h", hp=hp, run=RUN,
                             sign=lambda digest: b"\0" * 64)
    shapes = {n: p.shape for n, p in compute.model.named_parameters()}
    compute.apply_update(rule_of(hp.optimizer.method).aggregate([sent], [1.0], shapes), w)
    return encoded(payload)


def encoded(payload: bytes) -> tuple[dict, bytes]:
    """A payload as (its header, its tensors' bytes): the header's JSON maps may list their keys in
    any order from one write to the next, every byte after the header is compared as is."""
    size = int.from_bytes(payload[:8], "little")
    return json.loads(payload[8:8 + size]), payload[8 + size:]


def miner(hp: HParams, setting: MemorySettings) -> LocalCompute:
    compute = LocalCompute(build_model(hp), hp, setting)
    compute.enable_error_feedback()
    return compute


def theta(compute: LocalCompute) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in compute.model.named_parameters()}


@pytest.fixture(scope="module")
def default_run(hp: HParams) -> tuple[list[tuple[dict, bytes]], list[dict[str, torch.Tensor]]]:
    assert hp.inner.optimizer == "adamw" and hp.inner.steps > 1  # tiny's: the moments and θ_t are streamed
    compute = miner(hp, MemorySettings())
    payloads, thetas = [], []
    for w in range(WINDOWS):
        payloads.append(window(compute, hp, w))
        thetas.append(theta(compute))
    return payloads, thetas


@pytest.mark.slow(seconds=4)
@pytest.mark.parametrize("setting", ALL[1:], ids=lambda s: s.name)
def test_every_setting_sends_the_defaults_payloads_and_holds_its_theta(hp, default_run, setting) -> None:
    payloads, thetas = default_run
    compute = miner(hp, setting)
    if setting.offload:
        assert all(b.device.type == "cpu" for b in compute.demo.buffers.values())
        assert len(compute.inner_optimizer.optimizers) == hp.model.num_hidden_layers + 3  # layers, embed, norm, head
    for w in range(WINDOWS):
        assert window(compute, hp, w) == payloads[w], f"window {w}: payload differs"
        assert all(torch.equal(p, thetas[w][n]) for n, p in theta(compute).items()), f"window {w}: θ differs"
    if setting.offload:  # the moments really live in host memory between steps, one state per parameter
        state = compute.inner_optimizer.state
        assert len(state) == len(list(compute.model.parameters()))
        assert all(s["exp_avg"].device.type == "cpu" for s in state.values())


@pytest.mark.slow(seconds=6)
def test_the_state_file_is_the_defaults_and_restores_across_settings(hp, tmp_path) -> None:
    """Offloaded moments and error feedback are saved as before: the same file, which either kind of
    node restores and continues from bit for bit."""
    plain, offloaded = miner(hp, MemorySettings()), miner(hp, SETTINGS[2])
    for w in range(2):
        window(plain, hp, w)
        window(offloaded, hp, w)
    a, b = tmp_path / "plain.safetensors", tmp_path / "offloaded.safetensors"
    plain.save_state(a, NodeState(window=1, global_step=2))
    offloaded.save_state(b, NodeState(window=1, global_step=2))
    ta, tb = load_file(str(a)), load_file(str(b))
    assert set(ta) == set(tb) and any(k.startswith("inner.") for k in ta)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    crossed = [(miner(hp, SETTINGS[2]), a), (miner(hp, MemorySettings()), b)]
    expected = window(plain, hp, 2)
    for compute, path in crossed:
        state, _ = compute.load_state(path)
        assert state.window == 1
        assert window(compute, hp, 2) == expected


@pytest.mark.slow(seconds=5)
def test_a_group_streamed_into_the_wrong_place_changes_the_payload(hp, default_run) -> None:
    """Layers 0 and 1 have the same shapes, so mixing up their streamed state raises nothing: the
    bit-for-bit comparison above is what would catch it, as it does here."""
    payloads, _ = default_run
    compute = miner(hp, SETTINGS[1])
    assert window(compute, hp, 0) == payloads[0]
    optimizers = compute.inner_optimizer.optimizers
    first, second = optimizers[1], optimizers[2]  # after the embedding: layers 0 and 1
    for p, q in zip(first.param_groups[0]["params"], second.param_groups[0]["params"], strict=True):
        assert p.shape == q.shape
        first.state[p], second.state[q] = second.state[q], first.state[p]
    assert window(compute, hp, 1) != payloads[1]

    compute = miner(hp, SETTINGS[1])
    names = list(compute.demo.buffers)
    a, b = names.index("model.layers.0.self_attn.q_proj.weight"), names.index("model.layers.1.self_attn.q_proj.weight")
    buffers = compute.demo.buffers
    assert window(compute, hp, 0) == payloads[0]
    buffers[names[a]], buffers[names[b]] = buffers[names[b]], buffers[names[a]]
    assert window(compute, hp, 1) != payloads[1]


def test_the_snapshot_is_put_back_where_it_came_from(hp, default_run, monkeypatch) -> None:
    _, thetas = default_run
    compute = miner(hp, SETTINGS[1])
    names = [n for n, _ in compute.model.named_parameters()]
    a, b = names.index("model.layers.0.mlp.up_proj.weight"), names.index("model.layers.1.mlp.up_proj.weight")
    get = type(compute.snapshot).get
    monkeypatch.setattr(type(compute.snapshot), "get", lambda self, i, like: get(self, {a: b, b: a}.get(i, i), like))
    window(compute, hp, 0)
    assert not torch.equal(theta(compute)[names[a]], thetas[0][names[a]])


def test_the_flags_select_the_settings() -> None:
    parser = argparse.ArgumentParser()
    add_memory_args(parser)
    assert memory_settings(parser.parse_args([])) == MemorySettings()
    both = memory_settings(parser.parse_args(["--memory.offload", "--memory.checkpoint_activations"]))
    assert both == SETTINGS[2] and both.flags == ("--memory.offload", "--memory.checkpoint_activations")
    assert memory_settings(argparse.Namespace()) == MemorySettings()  # a validator's flags have none
