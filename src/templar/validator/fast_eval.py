"""Fast evaluation (paper §3.2) of many peers per window: cheap checks, each failure a named status.

A peer passes when its upload arrived inside the put window, decoded cleanly, is the document it
committed to before any gradient of the window was readable (`uncommitted` otherwise: its document
digest covers every tensor, probes included, and the signed metadata), does not repeat an upload of
an earlier window (`replay`: `templar.validator.replays`), claims the
global_step of the window's base (the θ the run computes the window's update from, `inner.overlap`: a claim is
checked, never adopted; the global_step of the run's other candidate base is `wrong_base`), is in sync with that
base (mean |θ_val − θ_peer| / α over this window's probes ≤ `sync_max_steps`; probes nearer the other candidate
base than this one are `wrong_base`), is not a copy
of an earlier upload by another hotkey, and is not shouting: the L2 norm of its values is at most
`max_norm_ratio` times the median norm of the window's aggregate (the payloads of the peer list in
effect: peers the run chose by their work, so uploads that cost nothing cannot set the yardstick). Only
the upper side is checked: error-feedback buffers grow with a miner's age (up to 1/(1 − decay) = 1000×),
so a new honest miner is quiet. Aggregation normalises every peer, so a rescaled update
cannot move the model, but its sign is an honest peer's; without this check it would be paid like
one while probing for implementations that forget to normalise. Everything else multiplies μ by φ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from templar.comms import GatherResult, GatherStatus
from templar.compress import Compressed
from templar.core.config import GauntletConfig
from templar.gauntlet import (
    FastVerdict,
    Status,
    Upload,
    find_pools,
    fingerprint,
    is_synced,
    shared_positions,
    shares_work,
    sync_steps,
)
from templar.gauntlet.borrowed import AGGREGATE, Reference, aggregate_references, find_borrowed, top_of_mean
from templar.gauntlet.duplicates import PairBaseline, Typical, window_typical
from templar.validator.replays import Sighting
from templar.wire import Gradient, PayloadError


@dataclass
class PoolBaselines:
    """The validator's memory for the pool check: earlier windows' typical pairs on each sample
    (`typical_ceiling_*` caps the first sample's, `confirm_ceiling_*` the second look's: honest
    windows' medians measured on it are cosine ≤ 0.31, shared positions ≤ 0.29, docs/scoring.md §8)."""

    first: PairBaseline
    second: PairBaseline

    @classmethod
    def of(cls, rules: GauntletConfig) -> PoolBaselines:
        """Empty memories under the run's rules (a restarted validator starts with none)."""
        return cls(PairBaseline(Typical(rules.typical_ceiling_cosine, rules.typical_ceiling_shared), rules.pair_history),
                   PairBaseline(Typical(rules.confirm_ceiling_cosine, rules.confirm_ceiling_shared), rules.pair_history))


@dataclass(frozen=True)
class OtherBase:
    """The θ a window's updates are not computed from but a miner could mistake for their base: the
    run's model one window newer or older than the base (what the other overlap mode would compute
    from, docs/scoring.md §2). Its global_step, and its values at the window's probe positions when
    the validator holds it (None: judged by the step alone)."""

    global_step: int
    probes: Mapping[str, torch.Tensor] | None = None


def failure_verdict(res: GatherResult) -> FastVerdict:
    """The verdict on a failed gather: its status, with the payload's stable reason code when the
    bytes were malformed (labelled `malformed:bad_signature`)."""
    reason = res.error.reason if res.status == GatherStatus.MALFORMED and isinstance(res.error, PayloadError) else ""
    return FastVerdict(Status(res.status.value), reason=reason)


def canonical_values(tensors: Mapping[str, Compressed], salt: int, *, tensor_count: int,
                     chunk_count: int) -> dict[str, torch.Tensor]:
    """Position-canonical coefficients of `chunk_count` chunks of `tensor_count` tensors, for copy
    fingerprints (the first sample: the rules' `sample_tensors` × `sample_chunks`).

    Raw top-k value arrays are not canonical (a copier could permute values with their indices);
    scattering them to their positions is, and costs O(chunks·chunk_size) per tensor. Which tensors
    and chunks are used comes from the validator's private `salt`, so a copier cannot know which
    part of a payload to perturb to evade detection.
    """
    g = torch.Generator().manual_seed(salt & 0x7FFF_FFFF_FFFF_FFFF)
    names = sorted(tensors)
    picked = torch.randperm(len(names), generator=g)[:tensor_count].sort().values
    out = {}
    for i in picked.tolist():
        c = tensors[names[i]]
        n_chunks = c.indices.shape[0]
        rows = torch.randperm(n_chunks, generator=g)[:chunk_count].sort().values
        dense = torch.zeros(len(rows), c.plan.chunk_numel, dtype=torch.float32)
        dense.scatter_(1, c.indices[rows].cpu(), c.values[rows].float().cpu())
        out[names[i]] = dense.view(-1)
    return out


def first_sample(tensors: Mapping[str, Compressed], salt: int, rules: GauntletConfig) -> dict[str, torch.Tensor]:
    """The first, cheap sample of a payload every pair of F_t is compared on."""
    return canonical_values(tensors, salt, tensor_count=rules.sample_tensors, chunk_count=rules.sample_chunks)


def probe_sync_steps(own: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor], unit: float, *,
                     ulp_slack: float = 0.0) -> float:
    """`sync_steps` over every probed parameter (names in sorted order)."""
    names = sorted(own)
    mine = torch.cat([own[n].reshape(-1).double() for n in names])
    peer = torch.cat([theirs[n].reshape(-1).double() for n in names])
    return sync_steps(mine, peer, unit, ulp_slack=ulp_slack)


