"""What `benchmarks/performance/gpu.py` measures with: its scales (production on the GPU, smoke on the CPU), the
run's state (`Bench`: model, corpus, deadline) and the device facts its figures are read against."""

from __future__ import annotations

import gc
import hashlib
import hmac
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import RESULTS_DIR
from templar.compress import (
    ChunkedDCT,
    ChunkPlan,
    Compressed,
    DeMo,
)
from templar.compress.methods import OuterRule, rule_of
from templar.core.config import HParams, load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.core.schedule import learning_rate
from templar.runtime.train import (
    accumulate_gradients,
    gradients,
)
from templar.tools.sizing import PEAK_BF16_FLOPS
from templar.wire import Run

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("setup", "corpus", "window", "memory", "validator", "consensus", "noise")
MEMORY_STEPS = 2
"""Inner steps of one micro-batch each that the memory phase runs per setting (see `phase_memory`)."""
COMMON_GROUPS = 3      # groups of S_t whose mean steps give each unit its own baseline (docs/scoring.md §4)
WINDOW = 1000          # window number stamped on payloads and fingerprints (any fixed value)
FIT_FILE = RESULTS_DIR / "subnet_sim_fit.json"
NEAR_TIE = 1e-5
"""Kept sets may differ between implementations only where the k-th and a dropped coefficient are
this close, relative to the chunk's largest (float32 rounding of a 64-term sum: ~1e-6)."""


@dataclass(frozen=True)
class Scale:
    """How much of each phase one run does: production (1.2B, the GPU) or smoke (tiny's rules on a micro model, the CPU)."""

    name: str
    hparams: str | None             # preset (None: hparams.json, the production run)
    vocab: int                      # tokenizer entries of the prepared corpus
    model_on_vocab: bool            # the model's vocabulary set to `vocab` (smoke: tiny's 8192 rows would be
                                    # mostly never read); production measures hparams.json's model as it is
    max_documents: int | None       # per corpus file (None: the whole offline sample corpus)
    workers: int                    # tokenizer processes of `prepare` (0: in-process)
    timed_micro_batches: int        # forward+backward timed one by one
    validator_peers: int            # peers of the timed `score_peers`
    noise_peers: int
    noise_min_peers: int            # trained whatever the time cap says (the others' baseline needs 4)
    noise_pages_per_peer: int       # each noise peer's pages: a production window's at most, what the corpus holds
    noise_random_pages: int
    noise_pretrain_pages: int
    noise_pretrain_steps: int
    inner_steps_exercised: int      # also run the window with this many inner steps (0: only the hparams')
    kept_sets_layers: int | None    # consensus compares kept sets on the first N decoder layers and every
                                    # tensor outside them (None: all tensors; the CPU side is torch's path)
    budget: float                   # seconds for the whole run
    layers: dict[str, int] = field(default_factory=dict)  # the model's layer sizes (smoke: the test suite's micro
                                    # model; production measures hparams.json's model as it is)
    caps: dict[str, float] = field(default_factory=dict)    # seconds per phase at most
    minimum: dict[str, float] = field(default_factory=dict)  # skip a phase with less than this left


PRODUCTION = Scale(
    name="production", hparams=None, vocab=32000, model_on_vocab=False, max_documents=None, workers=min(8, max(1, (os.cpu_count() or 2) - 1)),
    timed_micro_batches=6, validator_peers=3, noise_peers=4, noise_min_peers=2, noise_pages_per_peer=3, noise_random_pages=4, noise_pretrain_pages=2,
    noise_pretrain_steps=48, inner_steps_exercised=0, kept_sets_layers=1, budget=480.0,
    caps={"corpus": 90, "window": 120, "memory": 90, "validator": 120, "consensus": 90, "noise": 150},
    minimum={"corpus": 30, "window": 40, "memory": 30, "validator": 20, "consensus": 25, "noise": 45},
)
SMOKE = Scale(
    name="smoke", hparams="tiny", vocab=1024, model_on_vocab=True, max_documents=120, workers=0, timed_micro_batches=1,
    validator_peers=2, noise_peers=4, noise_min_peers=4, noise_pages_per_peer=1 << 10, noise_random_pages=3, noise_pretrain_pages=2, noise_pretrain_steps=2,
    inner_steps_exercised=2, kept_sets_layers=None, budget=120.0,
    layers={"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
            "intermediate_size": 256},
    caps={"corpus": 30, "window": 30, "memory": 30, "validator": 20, "consensus": 30, "noise": 30},
    minimum={},
)


