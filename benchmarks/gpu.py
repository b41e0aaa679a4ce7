"""The production window, the validator, evaluation noise and cross-device consensus, measured on one GPU.

    python benchmarks/gpu.py                   # 1.2B in bf16 on the GPU: writes results/gpu_<device>.json
    python benchmarks/gpu.py --smoke           # the same code on the tiny preset and the CPU (~10 s; tests)
    python benchmarks/gpu.py --phases corpus,window --budget 200

Every GPU figure of the project was an estimate (the sizing table of docs/mining.md assumes 40 %
MFU); this script replaces them with measurements in one short device call. It runs the project's
own functions (`accumulate_gradients`, `DeMo`, `write_gradient`/`read_gradient`, `aggregate`,
`apply_signed_update`, `Evaluator`, `model_fingerprint`/`model_in_sync`) and none of the chain
layer: `templar.runtime.outer` imports `templar.chain` (bittensor), so the outer step is its two
pure halves, `compress.aggregate` and `compress.apply_signed_update` at `core.schedule.learning_rate`;
payloads are signed with a stand-in HMAC (`StandInKey`) instead of sr25519.

Phases (`--phases`, comma-separated; `setup` always runs). Each is one function writing its part
of the JSON; an exception (a CUDA OOM too) is recorded as that phase's error and the next phase
still runs; the JSON is rewritten after every phase, so a killed run leaves what it measured.
Estimates for one H100 (the sizing formulas at ~35 % MFU; CPU parts scaled from this 2-core VM,
where the torch CPU paths at 1.2B took 104 s to compress, 42 s to decode one peer's signs and
83 s to aggregate 15 peers on 2 loaded threads; the device's 16 cores are assumed ~8× faster):

| phase | what | estimate | cap |
|---|---|---|---|
| start-up | imports, CUDA context | 15 s | |
| setup | versions, device, the sizing table's estimates | 1 s | |
| corpus | a 32,000-entry byte-level BPE trained on the offline sample corpus the way `scripts/build_assets.py` trains tiny's (8 s on 2 cores here), then `templar.data.prepare` at 2,048 × 64 (2.4 M tokens, 18 pages; 17–33 s on 2 cores here); cached in `assets/gpu_sample_32000`. With tokenizers 0.23.3 the tokenizer's sha256 is 823b1725… and the manifest digest 49cc596a…, both in the JSON | 30 s | 90 s |
| window | 1.2B built on the CPU from `init_seed` (12 s here), one untimed and 6 timed forward+backward passes of a micro-batch, the paper's window (3 pages, 48 micro-batches accumulated, one gradient), the DeMo step, encoding the payload, decoding it 15 times (full reads), aggregating 15 peers on the CPU (what a node does today: decoded payloads stay in host memory) and on the GPU, the outer step; the 15 peers' updates are real DeMo steps on one micro-batch each | 60 s | 120 s |
| validator | one peer's sign decode on the CPU and the GPU, `Evaluator.score_peers` with 3 peers on one production page each (signs held on the host, as the validator holds them), the random page and 4 held-out pages alone: seconds per peer, peers per 84 s window | 25 s | 60 s |
| consensus | one gradient compressed on the GPU and the CPU (kept sets of decoder layer 0, embeddings, head and final norm: the CPU side is torch's path), the 15 peers aggregated on both (fixed-point accumulators bit for bit, signs), the window applied to θ on both, `model_in_sync` | 35 s | 90 s |
| noise | 48 AdamW steps away from θ_0 on 2 pages, 4 honest peers train on 3 pages each (one DeMo step each), LossScores per page on 4 random pages and their own pages: spread of δ across pages and across peers, and what the proof of computation by size credits each honest peer, range by range of each sequence | 95 s | 150 s |

About 4.5 minutes expected; `--budget` (420 s) is the whole run's deadline: a phase is skipped
when less than its minimum is left, and `noise` trains fewer peers when its cap is near. The
sample corpus gives 18 production pages (2.4 M tokens), and `noise` uses all of them: 2 to train
away from θ_0, 4 × 3 assigned, 4 random; more peers or pages need a larger corpus. Until hparams
have inner optimizer steps (`inner.steps` > 1), production's window is the paper's;
`measure_window(b, hp, steps)` times H > 1 steps (a timing model: H AdamW steps over the same
tokens, `--smoke` runs H = 2) once they exist.

On the device machine (Python 3.12, torch, transformers, safetensors, numpy; no network, no
bittensor). Here, once: `bash benchmarks/gpu_wheels.sh` puts the wheels it lacks in the git-ignored
`benchmarks/.gpu_wheels/` (23 wheels, 22 MB: pydantic and pydantic-core for cp312, loguru, and
aiobotocore with its closure, which `templar.data` imports through `templar.storage`). The one
device call carries `benchmarks/.gpu_wheels` and `assets/corpus` (10 MB of text, from
`scripts/build_assets.py`):

    python3 -m pip install -q --no-index --find-links benchmarks/.gpu_wheels --target /tmp/gpu_site \
        pydantic loguru aiobotocore && \
    PYTHONPATH=src:/tmp/gpu_site timeout 450 python3 benchmarks/gpu.py 2>&1 | tee "$OUT/gpu.log"; \
    cp benchmarks/results/gpu_*.json "$OUT"/

`--target` installs beside the image's packages without touching them (and without the
externally-managed-environment refusal). The C kernels (`templar.compress._native`) are not built
there: the CPU sides run torch's paths, as on a node without a compiler (a node with them
accumulates faster; the inverse DCT is torch's either way). The JSON's `table` lists each measured
figure beside the estimate it replaces.
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import hmac
import importlib.util
import math
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from _common import RESULTS_DIR, _rounded, write_result
from templar.compress import (
    ChunkedDCT,
    ChunkPlan,
    Compressed,
    DCTCompressor,
    DeMo,
    aggregate,
    apply_signed_update,
    native,
)
from templar.core.config import HParams, load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.core.schedule import learning_rate
from templar.runtime.fingerprint import FINGERPRINT_POSITIONS, model_fingerprint, model_in_sync, off_positions
from templar.runtime.train import (
    accumulate_gradients,
    evaluate_loss,
    gradients,
    inner_lr,
    inner_steps,
    make_inner_optimizer,
)
from templar.tools.sizing import H100_BF16_FLOPS, HOLDOUT_PAGES, window_sizing
from templar.validator.evaluate import POSITION_RANGES, Evaluator, page_deltas, range_weights, sequence_deltas
from templar.wire import Run, read_gradient, take_probes, write_gradient

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("setup", "corpus", "window", "validator", "consensus", "noise")
WINDOW = 1000          # window number stamped on payloads and fingerprints (any fixed value)
FIT_FILE = RESULTS_DIR / "subnet_sim_fit.json"
NEAR_TIE = 1e-5
"""Kept sets may differ between implementations only where the k-th and a dropped coefficient are
this close, relative to the chunk's largest (float32 rounding of a 64-term sum: ~1e-6)."""

