"""The outer step is the run's choice (hparams `optimizer.method`): one object per rule.

Each rule says, once, for every node kind (1 process, torchrun ranks, catch-up, the validator's
trial step):
- `compressor`: what a miner's error feedback sends (the wire codec named by `codec`);
- `aggregate`: the update direction of the top-G peers' payloads, bit-identical on every machine
  and for any peer order (`peer_factors` + `aggregate_param` are the same rule split for a node
  whose ranks each hold some parameters: the factors come from the whole payloads, once);
- `trial`: one peer's update as the outer step would apply it alone (the validator's LossScore), held
  to the size the aggregate would give it (`trial_reference` of the window's typical payload, the
  smaller of the validator's `fast_eval.typical_payloads`);
- `apply`: θ ← θ − α·update at the run's outer learning rate α;
- `moves_every_coordinate`: whether one step moves every coordinate of θ by α, so that "how many
  steps apart" two models are reads as their distance over α (the sync score, docs/scoring.md §2);
  a rule that moves some coordinates by less is measured in its own steps' movement instead.

- `signed`, the Gauntlet paper's: DeMo (chunked DCT, top-k, int8 values with a per-chunk exponent),
  every peer L2-normalised per tensor, the weighted sum's sign (`templar.compress.aggregate`);
  applied with decoupled weight decay, θ·(1 − α·wd) − α·sign.
- `sparseloco`: chunked top-k without DCT, ternary values on a 2-bit code with a per-chunk scale,
  the mean of the peers with each one's whole-payload norm clipped to the median, or to the lead's
  lower ceiling (`templar.compress.sparseloco`), applied with outer SGD (the inner AdamW owns weight decay).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Protocol

import torch
from torch import nn

from templar.compress.aggregate import aggregate as signed_aggregate
from templar.compress.aggregate import apply_signed_update
from templar.compress.compressor import Compressed, DCTCompressor
from templar.compress.sparseloco import (
    SparseLoCoCompressor,
    aggregate_clipped_mean,
    apply_mean_update,
    clip_factor,
    clip_factors,
    lower_median,
    payload_norm_squared,
    quantise,
)

__all__ = ["METHODS", "OuterRule", "SignedRule", "SparseLoCoRule", "rule_of"]

Params = Mapping[str, torch.Tensor] | nn.Module


class OuterRule(Protocol):
    """One outer-step method: its compressor, its aggregate and its trial step."""

    name: str
    codec: str
    state_copies: int
    """float32 tensors the size of θ the rule keeps on every node between windows (e.g. 1 for an outer
    momentum buffer): what `templar.tools.sizing` counts in every node's memory and state file."""
    moves_every_coordinate: bool
    """True when one step moves every coordinate by α (the sign of a dense update): a distance over α
    counts steps. False: a step moves a sparse set of coordinates by α times a small value, and the
    validator measures one step's movement where it probes (`templar.validator.base`)."""

    def compressor(self, target_chunk: int, topk: int): ...

    def aggregate(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float],
                  shapes: Mapping[str, torch.Size], *, ceiling: float | None = None) -> dict[str, torch.Tensor]:
        """The update of `peers` at `weights`; `ceiling`: the lead's bound on a magnitude rule's clip
        level (`templar.compress.sparseloco.clip_level`), published with the window's inputs."""
        ...

    def trial(self, peer: Mapping[str, Compressed], shapes: Mapping[str, torch.Size], *,
              reference: Fraction | None = None, max_lift: float = 1.0) -> dict[str, torch.Tensor]:
        """The step a validator tries for `peer` alone: the rule's update of it, held to `reference`
        (`trial_reference`) when larger and, under a rule that applies magnitudes, lifted to it by at
        most `max_lift` when smaller."""
        ...

    def trial_reference(self, peers: Sequence[Mapping[str, Compressed]]) -> Fraction | None:
        """What a trial step is held to among the window's `peers` (None: nothing, the rule's own step
        has one size whatever the payload's)."""
        ...

    def peer_factors(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float], *,
                     ceiling: float | None = None) -> list[float]:
        """Each peer's final factor (weight times clip) from the whole payloads, once (`aggregate`'s split)."""
        ...

    def aggregate_param(self, name: str, items: Sequence[Compressed], factors: Sequence[float],
                        shape: torch.Size) -> torch.Tensor: ...

    def apply(self, params: Params, update: Mapping[str, torch.Tensor], lr: float, weight_decay: float) -> None: ...

    def wire_values(self, values: torch.Tensor) -> torch.Tensor:
        """Kept values `[n_chunks, k]` as the wire can carry them (identity for the compressor's own)."""
        ...