def fast_evaluate(
    results: Mapping[str, GatherResult[Gradient]],
    own_probes: Mapping[str, torch.Tensor],
    unit: float,
    *,
    rules: GauntletConfig,
    salt: int,
    expected_step: int | None = None,
    commitments: Mapping[str, bytes] | None = None,
    replayed: Mapping[str, Sighting] | None = None,
    earlier: Mapping[int, Mapping[str, Gradient]] | None = None,
    baseline: PoolBaselines | None = None,
    other_base: OtherBase | None = None,
    ulp_slack: float = 0.0,
    sizes: TypicalPayloads | None = None,
) -> dict[str, FastVerdict]:
    """A verdict for every gathered peer; pure given the gather results, our probes, the run's
    `rules` (`HParams.gauntlet`: thresholds, samples, margins) and `baseline`.
    `unit`: one outer step's movement at the probed values, the sync score's unit (`sync_steps`): α
    under a rule that moves every coordinate by α, else the measured movement of the step that made
    the base (`templar.validator.base.StepUnits`), with `ulp_slack` (the run's `sync.ulp_slack`) for
    rounding across devices.
    `expected_step`: the global_step of the window's base (the θ its updates are computed from); a
    payload claiming another is `wrong_step`, or `wrong_base` when it is the step of `other_base` (the
    θ the run's other overlap mode would compute from: a miner computing from the wrong model), as is
    a payload whose probes lie nearer `other_base`'s than the base's.
    `commitments`: the document digests read before the window's gradients were readable
    (`templar.comms.commit`; b"": none); a payload whose `Gradient.document_digest` differs is
    `uncommitted`. A peer absent from it (this validator could not start its read in time,
    `validator.commits.WindowCommits`), or None for all, is not judged on it. `replayed`: the
    peers whose gradient repeats an earlier window's upload (`ReplayMemory.observe`), each `replay`.
    `earlier`: public work of earlier windows (window → hotkey → the aggregated payload,
    `validator.public_work`); an upload that copies one of them, or their mean, is `copy`.
    `baseline`: the validator's memory of earlier windows' typical pairs (`PoolBaselines`, which this
    call updates); None judges pools against this window's uploads alone.
    `sizes`: the typical sizes of the window's aggregate as this validator gathered it
    (`typical_payloads`): the scale check's yardstick is the larger; read from fewer than
    `norm_check_min_peers` payloads, or None (a run's first windows), nothing is `scale`."""
    verdicts: dict[str, FastVerdict] = {}
    uploads: list[Upload] = []
    for hotkey, res in results.items():
        if res.status != GatherStatus.OK or res.value is None:
            verdicts[hotkey] = failure_verdict(res)
            continue
        g = res.value
        if commitments is not None and hotkey in commitments and not _committed(commitments[hotkey], g):
            verdicts[hotkey] = FastVerdict(Status.UNCOMMITTED)
            continue
        if replayed and hotkey in replayed:
            verdicts[hotkey] = FastVerdict(Status.REPLAY, copied_from=replayed[hotkey].hotkey)
            continue
        if expected_step is not None and g.global_step != expected_step:
            other = other_base is not None and g.global_step == other_base.global_step
            verdicts[hotkey] = FastVerdict(Status.WRONG_BASE if other else Status.WRONG_STEP)
            continue
        steps = probe_sync_steps(own_probes, g.probes, unit, ulp_slack=ulp_slack)
        if other_base is not None and other_base.probes is not None and \
                probe_sync_steps(other_base.probes, g.probes, unit, ulp_slack=ulp_slack) < steps:
            verdicts[hotkey] = FastVerdict(Status.WRONG_BASE, sync_steps=steps)
            continue
        if not is_synced(steps, rules.sync_max_steps):
            verdicts[hotkey] = FastVerdict(Status.DESYNC, sync_steps=steps)
            continue
        verdicts[hotkey] = FastVerdict(Status.WARMUP if g.warmup else Status.OK, sync_steps=steps)
        if g.warmup:  # earns nothing and is never aggregated: no work to share, and no pool to remember
            continue
        canonical = first_sample(g.tensors, salt, rules)
        uploads.append(Upload(hotkey=hotkey, timestamp=float(res.timestamp or 0.0), digest=g.digest,
                              fingerprint=fingerprint(canonical, size=rules.fingerprint_size), canonical=canonical))
    # A group sharing work is paid as one (the book splits its score, one top-G slot): the earliest
    # upload stands for it and is rated, the others are `copy` (docs/scoring.md §8). Warm-up payloads
    # stay out: every miner's first window starts from fresh error feedback and the same few
    # gradients, so they are alike (whole-payload cosine 0.60-0.72 in an 8-page localnet), and a
    # false pool there would split honest miners' pay for the book's whole pool memory.
    typical = (baseline.first.observe(window_typical(uploads, rules.typical_pair_min_pairs))
               if baseline is not None else None)
    confirm = _SecondLook({hk: results[hk].value for hk in (u.hotkey for u in uploads)}, salt, rules,
                          baseline.second if baseline is not None else None)
    for pool in find_pools(uploads, rules, confirm=confirm, typical=typical):
        first, *rest = pool
        verdicts[first] = replace(verdicts[first], pool=tuple(pool))
        for member in rest:
            verdicts[member] = FastVerdict(Status.COPY, sync_steps=verdicts[member].sync_steps, copied_from=first,
                                           pool=tuple(pool))
    # Work public before this window's commit deadline (docs/scoring.md §8, borrowed work): an
    # upload that copies an earlier window's aggregate or top-G upload earns nothing.
    if earlier:
        references = earlier_references(earlier, salt, rules)
        borrowed = find_borrowed([u for u in uploads if verdicts[u.hotkey].passed], references, rules,
                                 confirm=_second_look_at_references(earlier, confirm, rules))
        for hotkey, ref in borrowed.items():
            verdicts[hotkey] = FastVerdict(Status.COPY, sync_steps=verdicts[hotkey].sync_steps, copied_from=ref.source,
                                           pool=verdicts[hotkey].pool)
    # The scale check protects the aggregate, so it measures against the aggregate's own payloads. The
    # window's uploads cannot be the yardstick: warm-ups and near-zero uploads cost nothing to post, and
    # counted in the median, those of a few hotkeys dragged it down until every honest upload was `scale`.
    earning = {hk: results[hk].value for hk, v in verdicts.items() if v.status.earns}
    yardstick = sizes.larger if sizes is not None and sizes.peers >= rules.norm_check_min_peers else None
    for hotkey in norm_outliers(earning, yardstick, rules.max_norm_ratio):
        verdicts[hotkey] = FastVerdict(Status.SCALE, sync_steps=verdicts[hotkey].sync_steps)
    return verdicts


