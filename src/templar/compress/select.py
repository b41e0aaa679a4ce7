"""Deterministic per-chunk top-k of |coefficient| in matrix layout.

The result is defined exactly: the k largest |v| of each chunk, ties broken towards the lower
within-chunk index. The exact path ranks an int64 key `(bits(|v|) << b) | (chunk_numel - 1 - index)`
(for non-negative floats the IEEE bit pattern orders like the value), so every key is unique and
the result does not depend on how `topk` breaks ties on a given device or build.

A full top-k over every 4096-coefficient chunk is the slowest step of compression, so large chunks
use a pre-filter built on one lemma: if the `k` groups (any partition of the chunk) with the largest
max |v| are kept and no other group reaches the k-th group maximum `t`, every coefficient outside
the kept groups is strictly below `t` while at least `k` inside are `>= t`, so the top-k lies inside
the kept groups. Applied three times: keep the k best columns of the chunk; among their groups of
`g` rows x 1 column keep the k best (each kept column holds a group `>=` its column threshold, so
the second threshold is no lower than the first); then take a plain float top-k of the `k*g`
coefficients of the kept groups. Chunks where a premise fails (a tie at a boundary, or a NaN) are
redone with the exact keyed path, so both paths always return the same answer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from templar.compress import native
from templar.compress.dct import ChunkPlan

__all__ = ["select_topk"]

_MAX_GROUP = 8

Scratch = Callable[[str, int, torch.dtype, torch.device], torch.Tensor]


def _fresh(slot: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype, device=device)


def _keys(values: torch.Tensor, within: torch.Tensor, chunk_numel: int) -> torch.Tensor:
    shift = max(chunk_numel - 1, 1).bit_length()
    keys = values.abs().view(torch.int32).to(torch.int64)
    return keys.bitwise_left_shift_(shift).bitwise_or_(chunk_numel - 1 - within)


def _group_size(plan: ChunkPlan, k: int) -> int:
    """Rows per pre-filter group, or 0 when the exact path is cheaper (or the filter needs w >= k)."""
    if plan.w < k:
        return 0
    for g in range(min(_MAX_GROUP, plan.h), 1, -1):
        if plan.h % g == 0 and 4 * k * g <= plan.chunk_numel:
            return g
    return 0


def _exact(
    coef: torch.Tensor, plan: ChunkPlan, k: int, chunks: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """Exact keyed top-k over whole chunks (all chunks, or only `chunks`)."""
    cn = plan.chunk_numel
    r_grid, c_grid = plan.grid
    within_all = torch.arange(cn, device=coef.device, dtype=torch.int64)
    if chunks is None:
        values = coef.view(r_grid, plan.h, c_grid, plan.w).permute(0, 2, 1, 3).reshape(-1, cn)
    else:
        values = coef[plan.chunk_positions(chunks)]
    keys = _keys(values, within_all, cn)
    sel = torch.topk(keys, k, dim=1, sorted=False).indices
    return sel, torch.gather(values, 1, sel)


def select_topk(
    coef: torch.Tensor, plan: ChunkPlan, k: int, *, scratch: Scratch | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-`k` coefficients of every chunk of the flat matrix-layout `coef`.

    Returns `(indices, values)`, both `[n_chunks, k]`; indices are within-chunk (`i*w + j`), int64,
    ascending in each row. On CPU the C kernel (`templar.compress.native`) computes the same answer. `scratch(slot, numel, dtype, device)` may supply reusable buffers for
    the large intermediates (see `ChunkedDCT.scratch`).
    """
    cn = plan.chunk_numel
    if not 0 < k <= cn:
        raise ValueError(f"k={k} must be in [1, {cn}]")
    selected = native.select_topk(coef, plan, k)
    if selected is not None:
        return selected
    g = _group_size(plan, k)
    if g == 0:
        idx, val = _exact(coef, plan, k, None)
    else:
        idx, val = _prefiltered(coef, plan, k, g, scratch or _fresh)
    order = torch.argsort(idx, dim=1)
    return torch.gather(idx, 1, order), torch.gather(val, 1, order)


