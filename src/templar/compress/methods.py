"""The outer step is the run's choice (hparams `optimizer.method`): one object per rule.

Each rule says, once, for every node kind (1 process, torchrun ranks, catch-up, the validator's
trial step):
- `compressor`: what a miner's error feedback sends (the wire codec named by `codec`);
- `aggregate`: the update direction of the top-G peers' payloads, bit-identical on every machine
  and for any peer order;
- `trial`: one peer's update as the outer step would apply it alone (the validator's LossScore).

The update is applied by the one rule θ ← θ·(1 − α·wd) − α·update (`apply_update`), α the run's
outer learning rate at the window's global_step.

- `signed`, the Gauntlet paper's: DeMo (chunked DCT, top-k, int8 values with a per-chunk exponent),
  every peer L2-normalised, the weighted sum's sign (`templar.compress.aggregate`).
- `sparseloco` (when available): chunked top-k without DCT, 2-bit values, the mean of the peers with
  each one's norm clipped to the median (`templar.compress.sparseloco`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from templar.compress.aggregate import aggregate as signed_aggregate
from templar.compress.compressor import Compressed, DCTCompressor

__all__ = ["METHODS", "OuterRule", "SignedRule", "rule_of"]


class OuterRule(Protocol):
    """One outer-step method: its compressor, its aggregate and its trial step."""

    name: str
    codec: str

    def compressor(self, target_chunk: int, topk: int): ...

    def aggregate(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float],
                  shapes: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]: ...

    def trial(self, peer: Mapping[str, Compressed], shapes: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]: ...


class SignedRule:
    """The paper's: Δ = sign(iDCT(Σ_p w_p·q_p/‖q_p‖)) in 2^-60 fixed point."""

    name = "signed"
    codec = "rice-mxint8"

    def compressor(self, target_chunk: int, topk: int) -> DCTCompressor:
        return DCTCompressor(target_chunk, topk)

    def aggregate(self, peers: Sequence[Mapping[str, Compressed]], weights: Sequence[float],
                  shapes: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
        return signed_aggregate(peers, weights, shapes)

    def trial(self, peer: Mapping[str, Compressed], shapes: Mapping[str, torch.Size]) -> dict[str, torch.Tensor]:
        return signed_aggregate([peer], [1.0], shapes)


METHODS: dict[str, OuterRule] = {"signed": SignedRule()}


def rule_of(method: str) -> OuterRule:
    """The rule a run's hparams name (`optimizer.method`)."""
    try:
        return METHODS[method]
    except KeyError:
        raise ValueError(f"unknown outer-step method {method!r} (one of {sorted(METHODS)})") from None
