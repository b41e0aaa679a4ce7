"""The Gauntlet formulas (the paper's sections 3.1-3.3 and Algorithm 1) as pure functions.

Units: losses are mean cross-entropy in nats; `lr` is the outer learning rate α_t of the window
being scored; every score is a plain Python float so it serialises exactly. Nothing here touches
a model: the validator computes losses and hands the numbers in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence

import torch


def sync_steps(theta_val: torch.Tensor, theta_peer: torch.Tensor, unit: float, *, ulp_slack: float = 0.0) -> float:
    """SyncScore (paper §3.2): mean |θ_val − θ_peer| over the probed parameter values, in units of
    one outer step's movement there: "how many steps the peer's model is away from ours".

    Under the signed rule every element moves by exactly α per outer step, so `unit` is α (the
    paper's formula). A rule whose step moves a sparse set of coordinates by α times a small value
    (SparseLoCo) would read a model many windows behind as "in sync" in units of α, so its `unit` is
    the mean movement of the step that made θ_val at these very positions (`step_movement`), and
    differences within `ulp_slack` of our value's magnitude (float rounding across devices) count as
    none. A unit of 0 (the step moved none of the probed values) makes any remaining difference
    infinitely far: the peer differs where the run did not move.

    The peer's values are hostile: any non-finite one makes the peer infinitely far away (`+inf`),
    which fails any threshold. Our own values and `unit` are trusted; nonsense there is a bug → ValueError.
    """
    if not unit >= 0 or not math.isfinite(unit):
        raise ValueError(f"sync_steps: unit must be a non-negative finite number, got {unit!r}")
    if theta_val.shape != theta_peer.shape:
        raise ValueError(
            f"sync_steps: shape mismatch, validator {tuple(theta_val.shape)} vs peer {tuple(theta_peer.shape)}"
        )
    if theta_val.numel() == 0:
        raise ValueError("sync_steps: no probed values")
    ours = theta_val.detach().to(device="cpu", dtype=torch.float64)
    theirs = theta_peer.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(ours).all()):
        raise ValueError("sync_steps: the validator's own probe values are not finite")
    if not bool(torch.isfinite(theirs).all()):
        return math.inf
    apart = (ours - theirs).abs()
    if ulp_slack > 0:
        apart = torch.where(apart <= ours.abs() * ulp_slack, torch.zeros_like(apart), apart)
    distance = float(apart.mean().item())
    if unit == 0:
        return 0.0 if distance == 0 else math.inf
    return distance / unit


def step_movement(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> float:
    """One outer step's mean movement |θ_after − θ_before| at a window's probed values (per
    parameter, as `collect_probes` returns them; names in sorted order, float64): the unit of the
    sync score under a rule that does not move every coordinate by α. A pure function of two sets
    of θ values that every node kind reads bit-identically, so any two honest validators measure
    the same unit."""
    if sorted(before) != sorted(after) or not before:
        raise ValueError("step_movement: the probes before and after the step name different parameters")
    moved = [(after[n].double() - before[n].double()).abs().reshape(-1) for n in sorted(before)]
    return float(torch.cat(moved).mean().item())


def is_synced(steps: float, max_steps: float) -> bool:
    """The sync filter: within `max_steps` (paper: 3) of the validator's model. NaN never passes."""
    return steps <= max_steps


def loss_score(loss_before: float, loss_after: float) -> float:
    """LossScore (paper eq. 2): L(θ_t, D) − L(θ_t − β·sign(Δ_p), D); positive = the update helped.

    `loss_before` is the validator's own model and must be finite. `loss_after` depends on the
    peer's update: if that update makes the loss non-finite the peer broke the model, and the
    score is `-inf` (worst possible, never NaN) so it ranks last and earns no proof-of-computation
    credit (see `update_mu`).
    """
    if not math.isfinite(loss_before):
        raise ValueError(f"loss_score: baseline loss must be finite, got {loss_before!r}")
    if not math.isfinite(loss_after):
        return -math.inf
    return loss_before - loss_after


def _sign(x: float) -> float:
    return 1.0 if x > 0 else -1.0 if x < 0 else 0.0


def _direction(delta_assigned: float, delta_rand: float, margin: float, scale: float) -> float:
    """One comparison of δ_assigned with δ_rand in [−1, 1] (the soft sign of `update_mu`)."""
    if math.isnan(delta_assigned):
        raise ValueError("NaN LossScore (loss_score never produces NaN; this is a caller bug)")
    if not (math.isfinite(delta_assigned) and math.isfinite(delta_rand)):
        return -1.0
    gap = delta_assigned - delta_rand
    zone = margin * max((abs(delta_assigned) + abs(delta_rand)) / 2.0, scale)
    if zone > 0:
        excess = (abs(gap) - zone / 2.0) / (zone / 2.0)
        return math.copysign(min(1.0, excess), gap) if excess > 0 else 0.0
    return _sign(gap)


def page_credit(page_deltas: Sequence[float], delta_rand: float, margin: float = 0.0, scale: float = 0.0) -> float:
    """Proof-of-computation credit of one evaluation, page by page: the mean of each evaluated
    assigned page's own comparison with δ_rand (docs/scoring.md §4).

    The mean δ over the assigned pages hid an untrained page: a peer that trained hard on one of
    its two pages still showed a clear mean gap and drew the full +1. Judged separately, a trained
    page earns its +1 and an untrained one earns nothing on average (a coin flip with margin 0,
    about 0 with a margin), so the credit scales with the share of pages trained. With one
    evaluated page (production) this is exactly the paper's sign.
    """
    if not page_deltas:
        raise ValueError("page_credit: no pages")
    return math.fsum(_direction(d, delta_rand, margin, scale) for d in page_deltas) / len(page_deltas)


def window_gap(gaps: Sequence[float]) -> float | None:
    """One window's own median of S_t's gaps δ_assigned − δ_rand (each peer's mean over its
    evaluated pages, `proof_gap`); None when no gap is finite."""
    finite = sorted(g for g in gaps if math.isfinite(g))
    return statistics.median(finite) if finite else None


def typical_gap(own: float | None, earlier: Sequence[float], scale: float, *, floor: float, history: int,
                resolution: float) -> float:
    """The typical proof-of-computation gap a window's credits are measured against: the median of
    this window's own median gap (`window_gap`) and the earlier windows' (at most `history` in
    all: the rules' `proof_gap_history`), never below `floor` × `scale` (`proof_gap_floor` × the
    window's median LossScore size, `window_loss_scale`) nor below `resolution` (`proof_gap_resolution`,
    nats). 0.0 when none gives a positive size.

    Why a history: S_t holds a handful of peers (8 of 256 in production), so one window's median
    moves with whoever was drawn, and a window that cheats happen to fill would set the scale every
    gap in it is judged by; the median over 16 windows moves only when most of them move, and lags
    the slow shrinking of honest gaps over a run by a few windows (about 10 minutes). Why a floor:
    where most of S_t shows no gap (a window full of page-skippers) the median gap is noise, and
    dividing by noise would turn noise into full credit (honest gaps on `micro`: 5–20 % of the
    scale with H = 2 inner AdamW steps, 30–60 % with the paper's one SGD step). Why an absolute
    floor too: where most of S_t posts updates too small to move the loss (near-zero values cost
    nothing), its LossScores are float32 rounding (1e-8 to 1e-6 nats) and so is the relative floor;
    measured against it, rounding earned the credit of honest work."""
    if history < 1:
        raise ValueError(f"typical_gap: history must be >= 1, got {history}")
    recent = earlier[max(0, len(earlier) - (history - 1)):]
    medians = [g for g in (*recent, own) if g is not None and math.isfinite(g)]
    median = statistics.median(medians) if medians else 0.0
    return max(median, floor * scale, resolution, 0.0)


def size_credit(deltas: Sequence[float], delta_rand: float, typical: float) -> float:
    """Proof-of-computation credit by size: the mean over the evaluated assigned sequences (or
    pages) of clip((δ − δ_rand) / typical, −1, 1), `typical` being the window's `typical_gap`
    (times `proof_full_gap`).

    A sign pays an update that helps a quarter of a page's sequences as much as one that helps all
    of them; the size of each sequence's gap does not. Each sequence is clipped on its own, so a
    miner that trained hard on a quarter of them (its inner optimiser normalises the step, so those
    few are fitted several times harder than an honest miner's) still earns about a quarter: its
    trained sequences count at most 1 each, the others about 0. Every sequence of the page is
    measured, so a miner cannot know which of them count. A typical honest sequence earns 1; a
    non-finite δ counts −1 (the update broke the model). `typical` ≤ 0 (no scale in this window)
    falls back to the sign."""
    if not deltas:
        raise ValueError("size_credit: no pages")
    if any(math.isnan(d) for d in deltas) or math.isnan(delta_rand):
        raise ValueError("size_credit: NaN LossScore (loss_score never produces NaN; this is a caller bug)")
    total = 0.0
    for delta in deltas:
        if not (math.isfinite(delta) and math.isfinite(delta_rand)):
            total += -1.0
        elif typical > 0:
            total += max(-1.0, min(1.0, (delta - delta_rand) / typical))
        else:
            total += _sign(delta - delta_rand)
    return total / len(deltas)


def evaluation_credit(units: Sequence[float], delta_rand: float, typical: float, declared_units: int = 0,
                      declared_share: float | None = None) -> float:
    """An evaluation's size credit (`size_credit`). With `declared_share` (`gauntlet.class_credit_weights`
    "work": K / (A + K) of a peer that declared K pages beyond its A assigned ones), the units of its
    declared pages (the last `declared_units`) and of its assigned ones are each a class weighed by its
    share of the work, not by how many units were read of it: read in proportion, one declared page is
    as many units as the assigned pages together, and a miner declaring one page and leaving half its
    assigned pages untrained was paid as if it had trained most of them."""
    split = len(units) - max(0, min(declared_units, len(units)))
    if declared_share is None or split in (0, len(units)):
        return size_credit(units, delta_rand, typical)
    return ((1.0 - declared_share) * size_credit(units[:split], delta_rand, typical)
            + declared_share * size_credit(units[split:], delta_rand, typical))


def proof_gap(delta_assigned: float, delta_rand: float, pages: Sequence[float] | None) -> float:
    """A peer's gap δ_assigned − δ_rand (its pages' mean when it has them), for `typical_gap`."""
    if pages:
        return math.fsum(pages) / len(pages) - delta_rand
    return delta_assigned - delta_rand


def update_mu(
    mu: float, delta_assigned: float, delta_rand: float, gamma: float, margin: float = 0.0, scale: float = 0.0,
    pages: Sequence[float] | None = None, typical: float | None = None, sequences: Sequence[float] | None = None,
    multiple: float = 1.0, declared_units: int = 0, declared_share: float | None = None,
) -> float:
    """Proof of computation (paper eq. 3): μ ← γμ + (1−γ)·sign(δ_assigned − δ_rand).

    A peer that trained on its assigned pages improves the loss there more than on random pages,
    so μ drifts towards +1; a peer that ignores its assignment drifts to ≤ 0. A non-finite δ
    (the update broke the model on one of the sets, `loss_score` returned -inf) counts as −1:
    a destructive update never earns credit, and `-inf − -inf = NaN` never reaches the EMA.

    `margin` (beyond the paper, 0 reproduces it) widens the sign into a soft threshold. With
    zone = `margin`·(|δa| + |δr|)/2: a gap within zone/2 counts 0, a gap beyond the zone counts
    ±1, and in between the credit rises linearly. A peer that trained on other data has δa ≈ δr
    up to evaluation noise; with a bare sign it still earns +1 half of the time and its μ
    random-walks to positive values, while noise-sized gaps here earn nothing and μ decays
    towards 0. Honest gaps lie beyond the zone. A peer that trains on its assigned pages *and*
    on extra data has a smaller relative gap (its update is diluted, not absent), so it earns
    partial credit where a hard dead zone (0 inside the zone, ±1 outside) gave it none and
    punished exactly the extra work the subnet pays for.

    `scale` (≥ 0) is the window's typical LossScore (the validator passes the median of
    (|δa| + |δr|)/2 over S_t); the zone uses the larger of it and the peer's own. A peer whose
    update barely moves the loss (noise, a zero update) has tiny δs, so its own scale would turn
    pure noise into "large" relative gaps; against the window's scale those gaps earn nothing.
    Taking the larger keeps a window of such peers from shrinking everyone's zone.

    `pages` (beyond the paper): the δ of each evaluated assigned page; when given, the credit is
    `page_credit` (each page compared with δ_rand on its own) instead of the mean's comparison.

    `typical` (beyond the paper; `gauntlet.proof_credit` "size"): the window's `typical_gap`. When
    given, the credit is `size_credit` (each sequence's gap relative to the typical one, `sequences`;
    each page's without them) and `margin` plays no part: credit by size needs no dead zone, noise-sized gaps earn noise-sized credit.

    `multiple` (with `typical`): the size credit is multiplied by it, at most ±1: the work beyond the
    assigned that the peer's declared pages are shown to hold (`extra_work.trained_multiple`), whose
    share of the update's bounded trial step each page's gap was diluted by.
    """
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"update_mu: gamma must be in [0, 1), got {gamma!r}")
    if not margin >= 0.0:
        raise ValueError(f"update_mu: margin must be >= 0, got {margin!r}")
    if not 0.0 <= scale < math.inf:
        raise ValueError(f"update_mu: scale must be finite and >= 0, got {scale!r}")
    if math.isnan(mu) or math.isnan(delta_assigned) or math.isnan(delta_rand):
        raise ValueError("update_mu: NaN input (loss_score never produces NaN; this is a caller bug)")
    if typical is not None:
        credit = evaluation_credit(sequences or pages or (delta_assigned,), delta_rand, typical,
                                   declared_units, declared_share)
        direction = max(-1.0, min(1.0, credit * multiple)) if credit > 0 else credit
    elif pages:
        direction = page_credit(pages, delta_rand, margin, scale)
    else:
        direction = _direction(delta_assigned, delta_rand, margin, scale)
    return gamma * mu + (1.0 - gamma) * direction