class SignedRule:
    """The paper's: Δ = sign(iDCT(Σ_p w_p·q_p/‖q_p‖)) in 2^-60 fixed point."""

    name = "signed"
    codec = "rice-mxint8"
    state_copies = 0
    moves_every_coordinate = True

    def compressor(self, target_chunk: int, topk: int) -> DCTCompressor:
        return DCTCompressor(target_chunk, topk)

    def aggregate(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float],
                  shapes: Mapping[str, torch.Size], *, ceiling: float | None = None) -> dict[str, torch.Tensor]:
        """`ceiling` has no part: the sign rule normalises every peer, so no size reaches the step."""
        return signed_aggregate(peers, weights, shapes)

    def trial(self, peer: Mapping[str, Compressed], shapes: Mapping[str, torch.Size], *,
              reference: Fraction | None = None, max_lift: float = 1.0) -> dict[str, torch.Tensor]:
        return signed_aggregate([peer], [1.0], shapes)

    def trial_reference(self, peers: Sequence[Mapping[str, Compressed]]) -> Fraction | None:
        """None: a sign step moves every coordinate by β, whatever the payload's magnitude."""
        return None

    def peer_factors(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float], *,
                     ceiling: float | None = None) -> list[float]:
        """Each peer's weight as is: the sign rule normalises every tensor of every peer itself."""
        return [float(w) for w in weights]

    def aggregate_param(self, name: str, items: Sequence[Compressed], factors: Sequence[float],
                        shape: torch.Size) -> torch.Tensor:
        return signed_aggregate([{name: c} for c in items], factors, {name: shape})[name]

    def apply(self, params: Params, update: Mapping[str, torch.Tensor], lr: float, weight_decay: float) -> None:
        apply_signed_update(params, update, lr, weight_decay)

    def wire_values(self, values: torch.Tensor) -> torch.Tensor:
        return values  # the codec rounds any float32 to its int8 and exponent


class SparseLoCoRule:
    """SparseLoCo's: Δ = Σ_p w_p·min(1, m/‖q_p‖)·q_p, m the median payload norm, exact and in fixed point."""

    name = "sparseloco"
    codec = "rice-q2"
    state_copies = 0
    moves_every_coordinate = False

    def compressor(self, target_chunk: int, topk: int) -> SparseLoCoCompressor:
        return SparseLoCoCompressor(target_chunk, topk)

    def aggregate(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float],
                  shapes: Mapping[str, torch.Size], *, ceiling: float | None = None) -> dict[str, torch.Tensor]:
        return aggregate_clipped_mean(peers, weights, shapes, ceiling=ceiling)

    def trial(self, peer: Mapping[str, Compressed], shapes: Mapping[str, torch.Size], *,
              reference: Fraction | None = None, max_lift: float = 1.0) -> dict[str, torch.Tensor]:
        """The peer's update at the size m (m² is `reference`, `trial_reference`: the window's typical
        payload norm): scaled by min(1, m/‖q_p‖) as the aggregate clips it when larger, and by
        min(`max_lift`, m/‖q_p‖) when smaller. None: the update as it is.

        Why both ways: LossScore is to pay a payload's direction, not its magnitude, which costs
        nothing to change. Held only, a larger update (a higher inner rate, values scaled up) bought no
        larger trial step, but a smaller one was tried smaller: honest work sent at half its size was
        paid 0.34x honest work, and a group most of the miners sending theirs ×5 held every typical size
        to theirs and took 0.33 each of the pay against 0.01 (benchmarks/LOG.md §63, §66). Lifted, every
        upload within `max_lift` of the typical size is tried at that size. Why a bound: an upload far
        below it (near-zero values, which cost nothing to post) stays a near-zero step, judged on
        rounding no more than before."""
        if reference is None:
            return aggregate_clipped_mean([peer], [1.0], shapes)
        norm = payload_norm_squared(peer, sorted(peer))
        factor = clip_factor(norm, reference) if norm > 0 else 1.0
        if norm > 0 and norm < reference and max_lift > 1.0:
            lift = min(float(max_lift), math.sqrt(float(reference / norm)))
            update = aggregate_clipped_mean([peer], [1.0], shapes, clip=False)
            return {name: t.mul_(lift) for name, t in update.items()}
        return aggregate_clipped_mean([peer], [factor], shapes, clip=False)

    def trial_reference(self, peers: Sequence[Mapping[str, Compressed]]) -> Fraction | None:
        """The lower median of the window's payloads' exact squared norms (`clip_factors`' median):
        None when no payload has a norm."""
        norms = [n for n in (payload_norm_squared(p, sorted(p)) for p in peers) if n > 0]
        return lower_median(norms) if norms else None

    def peer_factors(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float], *,
                     ceiling: float | None = None) -> list[float]:
        """w_p·min(1, m/‖q_p‖) from the whole payloads (exact norms; 0 for a peer that adds nothing)."""
        names = sorted(peers[0]) if peers else []
        factors = clip_factors([payload_norm_squared(p, names) for p in peers], [float(w) for w in weights],
                               ceiling=ceiling)
        return [float(w) * c for w, c in zip(weights, factors, strict=True)]

    def aggregate_param(self, name: str, items: Sequence[Compressed], factors: Sequence[float],
                        shape: torch.Size) -> torch.Tensor:
        return aggregate_clipped_mean([{name: c} for c in items], factors, {name: shape}, clip=False)[name]

    def apply(self, params: Params, update: Mapping[str, torch.Tensor], lr: float, weight_decay: float) -> None:
        apply_mean_update(params, update, lr)

    def wire_values(self, values: torch.Tensor) -> torch.Tensor:
        return quantise(values)  # the ternary grid (idempotent on the compressor's own values)


METHODS: dict[str, OuterRule] = {"signed": SignedRule(), "sparseloco": SparseLoCoRule()}


def rule_of(method: str) -> OuterRule:
    """The rule a run's hparams name (`optimizer.method`)."""
    try:
        return METHODS[method]
    except KeyError:
        raise ValueError(f"unknown outer-step method {method!r} (one of {sorted(METHODS)})") from None