PEAK_BF16_FLOPS = {  # dense bf16 tensor-core peaks (vendor data sheets), by a substring of the device name
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": H100_BF16_FLOPS,   # SXM (HBM3), the sizing table's reference
    "H200": H100_BF16_FLOPS,   # same compute as the H100 SXM, more memory
    "A100": 312e12,
}


@dataclass(frozen=True)
class Scale:
    """How much of each phase one run does: production (1.2B, the GPU) or smoke (tiny, the CPU)."""

    name: str
    hparams: str | None             # preset (None: hparams.json, the production run)
    vocab: int                      # tokenizer entries of the prepared corpus
    max_documents: int | None       # per corpus file (None: the whole offline sample corpus)
    workers: int                    # tokenizer processes of `prepare` (0: in-process)
    timed_micro_batches: int        # forward+backward timed one by one
    validator_peers: int            # peers of the timed `score_peers`
    noise_peers: int
    noise_random_pages: int
    noise_pretrain_pages: int
    noise_pretrain_steps: int
    inner_steps_exercised: int      # also run the window with this many inner steps (0: only the hparams')
    kept_sets_layers: int | None    # consensus compares kept sets on the first N decoder layers and every
                                    # tensor outside them (None: all tensors; the CPU side is torch's path)
    budget: float                   # seconds for the whole run
    caps: dict[str, float] = field(default_factory=dict)    # seconds per phase at most
    minimum: dict[str, float] = field(default_factory=dict)  # skip a phase with less than this left


PRODUCTION = Scale(
    name="production", hparams=None, vocab=32000, max_documents=None, workers=min(8, max(1, (os.cpu_count() or 2) - 1)),
    timed_micro_batches=6, validator_peers=3, noise_peers=4, noise_random_pages=4, noise_pretrain_pages=2,
    noise_pretrain_steps=48, inner_steps_exercised=0, kept_sets_layers=1, budget=420.0,
    caps={"corpus": 90, "window": 120, "validator": 60, "consensus": 90, "noise": 150},
    minimum={"corpus": 30, "window": 40, "validator": 20, "consensus": 25, "noise": 45},
)
SMOKE = Scale(
    name="smoke", hparams="tiny", vocab=1024, max_documents=120, workers=0, timed_micro_batches=1,
    validator_peers=2, noise_peers=3, noise_random_pages=3, noise_pretrain_pages=2, noise_pretrain_steps=2,
    inner_steps_exercised=2, kept_sets_layers=None, budget=120.0,
    caps={"corpus": 30, "window": 30, "validator": 20, "consensus": 30, "noise": 30},
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
        self.hp: HParams = load_hparams(scale.hparams)
        self.started = time.monotonic()
        self.deadline = self.started + scale.budget
        self.phase_deadline = self.deadline
        self.key = StandInKey()
        self.run = Run(netuid=0, digest=self.hp.digest())
        self.shapes = parameter_shapes(build_model(self.hp, "meta"))
        self.result: dict[str, Any] = {"mode": scale.name, "hparams": self.hp.name, "phases": {}}
        self._model: torch.nn.Module | None = None
        self._corpus: Any = None
        self._demo: DeMo | None = None
        self._peers: list[dict[str, Compressed]] | None = None

    # -- shared state ---------------------------------------------------------------------------
    def model(self) -> torch.nn.Module:
        """θ_0 of the run (built on the CPU from `init_seed`, as every node does), on the device."""
        if self._model is None:
            started = time.perf_counter()
            self._model = build_model(self.hp, self.device)
            self.result["model_build_seconds"] = time.perf_counter() - started
        return self._model

    def demo(self) -> DeMo:
        """One error-feedback state, zeroed for each use (its cost does not depend on its contents)."""
        hp = self.hp
        if self._demo is None:
            self._demo = DeMo(self.model(), compressor=DCTCompressor(hp.demo.target_chunk, hp.demo.topk),
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
        """`top_g` peers' real DeMo updates (one micro-batch of gradient each, distinct data), on the
        CPU, where a node's decoded payloads are. Built once; shared by window, validator, consensus."""
        if self._peers is None:
            model, hp = self.model(), self.hp
            lr = peak_lr(hp)
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
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_lr(hp: HParams) -> float:
    """α at the end of warm-up: the step size of most of the run."""
    return learning_rate(hp.optimizer.warmup_steps, hp.optimizer)


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


def _stats(values: Sequence[float]) -> dict[str, float]:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"n": 0}
    mean = statistics.fmean(finite)
    sd = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return {"n": len(finite), "mean": mean, "sd": sd, "cv": sd / abs(mean) if mean else math.inf,
            "min": min(finite), "max": max(finite)}


# -- phases ---------------------------------------------------------------------------------------
def phase_setup(b: Bench) -> dict[str, Any]:
    """Versions, the device, and the sizing table's estimates the measurements replace."""
    import numpy
    import transformers

    hp = b.hp
    sizing = window_sizing(hp)
    peak, peak_source = peak_flops(b.device)
    out: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "numpy": numpy.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "device": str(b.device), "native_kernels": native.available(),
        "bittensor_imported": "bittensor" in sys.modules,
        "hparams": hp.name, "digest": hp.digest(), "parameters": sizing["parameters"],
        "peak_bf16_flops": peak, "peak_source": peak_source,
        "estimate": {k: sizing[k] for k in ("tokens_per_window_per_peer", "train_flops_per_window", "mfu_assumed",
                                            "h100_train_seconds", "validator_eval_tokens_per_window",
                                            "validator_eval_flops_per_window", "h100_validator_eval_seconds",
                                            "miner_gpu_memory_gb", "validator_gpu_memory_gb", "window_seconds")},
    }
    if b.device.type == "cuda":
        props = torch.cuda.get_device_properties(b.device)
        out.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gb=props.total_memory / 1e9, cuda=torch.version.cuda,
                   tf32_matmul=torch.backends.cuda.matmul.allow_tf32, bf16_supported=torch.cuda.is_bf16_supported())
    return out