def ramped_mu(mu: float, evaluations: int, gamma: float, prior_evals: float | None) -> float:
    """μ as PeerScore reads it: the EMA divided by the weight it has accumulated so far.

    μ starts at 0, so after n evaluations it carries only 1 − γⁿ of its full weight: with
    γ = 0.9 an honest newcomer reads 0.1 after one evaluation and 0.65 after ten, whatever it
    proved. Dividing by 1 − γ^(n + k) removes that start-up bias except for k pseudo-evaluations
    of prior doubt (k = `prior_evals`): k = 0 is the full bias correction (one +1 reads 1.0),
    large k is the paper's μ, None turns the ramp off. The stored μ (eq. 3) is unchanged; the
    result is clipped to [−1, 1].
    """
    if prior_evals is None:
        return mu
    if not prior_evals >= 0 or not 0.0 <= gamma < 1.0 or evaluations < 0:
        raise ValueError(f"ramped_mu: need prior_evals >= 0, 0 <= gamma < 1, evaluations >= 0, "
                         f"got {prior_evals!r}, {gamma!r}, {evaluations!r}")
    accumulated = 1.0 - gamma ** (evaluations + prior_evals)
    if accumulated <= 0.0:
        return 0.0
    return max(-1.0, min(1.0, mu / accumulated))


