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

from pydantic import Field, ValidationError, model_validator

from templar.core.gauntlet_config import GauntletConfig
from templar.core.strict import Strict

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_HPARAMS = REPO_ROOT / "hparams.json"
PRESETS_DIR = REPO_ROOT / "hparams"
DEFAULT_CACHE_GB = 16.0
"""A node's default cap on its on-disk page cache (`--data.cache_gb`)."""

PROTOCOL_VERSION = 4
"""Bumped whenever the wire format or the consensus maths change; keys live under v{P}/."""

class ModelConfig(Strict):
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


class DataConfig(Strict):
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


class OptimizerConfig(Strict):
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


class InnerConfig(Strict):
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


class DemoConfig(Strict):
    """DeMo compression (DCT + top-k + error feedback), Algorithm 2 of the paper."""

    target_chunk: int = Field(gt=0, description="chunk side: largest divisor of each dim not above this")
    topk: int = Field(gt=0, description="coefficients kept per chunk")
    momentum_decay: float = Field(gt=0, lt=1, description="error-feedback decay")

    @model_validator(mode="after")
    def _topk_fits(self) -> DemoConfig:
        if self.topk > self.target_chunk * self.target_chunk:
            raise ValueError("demo.topk cannot exceed demo.target_chunk**2")
        return self


class SyncConfig(Strict):
    """The proof that a node holds the run's model: the fingerprint of θ the lead publishes with each
    window's progress and the rule that compares a node's own with it (`templar.runtime.consensus.fingerprint`)."""

    fingerprint_positions: int = Field(default=256, gt=0, le=4096, description="public coordinates of θ the "
                                       "fingerprint reads, drawn anew each window")
    max_off_share: float = Field(default=1 / 32, ge=0, lt=0.5, description="share of the positions that may be "
                                 "off by more than α/2 (cross-device sign flips near 0) in a node that is in sync")
    ulp_slack: float = Field(default=8 * 2.0**-23, ge=0, lt=1e-3, description="a value is never off by less than "
                             "this many of its own magnitude (8 float32 ulps), whatever α is")


class WindowConfig(Strict):
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


class HParams(Strict):
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
