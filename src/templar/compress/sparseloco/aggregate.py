"""SparseLoCo's aggregation: the mean of the peers' updates, each clipped to the median norm, and
the outer SGD step.

    n_p = ||q_p||                         # L2 norm of peer p's whole payload (every parameter)
    m   = lower median of n_p over the contributing peers, or the lead's ceiling c when lower
    Δ   = Σ_p w_p · min(1, m / n_p) · q_p # dense, per parameter
    θ  <- θ - lr · Δ

A peer contributes when its weight and its norm are non-zero (an all-zero payload has no
direction, and counting it would drag the median, and so every honest peer, towards zero). With
one peer, or all norms equal, nothing is clipped. A peer that scales its update ×1000 is clipped
back to the median norm: it moves the mean no more than a median peer does. The ceiling c is the
lead's (published with the window's inputs, `templar.wire.inputs`): the peers hold the list's
median only when they hold most of its slots, and a group that does would set the step's size; the
lead bounds it by the window's typical earning upload (`templar.validator.fast_eval.step_ceiling`).

Determinism (every honest node must compute the same Δ, bit for bit, for any peer order):
- Norms are exact. On the 2-bit grid the non-zero values of a chunk share one magnitude
  s = m · 2^e (an 8-bit mantissa; up to 12 bits are accepted), so a chunk's Σ v² is its count of
  non-zero values times m² · 2^(2e): per tensor, these integers are summed per exponent in int64
  (exact whatever the order) and the exponent groups combined as Python integers. The median compares exact rationals, and the clip factor
  is `sqrt(m² / n_p²)` rounded once to float64 (correctly rounded division and square root).
- The sum is fixed point, as in the signed aggregate: `round(v · w_p · c_p · 2^F)` in float64
  (ties to even), added in int64 (associative), converted to float32 once and scaled by 2^-F
  (a power of two: exact unless the result is subnormal, then one IEEE rounding). F is chosen
  per tensor from the largest term (an order-free maximum), so the int64 sum stays below 2^62.
On CPU the accumulation runs in the C kernel of the signed aggregate, bit-identical to the torch
path (which a GPU runs); tests hold both to it and to a float64 reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

import torch
from torch import nn

from templar.compress import native
from templar.compress.compressor import Compressed, check_peers
from templar.compress.dct import ChunkPlan

__all__ = ["aggregate_clipped_mean", "apply_mean_update", "clip_factor", "clip_factors", "clip_level",
           "lower_median", "payload_norm_squared"]

_MANTISSA_BITS = 12  # values with more significant bits are refused (the grid has 8)
_EXP_OFFSET = 160  # frexp exponents of float32 lie in [-148, 128]
_FIXED_MAX_BITS = 62  # the accumulated sum stays below 2^62


def _norm_terms(values: torch.Tensor, name: str = "") -> tuple[Fraction, int | None]:
    """Exact Σ v² of one tensor's values `[n_chunks, k]`, and the smallest E with every |v| < 2^E
    (None if all are 0). ValueError unless every chunk's non-zero values share one magnitude s
    (the grid) and every s has at most 12 significant bits."""
    return _norms_in_one_pass([(name, values)])[0]


def _payload_norm_terms(named_values: Sequence[tuple[str, torch.Tensor]],
                        group_values: int = 1 << 16) -> list[tuple[Fraction, int | None]]:
    """`_norm_terms` of each of one payload's tensors, in order, with consecutive tensors of one layout
    computed in one pass (groups of at most `group_values` values: a bounded copy).

    Why: one tensor's norm is about 17 small torch operations, and on a small model (21 tensors of a
    few chunks each) that overhead was most of an aggregate's time; see
    `benchmarks/performance/aggregate.py`. Each result, and the first refusal, is the tensor's own."""

    def layout(values: torch.Tensor) -> tuple:
        return values.dim(), values.shape[-1] if values.dim() else 0, values.dtype, values.device

    results: list[tuple[Fraction, int | None]] = []
    group: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, values in named_values:
        if group and (size + values.numel() > group_values or layout(values) != layout(group[0][1])):
            results.extend(_norms_in_one_pass(group))
            group, size = [], 0
        group.append((name, values))
        size += values.numel()
    if group:
        results.extend(_norms_in_one_pass(group))
    return results


