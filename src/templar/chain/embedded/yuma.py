"""Yuma consensus: one subnet epoch as a pure function of weights, stake and the previous bonds.

Written from the public description of Yuma consensus (subtensor's `docs/consensus.md`, the
Bittensor developer docs "Yuma Consensus"), not from subtensor's code. Every tempo the chain
turns the validators' weight rows into what operators read on the metagraph:

    W      weights: row i = validator i's weights, masked (no permit, self-weight, weights set
           before the target registered) and normalised to sum 1 per row
    S      active stake: permit holders that set weights within `activity_cutoff` blocks, sum 1
    C_j    consensus: the largest weight w that validators holding at least κ of the stake give
           to j (Σ_{i: W_ij ≥ w} S_i ≥ κ), the stake-weighted κ-quantile of column j
    W̄     clipped weights: min(W_ij, C_j); weight above consensus earns nobody anything
    R      ranks = Sᵀ·W̄, incentive I = R / Σ R (rank is stored as the same normalised vector)
    T_j    trust = R_j / P_j with P = Sᵀ·W (the share of j's support that survived clipping)
    V_i    validator trust = Σ_j W̄_ij (the share of i's weight that consensus agrees with)
    ΔB_ij  = S_i·W_b,ij normalised per column, W_b = (1−β)·W + β·W̄ (β = bonds_penalty)
    B      = α·ΔB + (1−α)·B_prev, normalised per column; α = 1 − bonds_moving_avg
    D_i    dividends = Σ_j B_ij·I_j, normalised

Emission per epoch: the owner's cut (18 %) goes to the subnet owner, the rest is split equally
between miners (by I) and validators (by D). With no dividends yet (no bonds), the validators'
half goes by active stake, as on subtensor; with no incentive, the miners' half is not emitted.

Floats throughout (float64), not subtensor's I32F32 fixed point: the results agree to well
under one u16 step, which is all the metagraph shows, but they are not bit-identical to a
real node. Liquid alpha (per-bond α) and Yuma 3's bond rules are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KAPPA = 32767 / 65535
"""Default κ on subtensor (u16 32767): consensus is the stake-weighted median."""

BONDS_MOVING_AVG = 0.9
"""Default `bonds_moving_avg` (900,000 / 10⁶): bonds move 10 % of the way each epoch."""

BONDS_PENALTY = 1.0
"""Default `bonds_penalty` (u16 max = 1): bonds form on the clipped weights only."""

ACTIVITY_CUTOFF = 5000
"""Blocks after which a validator's weights no longer count (subtensor default 5000)."""

OWNER_CUT = 0.18
"""The subnet owner's share of each epoch's emission (dTAO: 18 %)."""

_EPS = 1e-12


@dataclass(frozen=True)
class EpochInputs:
    """Everything one epoch reads, as plain arrays over the subnet's n uids.

    `weights[i]` is validator i's row as stored on chain (any non-negative scale, e.g. u16);
    `stake` in any unit; `last_update` and `registered_at` in blocks; `bonds` the previous
    epoch's bond matrix (n×n, columns sum to 1 or 0), or None for a subnet's first epoch.
    """

    weights: np.ndarray
    stake: np.ndarray
    permit: np.ndarray
    last_update: np.ndarray
    registered_at: np.ndarray
    block: int
    bonds: np.ndarray | None = None
    kappa: float = KAPPA
    bonds_moving_avg: float = BONDS_MOVING_AVG
    bonds_penalty: float = BONDS_PENALTY
    activity_cutoff: int = ACTIVITY_CUTOFF
    emission: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.stake)
        shapes = {
            "weights": (self.weights.shape, (n, n)),
            "permit": (self.permit.shape, (n,)),
            "last_update": (self.last_update.shape, (n,)),
            "registered_at": (self.registered_at.shape, (n,)),
        }
        if self.bonds is not None:
            shapes["bonds"] = (self.bonds.shape, (n, n))
        for name, (got, want) in shapes.items():
            if tuple(got) != want:
                raise ValueError(f"EpochInputs: {name} has shape {tuple(got)}, expected {want}")
        if np.any(self.weights < 0) or np.any(self.stake < 0) or not np.all(np.isfinite(self.weights)):
            raise ValueError("EpochInputs: weights and stake must be finite and non-negative")
        if not 0.0 <= self.kappa <= 1.0 or not 0.0 <= self.bonds_moving_avg <= 1.0:
            raise ValueError("EpochInputs: kappa and bonds_moving_avg must lie in [0, 1]")
        if not 0.0 <= self.bonds_penalty <= 1.0:
            raise ValueError("EpochInputs: bonds_penalty must lie in [0, 1]")


