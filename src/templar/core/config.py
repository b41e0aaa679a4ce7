"""Hyperparameters: one strict pydantic model for every run setting.

`hparams.json` at the repository root is the production run (the paper's 1.2B LLaMA).
Presets under `hparams/` name a `"base"` file and override only what differs; sections are
merged key by key. Every section forbids unknown keys, so a typo fails at start with its name
instead of silently falling back to a default (the anti-pattern of the earlier subnet).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_HPARAMS = REPO_ROOT / "hparams.json"
PRESETS_DIR = REPO_ROOT / "hparams"
DEFAULT_CACHE_GB = 16.0
"""A node's default cap on its on-disk page cache (`--data.cache_gb`)."""

PROTOCOL_VERSION = 3
"""Bumped whenever the wire format or the consensus maths change; keys live under v{P}/."""

HISTORY_LIMIT = 256
"""The most windows any per-window history a rule reads may span (the score book's persisted
schema bounds what it keeps by this, whatever a run sets)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelConfig(_Strict):
    """LLaMA architecture (`transformers.LlamaConfig` fields)."""

    vocab_size: int = Field(gt=0, description="token vocabulary; must match the tokenizer")
    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    intermediate_size: int = Field(gt=0, description="FFN width")
    max_position_embeddings: int = Field(gt=0)
    rope_theta: float = Field(gt=0)
    rms_norm_eps: float = Field(gt=0)
    tie_word_embeddings: bool
    init_seed: int = Field(ge=0, description="seed of the run's initial weights (shared by all nodes)")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("model.hidden_size must be divisible by model.num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("model.num_attention_heads must be divisible by model.num_key_value_heads")
        return self


class DataConfig(_Strict):
    """Where tokens come from and how they are cut into pages."""

    corpus: str = Field(
        description="where the run's prepared corpus lives (docs/data.md): a bucket locator "
        "(r2:…, s3:…, local:/abs/path) or a folder relative to the repository root; '' until the "
        "subnet owner publishes it. Nodes may read a mirror instead (--data.locator): the pinned "
        "manifest digest makes every copy byte-identical",
    )
    corpus_prefix: str = Field(pattern=r"^([A-Za-z0-9_.=+-]+/)*$",
                               description="key prefix of manifest.json and shards/ inside the bucket")
    manifest: str = Field(pattern=r"^([0-9a-f]{64})?$",
                          description="sha256 of the corpus manifest.json (consensus: every node reads the "
                          "same bytes); '' until published, and a node refuses to start")
    sequence_length: int = Field(gt=1, description="tokens per training sequence (must match the manifest)")
    sequences_per_page: int = Field(gt=0, description="a page is this many packed sequences (must match the "
                                    "manifest)")
    pages_per_window: int = Field(gt=0, description="assigned pages each miner trains on per window")
    eval_pages: int = Field(gt=0, description="pages per LossScore evaluation (assigned and random)")
    holdout_fraction: float = Field(ge=0, lt=0.5, description="pages kept out of assignment for held-out loss")
    holdout_eval_pages: int = Field(default=4, gt=0, description="held-out pages a validator measures its "
                                    "model's held-out loss on each window")
    data_seed: int = Field(ge=0, description="seed of the deterministic page assignment")
    max_extra_pages: int = Field(
        default=0, ge=0, le=4096, description="the most pages beyond its assigned ones a miner may declare per "
        "window (--extra-pages, docs/mining.md §6): which pages follows from the count by a public rule "
        "(PagePlan.declared_pages), validators draw the proof of computation across assigned and declared pages "
        "alike, and the declared work is paid (gauntlet.extra_work_exponent); 0: no extra pages in this run")


class OptimizerConfig(_Strict):
    """The outer step θ ← θ·(1 − α_t·wd) − α_t·update, with warm-up and cosine decay of α_t over
    global_step; `method` says what the update is (`templar.compress.methods`)."""

    method: Literal["signed", "sparseloco"] = Field(
        default="signed", description="the outer step (templar.compress.methods): signed = the Gauntlet paper's "
        "sign of the normalised top-G sum of DeMo-compressed pseudo-gradients, learning_rate its step size; "
        "sparseloco = the median-clipped mean of chunked top-k 2-bit pseudo-gradients, learning_rate the outer "
        "SGD rate (about 1), weight decay left to the inner AdamW")
    learning_rate: float = Field(gt=0)
    warmup_steps: int = Field(ge=0)
    total_steps: int = Field(gt=0, description="cosine decay horizon in outer steps")
    min_lr_factor: float = Field(ge=0, le=1, description="floor of the cosine as a fraction of lr")
    outer_schedule: Literal["cosine", "constant"] = Field(
        default="cosine", description="α_t: the warm-up and cosine the inner rate follows, or constant after "
        "the warm-up (DiLoCo's outer SGD: the inner rate alone anneals; templar.core.schedule.learning_rate)")
    weight_decay: float = Field(ge=0)
    micro_batch_size: int = Field(gt=0, description="sequences per forward/backward (grad accumulation)")
    grad_clip: float = Field(gt=0)


class InnerConfig(_Strict):
    """A miner's inner steps inside one window: H optimizer steps from the run's θ_t on its pages
    (split into H equal parts), whose pseudo-gradient Δ = θ_t − θ_H goes through the compressor's
    error feedback. The defaults are the paper's: one plain gradient of all the window's pages,
    scaled by the outer learning rate (bit for bit what miners sent before inner steps existed)."""

    steps: int = Field(default=1, gt=0, le=4096, description="H: inner optimizer steps per window")
    optimizer: Literal["sgd", "adamw"] = Field(
        default="sgd", description="sgd: θ ← θ − α_t·g per step, α_t the run's outer learning rate (H = 1: the "
        "paper's single gradient); adamw: torch's AdamW with the settings below")
    learning_rate: float = Field(default=4e-4, gt=0, description="adamw: peak inner learning rate, following the "
                                 "run's schedule shape (warm-up, cosine to min_lr_factor) over global_step")
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0, description="adamw: decoupled weight decay of the inner steps")
    overlap: Literal["blocking", "delayed", "eager"] = Field(
        default="blocking", description="what window w's update is computed from, and so whether a miner's next "
        "inner steps wait for the exchange (docs/architecture.md §2, `base_lag`): blocking = from θ after window "
        "w−1's outer step (the paper; the GPU idles through the put window, gather and step); delayed = from θ "
        "after w−2's step, the newest θ a miner holds when w's inner steps start the moment its w−1 payload is "
        "committed; eager (arXiv 2502.12996, inner adamw) = the inner steps start from that θ with the miner's own "
        "w−1 update applied as a proxy, swapped for the real step when it lands: computed from θ after w−1 as "
        "blocking")


class DemoConfig(_Strict):
    """DeMo compression (DCT + top-k + error feedback), Algorithm 2 of the paper."""

    target_chunk: int = Field(gt=0, description="chunk side: largest divisor of each dim not above this")
    topk: int = Field(gt=0, description="coefficients kept per chunk")
    momentum_decay: float = Field(gt=0, lt=1, description="error-feedback decay")

    @model_validator(mode="after")
    def _topk_fits(self) -> DemoConfig:
        if self.topk > self.target_chunk * self.target_chunk:
            raise ValueError("demo.topk cannot exceed demo.target_chunk**2")
        return self


class GauntletConfig(_Strict):
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


class SyncConfig(_Strict):
    """The proof that a node holds the run's model: the fingerprint of θ the lead publishes with each
    window's progress and the rule that compares a node's own with it (`templar.runtime.consensus.fingerprint`)."""

    fingerprint_positions: int = Field(default=256, gt=0, le=4096, description="public coordinates of θ the "
                                       "fingerprint reads, drawn anew each window")
    max_off_share: float = Field(default=1 / 32, ge=0, lt=0.5, description="share of the positions that may be "
                                 "off by more than α/2 (cross-device sign flips near 0) in a node that is in sync")
    ulp_slack: float = Field(default=8 * 2.0**-23, ge=0, lt=1e-3, description="a value is never off by less than "
                             "this many of its own magnitude (8 float32 ulps), whatever α is")


class WindowConfig(_Strict):
    """The time model: blocks, windows, put windows, cadences (all in windows unless named)."""

    blocks_per_window: int = Field(gt=0)
    block_time: float = Field(gt=0, description="seconds per block on the embedded chain")
    put_window_seconds: float = Field(gt=0, description="uploads count only this long after the window ends")
    clock_skew_seconds: float = Field(ge=0, description="tolerance on object timestamps at both ends of the "
                                      "put window (S3 LastModified has 1 s resolution; clocks drift)")
    gather_seconds: float = Field(gt=0, description="whole-round gather deadline after the put window")
    windows_per_weights: int = Field(gt=0)
    checkpoint_frequency: int = Field(gt=0)
    peer_replacement_frequency: int = Field(gt=0)
    warmup_windows: int = Field(ge=0)
    max_allowed_stale: int = Field(gt=0)
    lead_slots: int = Field(default=3, ge=1, le=16, description="how many validators of the succession order "
                            "(templar.chain.succession_of) may publish a window's inputs, one slot each, in order")
    lead_cadence: int = Field(default=16, ge=1, le=1024, description="windows between two returns to the "
                              "succession's own order: the validator that led a window keeps the first slot of the "
                              "next, except in a window that is a multiple of this (a returning lead takes its slot "
                              "back there)")
    handover_seconds: float = Field(default=5.0, gt=0, description="how long each lead slot is open for publishing: "
                                    "the lead's inputs count only if stored by gather_deadline + this (plus the "
                                    "clock-skew allowance), candidate k's by this long after slot k - 1 settled, and "
                                    "none before the slot before closed (docs/design.md §5)")
    handover_settle_seconds: float = Field(default=1.0, ge=0, description="after a slot's last acceptable "
                                           "timestamp (with the clock-skew allowance), how long until a 'not found' "
                                           "of that candidate's inputs is taken as definite by every reader")
    retained_checkpoints: int = Field(default=3, ge=1, le=64, description="checkpoints each candidate of the "
                                      "succession keeps; its published history before the oldest is deleted, so a "
                                      "'not found' of an older window proves nothing (templar.runtime.consensus.windows."
                                      "retained_windows)")
    settle_seconds: float = Field(default=0.25, ge=0, le=60, description="time for an upload stamped at the last "
                                  "acceptable instant to become visible to readers: the gather starts this long "
                                  "after put_window_seconds + clock_skew_seconds")
    apply_seconds: float = Field(default=5.0, gt=0, description="how long past the last lead slot a node that "
                                 "could not establish a window's inputs keeps trying (and fetches the payloads they "
                                 "name that its own gather lacks), at most gather_seconds, before it falls back to "
                                 "catch-up")
    commit_read_seconds: float = Field(default=4.0, gt=0, description="how long validators have to read the "
                                       "window's commitments before any gradient can count (at most half the put "
                                       "window): a miner's commitment is due this long before the window ends")

    @property
    def window_seconds(self) -> float:
        """A window's nominal length: its blocks at the configured block time."""
        return self.blocks_per_window * self.block_time


