"""DeMo aggregation (Algorithm 2, `DeMoAggregation`) and the signed outer step.

Δ = sign(iDCT(Σ_p w_p · q_p / ||q_p||)), every peer's values L2-normalised per tensor so that
rescaling a gradient (×1e6) changes nothing, then θ ← θ·(1 − α·wd) − α·Δ.

Determinism: the weighted sum is accumulated in 2^-60 fixed point (int64), one `index_add_` of
each peer's coefficients into one accumulator per tensor. Integer addition is associative, so the
sum is bit-identical for any peer order and any scatter implementation, with no sorting of peers. The weights are divided by Σ|w| first (the sign is invariant to a positive
scale) so every term and partial sum is below 2^60 in magnitude and cannot overflow. The
quantisation step is 2^-60 of the unit-norm peer vectors, far below float32 resolution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from templar.compress import native
from templar.compress.compressor import Compressed, check_peers
from templar.compress.dct import ChunkedDCT, ChunkPlan

__all__ = ["aggregate", "apply_signed_update"]

_FIXED_BITS = 60
_DEFAULT_DCT = ChunkedDCT()


@torch.no_grad()
def aggregate(
    peers: Sequence[Mapping[str, Compressed]],
    weights: Sequence[float],
    shapes: Mapping[str, torch.Size],
    *,
    dct: ChunkedDCT | None = None,
) -> dict[str, torch.Tensor]:
    """sign(Δ) per parameter (float32 of -1/0/+1, on the peers' device), for G peers at once.

    Each peer's indices must be unique within a chunk (as `templar.wire` guarantees). A single
    peer, `aggregate([p], [1.0], shapes)`, is that peer's own update (validators' evaluation).
    """
    if len(peers) != len(weights):
        raise ValueError(f"{len(peers)} peers but {len(weights)} weights")
    if not peers:
        raise ValueError("aggregate needs at least one peer")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weights must be finite")
    total = float(w.abs().sum())
    w = w / total if total > 0 else w
    dct = dct if dct is not None else _DEFAULT_DCT
    signs: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        plan = check_peers(name, peers, torch.Size(shape))
        items = [p[name] for p in peers]
        # one pass over all peers: per-peer checks cost more in dispatch than in arithmetic
        values = torch.cat([c.values.reshape(-1) for c in items]) if len(items) > 1 else items[0].values
        if not bool(torch.isfinite(values).all()):
            raise ValueError(f"{name}: non-finite values")
        device = items[0].values.device
        p_rows, p_cols = plan.padded
        included = []  # (peer, fixed-point scale); all-zero peers and zero weights add nothing
        for c, weight in zip(items, w.tolist(), strict=True):
            norm = float(torch.linalg.vector_norm(c.values.to(torch.float64)))
            if norm != 0.0 and weight != 0.0:
                included.append((c, weight / norm * 2.0**_FIXED_BITS))
        with dct.lock:
            coef = dct.scratch("acc32", p_rows * p_cols, torch.float32, device)
            peer_indices = [c.indices for c, _ in included]
            peer_values = [c.values for c, _ in included]
            scales = [scale for _, scale in included]
            if not native.accumulate(peer_indices, peer_values, scales, plan, coef):
                _accumulate(dct, plan, included, coef)
            delta = dct.crop(dct.inverse(coef, plan), plan)
            signs[name] = torch.sign(delta)
    return signs


def _accumulate(
    dct: ChunkedDCT, plan: ChunkPlan, included: list[tuple[Compressed, float]], coef: torch.Tensor
) -> None:
    """The torch path of `native.accumulate`: int64 `index_add_` of every peer, then float32."""
    acc = dct.scratch("acc", coef.numel(), torch.int64, coef.device)
    acc.zero_()
    for c, scale in included:
        fixed = torch.round(c.values.to(torch.float64) * scale).to(torch.int64)
        acc.index_add_(0, plan.positions(c.indices).view(-1), fixed.view(-1))
    coef.copy_(acc)


@torch.no_grad()
def apply_signed_update(
    params: Mapping[str, torch.Tensor] | nn.Module,
    signs: Mapping[str, torch.Tensor],
    lr: float,
    weight_decay: float,
) -> None:
    """θ ← θ·(1 − lr·wd) − lr·sign, in place, for every parameter named in `signs`.

    Parameters without a sign are left untouched. Raises ValueError on unknown names or shapes
    before modifying anything.
    """
    named = dict(params.named_parameters()) if isinstance(params, nn.Module) else dict(params)
    for name, s in signs.items():
        if name not in named:
            raise ValueError(f"sign for unknown parameter {name}")
        if s.shape != named[name].shape:
            raise ValueError(f"{name}: sign shape {tuple(s.shape)} != parameter {tuple(named[name].shape)}")
    decay = 1.0 - lr * weight_decay
    for name, s in signs.items():
        p = named[name]
        if decay != 1.0:
            p.mul_(decay)
        p.add_(s.to(device=p.device, dtype=p.dtype), alpha=-lr)