class StandInKey:
    """HMAC-SHA512 in place of the hotkey's sr25519 signature: no bittensor on the device. Both sign
    the 32-byte digest that `write_gradient` computes over every tensor (which is the costly part);
    an sr25519 signature or check of 32 bytes takes tens of microseconds."""

    _key = b"templar-gpu-benchmark-stand-in-k"

    def sign(self, digest: bytes) -> bytes:
        return hmac.new(self._key, digest, hashlib.sha512).digest()

    def verify(self, hotkey: str, digest: bytes, signature: bytes) -> bool:
        return hmac.compare_digest(self.sign(digest), signature)


class RecordingDCT(ChunkedDCT):
    """The transform `aggregate` runs, with the fixed-point accumulator of each tensor handed to
    `see(index, coef)` just before the inverse DCT: the float32 value of the int64 sum of every
    peer, which must be the same bits on every device and implementation."""

    def __init__(self, see: Callable[[int, torch.Tensor], None]) -> None:
        super().__init__()
        self.see = see
        self.calls = 0

    def inverse(self, coef: torch.Tensor, plan: ChunkPlan, out: torch.Tensor | None = None) -> torch.Tensor:
        self.see(self.calls, coef)
        self.calls += 1
        return super().inverse(coef, plan, out=out)


class Bench:
    """One run: settings, the deadline, results, and what phases share (model, corpus, peers)."""

    def __init__(self, scale: Scale, device: torch.device, out: Path, work: Path) -> None:
        self.scale = scale
        self.device = device
        self.out = out
        self.work = work
        hp = load_hparams(scale.hparams)
        model = {**scale.layers, **({"vocab_size": scale.vocab} if scale.model_on_vocab else {})}
        if model:
            hp = hp.model_copy(update={"model": hp.model.model_copy(update=model)})
        self.hp: HParams = hp
        self.started = time.monotonic()
        self.deadline = self.started + scale.budget
        self.phase_deadline = self.deadline
        self.key = StandInKey()
        self.run = Run(netuid=0, digest=self.hp.digest())
        self.shapes = parameter_shapes(build_model(self.hp, "meta"))
        self.result: dict[str, Any] = {"mode": scale.name, "hparams": self.hp.name, "phases": {}}
        self._model: torch.nn.Module | None = None
        self._theta0: dict[str, torch.Tensor] = {}  # a host copy of θ_0, for `restore_theta0`
        self._corpus: Any = None
        self._demo: DeMo | None = None
        self._peers: list[dict[str, Compressed]] | None = None

    # -- shared state ---------------------------------------------------------------------------
    def model(self) -> torch.nn.Module:
        """θ_0 of the run (built on the CPU from `init_seed`, as every node does), on the device."""
        if self._model is None:
            started = time.perf_counter()
            self._model = build_model(self.hp, self.device)
            self._theta0 = {n: p.detach().to("cpu", copy=True) for n, p in self._model.named_parameters()}
            self.result["model_build_seconds"] = time.perf_counter() - started
        return self._model

    def restore_theta0(self) -> None:
        """Put θ_0 back into the shared model. The window phase trains it and the consensus phase applies
        a window to it; every phase documents its figures from θ_0 (the noise phase's 48 steps away from
        it), so `run_phase` restores it after each phase rather than trusting each phase to."""
        if self._model is None:
            return
        with torch.no_grad():
            for name, param in self._model.named_parameters():
                param.copy_(self._theta0[name])

    @property
    def rule(self) -> OuterRule:
        """The run's outer rule (`optimizer.method`): its compressor, aggregate, trial step and apply."""
        return rule_of(self.hp.optimizer.method)

    def demo(self) -> DeMo:
        """One error-feedback state under the run's compressor, zeroed for each use (its cost does not
        depend on its contents)."""
        hp = self.hp
        if self._demo is None:
            self._demo = DeMo(self.model(), compressor=self.rule.compressor(hp.demo.target_chunk, hp.demo.topk),
                              decay=hp.demo.momentum_decay)
        for buffer in self._demo.buffers.values():
            buffer.zero_()
        return self._demo

    def release_demo(self) -> None:
        self._demo = None
        free_memory()

    def corpus(self) -> Any:
        if self._corpus is None:
            from templar.data import LocalCorpus

            shards = self.work / "shards"
            if not (shards / "manifest.json").is_file():
                raise RuntimeError(f"no prepared corpus in {shards}: run the corpus phase")
            self._corpus = LocalCorpus(shards)
            geometry = (self._corpus.sequence_length, self._corpus.sequences_per_page)
            if geometry != (self.hp.data.sequence_length, self.hp.data.sequences_per_page):
                raise RuntimeError(f"{shards} is cut {geometry}, the run needs "
                                   f"{(self.hp.data.sequence_length, self.hp.data.sequences_per_page)}")
        return self._corpus

    def pages(self, pages: Iterable[int]) -> torch.Tensor:
        corpus = self.corpus()
        return corpus.batch([p % corpus.num_pages for p in pages])

    def micro_batch(self, index: int) -> torch.Tensor:
        """The `index`-th micro-batch of the corpus's sequences (wrapping around)."""
        corpus, mb = self.corpus(), self.hp.optimizer.micro_batch_size
        per_page = corpus.sequences_per_page
        total = corpus.num_pages * per_page
        rows = [(index * mb + i) % total for i in range(mb)]
        return torch.stack([corpus.page(r // per_page)[r % per_page] for r in rows])

    def peers(self) -> list[dict[str, Compressed]]:
        """`top_g` peers' real compressed updates (one micro-batch of gradient each, distinct data), on the
        CPU, where a node's decoded payloads are. Built once; shared by window, validator, consensus."""
        if self._peers is None:
            model, hp = self.model(), self.hp
            lr = gradient_scale(hp)
            out = []
            for i in range(hp.gauntlet.top_g):
                accumulate_gradients(model, self.micro_batch(1 + i), hp.optimizer.micro_batch_size)
                compressed = self.demo().step(gradients(model), lr)
                model.zero_grad(set_to_none=True)
                out.append({name: c.to("cpu") for name, c in compressed.items()})
            self._peers = out
        return self._peers

    # -- time -----------------------------------------------------------------------------------
    def left(self) -> float:
        return min(self.deadline, self.phase_deadline) - time.monotonic()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """(fn(*args, **kwargs), wall seconds), the device's queue drained on both sides."""
        self.sync()
        started = time.perf_counter()
        out = fn(*args, **kwargs)
        self.sync()
        return out, time.perf_counter() - started

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            self.sync()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gb(self) -> float | None:
        """Peak GPU memory allocated by torch since `reset_peak` (None on the CPU)."""
        if self.device.type != "cuda":
            return None
        self.sync()
        return torch.cuda.max_memory_allocated(self.device) / 1e9


def free_memory() -> None:
    """Hand a finished phase's GPU memory back, so the next phase's peak is its own: the cycles the
    model and optimizer leave hold device memory until a collection. On a machine without CUDA there
    is no peak to protect and nothing to hand back, so no collection either (a full one costs a
    fraction of a second in a process that has imported torch and transformers: 5 s of the CPU smoke)."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def peak_lr(hp: HParams) -> float:
    """α at the end of warm-up: the step size of most of the run."""
    return learning_rate(hp.optimizer.warmup_steps, hp.optimizer)


def gradient_scale(hp: HParams) -> float:
    """What a stand-in peer's gradient is scaled by to read as a window's update: α for the signed rule
    (the paper's window sends α·g, and its step moves every coordinate by α whatever the size); the inner
    AdamW's peak rate under SparseLoCo, whose outer SGD step at α ≈ 2 applies the size it is sent (α·g
    would move θ by 2·α·g and wreck the model the later phases measure)."""
    if hp.optimizer.method == "signed" or hp.inner.optimizer != "adamw":
        return peak_lr(hp)
    return hp.inner.learning_rate


def production_inner_steps(hp: HParams) -> int:
    """Inner optimizer steps per window under the hparams (`inner.steps`; 1: the paper's one
    gradient per window)."""
    return hp.inner.steps


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """Dense bf16 peak of the device and where it came from (None: unknown device, no MFU)."""
    if device.type != "cuda":
        return None, "no peak for a CPU"
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return flops, f"{key} dense bf16 data-sheet peak"
    return None, f"unknown device {name!r}: no MFU"


def device_slug(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def spread_stats(values: Sequence[float]) -> dict[str, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"n": 0}
    mean = statistics.fmean(finite)
    sd = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return {"n": len(finite), "mean": mean, "sd": sd, "cv": sd / abs(mean) if mean else math.inf,
            "min": min(finite), "max": max(finite)}