class HParams(_Strict):
    """A whole run's settings; the hash of this object is part of every checkpoint manifest."""

    name: str = Field(min_length=1)
    model: ModelConfig
    data: DataConfig
    optimizer: OptimizerConfig
    inner: InnerConfig = InnerConfig()
    demo: DemoConfig
    gauntlet: GauntletConfig
    windows: WindowConfig
    sync: SyncConfig = SyncConfig()
    protocol: Literal[PROTOCOL_VERSION] = PROTOCOL_VERSION  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _sparseloco_needs_pseudo_gradients(self) -> HParams:
        if self.optimizer.method == "sparseloco" and self.inner.optimizer != "adamw":
            raise ValueError("optimizer.method sparseloco applies the mean pseudo-gradient at an outer rate of about "
                             "1: it needs inner.optimizer adamw (an SGD window's gradient is scaled by that rate)")
        if self.optimizer.method == "sparseloco" and self.optimizer.weight_decay > 0:
            # Its outer step is θ − α·Δ: a run that asked for an outer decay would not get one. Applied
            # there (θ·(1 − α·wd), decoupled, every coordinate) it ended 0.027-0.029 nats worse on
            # both draws than the same decay in the inner steps (benchmarks/LOG.md §32).
            raise ValueError("optimizer.method sparseloco takes its weight decay in the inner steps "
                             "(inner.weight_decay); optimizer.weight_decay must be 0")
        return self

    @model_validator(mode="after")
    def _honest_warm_ups_are_never_overdue(self) -> HParams:
        """A miner warms up for `windows.warmup_windows` after joining or re-syncing, one window more when its
        sync check found a fork: an allowance within that would fail honest warm-ups."""
        allowance, warmup = self.gauntlet.warmup_overdue_windows, self.windows.warmup_windows
        if 0 < allowance <= warmup + 1:
            raise ValueError(f"gauntlet.warmup_overdue_windows ({allowance}) must exceed windows.warmup_windows + 1 "
                             f"({warmup + 1}), or be 0 (never): an honest warm-up would fail")
        if 0 < self.gauntlet.warmup_overdue_horizon <= allowance:
            raise ValueError(f"gauntlet.warmup_overdue_horizon ({self.gauntlet.warmup_overdue_horizon}) must exceed "
                             f"warmup_overdue_windows ({allowance}), or be 0 (no budget): a horizon within one "
                             "allowance budgets nothing")
        return self

    @model_validator(mode="after")
    def _eager_needs_pseudo_gradients(self) -> HParams:
        if self.inner.overlap == "eager" and self.inner.optimizer != "adamw":
            raise ValueError("inner.overlap eager swaps a proxy for the real step inside the inner steps and forms "
                             "θ − θ_H: it needs inner.optimizer adamw")
        return self

    @model_validator(mode="after")
    def _overlapped_step_lands_before_the_next_commitment(self) -> HParams:
        """An overlapped miner encodes window w+1's payload once w's step has landed; the lead's inputs
        of w count when stored by its first slot's deadline widened by the clock-skew allowance, so that
        must fall before w+1's commitment deadline (each later slot, a failed lead's, may cost the miners
        that window's commitment)."""
        if self.inner.overlap == "blocking":
            return self
        w = self.windows
        first_slot = w.put_window_seconds + w.clock_skew_seconds + w.settle_seconds + w.gather_seconds \
            + w.handover_seconds + w.clock_skew_seconds  # after window w ends
        commitment = w.window_seconds - w.clock_skew_seconds - min(w.commit_read_seconds, w.put_window_seconds / 2)
        if first_slot >= commitment:
            raise ValueError(f"inner.overlap {self.inner.overlap}: the lead's step of a window is due {first_slot:g} s "
                             f"after it ends (put window, clock skew, settle, gather, first lead slot, clock skew), after the "
                             f"next window's commitment deadline ({commitment:g} s): lengthen the windows or "
                             "shorten the put window or gather, or run inner.overlap blocking")
        return self

    @model_validator(mode="after")
    def _inner_steps_fit(self) -> HParams:
        sequences = self.data.pages_per_window * self.data.sequences_per_page
        if self.inner.steps > sequences:
            raise ValueError(f"inner.steps ({self.inner.steps}) exceeds the window's sequences ({sequences}: "
                             "pages_per_window × sequences_per_page)")
        return self

    def digest(self) -> str:
        """Stable sha256 of the settings that consensus depends on: not the name, and not where a
        node reads its corpus from (mirrors differ between honest nodes; the manifest digest,
        which is included, makes their bytes identical)."""
        body = self.model_dump(exclude={"name": True, "data": {"corpus", "corpus_prefix"}})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def base_lag(inner: InnerConfig) -> int:
    """How many windows before its own window the θ an update is computed from lies: window w's update
    is computed from θ after window w − `base_lag`'s outer step (its base, whose global_step the payload
    declares): 1 for blocking and eager, 2 for delayed (`InnerConfig.overlap`)."""
    return 2 if inner.overlap == "delayed" else 1


