"""Whether a node holds the run's model: the fingerprint of θ the lead publishes with each
window's progress (`templar.comms.progress`), and the one rule that compares a node's own with it.

Why not sha256(θ): live nodes aggregate the peers' payloads themselves, possibly on different
hardware. A CPU and a GPU round the inverse DCT's float32 products differently and can flip the
sign of a coefficient that is almost exactly 0 (architecture §4), so two honest nodes may differ
in a few coordinates by 2·α after a window, and a byte hash would cry "fork" across device types.

What instead: θ in float32 at `fingerprint_positions` public coordinates (the run's `sync` rules,
`HParams.sync`: 256), drawn uniformly over all
trainable parameters (as one flat vector, names sorted) by keyed BLAKE2b of (`data_seed`, window)
with its own personalisation (not the sync probes' positions). The outer step moves *every*
coordinate by α·sign(Δ) (plus decoupled weight decay), so

- a missed, doubled or foreign window moves (almost) every fingerprinted value by ≈ α: all 256
  positions are off, far beyond the `max_off_share` (1/32: 8 positions) that `model_in_sync`
  allows; a fork by one missing peer flips 4.2 % of the signs at G = 15 (14.5 % at G = 4,
  measured on real DeMo payloads): ~11 positions expected, caught by one check with probability
  ~0.76 and, positions being redrawn every window while the fork persists, by three with ~0.99;
- under a rule whose step moves only some coordinates, by less than α (SparseLoCo), a position is off
  beyond rounding (`ulp_slack`) instead: the aggregate is exact and applied element-wise, so honest
  nodes differ by a few ulps, and a missed window moves the share of positions its step touched;
- ulp-level rounding never moves a value by α/2, so it is never "off" (nor by `ulp_slack`, 8
  float32 ulps of its magnitude, whatever α is);
- cross-device sign flips near 0 hit a share f of coordinates that grows by ~1e-6 per window
  (an estimate: float32 rounding of a 64-term sum against the density of values near 0); at
  f = 1 % the chance that 9 of 256 positions are off is ~1e-3 per check, and a false alarm only
  costs one re-sync, after which the node holds the lead's θ exactly (f = 0 again).

Cost: 256 BLAKE2b calls and one gather of 256 values per window: independent of the model's
size but for a `searchsorted` over the parameter offsets (~300 tensors at 1.2B parameters); on
the device it is one indexing kernel per touched tensor and one 1 KiB copy to the host.
"""

from __future__ import annotations

import torch

from templar.core.config import SyncConfig
from templar.wire import probe_positions

_PERSON = b"templar-fprint"


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)


def fingerprint_positions(model: torch.nn.Module, seed: int, window: int, count: int,
                          ) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Where window `window`'s fingerprint reads θ: (parameter name, slots of the fingerprint,
    flat offsets in that parameter), one entry per parameter touched. Shapes only: a sharded
    node (`templar.distributed`) reads the same positions from its ranks' rows."""
    params = _trainable(model)
    sizes = torch.tensor([p.numel() for _, p in params], dtype=torch.int64)
    ends = torch.cumsum(sizes, 0)
    flat = probe_positions(seed, window, "model", int(ends[-1]), count, person=_PERSON)
    which = torch.searchsorted(ends, flat, right=True)
    starts = ends - sizes
    out = []
    for i in torch.unique(which).tolist():
        picked = (which == i).nonzero().flatten()
        out.append((params[i][0], picked, flat[picked] - starts[i]))
    return out


@torch.no_grad()
def model_fingerprint(model: torch.nn.Module, seed: int, window: int, count: int) -> torch.Tensor:
    """θ (float32, on the CPU) at window `window`'s `count` public fingerprint positions."""
    params = dict(model.named_parameters())
    parts, order = [], []
    for name, picked, offsets in fingerprint_positions(model, seed, window, count):
        p = params[name]
        parts.append(p.detach().reshape(-1)[offsets.to(p.device)].float())
        order.append(picked)
    values = torch.cat(parts).cpu()  # one device-to-host copy
    out = torch.empty(count, dtype=torch.float32)
    out[torch.cat(order)] = values
    return out


def off_positions(own: torch.Tensor, published: torch.Tensor, lr: float, rules: SyncConfig, *,
                  moves_every_coordinate: bool = True) -> int:
    """How many positions differ by more than α/2 (or `ulp_slack` of the published value, if more).
    A non-finite own value is always off.

    Under a rule whose step does not move every coordinate by α (`OuterRule.moves_every_coordinate`
    False: SparseLoCo, whose step moves a sparse set of coordinates by α times a small value and whose
    aggregate is exact, so honest nodes differ by rounding only) the α/2 allowance would hide a missed
    window entirely: there a position is off when it differs by more than `ulp_slack` of its value."""
    if own.shape != published.shape:
        return max(own.numel(), published.numel())
    mine, theirs = own.double(), published.double()
    allowance = lr / 2 if moves_every_coordinate else 0.0
    tolerance = torch.clamp(theirs.abs() * rules.ulp_slack, min=allowance)
    return int((~((mine - theirs).abs() <= tolerance)).sum())


def model_in_sync(own: torch.Tensor, published: torch.Tensor, lr: float, rules: SyncConfig, *,
                  moves_every_coordinate: bool = True) -> bool:
    """The one rule for "this node holds the lead's model" (see the module docstring): at most
    `max_off_share` of the fingerprint positions off (`off_positions`). `lr` is the learning rate of
    the run's latest step (under the signed rule every coordinate moved by about that much in it)."""
    if not lr > 0:
        raise ValueError(f"model_in_sync: lr must be positive, got {lr!r}")
    off = off_positions(own, published, lr, rules, moves_every_coordinate=moves_every_coordinate)
    return off <= int(own.numel() * rules.max_off_share)