def _norms_in_one_pass(named_values: Sequence[tuple[str, torch.Tensor]]) -> list[tuple[Fraction, int | None]]:
    """`_norm_terms` of tensors of one layout `[n_chunks, k]`, in one pass over all their chunks: per
    tensor the same integers land in its own row of exponent bins. A refusal names the first tensor,
    in order, that fails a check, and that tensor's first failing check, as one tensor alone would."""
    for name, values in named_values:
        if values.numel() > 1 << 38:
            raise ValueError(f"{name}: {values.numel()} values in one tensor, more than the exact norm allows")
    values = named_values[0][1] if len(named_values) == 1 else torch.cat([v for _, v in named_values])
    magnitude = values.abs()
    scale = magnitude.amax(dim=1)
    count = torch.count_nonzero(values, dim=1)
    fraction, exponent = torch.frexp(scale)  # s = fraction · 2^exponent, fraction in [0.5, 1)
    mantissa = fraction * (1 << _MANTISSA_BITS)  # exact: a power-of-two scale
    checks = (  # per chunk, in the order a refusal is reported
        (torch.isfinite(scale), "non-finite values"),  # NaN propagates through amax
        (torch.where(scale > 0, (magnitude == scale[:, None]).sum(dim=1), 0) == count,
         "values are not on the 2-bit grid (a chunk holds more than one magnitude)"),
        (mantissa == torch.round(mantissa),
         f"scales with more than {_MANTISSA_BITS} significant bits (not on the 2-bit grid)"),
    )
    if not all(bool(passed.all()) for passed, _ in checks):
        start = 0
        for name, v in named_values:
            rows = slice(start, start + v.shape[0])
            start += v.shape[0]
            for passed, why in checks:
                if not bool(passed[rows].all()):
                    raise ValueError(f"{name}: {why}")
    # Σ v² = Σ_chunks count · m² · 2^(2(e - 12)) with m² < 2^24 and Σ count <= 2^38 values per tensor:
    # every int64 sum per exponent stays below 2^62, exact whatever order the additions run in.
    terms = count * mantissa.to(torch.int64).square()
    span = _EXP_OFFSET + 130  # a row of exponent bins per tensor
    chunks = torch.tensor([v.shape[0] for _, v in named_values], device=values.device)
    tensor_of_chunk = torch.repeat_interleave(torch.arange(len(named_values), device=values.device), chunks)
    sums = torch.zeros(len(named_values) * span, dtype=torch.int64, device=values.device)
    sums.index_add_(0, tensor_of_chunk * span + exponent.to(torch.int64) + _EXP_OFFSET, terms)
    filled = sums.nonzero().view(-1)
    results: list[tuple[Fraction, int | None]] = [(Fraction(0), None)] * len(named_values)
    for position, value in zip(filled.tolist(), sums[filled].tolist(), strict=True):  # by tensor, exponents growing
        tensor, index = divmod(position, span)
        e = index - _EXP_OFFSET
        results[tensor] = (results[tensor][0] + value * Fraction(2) ** (2 * (e - _MANTISSA_BITS)), e)
    return results


def payload_norm_squared(peer: Mapping[str, Compressed], names: Sequence[str]) -> Fraction:
    """||q||² of a payload over the parameters `names`, exactly (see the module docstring)."""
    return sum((total for total, _ in _payload_norm_terms([(name, peer[name].values) for name in names])), Fraction(0))