@dataclass(frozen=True)
class EpochResult:
    """One epoch's outputs per uid, as fractions in [0, 1] (emission in the input's unit)."""

    stake: np.ndarray
    consensus: np.ndarray
    incentive: np.ndarray
    dividends: np.ndarray
    trust: np.ndarray
    validator_trust: np.ndarray
    rank: np.ndarray
    emission: np.ndarray
    bonds: np.ndarray

    def as_rows(self) -> list[dict[str, float]]:
        """One dict per uid (without bonds), for storage and reports."""
        names = ("stake", "consensus", "incentive", "dividends", "trust", "validator_trust", "rank", "emission")
        return [{name: float(getattr(self, name)[uid]) for name in names} for uid in range(len(self.stake))]


def normalise(x: np.ndarray) -> np.ndarray:
    """x / Σx, or zeros when the sum is 0."""
    total = float(x.sum())
    return x / total if total > 0 else np.zeros_like(x, dtype=float)


def _normalise_columns(matrix: np.ndarray) -> np.ndarray:
    sums = matrix.sum(axis=0)
    return np.divide(matrix, sums[None, :], out=np.zeros(matrix.shape), where=sums[None, :] > 0)


def _normalise_rows(matrix: np.ndarray) -> np.ndarray:
    return _normalise_columns(matrix.T).T


def consensus(weights: np.ndarray, stake: np.ndarray, kappa: float) -> np.ndarray:
    """C_j = the largest w with Σ_{i: W_ij ≥ w} S_i ≥ κ·Σ S (0 if no stake).

    Only rows with stake vote. Sorting each column's weights in descending order, the answer is
    the first weight at which the cumulative stake reaches κ of the total.
    """
    total = float(stake.sum())
    n_cols = weights.shape[1]
    if total <= 0 or n_cols == 0:
        return np.zeros(n_cols)
    voters = stake > 0
    w = weights[voters]
    s = stake[voters]
    order = np.argsort(-w, axis=0, kind="stable")
    sorted_w = np.take_along_axis(w, order, axis=0)
    cumulative = np.cumsum(s[order], axis=0)
    reached = cumulative >= kappa * total - _EPS * total
    first = reached.argmax(axis=0)
    return sorted_w[first, np.arange(n_cols)]


def epoch(inputs: EpochInputs) -> EpochResult:
    """Run one Yuma epoch (see the module docstring for each step)."""
    n = len(inputs.stake)
    uids = np.arange(n)
    permit = inputs.permit.astype(bool)
    active = inputs.last_update + inputs.activity_cutoff >= inputs.block
    stake = normalise(np.where(permit & active & (inputs.last_update > 0), inputs.stake.astype(float), 0.0))

    weights = inputs.weights.astype(float).copy()
    weights[~permit] = 0.0                        # only permit holders' rows count
    weights[uids, uids] = 0.0                     # no self-weight
    outdated = inputs.registered_at[None, :] > inputs.last_update[:, None]
    weights[outdated] = 0.0                       # set before the target's hotkey registered
    weights = _normalise_rows(weights)

    prerank = stake @ weights
    cons = consensus(weights, stake, inputs.kappa)
    clipped = np.minimum(weights, cons[None, :])
    ranks = stake @ clipped
    trust = np.divide(ranks, prerank, out=np.zeros(n), where=prerank > 0)
    incentive = normalise(ranks)
    validator_trust = clipped.sum(axis=1)

    bond_weights = (1.0 - inputs.bonds_penalty) * weights + inputs.bonds_penalty * clipped
    delta = _normalise_columns(stake[:, None] * bond_weights)
    alpha = 1.0 - inputs.bonds_moving_avg
    previous = inputs.bonds if inputs.bonds is not None else np.zeros((n, n))
    bonds = _normalise_columns(alpha * delta + (1.0 - alpha) * previous)
    dividends = normalise(bonds @ incentive)

    share = inputs.emission * (1.0 - OWNER_CUT) / 2.0
    validator_part = dividends if dividends.sum() > 0 else stake
    emission = share * incentive + share * validator_part
    return EpochResult(
        stake=stake,
        consensus=cons,
        incentive=incentive,
        dividends=dividends,
        trust=trust,
        validator_trust=validator_trust,
        rank=incentive.copy(),
        emission=emission,
        bonds=bonds,
    )


def agreement(a: dict, b: dict) -> float:
    """1 − total variation distance between two weight vectors (each normalised first).

    1.0 means identical shares, 0.0 disjoint support. Keys are uids or hotkeys.
    """
    keys = set(a) | set(b)
    sa, sb = sum(a.values()), sum(b.values())
    if sa <= 0 or sb <= 0:
        return 0.0
    return 1.0 - 0.5 * sum(abs(a.get(k, 0.0) / sa - b.get(k, 0.0) / sb) for k in keys)