def _committed(commitment: bytes, g: Gradient) -> bool:
    """Whether the payload is the document committed to (an empty commitment matches nothing)."""
    return bool(commitment) and commitment == g.document_digest


class _SecondLook:
    """`find_pools`' confirmation of a pair that crossed on the first sample: the same rule (and
    the same typical pair) on a larger sample drawn from another private salt (`confirm_tensors` ×
    `confirm_chunks`), each upload's sample made once and only when asked for.

    Why a second look: the first sample is small so that comparing every pair of F_t stays cheap,
    and its figures scatter: honest pairs of a `tiny` localnet reach sampled cosine 0.66 and, one
    window in a few hundred, a single pair crosses 0.8 (a false pool remembered for 720 windows).
    A pool's members share their positions everywhere and cross on any sample; the second look
    costs one larger sample per upload, for flagged pairs only."""

    def __init__(self, payloads: Mapping[str, Gradient], salt: int, rules: GauntletConfig,
                 baseline: PairBaseline | None) -> None:
        self.payloads, self.salt, self.baseline = payloads, salt, baseline
        self.rules = rules
        self.samples: dict[str, tuple[dict[str, torch.Tensor], torch.Tensor]] = {}
        self._typical: Typical | None = None

    @property
    def typical(self) -> Typical:
        """The typical pair on this sample, made when first needed: the median over
        `confirm_typical_uploads` uploads drawn with the salt, through the baseline (None: no
        typical pair, the thresholds alone, as before a baseline existed). Its figures stand on
        another scale than the first sample's (honest pairs: shared positions at most 0.31 on it
        against 0.68)."""
        if self._typical is None:
            if self.baseline is None:
                self._typical = Typical()
            else:
                names = sorted(self.payloads)
                g = torch.Generator().manual_seed((self.salt + 2) & 0x7FFF_FFFF_FFFF_FFFF)
                count = self.rules.confirm_typical_uploads
                drawn = [names[i] for i in torch.randperm(len(names), generator=g)[:count].tolist()]
                uploads = [Upload(hk, 0.0, b"", self.sample(hk)[1], self.sample(hk)[0]) for hk in drawn]
                self._typical = self.baseline.observe(window_typical(uploads, self.rules.typical_pair_min_pairs))
        return self._typical

    def sample(self, hotkey: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if hotkey not in self.samples:
            values = confirm_values(self.payloads[hotkey].tensors, self.salt, self.rules)
            self.samples[hotkey] = (values, fingerprint(values, size=self.rules.fingerprint_size))
        return self.samples[hotkey]

    def __call__(self, a: Upload, b: Upload) -> bool:
        (values_a, print_a), (values_b, print_b) = self.sample(a.hotkey), self.sample(b.hotkey)
        return shares_work(float(print_a @ print_b), shared_positions(values_a, values_b), self.rules, self.typical)


def confirm_values(tensors: Mapping[str, Compressed], salt: int, rules: GauntletConfig) -> dict[str, torch.Tensor]:
    """The second look's larger sample (`confirm_tensors` × `confirm_chunks`, from salt + 1)."""
    return canonical_values(tensors, salt + 1, tensor_count=rules.confirm_tensors, chunk_count=rules.confirm_chunks)


def _layout(payloads: Mapping[str, Gradient]) -> dict[str, tuple[int, int]]:
    """Each tensor's (chunk size, k), from any one payload (the wire fixes both for a run)."""
    for g in payloads.values():
        return {name: (c.plan.chunk_numel, int(c.values.shape[-1])) for name, c in g.tensors.items()}
    return {}


def earlier_references(earlier: Mapping[int, Mapping[str, Gradient]], salt: int,
                       rules: GauntletConfig) -> list[Reference]:
    """The earlier public work as references on this window's sample (`salt`), newest window
    first: each aggregated upload (owned by its hotkey) and the aggregate (`aggregate_references`)."""
    out: list[Reference] = []
    for window in sorted(earlier, reverse=True):
        payloads = {hk: g for hk, g in sorted(earlier[window].items()) if not g.warmup}
        samples = {hk: first_sample(g.tensors, salt, rules) for hk, g in payloads.items()}
        out += [Reference(hk, window, fingerprint(values, size=rules.fingerprint_size), values, frozenset({hk}),
                          payloads[hk].digest)
                for hk, values in samples.items()]
        out += aggregate_references(window, samples, _layout(payloads), size=rules.fingerprint_size)
    return out


def _second_look_at_references(earlier: Mapping[int, Mapping[str, Gradient]], look: _SecondLook,
                               rules: GauntletConfig) -> Callable[[Upload, Reference], bool]:
    """`find_borrowed`'s confirmation: the reference rebuilt on the second look's sample (an upload,
    or the mean of the aggregate's members, which are its owners), each made once and only when
    asked for, judged on the absolute thresholds."""
    members: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    rebuilt: dict[int, tuple[dict[str, torch.Tensor], torch.Tensor]] = {}

    def member(window: int, hotkey: str) -> dict[str, torch.Tensor]:
        if (window, hotkey) not in members:
            members[(window, hotkey)] = confirm_values(earlier[window][hotkey].tensors, look.salt, rules)
        return members[(window, hotkey)]

    def again(ref: Reference) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if id(ref) not in rebuilt:
            if ref.source == AGGREGATE:
                values = top_of_mean([member(ref.window, h) for h in sorted(ref.owners)], _layout(earlier[ref.window]))
            else:
                values = member(ref.window, ref.source)
            rebuilt[id(ref)] = (values, fingerprint(values, size=rules.fingerprint_size))
        return rebuilt[id(ref)]

    def confirm(upload: Upload, ref: Reference) -> bool:
        ref_values, ref_print = again(ref)
        values, print_ = look.sample(upload.hotkey)
        return shares_work(float(print_ @ ref_print), shared_positions(values, ref_values), rules)

    return confirm


def payload_norm(g: Gradient) -> float:
    """‖values‖ of a payload (every tensor), for this validator's own size comparisons (the scale check,
    the typical sizes, the lead's ceiling): each chunk's norm in float32 (at most k squares), the chunks'
    squares summed in float64. The lead sizes every upload of F_t before it publishes its inputs, which
    every node waits for: one 1.2B payload cost 27 ms as a float64 copy of every value against 8 ms
    (benchmarks/performance/payload_size.py), and one float32 norm over a whole tensor drifted by 1e-3.
    A tensor whose squares may have under- or overflowed in float32 (grid values span 2^-128 to 2^128)
    is summed in float64 instead."""
    squares = 0.0
    for c in g.tensors.values():
        values = c.values if c.values.dim() == 2 else c.values.reshape(1, -1)
        square = float(torch.linalg.vector_norm(values, dim=-1).double().square().sum())
        if not 1e-12 < square < 1e36:  # a square under 2^-126 loses bits, one over 2^128 overflows
            square = float(values.double().square().sum())
        squares += square
    return math.sqrt(squares)


class TypicalPayloads(NamedTuple):
    """A window's two typical sizes (`typical_payloads`), each a payload of the window's aggregate."""

    smaller: Gradient  # the aggregate's trial reference: no trial step is larger (`held_to` may hold it lower)
    larger: Gradient  # the scale check's yardstick: a payload is `scale` only beyond both medians
    peers: int  # how many payloads with a norm they were read from

    def held_to(self, drawn: Sequence[Gradient], max_ratio: float) -> Gradient:
        """The payload whose size every trial step of the window is held to: the smaller of the
        aggregate's typical size (`smaller`) and the lower median of the sizes of S_t (`drawn`, this
        validator's private draw), counting only payloads at least 1/`max_ratio` of `larger`.

        Why S_t as well: the aggregate's medians are its peers', and a group that holds more than half
        of the list's slots (ties at the top, or one window's luck) set them to its own louder size,
        was rated above honest work for it and so kept the list: 3 hotkeys sending honest work ×5
        beside 4 honest miners were paid 0.25-0.33 each against 0.05-0.08 over 10 windows
        (benchmarks/LOG.md §62-§63). S_t is drawn with this validator's secret among every earning
        upload, so to set its median a group must be most of the subnet. Why the floor: near-zero
        values cost nothing to post, and hotkeys enough to be most of S_t would otherwise hold every
        trial step to rounding (§59); `max_ratio` is the scale check's own bound, the other way."""
        floor = payload_norm(self.larger) / max_ratio
        sized = ((payload_norm(g), g.hotkey, g) for g in drawn)
        counted = sorted((item for item in sized if item[0] > 0 and item[0] >= floor), key=lambda item: item[:2])
        if not counted:
            return self.smaller
        norm, _, median = counted[(len(counted) - 1) // 2]
        return median if norm < payload_norm(self.smaller) else self.smaller


class TrialSize(NamedTuple):
    """The size a window's trial steps are tried at (`trial_size`)."""

    typical: Gradient | None  # the payload whose size a trial step is held or lifted to; None: each as sent
    as_sent: frozenset[str] = frozenset()  # hotkeys whose upload is tried as it is, whatever `typical` is


def trial_size(sizes: TypicalPayloads | None, drawn: Mapping[str, Gradient], max_ratio: float) -> TrialSize:
    """The size every trial step of a window is tried at (`OuterRule.trial`: held to it, or lifted by up
    to `trial_max_lift`). Where the window has an aggregate (`sizes`), `TypicalPayloads.held_to` of S_t
    (`drawn`, by hotkey). In a run's first scored window, which has none, the lower median by value norm
    of S_t's own payloads with a norm; an upload more than `max_ratio` (the scale check's bound) above it
    is tried as sent, and the median is None when no payload has a norm.

    Why S_t's median in the first window: tried as sent there, two hotkeys sending honest work ×5 beside
    two honest miners took 0.448 each of that window's weight, and the lead it gave them lasted the
    run, 1.2x an honest miner's pay after 6 windows (benchmarks/LOG.md §62, §67). Every trial step tried
    at one size reads each upload's direction alone; S_t is drawn with this validator's secret among
    every upload that passed, so to set its median a group must be most of them, and then every upload,
    honest ones too, is tried at the group's size. Why not beyond `max_ratio`: no later window rates such
    an upload (`scale`), and held to the median an upload of honest work ×10⁴ was rated as honest work in
    the one window without a scale check (0.27 and 0.21 of the weight in the README localnet's first two
    windows at seed 0); and where near-zero uploads are most of S_t, every honest upload is beyond it and
    tried as it is rather than held to rounding."""
    if sizes is not None:
        return TrialSize(sizes.held_to(list(drawn.values()), max_ratio))
    norms = {hotkey: payload_norm(g) for hotkey, g in drawn.items()}
    sized = sorted((norm, hotkey) for hotkey, norm in norms.items() if norm > 0)
    if not sized:
        return TrialSize(None)
    median, hotkey = sized[(len(sized) - 1) // 2]
    return TrialSize(drawn[hotkey], frozenset(hk for hk, norm in norms.items() if norm > max_ratio * median))


def typical_payloads(aggregated: Sequence[Gradient], paid: Mapping[str, float]) -> TypicalPayloads | None:
    """The payloads of a window's typical size: two lower medians, by value norm, of the window's
    aggregate (`aggregated`, the payloads of the peer list in effect), one counting each payload
    alike, one weighting each by its uploader's weight in this validator's score book (`paid`; all
    alike when none of them has any, a new validator's book); None when no payload has a norm.

    Why not the window's uploads: near-zero values cost nothing to post, and uploads from hotkeys
    enough to be half of a window's would set the median (every honest upload `scale`, every trial
    step rounding). Why the aggregate: its peers were chosen by the run for their work, and the
    counted median is the size the outer step clips every payload to (`OuterRule.trial_reference`).
    Why both: each can be moved by someone. The counted one by hotkeys holding half the list's slots
    (fewer honest miners than `top_g`); the weighted one by whoever holds half of the list's pay, as
    a lone paid peer in a new validator's book does, or a miner that shouted in a window without a
    reference and was rated for it. So a trial step is clipped to the smaller (an upload shouting
    above the typical size gains nothing by it: neither median is its alone), or lower still by S_t's
    own (`TypicalPayloads.held_to`: a group may hold both of the list's), and the scale check judges
    against the larger (an honest upload is `scale` only if both were dragged down)."""
    sized = sorted(((payload_norm(g), g) for g in aggregated), key=lambda item: (item[0], item[1].hotkey))
    sized = [(norm, g) for norm, g in sized if norm > 0]
    if not sized:
        return None
    weights = [max(0.0, float(paid.get(g.hotkey, 0.0))) for _, g in sized]
    counted = _lower_median([1.0] * len(sized))
    by_pay = _lower_median(weights) if sum(weights) > 0 else counted
    return TypicalPayloads(smaller=sized[min(counted, by_pay)][1], larger=sized[max(counted, by_pay)][1],
                           peers=len(sized))


def step_ceiling(drawn: Sequence[Gradient], paid: Mapping[str, float]) -> float | None:
    """The lead's ceiling on its window's clip level (`StepInputs.clip_norm`): the lower median, by
    value norm, of the uploads it drew for the window (`drawn`: F_t's, the peer list's among them),
    each weighted by its uploader's weight in this validator's score book (`paid`); None when none of
    them is paid (a run's first windows, a new validator's book): the step then clips to its peers' own
    median, as every step did before.

    Why: every node clips each payload of the step to the lower median of the step's own payloads'
    sizes (`templar.compress.sparseloco.clip_level`), so a group that holds most of the peer list's
    slots, as ties at the top of the PeerScores give one now and then by the validator's draw, sets
    the step's size: 3 hotkeys sending honest work ×5 held 3 of 4 slots in 8 of 27 windows and one
    such step took the held-out loss from 6.28 to 7.46 (benchmarks/LOG.md §63-§64). F_t is drawn with
    the lead's secret among every miner, and weighting by pay counts only uploads the book pays for
    their work (near-zero, flooding or copied uploads earn nothing, so they cannot hold every step
    down): to set this median a group must hold most of the pay among the drawn, most of the subnet.
    The followers take the smaller of it and their own median, so a ceiling can only lower a step."""
    sized = sorted(((payload_norm(g), g.hotkey, max(0.0, float(paid.get(g.hotkey, 0.0)))) for g in drawn),
                   key=lambda item: item[:2])
    sized = [item for item in sized if 0 < item[0] < math.inf and item[2] > 0]
    if not sized:
        return None
    return sized[_lower_median([weight for _, _, weight in sized])][0]


def _lower_median(weights: Sequence[float]) -> int:
    """The index of the weighted lower median of items sorted by size: the first at which the running
    weight reaches half the total."""
    half, running = math.fsum(weights) / 2.0, 0.0
    for index, weight in enumerate(weights):
        running += weight
        if running >= half:
            return index
    return len(weights) - 1


def norm_outliers(payloads: Mapping[str, Gradient], typical: Gradient | None, max_ratio: float) -> list[str]:
    """Peers of `payloads` whose value norm exceeds `max_ratio` times the `typical` payload's
    (`TypicalPayloads.larger`; None, or one without a norm: nothing to judge by)."""
    if typical is None or (reference := payload_norm(typical)) <= 0:
        return []
    return sorted(hk for hk, g in payloads.items() if payload_norm(g) > reference * max_ratio)