def penalise(mu: float, phi: float) -> float:
    """Fast-evaluation penalty (paper §3.2): μ ← φ·μ with φ = 0.75 on any failed check.

    For a negative μ this moves μ *towards* zero (−0.4 → −0.3): the paper's multiplicative
    penalty is only a penalty for μ > 0. A failing peer with μ < 0 still cannot profit, because
    `peer_score` floors μ at 0: its score is 0 before and after, and it must first earn a positive
    μ through primary evaluations, which the penalty then shrinks again.
    """
    if not 0.0 < phi <= 1.0:
        raise ValueError(f"penalise: phi must be in (0, 1], got {phi!r}")
    return phi * mu


def peer_score(mu: float, rating: float) -> float:
    """PeerScore (paper eq. 4) = μ_p · LossRating_p, with both factors floored at 0.

    The paper multiplies the raw values, so a lazy peer (μ < 0) with a poor rating (< 0) would
    score positive; flooring each factor closes that exploit. NaN factors count as 0.
    """
    return (mu if mu > 0 else 0.0) * (rating if rating > 0 else 0.0)


def normalise(scores: Mapping[str, float], power: float, floor: float | None = None) -> dict[str, float]:
    """Incentive normalisation (paper eq. 5): x_p = (s_p − m)^c / Σ_k (s_k − m)^c.

    With `floor=None`, m = min(s) exactly as in the paper, so the lowest scorer always gets 0
    and a lone peer (or any all-equal set) gets 0 too. With a `floor`, m = min(min(s), floor):
    PeerScores are ≥ 0 by construction, so `floor=0.0` anchors the baseline at "no merit" and
    stops an honest but weakest peer from being zeroed just because no worse peer is registered.
    All-equal or empty input returns all zeros (no division by zero); otherwise the values sum
    to 1 (up to rounding). Summation runs in hotkey order with `math.fsum`, so the result does
    not depend on the mapping's order.
    """
    if not power > 0 or not math.isfinite(power):
        raise ValueError(f"normalise: power must be positive and finite, got {power!r}")
    if not scores:
        return {}
    for hotkey, value in scores.items():
        if not math.isfinite(value):
            raise ValueError(f"normalise: score of {hotkey} is not finite ({value!r})")
    base = min(scores.values())
    if floor is not None:
        base = min(base, floor)
    powered = {hotkey: (scores[hotkey] - base) ** power for hotkey in sorted(scores)}
    total = math.fsum(powered.values())
    if total <= 0.0:
        return dict.fromkeys(powered, 0.0)
    return {hotkey: value / total for hotkey, value in powered.items()}


