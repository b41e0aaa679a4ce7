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

PROTOCOL_VERSION = 2
"""Bumped whenever the wire format or the consensus maths change; keys live under v{P}/."""


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
    data_seed: int = Field(ge=0, description="seed of the deterministic page assignment")


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
    sync_max_steps: float = Field(gt=0, description="sync threshold in steps of alpha")
    fast_eval_penalty: float = Field(gt=0, lt=1, description="phi: mu multiplier on a failed fast eval")
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
    mu_prior_evals: float | None = Field(default=None, ge=0, description="PeerScore reads mu / (1 - gamma^(n + "
                                         "this)) after n primary evaluations (start-up bias removed); None is "
                                         "the paper's mu")
    loss_rating: Literal["openskill", "relative"] = Field(
        default="openskill", description="LossRating in PeerScore: the paper's OpenSkill mu, or 25 x the "
        "peer's relative LossScore (delta_rand / median of S_t) with a tie band and a power premium "
        "(gauntlet.relative_rating; docs/scoring.md §5)")
    rating_gamma: float = Field(default=0.95, ge=0, lt=1, description="relative rating: EMA factor of the "
                                "relative LossScores (memory about 1 / (1 - gamma) evaluations)")
    rating_tie_band: float = Field(default=3.5, ge=0, le=10, description="relative rating: a mean within "
                                   "this many standard errors (noise / sqrt(n_eff), noise measured from the "
                                   "windows' spread) of the median counts as the median")
    rating_exponent: float = Field(default=10.0, gt=0, le=100, description="relative rating: LossRating = "
                                   "25 x (relative LossScore beyond the band)^this")
    rating_cap: float | None = Field(default=None, ge=1, le=100, description="relative rating: LossRating "
                                     "<= 25 x this (None: no cap); bounds how far validators that crossed the "
                                     "band in different windows disagree")


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
    protocol: Literal[PROTOCOL_VERSION] = PROTOCOL_VERSION  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _sparseloco_needs_pseudo_gradients(self) -> HParams:
        if self.optimizer.method == "sparseloco" and self.inner.optimizer != "adamw":
            raise ValueError("optimizer.method sparseloco applies the mean pseudo-gradient at an outer rate of about "
                             "1: it needs inner.optimizer adamw (an SGD window's gradient is scaled by that rate)")
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