def _build_assets() -> Any:
    """`scripts/build_assets.py` as a module: the tokenizer is trained the way the bootstrap trains tiny's."""
    spec = importlib.util.spec_from_file_location("build_assets", ROOT / "scripts" / "build_assets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def phase_corpus(b: Bench) -> dict[str, Any]:
    """The offline sample corpus at the run's geometry with a `scale.vocab`-entry tokenizer (cached)."""
    from templar.data.prepare import Geometry, prepare

    source = ROOT / "assets" / "corpus"
    files = sorted(source.glob("*.jsonl"))
    if not files:
        raise RuntimeError(f"no sample corpus in {source}: run scripts/build_assets.py (or carry assets/corpus)")
    out: dict[str, Any] = {"source": str(source.relative_to(ROOT)), "source_mb": sum(f.stat().st_size for f in files) / 1e6}
    tokenizer, shards = b.work / "tokenizer", b.work / "shards"
    if b.scale.max_documents is not None:  # smoke: the first documents of each file, same code path
        sliced = b.work / "corpus"
        sliced.mkdir(parents=True, exist_ok=True)
        for f in files:
            with f.open(encoding="utf-8") as src:
                lines = [line for _, line in zip(range(b.scale.max_documents), src, strict=False)]
            (sliced / f.name).write_text("".join(lines), encoding="utf-8")
        files, source = sorted(sliced.glob("*.jsonl")), sliced
    if (tokenizer / "tokenizer.json").is_file():
        out["tokenizer_seconds"], out["tokenizer_cached"] = 0.0, True
    else:
        _, out["tokenizer_seconds"] = b.timed(lambda: _build_assets().train_tokenizer(files, tokenizer, b.scale.vocab))
    d = b.hp.data
    geometry = Geometry(sequence_length=d.sequence_length, sequences_per_page=d.sequences_per_page,
                        pages_per_shard=1 << 16)
    manifest, out["prepare_seconds"] = b.timed(lambda: prepare(
        str(source), str(tokenizer), shards, geometry, name=f"sample-{d.sequence_length}",
        workers=b.scale.workers, progress=False))
    if manifest.tokenizer.vocab_size > b.hp.model.vocab_size:
        raise RuntimeError(f"tokenizer has {manifest.tokenizer.vocab_size} entries, the model {b.hp.model.vocab_size}")
    b._corpus = None
    out.update(pages=manifest.num_pages, tokens=manifest.num_tokens, page_tokens=d.sequence_length * d.sequences_per_page,
               vocab=manifest.tokenizer.vocab_size, tokenizer_sha256=manifest.tokenizer.sha256,
               digest=manifest.digest(), work=str(b.work))
    return out


def measure_window(b: Bench, hp: HParams, steps_per_window: int, *, timed_micro_batches: int | None = None,
                   ) -> dict[str, Any]:
    """One miner window under `hp` with `steps_per_window` optimizer steps (1: the paper's single
    gradient over the assigned pages, micro-batches accumulated), split into its parts; first one
    untimed forward+backward (kernel selection, allocator) and `timed_micro_batches` timed alone."""
    model, mb = b.model(), hp.optimizer.micro_batch_size
    batch = b.pages(range(hp.data.pages_per_window))
    lr = peak_lr(hp)
    tokens = int(batch.numel())
    sizing = window_sizing(hp)  # the sizing table's FLOP arithmetic: 6·N + 12·L·d·S per trained token
    flops_per_token = sizing["train_flops_per_window"] / sizing["tokens_per_window_per_peer"]
    peak, _ = peak_flops(b.device)

    def mfu(n_tokens: int, seconds: float) -> float | None:
        return n_tokens * flops_per_token / seconds / peak if peak and seconds > 0 else None

    out: dict[str, Any] = {"steps_per_window": steps_per_window, "tokens": tokens, "micro_batch": mb,
                           "flops_per_token": flops_per_token}
    timed_micro_batches = b.scale.timed_micro_batches if timed_micro_batches is None else timed_micro_batches
    if timed_micro_batches:
        _, out["warmup_seconds"] = b.timed(accumulate_gradients, model, batch[:mb], mb)
        per_micro = [b.timed(accumulate_gradients, model, batch[i * mb:(i + 1) * mb], mb)[1]
                     for i in range(timed_micro_batches)]
        model.zero_grad(set_to_none=True)
        fb = statistics.median(per_micro)
        out["forward_backward_per_micro_batch"] = {"median_seconds": fb, "min_seconds": min(per_micro),
                                                   "tokens_per_second": mb * batch.size(1) / fb,
                                                   "mfu": mfu(mb * batch.size(1), fb)}
    demo = b.demo()
    # the miner's own inner steps (`runtime.train.inner_steps`): the hparams' when they ask for this
    # many steps, else AdamW at that many (the paper's window is one SGD step)
    inner = hp.inner if steps_per_window == hp.inner.steps else hp.inner.model_copy(
        update={"steps": steps_per_window, "optimizer": "sgd" if steps_per_window == 1 else "adamw"})
    inner_opt = make_inner_optimizer(model, inner)
    b.reset_peak()
    stats, out["train_seconds"] = b.timed(lambda: inner_steps(model, batch, mb, hp.optimizer.grad_clip, inner=inner,
                                                              optimizer=inner_opt,
                                                              lr=inner_lr(inner, lr, hp.optimizer)))
    out["train_loss"] = stats.loss
    out["inner_optimizer"] = inner.optimizer
    grads = gradients(model)
    out["tokens_per_second"] = tokens / out["train_seconds"]
    out["mfu"] = mfu(tokens, out["train_seconds"])
    compressed, out["compress_seconds"] = b.timed(demo.step, grads, stats.scale)
    inner_opt = None  # its moments: not part of the rest of the window
    del grads
    model.zero_grad(set_to_none=True)
    out["peak_memory_gb"] = b.peak_gb()  # θ, gradients, error feedback, activations, compression scratch
    probes = take_probes({n: p for n, p in model.named_parameters() if p.requires_grad}, seed=hp.data.data_seed,
                         window=WINDOW, count=hp.gauntlet.probe_count)
    payload, out["encode_seconds"] = b.timed(write_gradient, compressed, probes, window=WINDOW, global_step=0,
                                             hotkey="miner", hp=hp, run=b.run, sign=b.key.sign)
    out["payload_bytes"] = len(payload)
    del compressed
    g = hp.gauntlet.top_g
    decoded = []
    for _ in range(g):  # each a full read: size cap, header, schema, signature, digest, decode
        _, seconds = b.timed(read_gradient, payload, b.shapes, hp, run=b.run, verify=b.key.verify,
                             expected_hotkey="miner", expected_window=WINDOW)
        decoded.append(seconds)
    out["decode_seconds_per_peer"] = statistics.median(decoded)
    out["decode_seconds"] = sum(decoded)
    peers = b.peers()
    weights = [1.0 / g] * len(peers)
    signs, out["aggregate_cpu_seconds"] = b.timed(lambda: aggregate(peers, weights, b.shapes))
    out["aggregate_peers"] = len(peers)
    if b.device.type != "cpu":
        on_device, out["peers_to_device_seconds"] = b.timed(
            lambda: [{n: c.to(b.device) for n, c in p.items()} for p in peers])
        signs_device, out["aggregate_device_seconds"] = b.timed(lambda: aggregate(on_device, weights, b.shapes))
        del on_device
        _, out["outer_step_device_signs_seconds"] = b.timed(
            lambda: apply_signed_update(model, signs_device, lr, hp.optimizer.weight_decay))
        del signs_device
    _, out["outer_step_seconds"] = b.timed(lambda: apply_signed_update(model, signs, lr, hp.optimizer.weight_decay))
    return out


def phase_window(b: Bench) -> dict[str, Any]:
    """The miner's window at the paper's settings, and at production's once hparams have inner steps."""
    out = {"paper": measure_window(b, b.hp, 1)}
    steps = production_inner_steps(b.hp)
    out["production"] = measure_window(b, b.hp, steps) if steps > 1 else "the paper's: hparams have no inner steps yet"
    if b.scale.inner_steps_exercised > 1:  # keeps the inner-step path running where it is cheap (smoke)
        steps = b.scale.inner_steps_exercised
        out[f"inner_steps_{steps}"] = measure_window(b, b.hp, steps, timed_micro_batches=0)
    b.release_demo()
    return out


def phase_validator(b: Bench) -> dict[str, Any]:
    """LossScore evaluation at the run's page size: seconds per peer, and peers per window."""
    hp, model = b.hp, b.model()
    peers = b.peers()
    b.release_demo()  # a validator holds no error feedback
    d = hp.data
    out: dict[str, Any] = {"page_tokens": d.sequence_length * d.sequences_per_page, "eval_pages": d.eval_pages}
    # A validator decodes each evaluated payload's signs with `aggregate([payload], [1.0])` where the
    # decoded payload is: in host memory today. The same on the device is timed beside it.
    signs = [b.timed(aggregate, [peers[0]], [1.0], b.shapes)]
    out["sign_decode_cpu_seconds"] = signs[0][1]
    signs = [signs[0][0]]
    if b.device.type != "cpu":
        on_device = {n: c.to(b.device) for n, c in peers[0].items()}
        _, out["sign_decode_device_seconds"] = b.timed(aggregate, [on_device], [1.0], b.shapes)
        del on_device
    for p in peers[1:b.scale.validator_peers]:  # faster on the device; held on the host like the first
        on_device = {n: c.to(b.device) for n, c in p.items()}
        signs.append({n: t.to("cpu") for n, t in aggregate([on_device], [1.0], b.shapes).items()})
        del on_device
    evaluator = Evaluator(model, hp.optimizer.micro_batch_size)
    beta = hp.gauntlet.eval_lr_factor * peak_lr(hp)
    n = len(signs)
    random_batch = b.pages(range(d.eval_pages))
    assigned = {f"peer{i}": b.pages(range(d.eval_pages * (1 + i), d.eval_pages * (2 + i))) for i in range(n)}
    free_memory()
    evaluator.losses(random_batch)  # warm-up: kernels for the evaluation's shapes
    b.reset_peak()
    _, out["score_peers_seconds"] = b.timed(evaluator.score_peers, {f"peer{i}": signs[i] for i in range(n)},
                                            assigned, random_batch, beta, d.sequences_per_page)
    out["peak_memory_gb"] = b.peak_gb()  # θ, the rollback copy, activations of a forward pass
    out["score_peers_peers"] = n
    del evaluator  # and its copy of θ
    free_memory()
    # score_peers = one pass over the random pages before any step (shared), then per peer: its
    # page before, the trial step, random + its page after, the exact restore of θ
    _, out["random_pages_seconds"] = b.timed(evaluate_loss, model, random_batch, hp.optimizer.micro_batch_size)
    per_peer = max(0.0, out["score_peers_seconds"] - out["random_pages_seconds"]) / n
    holdout = b.pages(range(HOLDOUT_PAGES))
    _, out["holdout_seconds"] = b.timed(evaluate_loss, model, holdout, hp.optimizer.micro_batch_size)
    out["seconds_per_peer"] = per_peer
    sign_decode = out.get("sign_decode_device_seconds", out["sign_decode_cpu_seconds"])
    out["fixed_seconds"] = out["holdout_seconds"] + out["random_pages_seconds"]
    window = hp.windows.blocks_per_window * hp.windows.block_time
    out["window_seconds"] = window
    out["eval_seconds_per_window"] = out["fixed_seconds"] + hp.gauntlet.uids_per_window * (per_peer + sign_decode)
    out["uids_per_window"] = hp.gauntlet.uids_per_window
    out["peers_per_window"] = max(0, math.floor((window - out["fixed_seconds"]) / (per_peer + sign_decode)))
    return out


def _near_tie_gap(x: torch.Tensor, plan: ChunkPlan, chunks: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  k: int) -> float:
    """Largest gap, over `chunks` (whose kept sets differ), between a swapped coefficient's magnitude
    and the chunk's k-th largest, relative to the chunk's largest: float32 rounding gives ~1e-6."""
    chunks = chunks[:4096]
    coef = ChunkedDCT(reuse_buffers=False).forward(x.detach().to("cpu", torch.float32).contiguous(), plan)
    values = coef[plan.chunk_positions(chunks)].abs().double()                  # [m, chunk_numel]
    kth = values.sort(dim=1, descending=True).values[:, k - 1:k]
    kept_a = torch.zeros_like(values, dtype=torch.bool).scatter_(1, a[chunks], True)
    kept_b = torch.zeros_like(values, dtype=torch.bool).scatter_(1, b[chunks], True)
    gaps = (values - kth).abs() / values.amax(dim=1, keepdim=True).clamp_min(1e-300)
    return float(gaps[kept_a ^ kept_b].max())


def phase_consensus(b: Bench) -> dict[str, Any]:
    """The same inputs on two implementations: the GPU's torch paths against the CPU (C kernels where
    built), or, CPU only, the C kernels against torch. Consensus needs bit-identical accumulators;
    kept sets may differ only at float32 near-ties (compression is local to one miner)."""
    hp, model = b.hp, b.model()
    on_gpu = b.device.type != "cpu"
    ref_native = native.available()
    if not on_gpu and not ref_native:
        raise RuntimeError("nothing to compare on a CPU without the C kernels (build them with `pip install -e .`)")
    reference, candidate = f"cpu/{'native' if ref_native else 'torch'}", f"{b.device.type}/torch"
    out: dict[str, Any] = {"reference": reference, "candidate": candidate}

    def on_candidate(fn: Callable[[], Any]) -> Any:
        if on_gpu:
            return fn()
        with native.disabled():
            return fn()

    # 1. kept sets: a real gradient (one micro-batch), compressed by both
    accumulate_gradients(model, b.micro_batch(0), hp.optimizer.micro_batch_size)
    grads = gradients(model)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    chunks = same = 0
    worst = 0.0
    layers = b.scale.kept_sets_layers
    compared = [n for n in grads if layers is None or not (m := re.search(r"\.layers\.(\d+)\.", n))
                or int(m.group(1)) < layers]
    for g in (grads[n] for n in compared):
        ref = compressor.compress(g.to("cpu"))
        cand = on_candidate(lambda g=g: compressor.compress(g))
        differ = (ref.indices != cand.indices.to("cpu")).any(dim=1)
        chunks += differ.numel()
        same += int((~differ).sum())
        if bool(differ.any()):
            worst = max(worst, _near_tie_gap(g, ref.plan, differ.nonzero().flatten(), ref.indices,
                                             cand.indices.to("cpu"), ref.k))
    out["kept_sets"] = {"tensors": len(compared), "of_tensors": len(grads),
                        "parameters": sum(grads[n].numel() for n in compared), "chunks": chunks, "identical": same,
                        "share_identical": same / chunks, "worst_gap_over_chunk_max": worst,
                        "only_near_ties": worst < NEAR_TIE}
    model.zero_grad(set_to_none=True)
    del grads

    # 2. the 15 peers aggregated by both: accumulators bit for bit, then the signs
    peers = b.peers()
    b.release_demo()
    weights = [1.0 / hp.gauntlet.top_g] * len(peers)
    accumulators: list[torch.Tensor] = []
    equal: list[bool] = []

    def record(_: int, coef: torch.Tensor) -> None:
        accumulators.append(coef.clone())

    def compare(i: int, coef: torch.Tensor) -> None:
        equal.append(torch.equal(coef.to("cpu").view(torch.int32), accumulators[i].view(torch.int32)))
        accumulators[i] = torch.empty(0)  # free as we go (1.2B float32 on the host)

    signs_ref = aggregate(peers, weights, b.shapes, dct=RecordingDCT(record))
    signs_cand = on_candidate(lambda: aggregate(
        [{n: c.to(b.device) for n, c in p.items()} for p in peers] if on_gpu else peers, weights, b.shapes,
        dct=RecordingDCT(compare)))
    accumulators.clear()
    flipped = sum(int((signs_ref[n] != signs_cand[n].to("cpu")).sum()) for n in signs_ref)
    total = sum(s.numel() for s in signs_ref.values())
    out["accumulators"] = {"tensors": len(equal), "bit_identical": sum(equal), "all": all(equal) and bool(equal)}
    out["signs"] = {"coordinates": total, "differing": flipped, "share": flipped / total}

    # 3. the window applied to θ on both; the fingerprint rule between them
    lr = peak_lr(hp)
    reference_model = copy.deepcopy(model).to("cpu")
    apply_signed_update(reference_model, signs_ref, lr, hp.optimizer.weight_decay)
    apply_signed_update(model, signs_cand, lr, hp.optimizer.weight_decay)
    del signs_ref, signs_cand
    differing, largest = 0, 0.0
    for p_ref, p in zip(reference_model.parameters(), model.parameters(), strict=True):
        diff = (p_ref.detach() - p.detach().to("cpu")).abs()
        differing += int((diff != 0).sum())
        largest = max(largest, float(diff.max()))
    own = model_fingerprint(model, hp.data.data_seed, WINDOW)
    published = model_fingerprint(reference_model, hp.data.data_seed, WINDOW)
    del reference_model
    out["theta"] = {"coordinates_differing": differing, "largest_difference": largest, "lr": lr,
                    "largest_over_lr": largest / lr}
    out["fingerprint"] = {"positions": FINGERPRINT_POSITIONS, "off": off_positions(own, published, lr),
                          "model_in_sync": model_in_sync(own, published, lr)}
    out["consistent"] = bool(out["accumulators"]["all"] and out["kept_sets"]["only_near_ties"]
                             and out["fingerprint"]["model_in_sync"])
    return out


def _pretrain(b: Bench, pages: Sequence[int], steps: int) -> dict[str, Any]:
    """AdamW micro-batch steps on `pages`, so the noise is measured past θ_0's first drop in loss
    (the run's own windows would need hours to get there)."""
    model, hp = b.model(), b.hp
    batch = b.pages(pages)
    mb = hp.optimizer.micro_batch_size
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=hp.optimizer.learning_rate,
                                  weight_decay=hp.optimizer.weight_decay,
                                  **({"fused": True} if b.device.type == "cuda" else {}))
    losses = []
    for step in range(steps):
        start = (step * mb) % batch.size(0)
        stats = accumulate_gradients(model, batch[start:start + mb], mb, hp.optimizer.grad_clip)
        optimizer.step()
        losses.append(stats.loss)
    model.zero_grad(set_to_none=True)
    del optimizer
    free_memory()
    return {"pages": list(pages), "steps": steps, "lr": hp.optimizer.learning_rate, "first_loss": losses[0],
            "last_loss": losses[-1]}


