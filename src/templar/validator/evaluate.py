"""LossScore evaluation (paper §3.1) without copying the model per peer.

θ_t is saved once per window; each peer's trial step θ' = θ_t − β·sign(Δ_p) is applied in place,
evaluated, and undone by copying the saved values back (exact, unlike subtracting the step back
in floating point). The losses at θ_t of every evaluated peer's pages and of the random pages are
computed in one batched pass, shared by all peers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from templar.gauntlet.baseline import baseline_groups, common_gains, others_gains, unit_adjustments
from templar.runtime.train import sequence_losses

if TYPE_CHECKING:
    from templar.core.config import HParams


@dataclass(frozen=True)
class LossScores:
    """δ = L(θ_t, D) − L(θ', D): positive when the peer's update helps on D."""

    loss_assigned_before: float
    loss_assigned_after: float
    loss_rand_before: float
    loss_rand_after: float
    page_deltas: tuple[float, ...] = ()
    """δ of each evaluated assigned page on its own (proof of computation credits pages separately)."""
    sequence_deltas: tuple[float, ...] = ()
    """δ of each position range of each evaluated assigned sequence (`position_ranges` per sequence,
    sequence after sequence, page after page): the units the proof of computation by size clips."""
    random_deltas: tuple[float, ...] = ()
    """δ of each position range of each random sequence (laid out like `sequence_deltas`): what a unit
    nobody trained shows under this trial step, its scatter the evaluation's noise per unit."""
    declared_units: int = 0
    """How many of `sequence_deltas` (the last ones) belong to pages the peer declared beyond its
    assigned ones (set by the validator, which knows which pages it drew; `gauntlet.extra_work`)."""

    @property
    def delta_assigned(self) -> float:
        return trial_delta(self.loss_assigned_before, self.loss_assigned_after)

    @property
    def delta_rand(self) -> float:
        return trial_delta(self.loss_rand_before, self.loss_rand_after)


def trial_delta(before: float, after: float) -> float:
    """δ = `before` − `after`, or −inf when the peer's trial step made the loss non-finite (the update
    broke the model), as `gauntlet.loss_score` and the units (`sequence_deltas`) read it. A step that
    overflows the model's activations gives a NaN loss, and a NaN δ made the window's scoring raise
    (`ScoreBook.record_primary` refuses NaN): one peer's payload stopped every peer's scoring. Our own
    `before` is not the peer's to break; a non-finite one is left to show (a bug of ours)."""
    return before - after if math.isfinite(after) or not math.isfinite(before) else -math.inf


def page_deltas(before: torch.Tensor, after: torch.Tensor, page_sequences: int | None) -> tuple[float, ...]:
    """δ of each page (consecutive runs of `page_sequences` per-sequence losses); a non-finite δ
    (the update broke the model there) is −inf, as in `gauntlet.loss_score`."""
    if not page_sequences or before.numel() % page_sequences:
        return ()
    deltas = (before.reshape(-1, page_sequences).mean(1) - after.reshape(-1, page_sequences).mean(1)).tolist()
    return tuple(d if math.isfinite(d) else -math.inf for d in deltas)


def sequence_deltas(before: torch.Tensor, after: torch.Tensor) -> tuple[float, ...]:
    """δ of each sequence (or of each of its position ranges, row after row); a non-finite δ is
    −inf, as in `gauntlet.loss_score`."""
    return tuple(d if math.isfinite(d) else -math.inf for d in (before - after).flatten().tolist())


def read_sequences(batch: torch.Tensor, chosen: list[list[int]]) -> torch.Tensor:
    """The rows of `batch` (its pages' sequences, page after page) that `chosen` names page by page
    (`gauntlet.select_eval_sequences`); the batch as it is when it does not hold whole pages (empty:
    a page the data bucket could not serve) or when every sequence is chosen."""
    pages = len(chosen)
    if not pages or batch.size(0) == 0 or batch.size(0) % pages:
        return batch
    per_page = batch.size(0) // pages
    rows = [page * per_page + i for page, picked in enumerate(chosen) for i in picked if 0 <= i < per_page]
    return batch[rows] if len(rows) < batch.size(0) else batch


def range_weights(tokens: int, ranges: int) -> torch.Tensor:
    """The share of a sequence's `tokens` predicted positions in each of its `ranges` position ranges
    (as `position_range_means` splits them): the weights that make the ranges' means its mean."""
    sizes = [len(part) for part in torch.arange(tokens).tensor_split(ranges)]
    return torch.tensor(sizes, dtype=torch.float64) / tokens


class Evaluator:
    """Evaluates many peers' updates against one fixed θ_t.

    `position_ranges` (the rules' `gauntlet.position_ranges`): how many consecutive position ranges
    of each assigned sequence the proof of computation by size measures and clips one by one.
    Clipping whole sequences stops a miner that trains a quarter of the sequences (`thin`), not one
    that trains the first quarter of every sequence's tokens (`short`: 1.45× an honest miner's pay
    per unit of compute on `micro`, benchmarks/LOG.md §8): each of its sequences still showed a
    typical gap. Four ranges give its untrained three quarters their own, empty, measurement; more
    would make each unit's δ noisier.

    `baseline` (the rules' `gauntlet.proof_baseline`; `evaluator_rules`): "random" reports each
    unit's δ as measured, to be judged against δ_rand; "groups" applies the mean trial step of each
    of `baseline_groups` groups of the window's peers once more, over every unit, and "others"
    applies every peer's own step over every unit (its own pass included) and reads each peer's
    baseline from the other peers' gains; both report each unit's δ less its share of the generic
    gain (`templar.gauntlet.baseline`): a unit that any step improves much no longer looks trained,
    nor one that steps barely move untrained. Left out, "groups" when `baseline_groups` > 0."""

    def __init__(self, model: torch.nn.Module, micro_batch_size: int, *, position_ranges: int,
                 baseline_groups: int = 0, baseline: str | None = None, baseline_min_others: int = 3,
                 baseline_clip: float = 4.0, baseline_resolution: float = 0.0):
        self.model = model
        self.micro_batch_size = micro_batch_size
        self.position_ranges = position_ranges
        self.baseline_groups = baseline_groups
        self.baseline = baseline or ("groups" if baseline_groups > 0 else "random")
        if self.baseline not in ("random", "groups", "others"):
            raise ValueError(f"Evaluator: unknown baseline {self.baseline!r}")
        self.baseline_min_others = baseline_min_others
        self.baseline_clip = baseline_clip
        self.baseline_resolution = baseline_resolution
        self._params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._saved: dict[str, torch.Tensor] = {}

    def snapshot(self) -> None:
        """Remember θ_t; call once per window before the first trial step."""
        self._saved = {n: p.detach().clone() for n, p in self._params.items()}

    @contextmanager
    def stepped(self, signs: dict[str, torch.Tensor], beta: float, *, fractional: bool = False) -> Iterator[None]:
        """Temporarily hold θ' = θ_t − β·sign inside the block (`fractional`: the step is a mean
        of trial steps, whose values a sign's int8 cannot carry; it matters to the sharded evaluator)."""
        if not self._saved:
            raise RuntimeError("Evaluator.snapshot() must run before a trial step")
        try:
            with torch.no_grad():
                for name, p in self._params.items():
                    sign = signs.get(name)
                    if sign is not None:
                        p.sub_(sign.to(p.device, p.dtype), alpha=beta)
            yield
        finally:
            with torch.no_grad():
                for name, p in self._params.items():
                    p.copy_(self._saved[name])

    def losses(self, batch: torch.Tensor, ranges: int = 1) -> torch.Tensor:
        return sequence_losses(self.model, batch, self.micro_batch_size, ranges)

    def score_peers(
        self,
        signs_by_peer: Mapping[str, dict[str, torch.Tensor]],
        assigned: dict[str, torch.Tensor],
        random_batch: torch.Tensor,
        beta: float,
        page_sequences: int | None = None,
    ) -> dict[str, LossScores]:
        """LossScores of every peer: one shared baseline pass, then one pass per peer.

        `page_sequences`: sequences per page; when given, each assigned page's δ is also reported
        on its own (`LossScores.page_deltas`), so an untrained page cannot hide in the mean.
        """
        # A page the data bucket could not serve leaves an empty batch: no score beats a made-up one.
        peers = sorted(p for p in signs_by_peer if assigned[p].size(0) > 0)
        if not peers or random_batch.size(0) == 0:
            return {}
        self.snapshot()
        n_rand = random_batch.size(0)
        sizes = [assigned[p].size(0) for p in peers]
        ranges = min(self.position_ranges, random_batch.size(1) - 1)
        weights = range_weights(random_batch.size(1) - 1, ranges)
        everything = torch.cat([random_batch, *(assigned[p] for p in peers)])
        before_ranges = self.losses(everything, ranges)
        before = before_ranges @ weights if ranges > 1 else before_ranges
        rand_before = float(before[:n_rand].mean())
        assigned_before = dict(zip(peers, torch.split(before[n_rand:], sizes), strict=True))
        assigned_before_ranges = dict(zip(peers, torch.split(before_ranges[n_rand:], sizes), strict=True))
        common = self._common_gains(signs_by_peer, peers, everything, before_ranges, beta, ranges)
        own_common = dict(zip(peers, torch.split(common[n_rand:], sizes), strict=True)) if common is not None else {}
        after_everything = self._every_peers_pass(signs_by_peer, peers, everything, beta, ranges)
        if after_everything is not None:  # a peer's rows of every unit: the random ones, then its own
            starts = dict(zip(peers, (n_rand + sum(sizes[:i]) for i in range(len(peers))), strict=True))
            rows = {p: torch.cat([torch.arange(n_rand), torch.arange(starts[p], starts[p] + assigned[p].size(0))])
                    for p in peers}
        random_units = before_ranges[:n_rand].numel()
        out: dict[str, LossScores] = {}
        for peer in peers:
            if after_everything is not None:
                after_ranges = after_everything[peer][rows[peer]]
            else:
                with self.stepped(signs_by_peer[peer], beta):
                    after_ranges = self.losses(torch.cat([random_batch, assigned[peer]]), ranges)
            after = after_ranges @ weights if ranges > 1 else after_ranges
            proof_after = after_ranges  # what the proof reads: δ less each unit's share of the generic gain
            unit_common: list[float] | None = None
            if common is not None:
                unit_common = torch.cat([common[:n_rand], own_common[peer]]).flatten().tolist()
            elif after_everything is not None:
                mine = before_ranges[rows[peer]]
                unit_common = others_gains({p: (mine - a[rows[peer]]).flatten().tolist()
                                            for p, a in after_everything.items()}, peer,
                                           random_units, self.baseline_min_others, self.baseline_clip,
                                           self.baseline_resolution)
            if unit_common is not None:
                adjust = unit_adjustments((before_ranges[:n_rand] - after_ranges[:n_rand]).flatten().tolist(),
                                          unit_common[:random_units], unit_common)
                if adjust is not None:
                    proof_after = after_ranges + torch.tensor(adjust, dtype=after_ranges.dtype).view_as(after_ranges)
            proof_seq = proof_after @ weights if ranges > 1 else proof_after
            out[peer] = LossScores(
                loss_assigned_before=float(assigned_before[peer].mean()),
                loss_assigned_after=float(after[n_rand:].mean()),
                loss_rand_before=rand_before,
                loss_rand_after=float(after[:n_rand].mean()),
                page_deltas=page_deltas(assigned_before[peer], proof_seq[n_rand:], page_sequences),
                sequence_deltas=sequence_deltas(assigned_before_ranges[peer], proof_after[n_rand:]),
                random_deltas=sequence_deltas(before_ranges[:n_rand], proof_after[:n_rand]),
            )
        return out

    def _every_peers_pass(self, signs_by_peer: Mapping[str, dict[str, torch.Tensor]], peers: list[str],
                          everything: torch.Tensor, beta: float, ranges: int) -> dict[str, torch.Tensor] | None:
        """Under baseline "others": each peer's losses over every unit of the window (the random
        pages and every evaluated peer's pages) after its own trial step, which serve as its own
        trial pass and as the other peers' baselines; None under any other baseline."""
        if self.baseline != "others":
            return None
        out = {}
        for peer in peers:
            with self.stepped(signs_by_peer[peer], beta):
                out[peer] = self.losses(everything, ranges)
        return out

    def _common_gains(self, signs_by_peer: Mapping[str, dict[str, torch.Tensor]], peers: list[str],
                      everything: torch.Tensor, before_ranges: torch.Tensor, beta: float,
                      ranges: int) -> torch.Tensor | None:
        """Every unit's gain under the window's common steps (`gauntlet.baseline.common_gains`),
        laid out like `before_ranges`; None when the baseline is off or S_t too small for it."""
        groups = baseline_groups(peers, self.baseline_groups) if self.baseline == "groups" else []
        if not groups:
            return None
        gains = []
        for group in groups:
            with self.stepped(mean_step([signs_by_peer[p] for p in group]), beta, fractional=True):
                gains.append((before_ranges - self.losses(everything, ranges)).flatten().tolist())
        return torch.tensor(common_gains(gains), dtype=before_ranges.dtype).view_as(before_ranges)


def evaluator_rules(hp: HParams) -> dict[str, Any]:
    """The run's rules an `Evaluator` applies, as its keyword arguments: every evaluator a node
    builds (one process or sharded, θ_t's or a delayed run's base) is built from these."""
    g = hp.gauntlet
    return {"position_ranges": g.position_ranges, "baseline": g.proof_baseline,
            "baseline_groups": g.proof_baseline_groups, "baseline_min_others": g.proof_baseline_min_others,
            "baseline_clip": g.proof_baseline_clip, "baseline_resolution": g.proof_gap_resolution}


def mean_step(steps: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of several trial steps, parameter by parameter (a parameter missing from a step
    counts as zero there); {} on a rank that holds no steps (the sharded evaluator's followers)."""
    names = sorted({name for step in steps for name in step})
    return {name: sum(step[name].float() for step in steps if name in step) / len(steps) for name in names}
