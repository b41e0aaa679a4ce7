"""ScoreBook: the validator's per-hotkey Gauntlet state, persisted so a kill -9 loses nothing.

The book is state only: every method that scores takes the run's rules (`HParams.gauntlet`, a
`GauntletConfig`) as its first argument, so two books holding the same records score alike under
the same rules, and no rule is remembered in the book or read from a module constant.

The book is keyed by hotkey, not uid: uids are recycled when a hotkey deregisters, and a new
hotkey on an old uid must never inherit its predecessor's μ or rating. Its records and its file's
schema are `templar.gauntlet.records`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from pydantic import ValidationError

from templar.core.atomic import atomic_write
from templar.core.config import GauntletConfig
from templar.core.strict import HISTORY_LIMIT
from templar.core.verdicts import Status
from templar.gauntlet.duplicates import one_per_pool
from templar.gauntlet.extra_work import (
    class_credits,
    declared_share,
    dilution_multiple,
    ema_mean,
    floored_level,
    paid_level,
    trained_multiple,
    update_class,
    update_declared,
    work_factor,
)
from templar.gauntlet.rating import (
    rate_match,
    relative_loss_scores,
    relative_rating,
    relative_spread,
    update_relative,
    without_premium,
)
from templar.gauntlet.records import MAX_POOL, BookFile, PeerRecord, PrimaryResult, ScoreBookError
from templar.gauntlet.saturation import evaluated_band, penalised_read, saturated_mu, unramped_mu
from templar.gauntlet.scores import (
    normalise,
    peer_score,
    penalise,
    proof_gap,
    ramped_mu,
    typical_gap,
    update_mu,
    window_gap,
)
from templar.gauntlet.scores import top_g as select_top_g

__all__ = ["PeerRecord", "PrimaryResult", "ScoreBook", "ScoreBookError", "window_loss_scale"]


def window_loss_scale(results: Iterable[PrimaryResult]) -> float:
    """Median of (|δ_assigned| + |δ_rand|)/2 over a window's finite results (0.0 if none)."""
    sizes = [
        (abs(r.delta_assigned) + abs(r.delta_rand)) / 2.0
        for r in results
        if math.isfinite(r.delta_assigned) and math.isfinite(r.delta_rand)
    ]
    return statistics.median(sizes) if sizes else 0.0