def lower_median(squares: Sequence[Fraction]) -> Fraction:
    """The lower median of squared norms: what every peer is clipped to."""
    ordered = sorted(squares)
    return ordered[(len(ordered) - 1) // 2]


def clip_factor(norm_squared: Fraction, median_squared: Fraction) -> float:
    """min(1, median / norm) (float64, correctly rounded) for a payload with a norm."""
    return 1.0 if norm_squared <= median_squared else math.sqrt(float(median_squared / norm_squared))


def clip_level(norms_squared: Sequence[Fraction], ceiling: float | None = None) -> Fraction:
    """The squared norm every contributing peer is clipped to: the lower median of `norms_squared`
    (non-empty), or the square of `ceiling` (the lead's, a positive finite float, taken exactly) when
    that is lower. A ceiling can only lower the median: a lead cannot make the step larger than its
    peers' own median size."""
    median = lower_median(norms_squared)
    if ceiling is None:
        return median
    if not (math.isfinite(ceiling) and ceiling > 0):
        raise ValueError(f"clip ceiling must be positive and finite, got {ceiling}")
    return min(median, Fraction(ceiling) ** 2)


def clip_factors(norms_squared: Sequence[Fraction], weights: Sequence[float], *,
                 ceiling: float | None = None) -> list[float]:
    """Per peer `min(1, m / norm)` (float64, correctly rounded), 0 for a non-contributing peer
    (zero weight or zero norm); m² is `clip_level` of the contributing peers' norms and `ceiling`."""
    contributing = [n for n, w in zip(norms_squared, weights, strict=True) if n > 0 and w > 0]
    if not contributing:
        return [0.0] * len(norms_squared)
    median = clip_level(contributing, ceiling)
    factors = []
    for n, w in zip(norms_squared, weights, strict=True):
        if n == 0 or w == 0:
            factors.append(0.0)
        else:
            factors.append(clip_factor(n, median))
    return factors


def _times_power_of_two_(t: torch.Tensor, exponent: int) -> torch.Tensor:
    """`t *= 2^exponent` in float32 with one rounding (none unless a result is subnormal).
    `t` holds float32 images of int64 sums, so a non-zero |t| >= 1."""
    if exponent >= -149:
        return t.mul_(2.0**exponent)  # 2^exponent is a float32 (exponent <= 127 by construction)
    if exponent >= -149 - 126:  # 2^-126 keeps every non-zero value normal, then one rounding
        return t.mul_(2.0**-126).mul_(2.0 ** (exponent + 126))
    return t.zero_()  # every result is below 2^(62-275): zero in float32


def _accumulate(
    items: Sequence[Compressed], scales: Sequence[float], plan: ChunkPlan, out: torch.Tensor
) -> None:
    """`out` (flat padded matrix layout) = float32(Σ_p round_half_even(v_p · scale_p)), int64 sum."""
    indices = [c.indices.contiguous() for c in items]
    values = [c.values.contiguous() for c in items]
    if native.accumulate(indices, values, scales, plan, out):
        return
    acc = torch.zeros(out.numel(), dtype=torch.int64, device=out.device)
    for i, v, scale in zip(indices, values, scales, strict=True):
        fixed = torch.round(v.to(torch.float64) * scale).to(torch.int64)
        acc.index_add_(0, plan.positions(i).view(-1), fixed.view(-1))
    out.copy_(acc)


@torch.no_grad()
def aggregate_clipped_mean(
    peers: Sequence[Mapping[str, Compressed]],
    weights: Sequence[float],
    shapes: Mapping[str, torch.Size],
    *,
    clip: bool = True,
    ceiling: float | None = None,
) -> dict[str, torch.Tensor]:
    """Δ per parameter of `shapes` (dense float32, on the peers' device), bit-identical for any
    order of `peers` (with their `weights`, each in [0, 1], e.g. 1/G) and any implementation.

    `clip=False` takes `weights` as the final per-peer factors w_p·min(1, m/‖q_p‖), computed once
    from the whole payloads (`clip_factors`): a node whose ranks each aggregate some parameters
    (`templar.distributed.outer`) must clip by the whole payload's norm, not by one tensor's.
    `ceiling`: the lead's bound on the clip level (`clip_level`); None, the peers' median alone.

    Values must be on the 2-bit grid (any float32 with at most 12 significant bits is accepted)
    and indices unique within a chunk, as `templar.wire` guarantees; ValueError otherwise. A single
    peer with weight 1 gives that peer's own update (what a validator evaluates).
    """
    if len(peers) != len(weights):
        raise ValueError(f"{len(peers)} peers but {len(weights)} weights")
    if not peers:
        raise ValueError("aggregate needs at least one peer")
    w = [float(x) for x in weights]
    if not all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in w):
        raise ValueError("weights must be finite and in [0, 1]")
    names = list(shapes)
    plans: dict[str, ChunkPlan] = {}
    for name in names:
        plans[name] = check_peers(name, peers, torch.Size(shapes[name]))

    terms = [_payload_norm_terms([(name, p[name].values) for name in names]) for p in peers]  # [peer][name]
    norms_squared = [sum((t for t, _ in row), Fraction(0)) for row in terms]
    factors = clip_factors(norms_squared, w, ceiling=ceiling) if clip else [1.0 if x > 0 else 0.0 for x in w]
    included = [i for i, c in enumerate(factors) if c > 0]

    out: dict[str, torch.Tensor] = {}
    for j, name in enumerate(names):
        plan = plans[name]
        device = peers[0][name].values.device
        p_rows, p_cols = plan.padded
        coef = torch.zeros(p_rows * p_cols, dtype=torch.float32, device=device)
        active = [i for i in included if terms[i][j][1] is not None]  # non-zero here
        if active:
            # |v| < 2^E, so every term is at most w·c·2^(E+F) (+1/2 of rounding): the sum stays below
            # 2^62 when the count of terms times the largest bound is below 2^(62-F).
            bound = len(active) * max(math.ldexp(w[i] * factors[i], terms[i][j][1]) for i in active)
            fixed_bits = _FIXED_MAX_BITS - math.frexp(bound)[1]
            scales = [math.ldexp(w[i] * factors[i], fixed_bits) for i in active]
            _accumulate([peers[i][name] for i in active], scales, plan, coef)
            _times_power_of_two_(coef, -fixed_bits)
        dense = coef.view(p_rows, p_cols)[: plan.rows, : plan.cols]
        out[name] = dense.reshape(plan.shape) if plan.is_padded else dense.view(plan.shape)
    return out


@torch.no_grad()
def apply_mean_update(
    params: Mapping[str, torch.Tensor] | nn.Module, update: Mapping[str, torch.Tensor], lr: float
) -> None:
    """θ ← θ − lr·Δ in place (outer SGD), for every parameter named in `update`.

    `lr·Δ` is rounded to float32 first and subtracted in a second operation, so no device can
    fuse the two into one FMA and round differently. Parameters without an update are left
    untouched; ValueError on unknown names, wrong shapes or a non-finite lr before modifying anything.
    """
    if not math.isfinite(lr):
        raise ValueError(f"lr must be finite, got {lr}")
    named = dict(params.named_parameters()) if isinstance(params, nn.Module) else dict(params)
    for name, u in update.items():
        if name not in named:
            raise ValueError(f"update for unknown parameter {name}")
        if u.shape != named[name].shape:
            raise ValueError(f"{name}: update shape {tuple(u.shape)} != parameter {tuple(named[name].shape)}")
    for name, u in update.items():
        p = named[name]
        step = u.to(device=p.device, dtype=torch.float32) * lr
        p.sub_(step.to(p.dtype))