def phase_noise(b: Bench) -> dict[str, Any]:
    """How much δ_rand and δ_assigned move from page to page and from peer to peer, for honest updates:
    the evaluation noise the relative LossRating's tie band (σ̂) and the simulator's `noise` stand for."""
    hp, model = b.hp, b.model()
    d = hp.data
    n_pages = b.corpus().num_pages
    s = b.scale
    per_peer = d.pages_per_window
    peers = min(s.noise_peers, max(2, (n_pages - s.noise_pretrain_pages - 2) // per_peer))
    random_n = min(s.noise_random_pages, n_pages - s.noise_pretrain_pages - peers * per_peer)
    if random_n < 2:
        raise RuntimeError(f"{n_pages} pages cannot hold {s.noise_pretrain_pages} + {peers}×{per_peer} + 2")
    pretrain = list(range(s.noise_pretrain_pages))
    assigned = {f"peer{i}": list(range(len(pretrain) + i * per_peer, len(pretrain) + (i + 1) * per_peer))
                for i in range(peers)}
    random_pages = list(range(len(pretrain) + peers * per_peer, len(pretrain) + peers * per_peer + random_n))
    out: dict[str, Any] = {
        "corpus_pages": n_pages, "random_pages": random_pages, "assigned": assigned,
        "allows": f"{n_pages} pages of {d.sequence_length * d.sequences_per_page:,} tokens: {len(pretrain)} to train "
                  f"away from θ_0, {len(assigned)} peers × {per_peer} assigned, {random_n} random; more peers or "
                  "random pages need a larger corpus"}
    out["pretrain"], out["pretrain_seconds"] = b.timed(lambda: _pretrain(b, pretrain, s.noise_pretrain_steps))
    lr = peak_lr(hp)
    beta = hp.gauntlet.eval_lr_factor * lr
    out.update(lr=lr, beta=beta)

    # honest updates: each peer trains on its own pages, one DeMo step from fresh error feedback,
    # decoded to signs as a validator decodes a payload
    signs: dict[str, dict[str, torch.Tensor]] = {}
    started = time.monotonic()
    for peer, pages in assigned.items():
        if len(signs) >= 2:  # train another only if it and the evaluation of all still fit the cap
            train = (time.monotonic() - started) / len(signs)
            page_forward = train / (3 * per_peer)  # forward+backward ≈ 3 forwards
            evaluation = page_forward * (random_n + (len(signs) + 1) * (2 * per_peer + random_n))
            if b.left() < train + evaluation:
                break
        # the run's own window: its inner steps (fresh moments, as a newly joined miner), then DeMo
        stats = inner_steps(model, b.pages(pages), hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                            inner=hp.inner, optimizer=make_inner_optimizer(model, hp.inner),
                            lr=inner_lr(hp.inner, lr, hp.optimizer))
        compressed = b.demo().step(gradients(model), stats.scale)
        model.zero_grad(set_to_none=True)
        signs[peer] = {n: t.to(torch.int8) for n, t in aggregate([compressed], [1.0], b.shapes).items()}
    out["train_seconds"] = time.monotonic() - started
    b.release_demo()

    evaluator = Evaluator(model, hp.optimizer.micro_batch_size)
    evaluator.snapshot()
    spp = d.sequences_per_page
    random_batch = b.pages(random_pages)
    started = time.monotonic()
    before_rand = evaluator.losses(random_batch)
    ranges = POSITION_RANGES  # the units the proof of computation by size clips, as the validator measures them
    weights = range_weights(d.sequence_length - 1, ranges)
    before = {peer: evaluator.losses(b.pages(assigned[peer]), ranges) for peer in signs}
    rows = {}
    for peer, peer_signs in signs.items():
        with evaluator.stepped(peer_signs, beta):
            after_rand = evaluator.losses(random_batch)
            after = evaluator.losses(b.pages(assigned[peer]), ranges)
        rows[peer] = {"delta_rand_pages": list(page_deltas(before_rand, after_rand, spp)),
                      "delta_assigned_pages": list(page_deltas(before[peer] @ weights, after @ weights, spp)),
                      "delta_assigned_sequences": list(sequence_deltas(before[peer], after))}
    del evaluator
    out["eval_seconds"] = time.monotonic() - started
    out["loss_rand_before"] = float(before_rand.mean())
    out["peers"] = rows
    out.update(noise_summary(rows))
    out["proof_credit"] = proof_credit_summary(rows, hp.gauntlet.proof_full_gap)
    return out


def _gauntlet_scores() -> Any:
    """`templar/gauntlet/scores.py` on its own: the package's `__init__` imports openskill (through
    the rating), which the device machine does not have; the proof's rule itself needs only torch."""
    spec = importlib.util.spec_from_file_location("gauntlet_scores", ROOT / "src" / "templar" / "gauntlet" / "scores.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proof_credit_summary(rows: Mapping[str, Mapping[str, Sequence[float]]], full_gap: float) -> dict[str, Any]:
    """What production's proof of computation by size credits these honest peers, one position
    range of one sequence at a time (docs/scoring.md §4): the credit c = 2 can reward only if honest sequences clear
    `full_gap` × the typical gap, which on the CPU's `micro` model they do half the time (mean
    credit ≈ 0.5; benchmarks/LOG.md §8). The typical gap is these peers' median, without the floor."""
    scores = _gauntlet_scores()
    rand = {p: statistics.fmean(rows[p]["delta_rand_pages"]) for p in rows}
    gaps = [scores.proof_gap(0.0, rand[p], rows[p]["delta_assigned_pages"]) for p in rows]
    typical = scores.typical_gap(scores.window_gap(gaps), [], 0.0)
    credit, full = {}, {}
    for p in rows:
        sequences = rows[p].get("delta_assigned_sequences") or []
        if not sequences or typical <= 0:
            continue
        credit[p] = scores.size_credit(sequences, rand[p], full_gap * typical)
        full[p] = sum(d - rand[p] >= full_gap * typical for d in sequences) / len(sequences)
    return {"full_gap": full_gap, "typical_gap": typical, "credit": credit, "full_credit_share": full,
            "credit_mean": statistics.fmean(credit.values()) if credit else None}


def noise_summary(rows: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, Any]:
    """The spreads the Gauntlet cares about, from δ per (peer, page).

    * across pages, one peer: coefficient of variation of δ_rand (and δ_assigned) over pages;
    * across peers, one page (what one validator-window sees: every peer of S_t on the same random
      pages): per page, the sd of δ_rand / mean δ_rand over peers (the simulator fit's measure,
      `subnet_sim_fit.json` honest `rand_mean_sd`) and 1.4826 · MAD / median (the tie band's σ̂);
    * `window_noise`: the sd of log(σ̂) over pages, the simulator's spread of windows' noise
      (its localnets' windows: 0.94; windows here differ only in their random page).
    """
    peers = list(rows)
    rand = [[float(v) for v in rows[p]["delta_rand_pages"]] for p in peers]
    out: dict[str, Any] = {
        "rand_cv_across_pages": {p: _stats(r).get("cv") for p, r in zip(peers, rand, strict=True)},
        "assigned_cv_across_pages": {p: _stats(rows[p]["delta_assigned_pages"]).get("cv") for p in peers},
        "mean_delta_rand": statistics.fmean(v for r in rand for v in r),
        "mean_delta_assigned": statistics.fmean(v for p in peers for v in rows[p]["delta_assigned_pages"]),
    }
    relative_sd, sigma_hat = [], []
    for page in range(len(rand[0])):
        xs = [r[page] for r in rand]
        mean, med = statistics.fmean(xs), statistics.median(xs)
        if len(xs) >= 2 and mean > 0:
            relative_sd.append(statistics.stdev(xs) / mean)
        if len(xs) >= 3 and med > 0:
            sigma_hat.append(1.4826 * statistics.median(abs(x / med - 1) for x in xs))
    out["relative_sd_across_peers"] = relative_sd
    out["sigma_hat_across_peers"] = sigma_hat
    positive = [v for v in sigma_hat if v > 0]
    out["window_noise"] = statistics.stdev(math.log(v) for v in positive) if len(positive) > 1 else None
    if relative_sd and FIT_FILE.is_file():
        import json

        fit_sd = json.loads(FIT_FILE.read_text())["summary"]["honest"]["rand_mean_sd"][1]
        out["fit_honest_relative_sd"] = fit_sd
        out["subnet_sim_noise"] = statistics.median(relative_sd) / fit_sd
    return out


PHASE_FUNCTIONS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "setup": phase_setup, "corpus": phase_corpus, "window": phase_window, "validator": phase_validator,
    "consensus": phase_consensus, "noise": phase_noise,
}


def run_phase(b: Bench, name: str) -> None:
    """One phase under its cap and the run's deadline; its outcome, good or bad, goes to the JSON."""
    left = b.deadline - time.monotonic()
    if left < b.scale.minimum.get(name, 0.0):
        record(b, name, {"status": "skipped", "reason": f"{left:.0f} s left of the run's budget"})
        return
    b.phase_deadline = time.monotonic() + b.scale.caps.get(name, left)
    started = time.perf_counter()
    print(f"[gpu] {name} ...", flush=True)
    try:
        entry = {"status": "ok", **PHASE_FUNCTIONS[name](b)}
    except Exception as exc:  # one failing phase (an OOM) must not cost the others
        entry = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:600],
                 "traceback": traceback.format_exc(limit=6)[-2000:]}
    finally:
        if b._model is not None:
            b._model.zero_grad(set_to_none=True)
        free_memory()
    entry["seconds"] = time.perf_counter() - started
    if b.device.type == "cuda":
        entry["gpu_memory_peak_gb_so_far"] = torch.cuda.max_memory_allocated(b.device) / 1e9
    record(b, name, entry)