def top_g(x: Mapping[str, float], g: int, min_share: float = 0.0, *,
          ties: Callable[[str], bytes] | None = None) -> list[str]:
    """SelectTopG (Algorithm 1, eq. 6): the `g` highest x, only x > 0 and at least `min_share` of the
    highest (the rules' `top_g_min_share`), ties by `ties` (a keyed draw, `selection_priority`; lower
    first), then by hotkey string.

    Deterministic on every machine, so miners and validators that hold the same x agree. Why a draw
    for ties: equal PeerScores are common (credits that honest work saturates, a new book), and by
    hotkey string alone a key ground for a small prefix won every tie; a group that took most of
    the list that way set its own trial steps' size (benchmarks/LOG.md §63). Why a least
    share: the list is the work the run applies, and the aggregate clips every peer to the lower median
    of its peers' sizes. On a subnet with fewer honest miners than `g`, hotkeys that post near-zero
    values score by rounding alone (PeerScores of 1e-10 to 1e-5 against honest 20) and filled the
    rest of the list; half of it theirs, every step was clipped to their size and the model stood still.
    """
    if g < 0:
        raise ValueError(f"top_g: g must be non-negative, got {g}")
    if not 0.0 <= min_share < 1.0:
        raise ValueError(f"top_g: min_share must be in [0, 1), got {min_share!r}")
    best = max(x.values(), default=0.0)
    eligible = [hotkey for hotkey, value in x.items() if value > 0 and value >= min_share * best]
    eligible.sort(key=lambda hotkey: (-x[hotkey], ties(hotkey) if ties is not None else b"", hotkey))
    return eligible[:g]
