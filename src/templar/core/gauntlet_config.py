"""The Gauntlet's rules (the paper's section 3 and this project's calibrated margins, samples,
ceilings and memories): the `gauntlet` section of the run's hparams, inside the run's digest.

Every number that changes a score, a weight, a verdict or θ is a field here or in another section
of `templar.core.config.HParams` (docs/scoring.md: "The rules are the run's"); `tests/test_rules.py`
fails on a module-level numeric constant in a consensus module that is not one of them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from templar.core.strict import HISTORY_LIMIT, Strict


class GauntletConfig(Strict):
    """The incentive (paper section 3)."""

    top_g: int = Field(gt=0, description="G: peers aggregated with weight 1/G")
    power: float = Field(gt=0, description="c in x_p = (s_p - min)^c / sum")
    eval_lr_factor: float = Field(gt=0, description="beta = eval_lr_factor * alpha for LossScore")
    uids_per_window: int = Field(gt=0, description="|S_t|: peers under primary evaluation per window")
    fast_eval_uids: int = Field(gt=0, description="peers under fast evaluation per window (top-G always)")
    mu_gamma: float = Field(ge=0, lt=1, description="gamma of the mu EMA")
    proof_margin: float = Field(ge=0, lt=2, description="relative width of the soft threshold that replaces "
                                "sign(δa − δr) in the mu update; 0 is the paper's formula (see gauntlet.update_mu)")
    proof_credit: Literal["sign", "size"] = Field(
        default="size", description="how a page's gap over δ_rand counts towards mu: its sign (the paper) or its "
        "size relative to the window's typical gap (gauntlet.size_credit)")
    proof_full_gap: float = Field(
        default=1.0, gt=0, le=1, description="proof_credit size: the share of the window's typical gap that "
        "earns the full credit (smaller gaps earn in proportion)")
    proof_baseline_groups: int = Field(
        default=0, ge=0, le=8, description="proof_credit size: 0 judges every unit's gain against δ_rand, the "
        "random pages' mean; k > 0 against the unit's own expected gain, read from the mean trial steps of k "
        "groups of S_t and their median per unit (gauntlet.baseline; one more forward pass per group)")
    proof_baseline: Literal["random", "groups", "others"] = Field(
        default="random", description="proof_credit size: what each unit's gain is judged against: 'random' the "
        "random pages' mean δ_rand (the paper), 'groups' the median over proof_baseline_groups groups of S_t's "
        "mean trial steps, 'others' a clipped mean over the other evaluated peers' own trial steps, which only a "
        "majority of them can move (gauntlet.baseline); left out, 'groups' when proof_baseline_groups > 0")
    proof_baseline_min_others: int = Field(
        default=3, ge=3, description="proof_baseline others: fewer other evaluated peers leave the window on "
        "δ_rand (the median of two others is their mean, which either one sets)")
    proof_baseline_clip: float = Field(
        default=4.0, ge=0, description="proof_baseline others: each other peer's value on a unit is clipped to "
        "the median ± this many median absolute deviations before their mean (0: the median; gauntlet.baseline."
        "clipped_mean)")
    proof_sequences: int = Field(
        default=0, ge=0, description="sequences of each evaluated page the primary evaluation reads, drawn "
        "with the validator's secret (gauntlet.select_eval_sequences); 0 reads them all")
    sync_max_steps: float = Field(gt=0, description="sync threshold in steps of alpha")
    fast_eval_penalty: float = Field(gt=0, lt=1, description="phi: mu multiplier on a failed fast eval")
    warmup_overdue_windows: int = Field(ge=0, le=HISTORY_LIMIT, description="a warm-up upload this many windows or more after the first "
                                        "warm-up upload a validator saw of the peer's warm-up fails fast evaluation "
                                        "(warmup_overdue): a warm-up passes unrated, and posted for ever it kept "
                                        "the score a miner had earned; 0: never (docs/scoring.md §2)")
    warmup_overdue_horizon: int = Field(default=0, ge=0, le=HISTORY_LIMIT, description="a warm-up upload also "
                                        "fails (warmup_overdue) when a validator saw warmup_overdue_windows warm-ups of "
                                        "the peer within this many windows before it, whatever came between: one "
                                        "trained upload between runs of warm-ups no longer starts the allowance "
                                        "again; 0: no such budget (docs/scoring.md §2)")
    probe_count: int = Field(gt=0, description="parameter values probed per tensor for the sync score")
    openskill_beta: float = Field(gt=0)
    openskill_tau: float = Field(ge=0)
    duplicate_threshold: float = Field(gt=0, le=1, description="fingerprint cosine at which two same-window "
                                       "payloads share work (calibrated: docs/scoring.md §8)")
    shared_positions_threshold: float = Field(gt=0, le=1, description="share of top-k positions in common at "
                                              "which two same-window payloads share work (calibrated: "
                                              "docs/scoring.md §8)")
    max_norm_ratio: float = Field(gt=1, description="a payload whose value norm exceeds the window's median "
                                  "by this factor fails fast evaluation as 'scale'")
    trial_max_lift: float = Field(default=1.0, ge=1, description="a SparseLoCo trial step is the payload at "
                                  "the window's typical size: held to it when larger, lifted to it when smaller, "
                                  "by at most this factor (1: held only, never lifted; docs/scoring.md §3)")
    selection_sharpness: float = Field(default=0.0, ge=0, le=16, description="F_t and S_t favour peers not "
                                       "evaluated for long: draw weight (windows since the last primary "
                                       "evaluation)^sharpness; 0 is the paper's uniform draw")
    newcomer_evals: int = Field(default=0, ge=0, description="with selection_sharpness > 0, a peer with fewer "
                                "primary evaluations than this counts as newcomer_evals / (evals + 1) times staler")
    newcomer_first_evals: int = Field(default=0, ge=0, le=64, description="with selection_sharpness > 0, a peer "
                                      "with fewer primary evaluations than this is drawn as one never evaluated "
                                      "(twice the stalest), so a newcomer collects this many within a few windows; "
                                      "0: only a peer never evaluated (docs/scoring.md §1)")
    mu_prior_evals: float | None = Field(default=None, ge=0, description="PeerScore reads mu / (1 - gamma^(n + "
                                         "this)) after n primary evaluations (start-up bias removed); None is "
                                         "the paper's mu")
    mu_tie_band: float = Field(
        default=0.0, ge=0, lt=1, description="mu as PeerScore reads it saturates at the run's paid level (the "
        "pay-weighted median mu of the peers that declared nothing, extra_work.paid_level): a mu at least "
        "(1 - this) of the level reads the level, a lower one the level x (mu / its edge)^mu_exponent "
        "(gauntlet.saturation); 0: no saturation (docs/scoring.md §4)")
    mu_exponent: float = Field(default=2.0, ge=1, le=16, description="with mu_tie_band > 0: the power at "
                               "which paid mu falls below the band's edge")
    mu_tie_band_widens: bool = Field(
        default=False, description="with mu_tie_band > 0: the band is an incumbent's, and a peer of fewer "
        "evaluations, whose mu scatters more, gets its edge lowered as a standard error grows "
        "(gauntlet.saturation.evaluated_band); False: the same band for every peer")
    loss_rating: Literal["openskill", "relative"] = Field(
        default="openskill", description="LossRating in PeerScore: the paper's OpenSkill mu, or 25 x the "
        "peer's relative LossScore (delta_rand / median of S_t) with a tie band and a power premium "
        "(gauntlet.relative_rating; docs/scoring.md §5)")
    rating_gamma: float = Field(default=0.95, ge=0, lt=1, description="relative rating: EMA factor of the "
                                "relative LossScores (memory about 1 / (1 - gamma) evaluations)")
    rating_tie_band: float = Field(default=3.5, ge=0, le=10, description="relative rating: a mean within "
                                   "this many standard errors (noise / sqrt(n_eff), noise measured from the "
                                   "windows' spread) of the median counts as the median")
    rating_tie_band_below: float = Field(
        default=0.0, ge=0, le=10, description="relative rating: below the median the mean is raised by up to "
        "this many standard errors, never past the median (a newcomer's few evaluations are not yet shown "
        "to be less than a typical peer's); 0: the mean itself (gauntlet.relative_rating; docs/scoring.md §5)")
    rating_below_after: int = Field(
        default=0, ge=0, le=64, description="relative rating: a peer whose relative mean holds fewer evaluations "
        "than this is rated as the median when the mean is below it (its proof of computation is read from the "
        "first); 0: read from the first evaluation, production's (benchmarks/LOG.md §43: it did not bring a "
        "newcomer to the median sooner; gauntlet.relative_rating; docs/scoring.md §5)")
    rating_exponent: float = Field(default=10.0, gt=0, le=100, description="relative rating: LossRating = "
                                   "25 x (relative LossScore beyond the band)^this")
    rating_cap: float | None = Field(default=None, ge=1, le=100, description="relative rating: LossRating "
                                     "<= 25 x this (None: no cap); bounds how far validators that crossed the "
                                     "band in different windows disagree")

    # ---- the rules below were module constants; as fields they are part of the run (its digest) --------------
    # Proof of computation by size (templar.gauntlet.scores, docs/scoring.md §4).
    proof_gap_floor: float = Field(
        default=0.02, ge=0, lt=1, description="the smallest typical gap, as a share of the window's LossScore "
        "scale: where most of S_t shows no gap the median gap is noise, and dividing by noise would turn noise "
        "into full credit (honest gaps on micro: 5-20 % of the scale with H = 2 inner AdamW steps)")
    top_g_min_share: float = Field(
        default=0.01, ge=0, lt=1, description="a peer holds a top-G slot only with a PeerScore at least this "
        "share of the best: hotkeys posting near-zero values score by rounding alone (1e-10 to 1e-5 against "
        "honest 20) and, where honest miners are fewer than top_g, filled the list and clipped every step to "
        "their size (docs/scoring.md §7)")
    proof_gap_resolution: float = Field(
        default=1e-5, ge=0, description="nats: the smallest typical gap whatever S_t shows. Two float32 losses "
        "of one batch under models a rounding apart differ by up to 8.5e-7 nats (micro, loss ~6.9); where most of "
        "S_t posts updates too small to move the loss (near-zero values cost nothing), the relative floor is a "
        "share of that rounding, and dividing by it paid rounding as full credit (docs/scoring.md §4)")
    proof_gap_history: int = Field(
        default=16, ge=1, le=HISTORY_LIMIT, description="windows whose own median gaps the typical gap is the "
        "median of (this one and the book's earlier ones): whoever fills one S_t cannot set the scale")
    extra_work_exponent: float = Field(
        default=0.5, ge=0, le=1, description="q: a miner that declared and proved pages/assigned times the "
        "assigned work is weighted (pages/assigned)^q times as much (its PeerScore times that to the 1/power): "
        "twice the pages earns 2^q. Below 1 so that more pages for one hotkey earn less per page than the same "
        "pages under their own hotkeys, and a declared page left untrained (which costs its share of the proof) "
        "earns less than not declaring it (docs/scoring.md §4)")
    extra_work_paid_cap: bool = Field(
        default=False, description="the mu and the LossRating PeerScore reads for a peer that declared extra pages "
        "are each at most the pay-weighted median of the peers that declared nothing (extra_work.paid_level): "
        "twice the pages shows each page more than half the gap (the give-back of the dilution would pay its mu "
        "above honest work's) and gains more on the random pages (its rating); capped, the pages are paid by "
        "extra_work_exponent alone (docs/scoring.md §4)")
    extra_work_level_floor: float = Field(
        default=0.0, ge=0, lt=1, description="the paid levels (extra_work.paid_level) are at least this share of "
        "the declaring peers' own: where every honest miner declares pages, one weak hotkey that declares none "
        "would alone set the level that caps them all and be paid at it (a quarter of the work took 0.066 of the "
        "weight beside ten honest declarers). At most 1/m for m the largest declared multiple (production 0.5 = "
        "29/58 pages): the give-back of the dilution lifts a declaring peer's mu at most m times (1.3-1.5x "
        "measured for twice the pages), so a run with honest non-declaring miners reads their level as before; "
        "0: no floor (docs/scoring.md §4)")
    declared_pages_evaluated: Literal["shared", "in_proportion", "in_proportion_on_average"] = Field(
        default="shared", description="how many of a declaring peer's pages its primary evaluation reads "
        "(gauntlet.evaluated_pages): shared, data.eval_pages across its assigned and declared pages alike (each "
        "class proven on part of them, some evaluations on one class only); in_proportion, eval_pages of its "
        "assigned pages and as many of its declared ones in proportion (at most all), so every evaluation proves "
        "each class on as much as an honest miner's assigned work, at the price of reading more pages for a "
        "peer that claims more work (docs/scoring.md §4); in_proportion_on_average, as in_proportion but the "
        "declared count rounded by a keyed draw instead of up, so one declared page of 29 is read in one "
        "evaluation of 29 on average, not in every one (a validator's time in proportion to the work)")
    class_credit_weights: Literal["units", "work"] = Field(
        default="units", description="how an evaluation's proof credit weighs the units of a declaring peer's "
        "assigned and declared pages (scores.update_mu): units, each unit alike, so under in_proportion one "
        "declared page read on as many units as the assigned ones weighed as much as all of them together (a "
        "miner declaring one page hid half its assigned pages left untrained, paid 0.63x the honest median for "
        "0.53x the work); work, each class by its share of the declared work (K and A pages of A + K)")
    extra_work_tolerance: float = Field(
        default=0.7, gt=0, le=1, description="τ: a page class (assigned or declared) whose proof credit reaches τ "
        "times the other's counts as fully trained (extra_work.trained_multiple): forgives the two classes' "
        "evaluation noise; a class left untrained shows about 0 whatever τ")
    extra_work_floor: float = Field(
        default=0.0, ge=0, lt=1, description="a page class whose proof credit is at most this share of the other's "
        "proves no work, and between it and extra_work_tolerance its share rises linearly "
        "(extra_work.trained_multiple): an untrained class shows 0 plus noise, and a few evaluations' noise would "
        "otherwise count as a share of the declared work; 0: no floor (docs/scoring.md §4)")
    position_ranges: int = Field(
        default=4, ge=1, le=64, description="consecutive position ranges of each assigned sequence that the "
        "proof by size measures and clips one by one (a miner training the first quarter of every sequence's "
        "tokens gets its untrained quarters measured on their own)")
    # Relative LossRating (templar.gauntlet.rating, docs/scoring.md §5).
    relative_clip_low: float = Field(default=-1.0, le=0, description="lower clip of one relative LossScore "
                                     "(δ_rand over S_t's median): a broken model counts this")
    relative_clip_high: float = Field(default=2.0, gt=1, description="upper clip of one relative LossScore: "
                                      "twice the median is beyond any honest spread measured, and bounds what one "
                                      "freak evaluation moves a peer's mean (benchmarks/LOG.md §3, §5)")
    relative_min_players: int = Field(default=3, ge=2, description="a window with fewer finite LossScores in "
                                      "S_t updates no relative rating (a median of two is one of the peers' own)")
    # Shared work: copies, pools and borrowed work (templar.gauntlet.duplicates, validator.fast_eval; §8).
    pool_memory: int = Field(default=720, ge=0, description="windows a pool is remembered after it was last seen "
                             "sharing work (about 17 h at 84 s)")
    typical_pair_margin: float = Field(default=0.1, ge=0, le=1, description="how far above the window's typical "
                                       "pair a pair's similarity must stand to count as shared work")
    typical_pair_min_pairs: int = Field(default=3, ge=1, description="fewer pairs have no typical pair of their "
                                        "own: the thresholds and the history decide")
    typical_ceiling_cosine: float = Field(default=0.7, gt=0, le=1, description="the most the typical pair's "
                                          "cosine may be taken to be on the first sample (a flood cannot lift it)")
    typical_ceiling_shared: float = Field(default=0.65, gt=0, le=1, description="the same for the shared "
                                          "positions")
    relative_shared_factor: float = Field(default=2.5, gt=1, description="a pair whose shared positions reach "
                                          "this many times the typical pair's shares work below the threshold")
    relative_shared_floor: float = Field(default=0.3, gt=0, le=1, description="... and at least this share")
    pair_history: int = Field(default=16, ge=1, le=HISTORY_LIMIT, description="earlier windows' typical pairs "
                              "the validator keeps (PairBaseline)")
    sample_tensors: int = Field(default=4, gt=0, description="tensors of each payload in the first, cheap "
                                "sample the copy fingerprints are made of (drawn with the private salt)")
    sample_chunks: int = Field(default=8, gt=0, description="chunks per sampled tensor (first sample)")
    confirm_tensors: int = Field(default=32, gt=0, description="the second look's larger, independent sample "
                                 "of a pair that crossed a threshold on the first: tensors")
    confirm_chunks: int = Field(default=32, gt=0, description="the second look's sample: chunks per tensor")
    confirm_typical_uploads: int = Field(default=8, ge=2, description="uploads (drawn with the salt) the "
                                         "second look's own typical pair is made of")
    confirm_ceiling_cosine: float = Field(default=0.45, gt=0, le=1, description="the most the second look's "
                                          "typical pair's cosine may be taken to be")
    confirm_ceiling_shared: float = Field(default=0.3, gt=0, le=1, description="the same for its shared "
                                          "positions")
    fingerprint_size: int = Field(default=1024, gt=0, le=1 << 20, description="length of a payload's copy "
                                  "fingerprint (count sketch)")
    public_windows: int = Field(default=2, ge=0, le=HISTORY_LIMIT, description="earlier windows whose aggregated "
                                "uploads (and their mean) are references of the borrowed-work check")
    replay_windows: int = Field(default=64, ge=1, le=10_000, description="windows whose valid uploads' content "
                                "digests the validator remembers: a repeat is 'replay'")
    norm_check_min_peers: int = Field(default=3, ge=1, description="fewer passing peers have no median for the "
                                      "'scale' check (max_norm_ratio)")

    @model_validator(mode="before")
    @classmethod
    def _baseline_from_groups(cls, data: Any) -> Any:
        """Files written before `proof_baseline` named only the groups: k > 0 meant 'groups'."""
        if isinstance(data, dict) and "proof_baseline" not in data and data.get("proof_baseline_groups"):
            return {**data, "proof_baseline": "groups"}
        return data

    @model_validator(mode="after")
    def _groups_only_for_groups(self) -> GauntletConfig:
        if (self.proof_baseline == "groups") != (self.proof_baseline_groups > 0):
            raise ValueError("gauntlet.proof_baseline_groups must be > 0 exactly when gauntlet.proof_baseline is "
                             f"'groups' (got {self.proof_baseline!r} with {self.proof_baseline_groups} groups)")
        return self

    @model_validator(mode="after")
    def _floor_below_tolerance(self) -> GauntletConfig:
        if not self.extra_work_floor < self.extra_work_tolerance:
            raise ValueError(f"gauntlet.extra_work_floor ({self.extra_work_floor}) must be below "
                             f"gauntlet.extra_work_tolerance ({self.extra_work_tolerance})")
        return self