def overlapped(inner: InnerConfig) -> bool:
    """Whether a miner's inner steps of window w+1 run while window w's exchange is in flight."""
    return inner.overlap != "blocking"


class HParamsError(ValueError):
    """A hyperparameter file is unreadable or invalid; the message names the key."""


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_layered(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise HParamsError(f"{path}: 'base' chain loops back on itself")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise HParamsError(f"hparams file not found: {path}") from exc
    except json.JSONDecodeError as exc:
        raise HParamsError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise HParamsError(f"{path}: top level must be an object")
    base_name = raw.pop("base", None)
    if base_name is None:
        return raw
    if not isinstance(base_name, str):
        raise HParamsError(f"{path}: 'base' must be a file name")
    base = _read_layered((path.parent / base_name), (*seen, path))
    return _deep_merge(base, raw)


def resolve_hparams_path(name_or_path: str | Path | None) -> Path:
    """`None` → production; a bare preset name (`tiny`) → `hparams/tiny.json`; else a path."""
    if name_or_path is None:
        return DEFAULT_HPARAMS
    candidate = Path(name_or_path)
    if candidate.suffix != ".json" and not candidate.exists():
        preset = PRESETS_DIR / f"{name_or_path}.json"
        if preset.exists():
            return preset
    return candidate


def load_hparams(name_or_path: str | Path | None = None) -> HParams:
    """Load and validate hparams; raise `HParamsError` naming the offending key."""
    path = resolve_hparams_path(name_or_path)
    if isinstance(name_or_path, str) and path == Path(name_or_path) and not path.exists() \
            and "/" not in name_or_path and path.suffix != ".json":
        raise HParamsError(f"no preset {name_or_path!r}: {PRESETS_DIR / (name_or_path + '.json')} does not exist "
                           f"(a bare name means hparams/<name>.json; docs/mining.md §6 shows how to write one), "
                           f"and neither does a file {name_or_path!r}")
    data = _read_layered(path)
    try:
        return HParams.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(part) for part in err["loc"]) or "<root>"
            problems.append(f"{key}: {err['msg']}")
        raise HParamsError(f"{path}: invalid hparams: " + "; ".join(problems)) from exc


def resolve_asset(value: str) -> str:
    """Relative paths in hparams are relative to the repository root; locators pass through."""
    if value.startswith(("r2:", "s3:", "local:", "hub:")):
        return value
    path = Path(value)
    return str(path if path.is_absolute() else REPO_ROOT / path)