def record(b: Bench, name: str, entry: dict[str, Any]) -> None:
    """A phase's outcome into the result, and the result to disk (a killed run keeps what it measured)."""
    b.result["phases"][name] = entry
    detail = f" in {entry['seconds']:.1f} s" if "seconds" in entry else ""
    reason = entry.get("error") or entry.get("reason")
    print(f"[gpu] {name}: {entry['status']}{detail}" + (f" ({reason})" if reason else ""), flush=True)
    b.result["elapsed_seconds"] = time.monotonic() - b.started
    b.result["host_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    b.result["table"] = table(b.result)
    write(b)


def write(b: Bench) -> None:
    if b.out.parent == RESULTS_DIR:
        write_result(b.out.name, b.result)
    else:
        import json

        b.out.parent.mkdir(parents=True, exist_ok=True)
        b.out.write_text(json.dumps(_rounded(b.result), indent=1) + "\n")


# -- the table ------------------------------------------------------------------------------------
def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return str(value)


def table(result: Mapping[str, Any]) -> list[list[str]]:
    """[figure, measured, estimate] rows: what each phase measured beside the figure it replaces. A
    section that cannot be read says so in its row instead of losing the others."""
    phases = result["phases"]
    est = phases.get("setup", {}).get("estimate", {})
    rows: list[list[str]] = []
    for name in PHASES[1:]:
        p = phases.get(name)
        if p is None:
            continue
        if p.get("status") != "ok":
            rows.append([name, p.get("status", "?") + ": " + str(p.get("error") or p.get("reason"))[:70], ""])
            continue
        try:
            rows += ROWS[name](p, est)
        except Exception as exc:
            rows.append([name, f"unreadable for the table: {type(exc).__name__}: {exc}"[:90], ""])
    return rows


def _rows_corpus(c: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    rows.append(["corpus: pages × tokens", f"{c['pages']} × {c['page_tokens']:,} ({c['vocab']:,}-entry tokenizer)", ""])
    return rows


def _rows_window(w: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for label, m in (("paper", w["paper"]), ("production", w["production"])):
        if not isinstance(m, dict):
            rows.append([f"window ({label})", m, ""])
            continue
        fb = m.get("forward_backward_per_micro_batch", {})
        rows += [
            [f"window ({label}): tokens, steps", f"{m['tokens']:,}, {m['steps_per_window']}",
             _fmt(est.get("tokens_per_window_per_peer"))],
            [f"window ({label}): forward+backward, whole window", _fmt(m["train_seconds"], " s"),
             _fmt(est.get("h100_train_seconds"), " s")],
            [f"window ({label}): tokens/s, MFU", f"{m['tokens_per_second']:,.0f}, {_fmt(m['mfu'])}",
             _fmt(est.get("mfu_assumed"))],
            [f"window ({label}): forward+backward per micro-batch",
             f"{_fmt(fb.get('median_seconds'), ' s')} ({m['micro_batch']} seq), MFU {_fmt(fb.get('mfu'))}", ""],
            [f"window ({label}): compression (DeMo step)", _fmt(m["compress_seconds"], " s"), ""],
            [f"window ({label}): encoding own payload", f"{m['encode_seconds']:.3g} s ({m['payload_bytes'] / 1e6:.1f} MB)", ""],
            [f"window ({label}): decoding {m['aggregate_peers']} peers", _fmt(m["decode_seconds"], " s"), ""],
            [f"window ({label}): aggregating {m['aggregate_peers']} peers, CPU (today)",
             _fmt(m["aggregate_cpu_seconds"], " s"), ""],
            [f"window ({label}): aggregating {m['aggregate_peers']} peers, device",
             _fmt(m.get("aggregate_device_seconds"), " s"), ""],
            [f"window ({label}): outer step (apply)", _fmt(m["outer_step_seconds"], " s"), ""],
            [f"window ({label}): peak GPU memory", _fmt(m["peak_memory_gb"], " GB"),
             _fmt(est.get("miner_gpu_memory_gb"), " GB")],
        ]
    return rows


def _rows_validator(v: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    rows += [
        ["validator: sign decode per peer, CPU / device",
         f"{_fmt(v['sign_decode_cpu_seconds'], ' s')} / {_fmt(v.get('sign_decode_device_seconds'), ' s')}", ""],
        [f"validator: score_peers, {v['score_peers_peers']} peers", _fmt(v["score_peers_seconds"], " s"), ""],
        ["validator: evaluation per peer (page before, step, pages after, restore)",
         _fmt(v["seconds_per_peer"], " s"), ""],
        [f"validator: held-out ({HOLDOUT_PAGES} pages) + shared random pages", _fmt(v["fixed_seconds"], " s"), ""],
        [f"validator: {v['uids_per_window']} peers' evaluation", _fmt(v["eval_seconds_per_window"], " s"),
         _fmt(est.get("h100_validator_eval_seconds"), " s")],
        [f"validator: peers that fit a {v['window_seconds']:.0f} s window", _fmt(v["peers_per_window"]),
         _fmt(v["uids_per_window"])],
        ["validator: peak GPU memory", _fmt(v["peak_memory_gb"], " GB"), _fmt(est.get("validator_gpu_memory_gb"), " GB")],
    ]
    return rows


def _rows_consensus(k: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    ks, acc, sg, fp = k["kept_sets"], k["accumulators"], k["signs"], k["fingerprint"]
    rows += [
        [f"consensus: {k['candidate']} vs {k['reference']}", "consistent" if k["consistent"] else "INCONSISTENT", ""],
        ["consensus: kept sets identical", f"{ks['share_identical']:.6f} of {ks['chunks']:,} chunks "
         f"(worst gap {ks['worst_gap_over_chunk_max']:.1e})", "near-ties only"],
        ["consensus: fixed-point accumulators", f"{acc['bit_identical']}/{acc['tensors']} bit-identical", "all"],
        ["consensus: signs differing", f"{sg['differing']:,} of {sg['coordinates']:,}", "near 0"],
        ["consensus: model_in_sync", f"{_fmt(fp['model_in_sync'])} ({fp['off']}/{fp['positions']} off)", "yes"],
    ]
    return rows


def _rows_noise(n: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    sd = n["relative_sd_across_peers"]
    rows += [
        ["noise: loss on random pages, δ_rand mean", f"{n['loss_rand_before']:.3f}, {n['mean_delta_rand']:.3g}", ""],
        ["noise: δ_rand sd/mean across peers, per page",
         ", ".join(f"{x:.3f}" for x in sd), _fmt(n.get("fit_honest_relative_sd"))],
        ["noise: σ̂ (1.4826·MAD/median) across peers", ", ".join(f"{x:.3f}" for x in n["sigma_hat_across_peers"]), ""],
        ["noise: δ_rand cv across pages, per peer",
         ", ".join(f"{x:.3f}" for x in n["rand_cv_across_pages"].values()), ""],
        ["noise: subnet_sim `noise` factor", _fmt(n.get("subnet_sim_noise")), "1.0"],
        ["noise: log-sd of σ̂ over pages (`window_noise`)", _fmt(n.get("window_noise")), "0.94"],
    ]
    proof = n.get("proof_credit") or {}
    if proof.get("credit"):
        rows.append(["noise: proof credit by size per honest peer (share at full credit)",
                     ", ".join(f"{c:.2f} ({proof['full_credit_share'][p]:.2f})" for p, c in proof["credit"].items()),
                     "1.0 intended; micro 0.5"])
    return rows


ROWS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], list[list[str]]]] = {
    "corpus": _rows_corpus, "window": _rows_window, "validator": _rows_validator, "consensus": _rows_consensus,
    "noise": _rows_noise,
}


def print_table(result: Mapping[str, Any]) -> None:
    rows = [["figure", "measured", "estimate / reference"], *result.get("table", [])]
    widths = [max(len(str(r[i])) for r in rows) for i in range(3)]
    print()
    for r in rows:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(f"\n  {result.get('device_name', result.get('device'))}, {result['mode']} mode, "
          f"{result.get('elapsed_seconds', 0):.0f} s in all", flush=True)


# -- entry point ----------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny preset on the CPU (the test suite's run)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if present; cpu with --smoke)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--hparams", default=None, help="another preset at the mode's scale (default: the mode's)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/gpu_<device>.json)")
    parser.add_argument("--work", type=Path, default=None, help="prepared corpus (default assets/gpu_<mode>)")
    args = parser.parse_args(argv)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    scale = SMOKE if args.smoke else PRODUCTION
    if args.budget is not None:
        scale = Scale(**{**scale.__dict__, "budget": args.budget})
    if args.hparams is not None:
        scale = Scale(**{**scale.__dict__, "hparams": args.hparams})
    device = torch.device(args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda"))
    slug = device_slug(device)
    out = args.out or RESULTS_DIR / (f"gpu_smoke_{slug}.json" if args.smoke else f"gpu_{slug}.json")
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASES)}")
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        work = args.work or (Path(tmp) if args.smoke else ROOT / "assets" / f"gpu_sample_{scale.vocab}")
        b = Bench(scale, device, out, work)
        b.result.update(device=str(device), device_name=torch.cuda.get_device_name(device)
                        if device.type == "cuda" else platform.processor() or "cpu",
                        started_unix=time.time(), phases_requested=phases)
        for name in PHASES:
            if name == "setup" or name in phases:
                run_phase(b, name)
    print_table(b.result)
    print(f"  written to {out}")
    failed = [n for n, p in b.result["phases"].items() if p["status"] == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
