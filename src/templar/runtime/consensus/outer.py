"""The outer step every honest node applies identically (paper eq. 1, Algorithm 2).

Miners and validators call the same function with the same inputs (the top-G peers' payloads of
a window) and get bit-identical parameters: aggregation is deterministic (`templar.compress`),
the learning rate is a pure function of `global_step`, whose one rule is `update_step`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from templar.chain import verify_signature
from templar.comms import GatherResult, gather
from templar.compress.methods import rule_of
from templar.core.config import HParams
from templar.core.schedule import learning_rate
from templar.runtime.consensus.windows import Clock
from templar.runtime.state import NodeState
from templar.storage import Bucket
from templar.wire import Gradient, PayloadError, Run, max_gradient_bytes, probe_positions
from templar.wire.shared_reads import read_gradient_shared


@dataclass(frozen=True)
class OuterStep:
    signs: dict[str, torch.Tensor]
    global_step: int     # the step this update was applied at
    learning_rate: float
    peers: int
    clip_norm: float | None = None  # the lead's ceiling on the clip level it was aggregated under


def update_step(own: int, published: int | None = None) -> int:
    """The consensus rule for the global_step an outer update is applied at (docs/design.md §3).

    global_step is the number of outer steps the run applied before this one. Every honest node
    applies the same updates, so it keeps the count by counting its own (`own`); the lead's signed
    record of the run (`published`: the step in an aggregate replayed during catch-up, or in the
    checkpoint a node loads) re-anchors it. A peer's claim is never an input: fast evaluation
    checks it against the validator's own count (`wrong_step`), so no payload can move any
    node's learning-rate schedule.
    """
    return own if published is None else published


def apply_update(model: torch.nn.Module | Mapping[str, torch.Tensor], signs: Mapping[str, torch.Tensor], step: int,
                 hp: HParams) -> float:
    """θ ← θ − α(step)·update, the run's method's own rule (`OuterRule.apply`: the signed one with
    decoupled weight decay): the one way any node applies an outer update, live or replayed.
    Returns the learning rate used.

    `model` may also be a mapping of parameter tensors with `signs` of the same shapes: a
    sharded node (`templar.distributed`) passes each rank's rows of θ and of the signs. The
    update is element-wise, so the rows come out bit-identical to the 1-process update."""
    lr = learning_rate(step, hp.optimizer)
    rule_of(hp.optimizer.method).apply(model, signs, lr, hp.optimizer.weight_decay)
    return lr


def peer_weight(hp: HParams) -> float:
    """The weight of one payload in an aggregate: w = 1/G (paper §3.3), whatever the number of
    payloads (an aggregate of fewer than G peers is not rescaled)."""
    return 1.0 / hp.gauntlet.top_g


def aggregation_weights(gradients: Sequence[Gradient], hp: HParams) -> tuple[list[Gradient], list[float]]:
    """The consensus rule for who enters an aggregate and with what weight (paper §3.3): every
    payload that is not a warm-up, each with `peer_weight`. A warm-up payload (a joining or
    re-syncing miner, whose error feedback is not yet built or whose model is not the run's) weighs 0."""
    eligible = [g for g in gradients if not g.warmup]
    return eligible, [peer_weight(hp)] * len(eligible)


def outer_step(model: torch.nn.Module, gradients: Sequence[Gradient], state: NodeState, hp: HParams,
               *, apply: bool = True, clip_norm: float | None = None) -> OuterStep | None:
    """Aggregate the eligible payloads (`aggregation_weights`), sign, and apply θ ← θ − α·sign(Δ).
    `clip_norm`: the lead's ceiling on the clip level (the window's inputs, `StepInputs.clip_norm`).

    Returns None when nothing is eligible: the window passes without a step (never stalls).
    """
    eligible, weights = aggregation_weights(gradients, hp)
    if not eligible:
        return None
    shapes = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
    step = update_step(state.global_step)
    signs = rule_of(hp.optimizer.method).aggregate([g.tensors for g in eligible], weights, shapes, ceiling=clip_norm)
    if apply:
        lr = apply_update(model, signs, step, hp)
        state.global_step = step + 1
    else:
        lr = learning_rate(step, hp.optimizer)
    return OuterStep(signs=signs, global_step=step, learning_rate=lr, peers=len(eligible), clip_norm=clip_norm)


def payload_reader(shapes: dict[str, torch.Size], hp: HParams, window: int, run: Run,
                   ) -> Callable[[str, bytes], Gradient]:
    """How every node reads a peer's gradient of `window`: strict, of this run, signed by the
    bucket's hotkey (decoded once for all the nodes of a process that shares reads,
    `templar.wire.shared_reads`)."""

    def read(hotkey: str, data: bytes) -> Gradient:
        return read_gradient_shared(data, shapes, hp, run=run, verify=verify_signature, expected_hotkey=hotkey,
                                    expected_window=window)
    return read


async def gather_gradients(buckets: Mapping[str, Bucket], window: int, *, clock: Clock, hp: HParams,
                           shapes: dict[str, torch.Size], run: Run, deadline: float | None = None,
                           ) -> dict[str, GatherResult[Gradient]]:
    """How every node, miner or validator, gathers `window`'s payloads: one put window, one skew
    allowance, one size cap and one strict reader, so all honest readers agree on what was on
    time and valid. `deadline` defaults to the window's gather deadline."""
    times = clock.times(window)
    return await gather(buckets, window, put_window=times.put_window,
                        deadline=times.gather_deadline if deadline is None else deadline,
                        max_bytes=max_gradient_bytes(shapes, hp), clock_skew=hp.windows.clock_skew_seconds,
                        validate=payload_reader(shapes, hp, window, run), malformed_errors=(PayloadError,),
                        now=clock.now)


@torch.no_grad()
def collect_probes(model: torch.nn.Module, window: int, hp: HParams) -> dict[str, torch.Tensor]:
    """θ at this window's probe positions, per parameter: what a validator compares (sync score)."""
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            idx = probe_positions(hp.data.data_seed, window, name, p.numel(), hp.gauntlet.probe_count)
            out[name] = p.detach().reshape(-1)[idx.to(p.device)].float().cpu()
    return out
