"""Helpers shared by the tiny-preset benchmarks (`performance.evaluate`, `performance.miner_window`,
`research.convergence`, `incentive.gauntlet_sim`, and the others that import it).

Every benchmark here runs on CPU with 2 threads, on the tiny preset and the offline sample corpus,
so its figures are comparable between runs on the same machine and need no network.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from templar.compress import Compressed, DCTCompressor, DeMo
from templar.core.config import HParams, load_hparams, resolve_asset
from templar.data import LocalCorpus, PagePlan
from templar.runtime.train import accumulate_gradients, gradients

RESULTS_DIR = Path(__file__).resolve().parent / "results"
THREADS = 2


def setup_torch() -> None:
    """Two threads (the benchmarks share a 2-core machine) and no hub access."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    torch.set_num_threads(THREADS)


@dataclass(frozen=True)
class Tiny:
    """The tiny preset with its pages and page plan over the offline corpus."""

    hp: HParams
    pages: LocalCorpus
    plan: PagePlan


def load_tiny(preset: str = "tiny") -> Tiny:
    hp = load_hparams(preset)
    pages = LocalCorpus(resolve_asset(hp.data.corpus), digest=hp.data.manifest)
    plan = PagePlan.build(pages.num_pages, hp.data.holdout_fraction, hp.data.data_seed, hp.data.pages_per_window,
                          hp.data.max_extra_pages)
    return Tiny(hp=hp, pages=pages, plan=plan)


def new_demo(model: torch.nn.Module, hp: HParams) -> DeMo:
    """A peer's own error-feedback state, with the preset's compression settings."""
    return DeMo(model, compressor=DCTCompressor(hp.demo.target_chunk, hp.demo.topk), decay=hp.demo.momentum_decay)


def peer_update(model: torch.nn.Module, demo: DeMo, batch: torch.Tensor, lr: float,
                hp: HParams) -> tuple[dict[str, Compressed], float]:
    """One peer's window as a miner runs it: accumulate gradients on `batch`, one DeMo step.

    Returns the compressed pseudo-gradient and the mean training loss; leaves no `.grad` behind.
    """
    stats = accumulate_gradients(model, batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip)
    compressed = demo.step(gradients(model), lr)
    model.zero_grad(set_to_none=True)
    return compressed, stats.loss


def shapes_of(model: torch.nn.Module) -> dict[str, torch.Size]:
    return {n: p.shape for n, p in model.named_parameters() if p.requires_grad}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(result, wall seconds) of one call."""
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def emit(record: dict[str, Any]) -> None:
    """One JSON line on stdout (machine-readable), floats rounded to 6 significant digits."""
    print(json.dumps(_rounded(record)), flush=True)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def write_result(name: str, data: dict[str, Any], folder: Path = RESULTS_DIR) -> Path:
    """`benchmarks/results/<name>` (or `folder/<name>`), pretty JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(_rounded(data), indent=1) + "\n")
    return path