def _prefiltered(
    coef: torch.Tensor, plan: ChunkPlan, k: int, g: int, scratch: Scratch
) -> tuple[torch.Tensor, torch.Tensor]:
    r_grid, c_grid = plan.grid
    h, w = plan.h, plan.w
    n, bands = plan.n_chunks, h // g
    device = coef.device
    row_stride = c_grid * w

    # Max |v| of every group (g rows x 1 column), kept in matrix layout: [R, bands, C*w].
    grouped = coef.view(r_grid, bands, g, row_stride)
    gabs = scratch("gmax", r_grid * bands * row_stride, coef.dtype, device).view(r_grid, bands, row_stride)
    gmin = scratch("gmin", r_grid * bands * row_stride, coef.dtype, device).view(r_grid, bands, row_stride)
    torch.amax(grouped, 2, out=gabs)
    torch.amin(grouped, 2, out=gmin)
    torch.maximum(gabs, gmin.neg_(), out=gabs)

    # Level 1: the k columns with the largest max |v| (a column is the group of all h rows);
    # chunk-major for free, since [R, C*w] is [n_chunks, w].
    column_abs = gabs.amax(1).view(n, w)
    top_cols = torch.topk(column_abs, k, dim=1, sorted=False)
    suspect = (column_abs >= top_cols.values.amin(1, keepdim=True)).sum(1) != k

    # Level 2: the k largest groups inside those columns (k * bands candidates per chunk).
    chunk = torch.arange(n, device=device, dtype=torch.int64)[:, None]
    gabs_origin = (
        torch.div(chunk, c_grid, rounding_mode="floor") * (bands * row_stride) + (chunk % c_grid) * w
    )
    band_offsets = torch.arange(bands, device=device, dtype=torch.int64) * row_stride
    group_pos = ((gabs_origin + top_cols.indices)[..., None] + band_offsets).view(n, k * bands)
    group_abs = gabs.view(-1)[group_pos]
    top_groups = torch.topk(group_abs, k, dim=1, sorted=False)
    suspect |= (group_abs >= top_groups.values.amin(1, keepdim=True)).sum(1) != k
    picked = torch.div(top_groups.indices, bands, rounding_mode="floor")
    band = top_groups.indices - picked * bands
    col = torch.gather(top_cols.indices, 1, picked)

    # Level 3: exact top-k among the g coefficients of each kept group.
    first_within = band * (g * w) + col
    first_pos = plan.chunk_origins(device)[:, None] + band * (g * row_stride) + col
    steps = torch.arange(g, device=device, dtype=torch.int64) * row_stride
    pos = scratch("cand_pos", n * k * g, torch.int64, device).view(n, k, g)
    torch.add(first_pos[..., None], steps, out=pos)
    candidates = scratch("cand", n * k * g, coef.dtype, device).view(n, k * g)
    torch.index_select(coef, 0, pos.view(-1), out=candidates.view(-1))
    magnitude = scratch("cand_abs", n * k * g, coef.dtype, device).view(n, k * g)
    torch.abs(candidates, out=magnitude)
    best = torch.topk(magnitude, k, dim=1, sorted=False)
    suspect |= (magnitude >= best.values.amin(1, keepdim=True)).sum(1) != k

    slot = torch.div(best.indices, g, rounding_mode="floor")
    idx = torch.gather(first_within, 1, slot) + (best.indices - slot * g) * w
    val = torch.gather(candidates, 1, best.indices)
    empty = column_abs.amax(1) == 0  # all-zero chunks (e.g. embedding rows no token hit): every |v| ties
    if bool(empty.any()):
        idx[empty] = torch.arange(k, device=device, dtype=torch.int64)
        val[empty] = 0.0
        suspect &= ~empty
    if bool(suspect.any()):
        chunks = suspect.nonzero()[:, 0]
        idx[chunks], val[chunks] = _exact(coef, plan, k, chunks)
    return idx, val