class ScoreBook:
    """Per-hotkey Gauntlet state plus the window-level updates of Algorithm 1."""

    def __init__(self, peers: Mapping[str, PeerRecord] | None = None, relative_noise: tuple[float, int] = (0.0, 0),
                 proof_gaps: Iterable[tuple[int | None, float]] = ()) -> None:
        self._peers: dict[str, PeerRecord] = dict(peers or {})
        self.relative_noise: tuple[float, int] = relative_noise
        """(one evaluation's spread of relative LossScores as a bias-corrected EMA over windows, windows)"""
        self.proof_gaps: deque[tuple[int | None, float]] = deque(
            (tuple(entry) for entry in proof_gaps), maxlen=HISTORY_LIMIT)
        """(window, own median proof gap `window_gap`) of the last windows evaluated, oldest first:
        `typical_gap`'s history (a window of None: recorded without one), at most the rules'
        `proof_gap_history` − 1 of them."""
        holders: dict[int, str] = {}
        for hotkey, record in self._peers.items():
            if record.uid in holders:
                raise ValueError(f"ScoreBook: uid {record.uid} held by both {holders[record.uid]} and {hotkey}")
            holders[record.uid] = hotkey

    # ---- access -------------------------------------------------------------------------

    @property
    def peers(self) -> Mapping[str, PeerRecord]:
        """Read-only view; mutate through the methods so scores stay consistent."""
        return MappingProxyType(self._peers)

    def __contains__(self, hotkey: object) -> bool:
        return hotkey in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._peers))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ScoreBook) and self._peers == other._peers
                and self.relative_noise == other.relative_noise and self.proof_gaps == other.proof_gaps)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def _require(self, hotkey: str) -> PeerRecord:
        try:
            return self._peers[hotkey]
        except KeyError:
            raise KeyError(f"hotkey {hotkey} is not in the score book; call get_or_create first") from None

    # ---- registry -----------------------------------------------------------------------

    def get_or_create(self, hotkey: str, uid: int, window: int) -> PeerRecord:
        """The record for `hotkey` at `uid`, created fresh if new; marks it seen in `window`.

        A hotkey found on a different uid re-registered, and another hotkey found on this uid was
        replaced: both old records are dropped, so nobody inherits a score they did not earn.
        """
        if not 0 < len(hotkey) <= 64:
            raise ValueError(f"get_or_create: hotkey must be 1-64 characters, got {hotkey!r}")
        record = self._peers.get(hotkey)
        if record is not None and record.uid != uid:
            del self._peers[hotkey]
            record = None
        if record is None:
            for other in [h for h, r in self._peers.items() if r.uid == uid]:
                del self._peers[other]
            record = PeerRecord(uid=uid, first_seen_window=window, last_seen_window=window)
            self._peers[hotkey] = record
        else:
            record.last_seen_window = max(record.last_seen_window, window)
        return record

    def forget(self, hotkey: str) -> None:
        """Drop `hotkey`'s state (no error if absent)."""
        self._peers.pop(hotkey, None)

    def sync_registry(self, uid_by_hotkey: Mapping[str, int]) -> list[str]:
        """Align the book with the metagraph; return the hotkeys dropped (sorted).

        Deregistered hotkeys drop out, and so does any hotkey now on a different uid (it
        re-registered and starts fresh on its next `get_or_create`). A new hotkey on a recycled
        uid therefore never sees the previous holder's state. Hotkeys not yet in the book are
        not added: a record is created when a peer is first evaluated.
        """
        holders: dict[int, str] = {}
        for hotkey, uid in uid_by_hotkey.items():
            if uid in holders:
                raise ValueError(f"sync_registry: uid {uid} given for both {holders[uid]} and {hotkey}")
            holders[uid] = hotkey
        dropped = sorted(h for h, r in self._peers.items() if uid_by_hotkey.get(h) != r.uid)
        for hotkey in dropped:
            del self._peers[hotkey]
        return dropped

    # ---- scoring ------------------------------------------------------------------------

    def loss_rating(self, rules: GauntletConfig, hotkey: str) -> float:
        """LossRating_p as PeerScore reads it under `rules.loss_rating`: the paper's OpenSkill mu or
        the relative rating (`relative_rating`)."""
        return self._loss_rating(rules, self._require(hotkey))

    def _loss_rating(self, rules: GauntletConfig, record: PeerRecord) -> float:
        if rules.loss_rating == "openskill":
            return record.loss_rating
        return relative_rating(record.relative_delta, record.relative_evals, gamma=rules.rating_gamma,
                               tie_band=rules.rating_tie_band, exponent=rules.rating_exponent,
                               noise=self.relative_noise[0], cap=rules.rating_cap,
                               tie_band_below=rules.rating_tie_band_below, below_after=rules.rating_below_after)

    def _penalised(self, rules: GauntletConfig, record: PeerRecord,
                   levels: tuple[float | None, float | None] | None = None) -> float:
        """The stored μ after a failed fast evaluation: φ·μ, or with `mu_tie_band` the μ whose paid value
        is φ times the paid value before (`saturation.penalised_read`), so the band does not absorb it.
        `levels`: the paid levels to read it at (`paid_levels`; None: the book's now)."""
        read = self._read_mu(rules, record)
        if not rules.mu_tie_band > 0.0 or not read > 0.0:
            return penalise(record.mu, rules.fast_eval_penalty)
        level, _ = levels if levels is not None else self._paid_levels(rules)
        if rules.extra_work_paid_cap and record.declared > 0.0 and level is not None:
            read = min(read, level)
        after = penalised_read(read, level, self._mu_band(rules, record), rules.mu_exponent, rules.fast_eval_penalty)
        return unramped_mu(after, record.primary_evals, rules.mu_gamma, rules.mu_prior_evals)

    @staticmethod
    def _reads_levels(rules: GauntletConfig, record: PeerRecord | None = None) -> bool:
        """Whether `record`'s score (any record's: None) reads the book's paid levels: under μ's tie band
        every score does, under `extra_work_paid_cap` a declaring peer's."""
        return rules.mu_tie_band > 0.0 or (rules.extra_work_paid_cap and (record is None or record.declared > 0.0))

    def _rescore(self, rules: GauntletConfig, record: PeerRecord,
                 levels: tuple[float | None, float | None] | None = None) -> None:
        """Set `record.score`; `levels`: `_paid_levels` when the caller already has them (one pass over
        the book for all of its peers instead of one each)."""
        record.score = self._score(rules, record, **self._reading(rules, record, levels))

    def _reading(self, rules: GauntletConfig, record: PeerRecord,
                 levels: tuple[float | None, float | None] | None = None) -> dict[str, float | None]:
        """How `_score` reads `record` against the book's paid levels: its caps (`extra_work_paid_cap`, a
        declaring peer's) and μ's saturation level (`mu_tie_band`); {} when its score reads no level."""
        if not self._reads_levels(rules, record):
            return {}
        mu_level, rating_level = levels if levels is not None else self._paid_levels(rules)
        tied = mu_level if rules.mu_tie_band > 0.0 else None
        if rules.extra_work_paid_cap and record.declared > 0.0 and mu_level is not None and rating_level is not None:
            return {"mu_cap": mu_level, "rating_cap": rating_level, "mu_level": tied}
        return {"mu_level": tied} if tied is not None else {}

    def paid_mus(self, rules: GauntletConfig) -> dict[str, float]:
        """Each peer's μ as its PeerScore reads it (μ̃: start-up ramp, a declaring peer's cap, saturation at
        the paid level): the proof pay follows, where the stored μ is the EMA behind it."""
        levels = self._paid_levels(rules) if self._reads_levels(rules) else None
        paid = {}
        for hotkey, record in self._peers.items():
            reading = self._reading(rules, record, levels)
            paid[hotkey] = self._paid_mu(rules, record, reading.get("mu_cap", math.inf), reading.get("mu_level"))
        return paid

    def paid_levels(self, rules: GauntletConfig) -> tuple[float | None, float | None]:
        """The book's paid levels of μ and of the LossRating now (`_paid_levels`): a window's fast verdicts
        are all applied at the levels before the first of them (`score_window`)."""
        return self._paid_levels(rules)

    def _paid_levels(self, rules: GauntletConfig) -> tuple[float | None, float | None]:
        """`paid_level` of the μ and of the LossRating PeerScore reads, over the peers that never declared
        extra pages, at least `extra_work_level_floor` times the declaring peers' own (`floored_level`).
        Both are read from scores that read no level (`_score`'s defaults), so the levels are the same in
        whatever order records are rescored."""
        floor = rules.extra_work_level_floor
        paid = [(self._score(rules, record), record) for record in self._peers.values()
                if record.declared == 0.0 or floor > 0.0]
        levels = []
        for read in (self._read_mu, self._loss_rating):
            level = paid_level(((score, read(rules, record)) for score, record in paid if record.declared == 0.0),
                               rules.power)
            if floor > 0.0:
                declaring = paid_level(((score, read(rules, record)) for score, record in paid if record.declared > 0.0),
                                       rules.power)
                level = floored_level(level, declaring, floor)
            levels.append(level)
        return levels[0], levels[1]

    @staticmethod
    def _read_mu(rules: GauntletConfig, record: PeerRecord) -> float:
        """μ as PeerScore reads it: with its start-up bias removed but for `mu_prior_evals` (None: the paper's μ)."""
        return ramped_mu(record.mu, record.primary_evals, rules.mu_gamma, rules.mu_prior_evals)

    def _score(self, rules: GauntletConfig, record: PeerRecord, mu_cap: float = math.inf,
               rating_cap: float = math.inf, mu_level: float | None = None) -> float:
        """PeerScore of `record`, its μ and LossRating read at most `mu_cap` and `rating_cap`
        (`extra_work_paid_cap`), its μ saturated at `mu_level` (`mu_tie_band`; None: as read)."""
        mu = self._paid_mu(rules, record, mu_cap, mu_level)
        # A pool's members split one member's score (docs/scoring.md §8): n hotkeys sharing one piece of work
        # earn n·(s/n)^c ≤ s^c of the normalisation, never more than one hotkey doing all of it.
        # Declared extra work, proven page class by page class, is paid as a power of its size (extra_work).
        work = work_factor(rules, self._trained(rules, record))
        return peer_score(mu, min(self._loss_rating(rules, record), rating_cap)) * work / max(1, len(record.pool))

    @classmethod
    def _paid_mu(cls, rules: GauntletConfig, record: PeerRecord, mu_cap: float, mu_level: float | None) -> float:
        """μ̃: the read μ at most `mu_cap`, saturated at `mu_level` (`_score`'s arguments)."""
        return saturated_mu(min(cls._read_mu(rules, record), mu_cap), mu_level, cls._mu_band(rules, record),
                            rules.mu_exponent)

    @staticmethod
    def _mu_band(rules: GauntletConfig, record: PeerRecord) -> float:
        """μ's tie band for `record`: `mu_tie_band`, widened for a peer of few evaluations when
        `mu_tie_band_widens` (`saturation.evaluated_band`)."""
        if not rules.mu_tie_band_widens:
            return rules.mu_tie_band
        return evaluated_band(rules.mu_tie_band, record.primary_evals, rules.mu_gamma)

    @staticmethod
    def _trained(rules: GauntletConfig, record: PeerRecord) -> float:
        """The work `record`'s evaluations prove, in units of the assigned work (`trained_multiple`)."""
        gamma = rules.mu_gamma
        return trained_multiple(1.0 + ema_mean(record.declared, record.primary_evals, gamma, 0.0),
                                ema_mean(record.assigned_credit, record.assigned_credit_evals, gamma, math.nan)
                                if record.assigned_credit_evals else None,
                                ema_mean(record.declared_credit, record.declared_credit_evals, gamma, math.nan)
                                if record.declared_credit_evals else None,
                                rules.extra_work_tolerance, rules.extra_work_floor)

    def record_pool(self, rules: GauntletConfig, members: Iterable[str], window: int) -> None:
        """Remember that `members` (hotkeys in the book) shared work in `window`: each is paid its
        score divided by the pool's size and the pool holds one top-G slot, for `pool_memory`
        windows after it was last seen (pools seen again merge)."""
        group = sorted({h for h in members if h in self._peers})
        if len(group) < 2:
            return
        merged = set(group)
        for hotkey in group:
            merged |= {h for h in self._peers[hotkey].pool if h in self._peers}
        pool = sorted(merged)[:MAX_POOL]
        for hotkey in pool:
            record = self._peers[hotkey]
            record.pool, record.pool_window = pool, window
            self._rescore(rules, record)

    def expire_pools(self, rules: GauntletConfig, window: int) -> None:
        """Forget pools not seen sharing work for more than `pool_memory` windows."""
        for record in self._peers.values():
            if record.pool and record.pool_window is not None and window - record.pool_window > rules.pool_memory:
                record.pool, record.pool_window = [], None
                self._rescore(rules, record)

    def pools(self) -> dict[str, list[str]]:
        """Each pooled hotkey's pool (itself included)."""
        return {hotkey: list(record.pool) for hotkey, record in self._peers.items() if record.pool}

    def staleness(self, window: int, newcomer_evals: int = 0, first_evals: int = 0) -> dict[str, float]:
        """Windows since each peer's last primary evaluation; peers never evaluated are absent.

        The input of the stale-first draw of S_t (`select_eval_peers(staleness=...)`). A peer
        with fewer than `newcomer_evals` evaluations counts as `newcomer_evals / (evals + 1)`
        times staler, so a newcomer collects its first few evaluations within a few windows
        instead of one per |peers| / |S_t| windows, while staying a random draw. A peer with fewer
        than `first_evals` evaluations is absent too, so it is drawn as a newcomer (twice the
        stalest): its first epoch reads that many evaluations, not one or two of them.

        A peer never evaluated whose last fast evaluation failed (no upload, a warm-up past its allowance,
        anything that costs μ) is no newcomer: it counts as stale by the windows since that fast
        evaluation. Drawn as a newcomer, a registered hotkey that never uploads, or posts warm-ups for
        ever, was twice the stalest peer in every draw of F_t for good: 48 such hotkeys of 256 took 58 %
        of F_t's places. Once it passes again (a late start's first warm-up) it is a newcomer again.
        """
        if newcomer_evals < 0 or first_evals < 0:
            raise ValueError(f"staleness: newcomer_evals and first_evals must be >= 0, got {newcomer_evals}, "
                             f"{first_evals}")
        out = {}
        for hotkey, record in self._peers.items():
            last = Status.of_label(record.last_status)  # None: "new", no verdict yet
            if record.last_primary_window is None and last is not None and not last.passes:
                out[hotkey] = float(max(0, window - record.last_seen_window))
                continue
            if record.last_primary_window is None or record.primary_evals < first_evals:
                continue
            boost = max(1.0, newcomer_evals / (record.primary_evals + 1))
            out[hotkey] = float(max(0, window - record.last_primary_window)) * boost
        return out

    def warmup_overdue(self, hotkey: str, window: int, warming: bool, allowance: int, horizon: int = 0) -> bool:
        """Whether `hotkey`'s warm-up upload of `window` comes after its warm-up should have ended: `allowance`
        (the run's `gauntlet.warmup_overdue_windows`; 0: never) windows or more after the first warm-up upload
        seen of it since its last verdict of another kind. `warming`: this window's verdict is a warm-up; any
        other verdict ends the warm-up.

        Why: a warm-up upload passes fast evaluation and is never rated, so μ and the rating stay as they
        are. Posted for ever, it kept a miner that had trained until its score was good paid at that score
        with no training at all (and in the top-G, its slot aggregating nothing), where a miner that posts
        nothing loses φ at every fast evaluation. Production's allowance is 2 × `windows.warmup_windows` + 1:
        an honest miner's warm-up spans more than `warmup_windows` windows when its sync check finds a fork
        (that window's upload weighs 0 too, then the re-sync's warm-up follows) or it drops a warm-up window's
        training (trained again), and a validator that samples the peer sees no verdict of the windows
        between two warm-ups; twice the length leaves those unpunished and still ends a free ride within a
        few windows of the honest warm-up's length.

        `horizon` (the run's `gauntlet.warmup_overdue_horizon`; 0: none) budgets warm-ups across episodes: one
        also fails when `allowance` warm-ups of the peer were seen within the `horizon` windows before it. An
        episode ends at any other verdict, so a top-G miner (seen every window) that posted ten warm-ups, then
        one trained upload, and again, never overran one episode's allowance: paid as an honest miner for a
        tenth of the work. Under the budget that costs a φ for each warm-up past it, so a miner can skip at
        most `allowance` windows of every `horizon`. An honest miner joins or re-syncs with one episode of at
        most `allowance`, and only a second re-sync within the horizon is charged for what passes it."""
        record = self._require(hotkey)
        if not warming:
            record.warmup_window = None
            return False
        if record.warmup_window is None or record.warmup_window > window:
            record.warmup_window = window
        within = [w for w in record.warmups if window - horizon < w < window] if horizon > 0 else []
        if allowance > 0 and (not record.warmups or record.warmups[-1] < window):
            record.warmups = [*record.warmups, window][-allowance:]
        return allowance > 0 and (window - record.warmup_window >= allowance or len(within) >= allowance)

    def record_fast_eval(
        self, rules: GauntletConfig, hotkey: str, passed: bool, status: str, *, sync_steps: float | None = None,
        levels: tuple[float | None, float | None] | None = None,
    ) -> PeerRecord:
        """Apply one fast evaluation (paper §3.2): on failure μ ← φ·μ (φ: `fast_eval_penalty`);
        counts and status kept. `levels`: the paid levels a failure is read at (`paid_levels`; None:
        the book's now). A window passes the levels before its first verdict, so its failures do not
        depend on the order they are applied in: read at the levels each left, one peer's penalty moved
        the next one's (μ 0.505 or 0.606 for the same peer, one order or the other)."""
        record = self._require(hotkey)
        if not 0 < len(status) <= 64:
            raise ValueError(f"record_fast_eval: status must be 1-64 characters, got {status!r}")
        if sync_steps is not None and (math.isnan(sync_steps) or sync_steps < 0):
            raise ValueError(f"record_fast_eval: invalid sync_steps {sync_steps!r}")
        record.last_status = status
        if sync_steps is not None:
            record.last_sync_steps = sync_steps
        if passed:  # nothing a score reads changed (`scores` rescores every peer against the current levels)
            record.fast_eval_passes += 1
            return record
        record.fast_eval_fails += 1
        record.mu = self._penalised(rules, record, levels)
        self._rescore(rules, record, levels)
        return record

    def record_primary(self, rules: GauntletConfig, results: Mapping[str, PrimaryResult], *,
                       window: int | None = None, premium: bool = True) -> None:
        """Apply one window's primary evaluation of S_t (Algorithm 1, lines after Fast Evaluation).

        One OpenSkill match among all of `results` ranked by δ_rand (`openskill_beta`, `_tau`),
        then each peer's μ update (γ: `mu_gamma`) from sign(δ_assigned − δ_rand) (softened by
        `proof_margin` against the window's median LossScore, see `update_mu`; page by page when
        the result carries its pages' δs), then its PeerScore. With the relative LossRating
        (`loss_rating` "relative"), each peer's relative LossScore (δ_rand over the window's
        median) also enters its EMA and the window's spread enters the book's noise estimate.
        `proof_credit` "size" scores the proof of computation by the size of each gap relative to
        the window's `typical_gap` (`size_credit`), "sign" by its sign; a gap of `proof_full_gap`
        × the typical one earns the full credit. A peer that declared extra pages (`PrimaryResult.work`
        > 1) has its credit on assigned and on declared units kept apart, and its credit multiplied by
        the work they prove (`templar.gauntlet.extra_work`). Every hotkey must already be in the book.
        `premium` False (a window whose trial steps were not held to a typical size): no δ_rand rates
        above S_t's median (the match reads `without_premium`, a relative LossScore's upper clip is 1),
        and the window's spread is not a measurement of the evaluation noise. Validation happens before any state changes, so a bad
        call leaves the book intact.
        """
        records = {hotkey: self._require(hotkey) for hotkey in results}
        for hotkey, result in results.items():
            if math.isnan(result.delta_assigned) or math.isnan(result.delta_rand):
                raise ValueError(f"record_primary: NaN LossScore for {hotkey}")
            if not 1.0 <= result.work < math.inf:
                raise ValueError(f"record_primary: declared work {result.work!r} for {hotkey} (need finite, >= 1)")
        deltas = {hotkey: result.delta_rand for hotkey, result in results.items()}
        new_ratings = rate_match(
            {hotkey: record.rating for hotkey, record in records.items()},
            deltas if premium else without_premium(deltas, resolution=rules.proof_gap_resolution),
            beta=rules.openskill_beta,
            tau=rules.openskill_tau,
        )
        scale = window_loss_scale(results.values())
        typical = None
        if rules.proof_credit == "size":
            # a peer's gap at the assigned-only scale: its pages' share of the update is 1/work (extra_work)
            own = window_gap([proof_gap(r.delta_assigned, r.delta_rand, r.pages) * max(1.0, r.work)
                              for r in results.values()])
            typical = rules.proof_full_gap * typical_gap(own, self._recent_gaps(rules, window), scale,
                                                         floor=rules.proof_gap_floor, history=rules.proof_gap_history,
                                                         resolution=rules.proof_gap_resolution)
        # each peer's declared work and class credits after this evaluation (extra_work), then its μ
        evidence: dict[str, PeerRecord] = {}
        for hotkey, result in results.items():
            ahead = records[hotkey].model_copy()
            ahead.declared = min(4096.0, update_declared(ahead.declared, result.work, rules.mu_gamma))
            ahead.primary_evals += 1
            if typical is not None and result.sequences:
                on_assigned, on_declared = class_credits(result.sequences, result.declared_units, result.delta_rand,
                                                         typical)
                ahead.assigned_credit, ahead.assigned_credit_evals = update_class(
                    ahead.assigned_credit, ahead.assigned_credit_evals, on_assigned, rules.mu_gamma)
                ahead.declared_credit, ahead.declared_credit_evals = update_class(
                    ahead.declared_credit, ahead.declared_credit_evals, on_declared, rules.mu_gamma)
            evidence[hotkey] = ahead
        new_mus = {
            hotkey: update_mu(records[hotkey].mu, result.delta_assigned, result.delta_rand, rules.mu_gamma,
                              rules.proof_margin, scale, pages=result.pages, typical=typical,
                              sequences=result.sequences, declared_units=result.declared_units,
                              declared_share=declared_share(result.work, rules),
                              multiple=dilution_multiple(self._trained(rules, evidence[hotkey]), result.random_units,
                                                         result.delta_rand, typical, rules.proof_full_gap)
                              if typical is not None else 1.0)
            for hotkey, result in results.items()
        }
        if typical is not None and own is not None:
            self.proof_gaps.append((window, own))
            while len(self.proof_gaps) > rules.proof_gap_history - 1:
                self.proof_gaps.popleft()
        upper = rules.relative_clip_high if premium else 1.0  # 1: S_t's median
        relative = relative_loss_scores(deltas, clip=(rules.relative_clip_low, upper),
                                        min_players=rules.relative_min_players, resolution=rules.proof_gap_resolution)
        spread = relative_spread(relative, deltas, min_players=rules.relative_min_players,
                                 resolution=rules.proof_gap_resolution)
        relative_on = rules.loss_rating == "relative"
        for hotkey, result in results.items():
            record = records[hotkey]
            record.rating = new_ratings[hotkey]
            record.mu = new_mus[hotkey]
            record.last_delta_assigned = float(result.delta_assigned)
            record.last_delta_rand = float(result.delta_rand)
            ahead = evidence[hotkey]
            record.declared = ahead.declared
            record.assigned_credit, record.assigned_credit_evals = ahead.assigned_credit, ahead.assigned_credit_evals
            record.declared_credit, record.declared_credit_evals = ahead.declared_credit, ahead.declared_credit_evals
            record.primary_evals += 1
            if relative_on and hotkey in relative:
                record.relative_delta = update_relative(record.relative_delta, record.relative_evals,
                                                        relative[hotkey], rules.rating_gamma)
                record.relative_evals += 1
            if window is not None:
                record.last_primary_window = window
            self._rescore(rules, record, (None, None))  # unlevelled here: the levels read the whole book, below
        if relative_on and spread is not None and premium:
            noise, windows = self.relative_noise
            self.relative_noise = (update_relative(noise, windows, spread, rules.rating_gamma), windows + 1)
            levels = self._paid_levels(rules) if self._reads_levels(rules) else None
            for record in self._peers.values():
                self._rescore(rules, record, levels)
        elif self._reads_levels(rules):  # the paid level moved with this window's μs
            levels = self._paid_levels(rules)
            for record in self._peers.values():
                if self._reads_levels(rules, record):
                    self._rescore(rules, record, levels)

    def _recent_gaps(self, rules: GauntletConfig, window: int | None) -> list[float]:
        """The remembered median gaps of the `proof_gap_history` − 1 windows before `window`: a
        validator back from a long stop judges by the present run, not by the gaps it saw before."""
        return [gap for seen, gap in self.proof_gaps
                if window is None or seen is None or 0 < window - seen < rules.proof_gap_history]

    def scores(self, rules: GauntletConfig) -> dict[str, float]:
        """PeerScore_p for every hotkey in the book (eq. 4, floored factors)."""
        levels = self._paid_levels(rules) if self._reads_levels(rules) else None
        for record in self._peers.values():
            self._rescore(rules, record, levels)
        return {hotkey: self._peers[hotkey].score for hotkey in sorted(self._peers)}

    def weights(self, rules: GauntletConfig) -> dict[str, float]:
        """x_p (eq. 5, c: `power`) for every hotkey, stored on the records; sums to 1 if any score is > 0.

        The baseline is min(min score, 0), not the paper's bare min: PeerScores are ≥ 0, so in
        a book with any unscored peer the two agree, and when every peer scores > 0 the weakest
        honest peer still earns a share instead of exactly 0 (and a lone peer earns 1).
        """
        x = normalise(self.scores(rules), rules.power, floor=0.0)
        for hotkey, value in x.items():
            self._peers[hotkey].weight = value
        return x

    def top_g(self, rules: GauntletConfig, ties: Callable[[str], bytes] | None = None) -> list[str]:
        """SelectTopG: the `top_g` best PeerScores > 0 and at least `top_g_min_share` of the best, ties
        by the draw `ties` (`score_window`: keyed by the validator's seed), else by hotkey.

        Equal to ranking by x from `weights`, which is a strictly increasing function of the
        score (floor 0, power > 0), and independent of the power. A pool of hotkeys that shared
        work holds one slot: only its best member is eligible (`one_per_pool`).
        """
        return select_top_g(one_per_pool(self.scores(rules), self.pools()), rules.top_g, rules.top_g_min_share, ties=ties)

    # ---- persistence --------------------------------------------------------------------

    def to_json(self) -> str:
        """Schema-versioned JSON, peers sorted by hotkey (same book → same text).

        Every record is revalidated first; an invalid one raises pydantic's ValidationError.
        """
        ordered = {hotkey: self._peers[hotkey] for hotkey in sorted(self._peers)}
        noise, windows = self.relative_noise
        return BookFile(peers=ordered, relative_noise=noise, relative_noise_windows=windows,
                       proof_gaps=list(self.proof_gaps)).model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> ScoreBook:
        """Parse and strictly validate; raise ScoreBookError naming the bad field."""
        try:
            schema = BookFile.model_validate_json(text, strict=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
            )
            raise ScoreBookError(f"invalid score book: {problems}") from exc
        return cls(schema.peers, (schema.relative_noise, schema.relative_noise_windows), schema.proof_gaps)

    def save(self, path: str | Path) -> None:
        """Write atomically (`templar.core.atomic`): a crash leaves the previous file or the new one."""
        atomic_write(path, self.to_json().encode())

    @classmethod
    def load(cls, path: str | Path) -> ScoreBook:
        """Read a saved book; a missing file is an empty book, a corrupt one raises ScoreBookError."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls()
        try:
            return cls.from_json(data)
        except ScoreBookError as exc:
            raise ScoreBookError(f"{path}: {exc}") from exc
