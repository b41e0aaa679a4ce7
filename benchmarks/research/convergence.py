"""Convergence over 90 windows, every method through production's code paths, and the overlapped
exchange (a miner computing window w+1 while window w's outer step is being made).

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.research.convergence --jobs 2 --threads 1 --cache /tmp/convergence
                             # the whole plan (sweep, refine, variants, overlap, small): hours on 2 shared cores
    python -m benchmarks.research.convergence --quick                     # 3 windows, one point per method and mode
    python -m benchmarks.research.convergence --stages sweep --only adamw_dp_h      # one stage of one method
    python -m benchmarks.research.convergence --point sparseloco_m:inner=3e-3,outer=0.7,momentum=0.9,decay=0.99
    python -m benchmarks.research.convergence --report-only --cache /tmp/convergence   # the report of the runs so far

K = 4 simulated peers start from the same θ_0 (`build_model`) and stay in sync (G = 4); peer k
trains on `assigned_pages(k, window, P)` (P pages of 4 sequences of 128 tokens). A decentralised
method runs exactly what a miner and the aggregator run: `inner_steps` (each peer with its own inner
optimizer from `make_inner_optimizer`, at `inner_lr` of the window's α, and its own error feedback,
both kept across windows), `DeMo.step(grads, stats.scale)` with the method's compressor, the payload
written with `write_gradient` and read back with `read_gradient` (the wire's codec and its
quantisation), and `runtime.consensus.outer.outer_step`: the method's `aggregate` with weights 1/G and its
`apply` at α = `learning_rate(global_step, optimizer)`. Each run's settings are a validated `HParams`
built from a preset (`tiny`, `tiny-sparseloco`), so every measured point is a run a subnet could
configure, except three variants no rule offers, which the benchmark computes itself around
production's aggregate and apply: DiLoCo's outer Nesterov momentum (`momentum` μ: m ← μ·m + Δ,
θ ← θ − α·(Δ + μ·m)), exact values and the signed vote (`aggregate`, below).

The reference is AdamW data-parallel on the same tokens: H steps per window, step i on the union of
the peers' i-th H-th of their pages (the same optimizer steps as H inner steps). Every run has
warm-up `windows // 10` and a cosine to `min_lr_factor` (0.1) over the run's windows; the inner rate
follows the same shape (a DP run's H steps of a window all take that window's rate). The held-out
loss (16 held-out pages, 64 sequences) is measured every 5 windows, and each method is reported by
its ratio to AdamW DP's best run at 30, 60 and 90 windows (each run on its own 90-window
schedule), so a gap that widens as the run matures shows.

The plan (`--stages`, each stage needs the ones before it; `--cache` keeps finished runs):
- `sweep`: each method's coarse log grid of peak rates (`Method.inner`, `Method.outer`) on the
  whole horizon (no early stopping);
- `refine`: one point per swept axis around each method's best: half a step towards the better
  neighbour when the best is inside the rates run along that axis, one step beyond it when it is
  on an edge; a second round for the baseline and each family's best member;
- `variants`: at each method's best so far, one setting changed at a time (`Method.variants`:
  outer momentum, error-feedback decay, density, value bits, the schedule's floor); a variant
  that beats the best becomes the method's best (what works is kept);
- `overlap` (beside the variants, from the best after the refine): the overlapped exchange at the
  best of `OVERLAP_TARGETS`, in three modes:
  blocking (today: window w's update is computed from θ_w, the model after window w−1's outer step),
  delayed (from θ_{w−1}, one outer step older, the newest model a miner holds when window w's
  inner steps start; window w's aggregate is applied to θ_w as always) and eager (arXiv 2502.12996:
  the inner steps start from θ_{w−1} with the peer's own window-(w−1) update applied by the outer
  rule, its momentum included, as a proxy for the aggregate not yet known; when the aggregate lands,
  after `LANDING` of the inner steps, the proxy is swapped for it (θ += θ_w − proxy, the inner
  progress kept) and the update is θ_w − θ_H: computed from θ_w, as blocking's). Equal tokens: the
  same H and pages. Equal wall-clock: production's blocking miner computes 42.6 s of an 84 s window
  (51 %), an overlapped one about 90 %, 1.76× as much; on tiny that is H = 7 inner steps on 14
  sequences (2 per step, as blocking's 4 on 8), 1.75× (`WALL_CLOCK`);
- `small` (beside the variants too): the conclusion checked on a larger model (`MODELS["small"]`, 2.7× tiny's parameters):
  AdamW DP at its tiny best rate and half of it, and the best SparseLoCo and signed runs at their
  tiny settings (fewer points; the asymmetry favours DP).

Targeted points (`--point`, tagged `extra`) change what the plan's grids do not search: the inner
AdamW's β1, β2 and weight decay, the warm-up. They never stand for a method in the plan's table;
the report's second table, tuned against tuned, takes each method's best of every point run,
extra points included, against AdamW DP's best of its own (`goals.tuned_best`). A point with
`seed=N` is another draw (θ_0, the page plan and the holdout from the preset's seeds + N): the
report compares such runs only with each other, against DP's best at the same draw (`draws`), to
check on a second draw a ratio or a trend read on the first; `goals.tuned_best` adds its run's
ratios on every other draw that ran its settings, and whether the goals hold on all of them.

Bytes per token: the mean size of the payloads the peers actually wrote (`write_gradient`) over the
tokens each trained on in the window; the reference ("dense") is the same window's pseudo-gradient
sent as dense fp32, 4 bytes per parameter per window, and a data-parallel run sends a dense fp32
gradient per optimizer step (H per window). `aggregate=exact` (SparseLoCo only) keeps the top-k values
as float32 and aggregates them with the same median clip in float64, outside the wire (no codec
carries them): an upper bound on what more value bits could buy, not a configurable run.
`aggregate=vote` (signed only) averages the peers' signs (each peer's own signed update, the rule's
`trial`): a coordinate moves α where every peer agrees and less where they disagree, an outer step
that shrinks as the peers' updates turn to noise late in a run.

Results: `benchmarks/results/convergence.json` (every run's curve and settings, the tables, the
goals), `convergence_tokens.png` (held-out loss of each method's best), `convergence_ratio.png`
(ratio to AdamW DP over the windows; a method's tuned best, where it differs, over DP's tuned
best), `convergence_overlap.png` and `convergence_small.png`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import sys
import time
from dataclasses import MISSING, asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import RESULTS_DIR, Tiny, emit, load_tiny, setup_torch, write_result
from templar.compress import Compressed, DeMo
from templar.compress.methods import rule_of
from templar.compress.sparseloco import SparseLoCoCompressor
from templar.core.config import HParams, load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.data import PagePlan
from templar.runtime.consensus.outer import aggregation_weights, apply_update, collect_probes, outer_step
from templar.runtime.state import NodeState
from templar.runtime.train import (
    TrainStats,
    accumulate_gradients,
    evaluate_loss,
    gradients,
    inner_lr,
    inner_parts,
    inner_steps,
    make_inner_optimizer,
)
from templar.wire import Run, read_gradient, write_gradient

PEERS = 4
HOLDOUT_PAGES = 16
MAX_PAGES = 8  # a plan slot's size: the largest run's pages per peer per window
WINDOWS = 90
RATIO_AT = (30, 60, 90)
AGGREGATES = {"signed": ("wire", "vote"), "sparseloco": ("wire", "exact")}
RUN = Run(netuid=0, digest="0" * 64)  # the run the simulated payloads are signed for

BASELINE = "adamw_dp_h"
MODES = ("blocking", "delayed", "eager")
LANDING = 0.5
"""Eager: the share of a window's inner steps done before the previous window's aggregate lands.
Production's overlapped window: the payload of window w is committed at the end of w's compute; its
put window (24 s), gather (20 s) and outer step follow, about 40 s, while window w+1 computes for
about 76 s (90 % of 84 s): the aggregate lands about half-way through."""
WALL_CLOCK = (7, 14)
"""(H, sequences per peer) of an overlapped window at equal wall-clock on tiny: 1.75× blocking's (4, 8)."""
OVERLAP_TARGETS = ("sparseloco", "signed_h")
"""Where the overlap stage runs: a family's best (`Method.family`) or a method's best; the first
one also at equal wall-clock."""
MODELS: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {"hidden_size": 256, "intermediate_size": 1024},  # 8.4M parameters against tiny's 3.1M
}
SMALL_TARGETS = ("sparseloco", "signed_h")
"""The small stage's decentralised runs, as `OVERLAP_TARGETS`: a family's best or a method's best."""
STAGES = ("sweep", "refine", "variants", "overlap", "small")
REFINE_ROUNDS = 2
SEARCH = ("sweep", "refine")  # the tags of the rate search (the variants change other settings)


@dataclass(frozen=True)
class Method:
    """One way of training θ: how a window runs, which peak rates it sweeps, which variants it tries."""

    key: str
    label: str
    kind: str               # "dp": AdamW data-parallel; "subnet": K peers, payloads, an outer step
    preset: str             # the hparams preset the settings start from
    steps: int              # optimizer steps per window (H; 1 for the paper and DP-1)
    inner: tuple[float, ...]  # inner (or DP) AdamW peak rates; () for the paper's SGD window
    outer: tuple[float, ...]  # outer α peaks; () for DP
    momentum: float | None = None  # the outer Nesterov μ of every grid point (sparseloco)
    schedule: str = "cosine"  # of α (`Spec.schedule`)
    variants: tuple[tuple[tuple[str, Any], ...], ...] = ()  # settings changed at the method's best
    family: str | None = None  # the family's variants (`FAMILY_VARIANTS`) run at the best of its members
    in_plan: bool = True    # run by default (the others on --only)


FLOOR = (("min_lr", 0.0),)  # the cosine to 0 instead of 0.1 of the peak
FAMILY_VARIANTS: dict[str, tuple[tuple[tuple[str, Any], ...], ...]] = {
    "sparseloco": ((("decay", 0.9),), (("decay", 0.99),), (("topk", 32),), (("topk", 96),),
                   (("aggregate", "exact"),), (("aggregate", "exact"), ("topk", 4096)), FLOOR),
}
"""Variant keys are `Spec` fields, or `inner_factor` / `outer_factor` (the best's rate times this)."""


def methods(h: int) -> dict[str, Method]:
    """The compared methods at H = `h` inner steps, with their coarse grids (rates a factor 2 apart,
    around the 30-window sweep's bests of benchmarks/LOG.md §7 and a 30-window probe of the outer
    momentum) and their variants."""
    sparse, signed = "tiny-sparseloco", SIGNED_PRESET
    return {m.key: m for m in (
        Method(BASELINE, f"AdamW DP, {h} steps/window", "dp", signed, h, (1e-3, 2e-3, 4e-3), ()),
        Method("adamw_dp_1", "AdamW DP, 1 step/window", "dp", signed, 1, (3e-3, 6e-3), (), in_plan=False),
        Method("signed_h1", "signed, 1 SGD step (paper)", "subnet", signed, 1, (), (3e-3, 6e-3), in_plan=False),
        Method("signed_h", f"signed, {h} inner AdamW", "subnet", signed, h, (3e-3, 6e-3), (3e-3, 6e-3),
               variants=(FLOOR, (("decay", 0.95),), (("aggregate", "vote"),))),
        Method("sparseloco_h", f"SparseLoCo, {h} inner AdamW", "subnet", sparse, h, (3e-3, 6e-3), (1.0, 2.0),
               family="sparseloco"),
        Method("sparseloco_c", f"SparseLoCo, constant α, {h} inner AdamW", "subnet", sparse, h, (3e-3, 6e-3),
               (1.0, 2.0), schedule="constant", family="sparseloco"),
        Method("sparseloco_m", f"SparseLoCo + outer Nesterov, constant α, {h} inner", "subnet", sparse, h, (3e-3,),
               (0.05, 0.1, 0.2), momentum=0.9, schedule="constant", family="sparseloco",
               variants=((("momentum", 0.5), ("outer_factor", 5.0)),)),
    )}


SIGNED_PRESET = "tiny-signed"
"""The signed rule's and AdamW DP's preset: `tiny` as it was before production moved to SparseLoCo
(bit for bit but its name). Runs cached under the old name are the same runs (`Spec.key`)."""
LATER_FIELDS = ("beta2", "inner_wd", "warmup", "beta1", "seed")
"""Spec fields added after runs were cached: left out of the key while unset, so those runs stay valid."""


@dataclass(frozen=True)
class Spec:
    """One training run: a method at one pair of peak rates, its settings and its exchange mode."""

    method: str
    kind: str
    preset: str
    inner_lr: float | None
    outer_lr: float | None
    steps: int
    pages: int
    windows: int
    topk: int | None = None
    decay: float | None = None
    momentum: float | None = None
    min_lr: float | None = None
    mode: str = "blocking"
    sequences: int | None = None  # per peer per window when not whole pages (the overlap's wall-clock window)
    aggregate: str = "wire"       # "exact": float32 values outside the wire (SparseLoCo; an upper bound);
                                  # "vote": the peers' signs averaged (signed; a step that shrinks as they disagree)
    schedule: str = "cosine"      # of α (`optimizer.outer_schedule`): "constant" after the warm-up (DiLoCo's)
    model: str = "tiny"
    tag: str = "sweep"            # sweep, refine, variant, overlap, small, extra (a targeted point)
    beta2: float | None = None     # the inner AdamW's β2 (the preset's 0.95 when None)
    inner_wd: float | None = None  # the inner AdamW's weight decay (the preset's when None)
    warmup: int | None = None      # warm-up windows (a tenth of the run when None)
    beta1: float | None = None     # the inner AdamW's β1 (the preset's 0.9 when None)
    seed: int | None = None        # another draw: θ_0 and the page plan (holdout included) from the preset's
                                   # seeds + seed; None: the preset's own, the draw every comparison is read on

    def name(self) -> str:
        parts = [self.method]
        for prefix, value in (("in", self.inner_lr), ("out", self.outer_lr), ("k", self.topk), ("d", self.decay),
                              ("m", self.momentum), ("min", self.min_lr), ("b2", self.beta2), ("wd", self.inner_wd),
                              ("wu", self.warmup), ("b1", self.beta1), ("seed", self.seed)):
            if value is not None:
                parts.append(f"{prefix}{value:g}")
        if self.mode != "blocking":
            parts.append(self.mode)
        if self.sequences is not None:
            parts.append(f"h{self.steps}s{self.sequences}")
        if self.aggregate != "wire":
            parts.append(self.aggregate)
        if self.schedule != "cosine":
            parts.append(self.schedule)
        if self.model != "tiny":
            parts.append(self.model)
        return "_".join(parts)

    def key(self) -> str:
        """What identifies the run's result (the tag does not: one run may serve several stages)."""
        body = {k: v for k, v in asdict(self).items()
                if k != "tag" and not (k in LATER_FIELDS and v is None)}  # unset: the key runs had before them
        if body["preset"] == SIGNED_PRESET:
            body["preset"] = "tiny"  # its name when the cached runs were made
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def sequences_per_peer(self) -> int:
        return self.sequences if self.sequences is not None else self.pages * 4


def hparams_for(spec: Spec) -> HParams:
    """The run's settings as a validated `HParams`: the method's preset with its schedule matched to
    the run's length, the swept rates, H and P (`model_validate`, so a setting no subnet could run
    fails here)."""
    base = load_hparams(spec.preset)
    warmup = spec.warmup if spec.warmup is not None else max(1, spec.windows // 10)
    optimizer: dict[str, Any] = {"warmup_steps": warmup, "total_steps": spec.windows}
    inner: dict[str, Any] = {"steps": spec.steps}
    if spec.inner_lr is None:  # the paper's window: H SGD steps at the outer rate, whatever the preset's inner
        inner["optimizer"] = "sgd"
    else:
        inner.update(optimizer="adamw", learning_rate=spec.inner_lr)
        if spec.preset == SIGNED_PRESET:
            # DP's AdamW owns weight decay (the preset's 0.1); under the signed rule the outer step
            # applies it (θ·(1 − α·wd)), so that run's inner AdamW has none.
            inner["weight_decay"] = base.optimizer.weight_decay if spec.kind == "dp" else 0.0
        if spec.beta1 is not None:
            inner["beta1"] = spec.beta1
        if spec.beta2 is not None:
            inner["beta2"] = spec.beta2
        if spec.inner_wd is not None:
            inner["weight_decay"] = spec.inner_wd
    if spec.outer_lr is not None:
        optimizer["learning_rate"] = spec.outer_lr
    elif spec.kind == "dp":  # the schedule's peak is the DP rate itself: inner_lr() is then the schedule
        optimizer["learning_rate"] = spec.inner_lr
    if spec.min_lr is not None:
        optimizer["min_lr_factor"] = spec.min_lr
    if spec.schedule == "constant":
        if spec.kind == "dp":
            raise ValueError(f"{spec.name()}: a DP run has one schedule")
        optimizer["outer_schedule"] = "constant"  # α: warm-up, then the peak; the inner rate anneals
    demo = {k: v for k, v in (("topk", spec.topk), ("momentum_decay", spec.decay)) if v is not None}
    body = base.model_dump()
    body["name"] = f"{base.name}-{spec.name()}"
    body["model"].update(MODELS[spec.model])
    body["optimizer"].update(optimizer)
    body["inner"].update(inner)
    body["data"]["pages_per_window"] = spec.pages
    body["demo"].update(demo)
    if spec.seed is not None:
        body["model"]["init_seed"] += spec.seed
        body["data"]["data_seed"] += spec.seed
    hp = HParams.model_validate(body)
    if spec.sequences_per_peer < hp.inner.steps or spec.sequences_per_peer > spec.pages * hp.data.sequences_per_page:
        raise ValueError(f"{spec.name()}: {spec.sequences_per_peer} sequences for H = {hp.inner.steps} on "
                         f"{spec.pages} pages")
    if spec.mode not in MODES:
        raise ValueError(f"{spec.name()}: mode {spec.mode!r} is not one of {MODES}")
    if spec.mode == "eager" and hp.inner.optimizer != "adamw":
        raise ValueError(f"{spec.name()}: eager needs inner AdamW steps (a pseudo-gradient θ − θ_H)")
    if spec.aggregate not in AGGREGATES[hp.optimizer.method]:
        raise ValueError(f"{spec.name()}: aggregate {spec.aggregate!r} is not one of {hp.optimizer.method}'s "
                         f"{AGGREGATES[hp.optimizer.method]}")
    if spec.momentum is not None and hp.optimizer.method != "sparseloco":
        raise ValueError(f"{spec.name()}: the outer momentum is a SparseLoCo variant (a signed step is α·sign)")
    if spec.schedule not in ("cosine", "constant"):
        raise ValueError(f"{spec.name()}: schedule {spec.schedule!r}")
    return hp


@lru_cache(maxsize=2)
def _data(data_seed: int) -> tuple[Tiny, PagePlan, torch.Tensor]:
    """The corpus, a plan whose slots hold `MAX_PAGES` pages (each run takes the first P of its
    peer's slot, so a run's pages are a subset of a larger run's), the held-out batch; `data_seed`
    draws the plan (tiny's own, or another draw's: `Spec.seed`)."""
    tiny = load_tiny()
    plan = PagePlan.build(tiny.pages.num_pages, tiny.hp.data.holdout_fraction, data_seed, MAX_PAGES)
    return tiny, plan, tiny.pages.batch(plan.holdout_pages()[:HOLDOUT_PAGES])


def _nosign(message: bytes) -> bytes:
    return b"\x00" * 64


class _ExactCompressor(SparseLoCoCompressor):
    """SparseLoCo's chunked top-k with the values kept as float32 (no 2-bit grid)."""

    def compress(self, x: torch.Tensor) -> Compressed:
        plan = self.plan(x.shape)
        x = x.detach().to(torch.float32).contiguous()
        indices, values = self._select(x, plan)
        return Compressed(indices=indices, values=values, shape=torch.Size(x.shape), chunk=plan.chunk)


@dataclass
class _Received:
    """A payload as the outer step reads it, for the exact-values variant (no wire in between)."""

    tensors: dict[str, Compressed]
    warmup: bool = False


@dataclass
class _Before:
    """What the last outer step started from: θ, the outer momentum and the global step."""

    theta: list[torch.Tensor]
    momentum: dict[str, torch.Tensor] | None
    step: int


class SubnetRun:
    """K peers around one θ_t, each with its own inner optimizer and error feedback, exchanging
    real payloads; the outer step is production's `outer_step`. `mode` says which θ each peer's
    inner steps start from (module docstring)."""

    def __init__(self, hp: HParams, spec: Spec) -> None:
        self.hp, self.spec = hp, spec
        self.model = build_model(hp)
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.shapes = parameter_shapes(self.model)
        self.rule = rule_of(hp.optimizer.method)
        self.exact = spec.aggregate == "exact"
        self.vote = spec.aggregate == "vote"
        def compressor():
            if self.exact:
                return _ExactCompressor(hp.demo.target_chunk, hp.demo.topk)
            return self.rule.compressor(hp.demo.target_chunk, hp.demo.topk)
        self.demos = [DeMo(self.model, compressor=compressor(), decay=hp.demo.momentum_decay) for _ in range(PEERS)]
        self.optimizers = [make_inner_optimizer(self.model, hp.inner) for _ in range(PEERS)]
        self.state = NodeState(window=-1, global_step=0)
        self.momentum = {n: torch.zeros(p.shape) for n, p in zip(self.names, self.params, strict=True)} \
            if spec.momentum else None
        self.payload_bytes: list[int] = []
        self.before: _Before | None = None      # the last outer step's start (delayed, eager)
        self.own: list[dict[str, torch.Tensor]] = []  # eager: each peer's own last update, as the rule applies it
        self.land = round(hp.inner.steps * LANDING)

    def _theta(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def _load(self, values: list[torch.Tensor]) -> None:
        for p, v in zip(self.params, values, strict=True):
            p.copy_(v)

    def window(self, window: int, batches: list[torch.Tensor]) -> float:
        hp = self.hp
        step = self.state.global_step
        lr = inner_lr(hp.inner, step, hp.optimizer)
        theta = self._theta()  # θ_w: the run's model before this window's outer step
        received, losses = [], []
        for k, (demo, optimizer, batch) in enumerate(zip(self.demos, self.optimizers, batches, strict=True)):
            stats = self._inner(k, theta, batch, optimizer, lr)
            compressed = demo.step(gradients(self.model), stats.scale)
            self.model.zero_grad(set_to_none=True)
            if self.exact:
                received.append(_Received(compressed))
            else:
                data = write_gradient(compressed, collect_probes(self.model, window, hp), window=window,
                                      global_step=step, hotkey=f"peer-{k}", hp=hp, run=RUN, sign=_nosign)
                self.payload_bytes.append(len(data))
                received.append(read_gradient(data, self.shapes, hp, run=RUN, verify=None, expected_window=window))
            losses.append(stats.loss)
        momentum = {n: m.clone() for n, m in self.momentum.items()} if self.momentum is not None else None
        before = _Before(theta, momentum, step)
        if self.momentum is None and not (self.exact or self.vote):
            outer_step(self.model, received, self.state, hp)  # what every node runs
        else:
            self._apply(self.model, self._aggregate(received), step, self.momentum)
            self.state.global_step = step + 1
        if self.spec.mode == "eager":
            self.own = [self._own_update(g.tensors) for g in received]
        self.before = before
        self.state.window = window
        return sum(losses) / len(losses)

    def _aggregate(self, received: list[Any]) -> dict[str, torch.Tensor]:
        """The window's update: production's `outer_step` aggregate (`aggregation_weights`, the rule's
        `aggregate`), or the exact-values or vote variant's."""
        if self.exact:
            return _clipped_mean_exact([g.tensors for g in received], self.shapes)
        if self.vote:
            return self._vote([g.tensors for g in received])
        eligible, weights = aggregation_weights(received, self.hp)
        return self.rule.aggregate([g.tensors for g in eligible], weights, self.shapes)

    def _apply(self, params: torch.nn.Module | dict[str, torch.Tensor], update: dict[str, torch.Tensor], step: int,
               momentum: dict[str, torch.Tensor] | None) -> None:
        """Production's `apply_update` (θ ← θ − α·update by the run's rule), through DiLoCo's outer
        Nesterov momentum first when the spec has one: m ← μ·m + Δ, update Δ + μ·m (each a float32
        operation of its own, as a consensus rule would need)."""
        if momentum is not None:
            mu = self.spec.momentum
            nesterov = {}
            for name, u in update.items():
                momentum[name].mul_(mu).add_(u)
                nesterov[name] = (momentum[name] * mu).add_(u)
            update = nesterov
        apply_update(params, update, step, self.hp)

    def _vote(self, payloads: list[dict[str, Compressed]]) -> dict[str, torch.Tensor]:
        """Σ_p (1/G)·sign_p, sign_p the signed rule's update of peer p alone (`trial`): α per
        coordinate where every peer agrees, less where they disagree."""
        total = {name: torch.zeros(shape) for name, shape in self.shapes.items()}
        for payload in payloads:
            for name, sign in self.rule.trial(payload, self.shapes).items():
                total[name].add_(sign.float(), alpha=1.0 / PEERS)
        return total

    def _own_update(self, payload: dict[str, Compressed]) -> dict[str, torch.Tensor]:
        if self.exact:
            return _clipped_mean_exact([payload], self.shapes)
        return self.rule.trial(payload, self.shapes)

    def _inner(self, k: int, theta: list[torch.Tensor], batch: torch.Tensor,
               optimizer: torch.optim.Optimizer | None, lr: float) -> TrainStats:
        """Peer k's inner steps of this window; leaves its pseudo-gradient in `p.grad`, θ_w in the model."""
        hp = self.hp
        if self.spec.mode == "blocking" or self.before is None:  # the first window has nothing in flight
            return inner_steps(self.model, batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                               inner=hp.inner, optimizer=optimizer, lr=lr)
        if self.spec.mode == "delayed":
            self._load(self.before.theta)  # θ_{w−1}: window w−1's outer step is not known yet
            stats = inner_steps(self.model, batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                                inner=hp.inner, optimizer=optimizer, lr=lr)
            self._load(theta)  # the pseudo-gradient (relative to θ_{w−1}) stays in p.grad
            return stats
        return self._eager(theta, self._proxy(k), batch, optimizer, lr)

    def _proxy(self, k: int) -> list[torch.Tensor]:
        """θ_{w−1} with peer k's own window-(w−1) update applied by the outer rule (its momentum too)."""
        before = self.before
        assert before is not None
        params = {n: t.clone() for n, t in zip(self.names, before.theta, strict=True)}
        momentum = {n: m.clone() for n, m in before.momentum.items()} if before.momentum is not None else None
        self._apply(params, self.own[k], before.step, momentum)
        return [params[n] for n in self.names]

    def _eager(self, theta: list[torch.Tensor], proxy: list[torch.Tensor], batch: torch.Tensor,
               optimizer: torch.optim.Optimizer | None, lr: float) -> TrainStats:
        """The inner steps from the proxy; after `land` of them the aggregate lands and the proxy is
        swapped for θ_w; the pseudo-gradient is θ_w − θ_H (the steps of `inner_steps`, one by one)."""
        hp = self.hp
        assert optimizer is not None
        self._load(proxy)
        for group in optimizer.param_groups:
            group["lr"] = lr
        losses, tokens = [], 0
        parts = [part for part in inner_parts(batch, hp.inner.steps) if part.size(0)]
        for i, part in enumerate(parts):
            if i == self.land:
                with torch.no_grad():
                    for p, now, guess in zip(self.params, theta, proxy, strict=True):
                        p.add_(now - guess)
            stats = accumulate_gradients(self.model, part, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip)
            losses.append((stats.loss, part.size(0)))
            tokens += stats.tokens
            optimizer.step()
        with torch.no_grad():
            for p, now in zip(self.params, theta, strict=True):
                delta = (now - p.detach()).float()
                p.copy_(now)
                p.grad = delta.to(p.dtype)
        n = sum(size for _, size in losses)
        return TrainStats(loss=sum(v * s for v, s in losses) / n, tokens=tokens, seconds=0.0, scale=1.0)


def _clipped_mean_exact(peers: list[dict[str, Compressed]], shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """SparseLoCo's aggregate of float32 values in float64: Σ_p (1/G)·min(1, m/‖q_p‖)·q_p, m the
    lower median norm (`aggregate_clipped_mean`'s rule without its 2-bit grid)."""
    norms = [math.sqrt(sum(float(c.values.double().square().sum()) for c in p.values())) for p in peers]
    live = sorted(n for n in norms if n > 0)
    median = live[(len(live) - 1) // 2] if live else 0.0
    compressor = _ExactCompressor()
    out = {}
    for name, shape in shapes.items():
        total = torch.zeros(shape, dtype=torch.float64)
        for p, norm in zip(peers, norms, strict=True):
            if norm > 0:
                factor = min(1.0, median / norm) / PEERS
                total += compressor.decompress(p[name]).double() * factor
        out[name] = total.float()
    return out


class DataParallelRun:
    """AdamW data-parallel on the same tokens: H steps per window, step i on the union of the
    peers' i-th parts (each peer's sequences split H ways as `inner_steps` splits them), the
    window's rate on every step, the DP gradient clipped to `grad_clip`."""

    def __init__(self, hp: HParams) -> None:
        self.hp = hp
        self.model = build_model(hp)
        self.optimizer = make_inner_optimizer(self.model, hp.inner)
        self.global_step = 0

    def window(self, window: int, batches: list[torch.Tensor]) -> float:
        hp = self.hp
        lr = inner_lr(hp.inner, self.global_step, hp.optimizer)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        parts = [inner_parts(batch, hp.inner.steps) for batch in batches]
        losses, sizes = [], []
        for i in range(hp.inner.steps):
            union = torch.cat([peer[i] for peer in parts])
            stats = accumulate_gradients(self.model, union, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip)
            self.optimizer.step()
            self.model.zero_grad(set_to_none=True)
            losses.append(stats.loss * union.size(0))
            sizes.append(union.size(0))
        self.global_step += 1
        return sum(losses) / sum(sizes)


def run_settings(spec: Spec, hp: HParams) -> dict[str, Any]:
    """The settings a run's result records: what its `HParams` resolved the spec to."""
    return {
        "method": hp.optimizer.method if spec.kind == "subnet" else "adamw-dp",
        "inner": hp.inner.model_dump(), "outer_lr_peak": hp.optimizer.learning_rate if spec.kind == "subnet"
        else None, "outer_momentum": spec.momentum,
        "warmup_windows": hp.optimizer.warmup_steps, "total_windows": hp.optimizer.total_steps,
        "min_lr_factor": hp.optimizer.min_lr_factor, "outer_schedule": hp.optimizer.outer_schedule,
        "outer_weight_decay": hp.optimizer.weight_decay
        if spec.kind == "subnet" else None, "topk": hp.demo.topk, "target_chunk": hp.demo.target_chunk,
        "momentum_decay": hp.demo.momentum_decay, "pages_per_window": spec.pages,
        "sequences_per_peer": spec.sequences_per_peer, "grad_clip": hp.optimizer.grad_clip,
        "micro_batch_size": hp.optimizer.micro_batch_size, "mode": spec.mode, "aggregate": spec.aggregate,
        "init_seed": hp.model.init_seed, "data_seed": hp.data.data_seed,
        "schedule": spec.schedule, "model": spec.model,
    }


def train(spec: Spec, eval_every: int, threads: int) -> dict[str, Any]:
    """One run from θ_0; its held-out curve, train losses, time and bytes per token."""
    torch.set_num_threads(threads)
    hp = hparams_for(spec)
    tiny, plan, holdout = _data(hp.data.data_seed)
    run = DataParallelRun(hp) if spec.kind == "dp" else SubnetRun(hp, spec)
    mbs = hp.optimizer.micro_batch_size
    evals, curve, train_loss, seconds = [0], [evaluate_loss(run.model, holdout, mbs)], [], 0.0
    for window in range(spec.windows):
        batches = [tiny.pages.batch(plan.assigned_pages(k, window, spec.pages))[: spec.sequences_per_peer]
                   for k in range(PEERS)]
        started = time.perf_counter()
        train_loss.append(run.window(window, batches))
        seconds += time.perf_counter() - started
        if (window + 1) % eval_every == 0 or window + 1 == spec.windows:
            evals.append(window + 1)
            curve.append(evaluate_loss(run.model, holdout, mbs))
    tokens = spec.sequences_per_peer * hp.data.sequence_length  # per peer per window
    n_params = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    if isinstance(run, SubnetRun):
        sent = sum(run.payload_bytes) / len(run.payload_bytes) if run.payload_bytes else None
    else:
        sent = 4.0 * n_params * spec.steps  # a dense fp32 gradient per step
    result = {
        "spec": asdict(spec), "name": spec.name(), "key": spec.key(), "hparams_name": hp.name,
        "settings": run_settings(spec, hp),
        "eval_windows": evals, "holdout_loss": curve, "final_loss": curve[-1], "train_loss": train_loss,
        "seconds": seconds, "tokens_per_peer_window": tokens, "bytes_per_window": sent,
        "bytes_per_token": sent / tokens if sent is not None else None,
        "dense_bytes_per_token": 4.0 * n_params / tokens, "parameters": n_params,
    }
    emit({"case": "run", "name": spec.name(), "final_loss": curve[-1], "seconds": seconds,
          "bytes_per_token": result["bytes_per_token"]})
    return result


def _job(args: tuple[Spec, int, int, str | None]) -> dict[str, Any]:
    spec, eval_every, threads, cache = args
    path = Path(cache) / f"{spec.name()}_{spec.windows}w_{spec.key()}.json" if cache else None
    if path is not None and path.exists():
        result = json.loads(path.read_text())
    else:
        result = train(spec, eval_every, threads)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
    result["spec"]["tag"] = spec.tag
    return result


def run_all(specs: list[Spec], eval_every: int, jobs: int, cache: str | None,
            threads: int | None = None) -> list[dict[str, Any]]:
    """Each spec once (a spec already run under another tag is not run again)."""
    threads = threads or max(1, 2 // jobs)
    unique = list({s.key(): s for s in specs}.values())
    work = [(s, eval_every, threads, cache) for s in unique]
    if jobs <= 1:
        return [_job(w) for w in work]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        return pool.map(_job, work, chunksize=1)


def cached_runs(cache: str | Path) -> list[dict[str, Any]]:
    """Every finished run in a `--cache` folder, each with its tag as first run (sorted by name), its
    spec and settings completed where it predates a key (`complete_run`)."""
    return [complete_run(json.loads(path.read_text())) for path in sorted(Path(cache).glob("*.json"))]


def complete_run(run: dict[str, Any]) -> dict[str, Any]:
    """A cached run as the report reads it: a spec field the run lacks takes `Spec`'s default, a
    setting it lacks takes what its spec resolves to now (`hparams_for`, `run_settings`: the
    preset's value unless the spec sets it); keys no longer used are kept, unread."""
    declared = {f.name: f for f in fields(Spec)}
    spec = dict(run["spec"])
    if spec.get("preset") == "tiny":  # cached before production moved to SparseLoCo: tiny was the signed rule's
        spec["preset"] = SIGNED_PRESET
    for name, field in declared.items():
        if name not in spec and field.default is not MISSING:
            spec[name] = field.default
    settings = dict(run.get("settings", {}))
    resolved = Spec(**{k: v for k, v in spec.items() if k in declared})
    for key, value in run_settings(resolved, hparams_for(resolved)).items():
        settings.setdefault(key, value)
    return {**run, "spec": spec, "settings": settings, "name": run.get("name", resolved.name())}


# --- the plan's stages --------------------------------------------------------------------------


def _centre(grid: tuple[float, ...]) -> float | None:
    return grid[len(grid) // 2] if grid else None


def _spec(m: Method, inner: float | None, outer: float | None, windows: int, pages: int, **extra: Any) -> Spec:
    return Spec(m.key, m.kind, m.preset, inner, outer, m.steps, pages, windows, momentum=m.momentum,
                schedule=m.schedule, **extra)


def sweep_specs(table: dict[str, Method], windows: int, pages: int, quick: bool, only: set[str] | None) -> list[Spec]:
    """Every (inner, outer) grid point of every planned method; `quick`: the grid's centre only."""
    specs = []
    for m in table.values():
        if not _wanted(m, only):
            continue
        inner: tuple[float | None, ...] = m.inner or (None,)
        outer: tuple[float | None, ...] = m.outer or (None,)
        if quick:
            inner, outer = (_centre(m.inner),), (_centre(m.outer),)
        specs += [_spec(m, i, o, windows, pages) for i in inner for o in outer]
    return specs


def _wanted(m: Method, only: set[str] | None) -> bool:
    return m.key in only if only else m.in_plan


def _equal_tokens(r: dict[str, Any], windows: int, model: str = "tiny") -> bool:
    """A run on `model` at equal tokens: blocking, the whole horizon, whole pages."""
    s = r["spec"]
    return s["mode"] == "blocking" and s["model"] == model and s["sequences"] is None and s["windows"] == windows


def _is_main(r: dict[str, Any], windows: int) -> bool:
    """A run of the equal-tokens comparison: on the preset's own draw (another draw's runs are
    compared only with each other, `draws`)."""
    return _equal_tokens(r, windows) and r["spec"].get("seed") is None


def searched_best(results: list[dict[str, Any]], windows: int) -> dict[str, dict[str, Any]]:
    """Each method's best of its grid and refine points: where the overlap and small stages start."""
    return best_runs([r for r in results if r["spec"]["tag"] in SEARCH], windows)


def best_runs(results: list[dict[str, Any]], windows: int, *, targeted: bool = False) -> dict[str, dict[str, Any]]:
    """Each method's best run of the equal-tokens comparison (lowest final held-out loss): over its
    grid, refine and variant points; a targeted extra point stands for its method only when
    `targeted` (the tuned comparison: each side at the best of every setting tried, β2 and weight
    decay included, which the plan's grids do not search)."""
    best: dict[str, dict[str, Any]] = {}
    for r in results:
        if not _is_main(r, windows) or (r["spec"]["tag"] == "extra" and not targeted):
            continue
        key = r["spec"]["method"]
        if key not in best or r["final_loss"] < best[key]["final_loss"]:
            best[key] = r
    return best


def draws(results: list[dict[str, Any]], windows: int, table: dict[str, Method],
          model: str = "tiny") -> dict[str, list[dict[str, Any]]]:
    """Each other draw's equal-tokens runs on `model` (`Spec.seed`: another θ_0, page plan and
    holdout), best first, against AdamW DP's best at the same draw: whether a ratio read on the
    preset's draw, and its trend from 30 to 90 windows, hold on another."""
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        if _equal_tokens(r, windows, model) and r["spec"].get("seed") is not None:
            by_seed.setdefault(r["spec"]["seed"], []).append(r)
    out = {}
    for seed, runs in sorted(by_seed.items()):
        dp = [r for r in runs if r["spec"]["method"] == BASELINE]
        reference = min(dp, key=lambda r: r["final_loss"]) if dp else None
        out[str(seed)] = [_row(r, reference, table[r["spec"]["method"]].label)
                          for r in sorted(runs, key=lambda r: r["final_loss"])]
    return out


def _axis_value(line: tuple[float, ...], best: float, loss_of: dict[float, float]) -> float | None:
    """The refine point of one axis, from the rates run along it through the best point (`line`,
    ascending): one step beyond an edge best (the ratio of its two nearest rates), the geometric
    midpoint towards the better neighbour of an inner best (None for a one-point line)."""
    if len(line) < 2 or best not in line:
        return None
    i = line.index(best)
    if i == 0:
        value = best * line[0] / line[1]
    elif i == len(line) - 1:
        value = best * line[-1] / line[-2]
    else:
        lower, upper = line[i - 1], line[i + 1]
        towards = lower if loss_of.get(lower, math.inf) <= loss_of.get(upper, math.inf) else upper
        value = math.sqrt(best * towards)
    return float(f"{value:.3g}")


def refine_specs(results: list[dict[str, Any]], table: dict[str, Method], windows: int, pages: int,
                 only: set[str] | None, leaders_only: bool = False) -> list[Spec]:
    """One round of refinement: per method and swept axis, `_axis_value` along the line of grid and
    refine points through the method's best of them (a rate already run is not run again).
    `leaders_only` (the second round): of a family, only its best member."""
    searched = [r for r in results if r["spec"]["tag"] in SEARCH]
    best = best_runs(searched, windows)
    specs = []
    for m in table.values():
        if not _wanted(m, only) or m.key not in best:
            continue
        if leaders_only and m.family is not None and family_best(best, table, m.family) is not best[m.key]:
            continue
        b = best[m.key]["spec"]
        runs = [r for r in searched if _is_main(r, windows) and r["spec"]["method"] == m.key]
        for axis, grid in (("inner_lr", m.inner), ("outer_lr", m.outer)):
            if len(grid) < 2:
                continue  # an axis the method does not sweep
            other = "outer_lr" if axis == "inner_lr" else "inner_lr"
            loss_of = {r["spec"][axis]: r["final_loss"] for r in runs if r["spec"][other] == b[other]}
            value = _axis_value(tuple(sorted(loss_of)), b[axis], loss_of)
            if value is not None and not any(math.isclose(value, v, rel_tol=0.02) for v in loss_of):
                rates = {"inner_lr": b["inner_lr"], "outer_lr": b["outer_lr"], axis: value}
                specs.append(_spec(m, rates["inner_lr"], rates["outer_lr"], windows, pages, tag="refine"))
    return specs


def _at_best(best: dict[str, Any], windows: int, pages: int, table: dict[str, Method], **changes: Any) -> Spec:
    s = best["spec"]
    m = table[s["method"]]
    fields = {k: s[k] for k in ("inner_lr", "outer_lr", "topk", "decay", "momentum", "min_lr", "aggregate",
                                "schedule")}
    for axis in ("inner", "outer"):
        if f"{axis}_factor" in changes:
            fields[f"{axis}_lr"] = float(f"{fields[f'{axis}_lr'] * changes.pop(f'{axis}_factor'):.4g}")
    fields.update(changes)
    return Spec(m.key, m.kind, m.preset, steps=m.steps, pages=pages, windows=windows, **fields)


def variant_specs(results: list[dict[str, Any]], table: dict[str, Method], windows: int, pages: int,
                  only: set[str] | None) -> list[Spec]:
    best = best_runs(results, windows)
    specs = []
    for m in table.values():
        if _wanted(m, only) and m.key in best:
            specs += [_at_best(best[m.key], windows, pages, table, tag="variant", **dict(v)) for v in m.variants]
    for family, variants in FAMILY_VARIANTS.items():
        lead = family_best(best, table, family, only)
        if lead is not None:
            specs += [_at_best(lead, windows, pages, table, tag="variant", **dict(v)) for v in variants]
    return specs


def family_best(best: dict[str, dict[str, Any]], table: dict[str, Method], family: str,
                only: set[str] | None = None) -> dict[str, Any] | None:
    """The best run of a family's members (None when none ran)."""
    runs = [r for k, r in best.items() if table[k].family == family and (not only or k in only)]
    return min(runs, key=lambda r: r["final_loss"]) if runs else None


def overlap_specs(results: list[dict[str, Any]], table: dict[str, Method], windows: int, pages: int,
                  only: set[str] | None, wall_clock: bool = True) -> list[Spec]:
    """Delayed and eager at equal tokens at each of `overlap_targets`, and at equal wall-clock
    (`WALL_CLOCK`) at the first, each at the target's best settings."""
    h, sequences = WALL_CLOCK
    wide_pages = -(-sequences // 4)
    specs = []
    for i, target in enumerate(overlap_targets(searched_best(results, windows), table, only)):
        for mode in MODES[1:]:
            specs.append(_at_best(target, windows, pages, table, mode=mode, tag="overlap"))
            if wall_clock and i == 0:
                wide = _at_best(target, windows, wide_pages, table, mode=mode, sequences=sequences, tag="overlap")
                specs.append(replace(wide, steps=h))
    return specs


def overlap_targets(best: dict[str, dict[str, Any]], table: dict[str, Method],
                    only: set[str] | None = None) -> list[dict[str, Any]]:
    """The best runs the overlap stage starts from (`OVERLAP_TARGETS`, those that ran)."""
    out = []
    for target in OVERLAP_TARGETS:
        run = best.get(target) if target in table else family_best(best, table, target)
        if run is not None and (not only or run["spec"]["method"] in only):
            out.append(run)
    return out


def small_specs(results: list[dict[str, Any]], table: dict[str, Method], windows: int, pages: int,
                only: set[str] | None) -> list[Spec]:
    """The larger model: AdamW DP at its tiny best rate and half of it; each of `SMALL_TARGETS` at its
    tiny best settings."""
    best = searched_best(results, windows)
    specs = []
    if BASELINE in best and (not only or BASELINE in only):
        b = best[BASELINE]
        specs += [replace(_at_best(b, windows, pages, table, model="small", tag="small"),
                          inner_lr=b["spec"]["inner_lr"] * factor) for factor in (1.0, 0.5)]
    for target in SMALL_TARGETS:
        run = best.get(target) if target in table else family_best(best, table, target)
        if run is not None and (not only or run["spec"]["method"] in only):
            specs.append(_at_best(run, windows, pages, table, model="small", tag="small"))
    return specs


def parse_point(text: str, table: dict[str, Method], windows: int, pages: int) -> Spec:
    """`method:inner=1e-3,outer=1,topk=128,decay=0.95,momentum=0.9,min_lr=0,mode=eager,model=small,beta1=0.9,
    beta2=0.99,inner_wd=0.3,warmup=9` → an extra Spec."""
    key, _, rest = text.partition(":")
    m = table[key]
    values = dict(item.split("=", 1) for item in rest.split(",") if item)
    number = {"inner": float, "outer": float, "topk": int, "decay": float, "momentum": float, "min_lr": float,
              "steps": int, "sequences": int, "pages": int, "beta2": float, "inner_wd": float, "warmup": int,
              "beta1": float, "seed": int}
    parsed = {k: number[k](v) if k in number else v for k, v in values.items()}
    if "steps" in parsed and "sequences" not in parsed and parsed["steps"] != m.steps:
        # a run's name and label show H only beside its sequences (`h7s14`): another H alone would be
        # reported as the method's own H, under the same name as the run it differs from
        raise ValueError(f"{text}: steps={parsed['steps']} needs sequences= too ({m.label} runs H = {m.steps})")
    spec = _spec(m, parsed.pop("inner", None), parsed.pop("outer", None), windows, pages, tag="extra")
    return replace(spec, **parsed)


# --- the report ---------------------------------------------------------------------------------


def loss_at(run: dict[str, Any], window: int) -> float | None:
    """The run's held-out loss after `window` windows (None when not measured then)."""
    if window in run["eval_windows"]:
        return run["holdout_loss"][run["eval_windows"].index(window)]
    return None


def ratios(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, float | None]:
    """Held-out loss over the reference's at each of `RATIO_AT` (None where either lacks it)."""
    out = {}
    for w in RATIO_AT:
        mine, theirs = loss_at(run, w), loss_at(reference, w)
        out[str(w)] = mine / theirs if mine is not None and theirs is not None else None
    return out


def _row(r: dict[str, Any], reference: dict[str, Any] | None, label: str) -> dict[str, Any]:
    s = r["spec"]
    dense_over_sent = r["dense_bytes_per_token"] / r["bytes_per_token"] \
        if s["kind"] == "subnet" and r["bytes_per_token"] else None
    inner = r["settings"].get("inner", {})
    return {"name": r["name"], "method": s["method"], "label": label, "tag": s["tag"], "mode": s["mode"],
            "inner_lr": s["inner_lr"], "outer_lr": s["outer_lr"], "momentum": s["momentum"],
            "topk": r["settings"]["topk"], "decay": r["settings"]["momentum_decay"],
            "min_lr": r["settings"]["min_lr_factor"], "aggregate": s["aggregate"], "schedule": s["schedule"],
            "steps": s["steps"], "beta1": inner.get("beta1"), "beta2": inner.get("beta2"),
            "inner_wd": inner.get("weight_decay"),
            "sequences": r["settings"]["sequences_per_peer"], "model": s["model"],
            "equal": "wall-clock" if s["sequences"] is not None else "tokens", "final_loss": r["final_loss"],
            "ratio": ratios(r, reference) if reference is not None else None,
            "bytes_per_token": r["bytes_per_token"], "dense_over_sent": dense_over_sent, "seconds": r["seconds"]}


def _fmt_ratio(row: dict[str, Any]) -> str:
    if not row["ratio"]:
        return "  ".join("  -   " for _ in RATIO_AT)
    return "  ".join(f"{v:.4f}" if v is not None else "  -   " for v in row["ratio"].values())


def _fmt_settings(row: dict[str, Any]) -> str:
    parts = [f"in {row['inner_lr']:g}" if row["inner_lr"] is not None else "",
             f"out {row['outer_lr']:g}" if row["outer_lr"] is not None else "",
             f"μ {row['momentum']:g}" if row["momentum"] else "",
             f"k {row['topk']}" if row["method"] != BASELINE else "",
             f"ef {row['decay']:g}" if row["method"] != BASELINE else "",
             f"floor {row['min_lr']:g}" if row["min_lr"] != 0.1 else "",
             f"β1 {row['beta1']:g}" if row.get("beta1") not in (None, 0.9) else "",
             f"β2 {row['beta2']:g}" if row.get("beta2") not in (None, 0.95) else "",
             f"wd {row['inner_wd']:g}" if row.get("inner_wd") not in (None, 0.0, 0.1) else "",
             row["aggregate"] if row["aggregate"] != "wire" else "",
             f"{row['schedule']} α" if row["schedule"] != "cosine" else "",
             f"H {row['steps']} on {row['sequences']}" if row["mode"] != "blocking" or row["steps"] != 4 else ""]
    return ", ".join(p for p in parts if p)


def _print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"  {'':<56} {'final':>7}  {'ratio at ' + ' / '.join(map(str, RATIO_AT)):<24}  {'B/token':>8}  settings")
    for row in rows:
        sent = f"{row['bytes_per_token']:8.1f}" if row["bytes_per_token"] is not None else "       -"
        print(f"  {row['label'][:56]:<56} {row['final_loss']:7.4f}  {_fmt_ratio(row):<24}  {sent}  "
              f"{_fmt_settings(row)}  [{row['tag']}{' ' + row['mode'] if row['mode'] != 'blocking' else ''}]")


def report(results: list[dict[str, Any]], h: int, windows: int, out_dir: Path, stem: str) -> dict[str, Any]:
    """Print the tables; write the JSON and the plots; return the JSON body."""
    table = methods(h)
    best = best_runs(results, windows)
    reference = best.get(BASELINE)

    sweeps = {}
    for key in table:
        runs = sorted((r for r in results if _is_main(r, windows) and r["spec"]["method"] == key),
                      key=lambda r: r["final_loss"])
        if runs:
            sweeps[key] = [_row(r, reference, table[key].label) for r in runs]
            _print_rows(f"{table[key].label}: every point, {windows} windows, best first", sweeps[key])

    tokens = [_row(best[k], reference, table[k].label) for k in table if k in best]
    _print_rows(f"Equal tokens, {windows} windows, K = {PEERS}: the best of each method, ratio to "
                f"{table[BASELINE].label}", tokens)
    tuned_best = best_runs(results, windows, targeted=True)
    tuned_reference = tuned_best.get(BASELINE)
    tuned = [_row(tuned_best[k], tuned_reference, table[k].label) for k in table if k in tuned_best]
    _print_rows(f"Tuned against tuned, {windows} windows: the best of every point of each method, extra "
                f"points included, ratio to {table[BASELINE].label}'s", tuned)

    other_draws = draws(results, windows, table)
    for seed, rows in other_draws.items():
        _print_rows(f"Another draw (seeds + {seed}: θ_0, the pages, the holdout), ratio to its own best "
                    f"{table[BASELINE].label}", rows)

    overlap = []
    for target in overlap_targets(searched_best(results, windows), table):
        key, spec = target["spec"]["method"], target["spec"]
        same = [r for r in results if r["spec"]["method"] == key and r["spec"]["model"] == "tiny"
                and r["spec"]["windows"] == windows and r["spec"]["mode"] != "blocking"
                and all(r["spec"][f] == spec[f] for f in ("inner_lr", "outer_lr", "topk", "decay", "momentum",
                                                          "min_lr", "aggregate", "schedule"))]
        if not same:
            continue  # the overlap stage has not run at this target
        overlap.append(_row(target, reference, f"{table[key].label}: blocking"))
        for r in sorted(same, key=lambda r: (r["spec"]["sequences"] or 0, MODES.index(r["spec"]["mode"]))):
            wide = " (equal wall-clock)" if r["spec"]["sequences"] is not None else ""
            overlap.append(_row(r, reference, f"{table[key].label}: {r['spec']['mode']}{wide}"))
    if overlap:
        _print_rows("Overlapped exchange (ratio to AdamW DP)", overlap)

    small = [r for r in results if _equal_tokens(r, windows, "small") and r["spec"].get("seed") is None]
    small_draws = draws(results, windows, table, "small")  # compared only with each other, as on tiny
    small_rows = []
    if small:
        dp = [r for r in small if r["spec"]["method"] == BASELINE]
        small_ref = min(dp, key=lambda r: r["final_loss"]) if dp else None
        small_rows = [_row(r, small_ref, table[r["spec"]["method"]].label)
                      for r in sorted(small, key=lambda r: r["final_loss"])]
        _print_rows(f"Larger model ({small[0]['parameters']:,} parameters), ratio to its best AdamW DP", small_rows)
    for seed, rows in small_draws.items():
        _print_rows(f"Larger model, another draw (seeds + {seed}), ratio to its own best AdamW DP", rows)

    goals = _goals(tokens, tuned, overlap, small_rows, table, other_draws, small_draws)
    print(f"\nGoals: {json.dumps(goals, indent=1)}")
    body = {"case": "summary", "windows": windows, "peers": PEERS, "top_g": PEERS, "inner_steps": h,
            "holdout_pages": HOLDOUT_PAGES, "ratio_at": list(RATIO_AT), "landing": LANDING,
            "wall_clock": {"steps": WALL_CLOCK[0], "sequences": WALL_CLOCK[1]}, "models": MODELS, "goals": goals,
            "equal_tokens": tokens, "equal_tokens_tuned": tuned, "draws": other_draws, "overlap": overlap, "small": small_rows,
            "small_draws": small_draws, "sweeps": sweeps,
            "methods": {k: {"label": m.label, "preset": m.preset, "inner": list(m.inner), "outer": list(m.outer),
                            "momentum": m.momentum, "variants": [dict(v) for v in m.variants]}
                        for k, m in table.items()},
            "runs": results}
    write_result(f"{stem}.json", body, out_dir)
    _plots(results, best, tuned_best, overlap, small, table, out_dir, stem)
    return body


def _best_decentralised(rows: list[dict[str, Any]], table: dict[str, Method]) -> dict[str, Any] | None:
    """The goals of the issue for the lowest ratio at the last window among `rows`' decentralised
    methods: within 1.05 (and 1.03) of AdamW DP, no wider at the end than at the first ratio window,
    ≥ 100x fewer bytes than dense fp32. None when no decentralised row reaches the last window."""
    last = str(RATIO_AT[-1])
    subnet = [r for r in rows if table[r["method"]].kind == "subnet" and r["ratio"] and r["ratio"][last]]
    if not subnet:
        return None
    top = min(subnet, key=lambda r: r["ratio"][last])
    first = top["ratio"][str(RATIO_AT[0])]
    return {"method": top["method"], "name": top["name"], "ratio": top["ratio"],
            "within_1.05": top["ratio"][last] <= 1.05, "within_1.03": top["ratio"][last] <= 1.03,
            "not_widening": first is not None and top["ratio"][last] <= first,
            "dense_over_sent": top["dense_over_sent"], "fewer_bytes_100x": (top["dense_over_sent"] or 0) >= 100,
            "final_loss": top["final_loss"]}


def _on_other_draws(top: dict[str, Any], other_draws: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The verdict's run on each other draw that ran its settings: its ratios there, and whether it is
    within 1.05 and no wider at the end on every draw, this one included (a margin one draw's noise
    decides is not the goal met)."""
    last, first = str(RATIO_AT[-1]), str(RATIO_AT[0])
    seen = {seed: row["ratio"] for seed, rows in other_draws.items() for row in rows
            if row["ratio"] and row["name"].replace(f"_seed{seed}", "") == top["name"]}
    if not seen:
        return {}
    ratios = [top["ratio"], *seen.values()]
    return {"other_draws": seen,
            "within_1.05_every_draw": all(r[last] is not None and r[last] <= 1.05 for r in ratios),
            "not_widening_every_draw": all(r[first] is not None and r[last] is not None and r[last] <= r[first]
                                           for r in ratios)}


def _goals(tokens: list[dict[str, Any]], tuned: list[dict[str, Any]], overlap: list[dict[str, Any]],
           small: list[dict[str, Any]], table: dict[str, Method],
           other_draws: dict[str, list[dict[str, Any]]] | None = None,
           small_draws: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    if (top := _best_decentralised(tokens, table)) is not None:
        goals["equal_tokens_best"] = top
        goals["signed_within_1pct_of_best"] = any(
            r["method"] == "signed_h" and r["final_loss"] <= 1.01 * top["final_loss"] for r in tokens)
    if (top := _best_decentralised(tuned, table)) is not None:
        goals["tuned_best"] = {**top, **_on_other_draws(top, other_draws or {})}
    by_method: dict[str, dict[str, dict[str, Any]]] = {}
    for r in overlap:
        kind = r["mode"] + ("_wall_clock" if r["equal"] == "wall-clock" else "")
        by_method.setdefault(r["method"], {})[kind] = r
    for key, rows in by_method.items():
        if "blocking" not in rows:
            continue
        base = rows["blocking"]["final_loss"]
        goals[f"overlap_{key}"] = {kind: {"final_loss": r["final_loss"], "over_blocking": r["final_loss"] / base}
                                   for kind, r in rows.items() if kind != "blocking"}
    if small:
        dp = [r for r in small if r["method"] == BASELINE]
        others = [r for r in small if r["method"] != BASELINE]
        if dp and others:
            top = min(others, key=lambda r: r["final_loss"])
            goals["small_best"] = {"method": top["method"], "name": top["name"], "ratio": top["ratio"],
                                   **_on_other_draws(top, small_draws or {})}
    return goals


def plot(path: Path, curves: dict[str, tuple[list[int], list[float]]], title: str, xlabel: str,
         ylabel: str = "held-out loss (nats)", span: float | None = 2.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=90)
    for label, (x, y) in curves.items():
        ax.plot(x, y, marker="o", markersize=2.5, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    # below the axes: a tuned run's label names its settings and is wider than the plot
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    lows = [min(y) for _, y in curves.values() if y]
    if lows and span is not None:
        ax.set_ylim(min(lows) - 0.1, min(lows) + span)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


def _ratio_curve(run: dict[str, Any], reference: dict[str, Any]) -> tuple[list[int], list[float]]:
    points = [(w, loss_at(run, w), loss_at(reference, w)) for w in run["eval_windows"] if w > 0]
    points = [(w, a / b) for w, a, b in points if a is not None and b is not None]
    return [w for w, _ in points], [v for _, v in points]


def _plots(results: list[dict[str, Any]], best: dict[str, dict[str, Any]], tuned: dict[str, dict[str, Any]],
           overlap: list[dict[str, Any]], small: list[dict[str, Any]], table: dict[str, Method], out_dir: Path,
           stem: str) -> None:
    xlabel = "window (same tokens for every method)"
    curves = {f"{table[k].label} ({r['final_loss']:.3f})": (r["eval_windows"], r["holdout_loss"])
              for k, r in best.items()}
    if curves:
        plot(out_dir / f"{stem}_tokens.png", curves, f"tiny, K={PEERS} peers, equal tokens, best of each method",
             xlabel)
    reference = best.get(BASELINE)
    if reference is None:
        return
    ratio_curves = {table[k].label: _ratio_curve(r, reference) for k, r in best.items() if k != BASELINE}
    tuned_reference = tuned.get(BASELINE)
    if tuned_reference is not None:  # tuned against tuned: each side at its best of every point run
        ratio_curves |= {f"{table[k].label}, tuned, over tuned DP ({_fmt_settings(_row(r, None, ''))})":
                         _ratio_curve(r, tuned_reference) for k, r in tuned.items()
                         if k != BASELINE and table[k].kind == "subnet" and r is not best.get(k)}
    if ratio_curves:
        plot(out_dir / f"{stem}_ratio.png", ratio_curves, "held-out loss over AdamW DP's (equal tokens)", xlabel,
             "ratio to AdamW DP", span=None)
    by_name = {r["name"]: r for r in results}
    overlap_curves = {row["label"]: _ratio_curve(by_name[row["name"]], reference) for row in overlap}
    if overlap_curves:
        plot(out_dir / f"{stem}_overlap.png", overlap_curves, "overlapped exchange: held-out loss over AdamW DP's",
             "window", "ratio to AdamW DP", span=None)
    if small:  # each method's best on the larger model (the table lists every run)
        small_best: dict[str, dict[str, Any]] = {}
        for r in small:
            method = r["spec"]["method"]
            if method not in small_best or r["final_loss"] < small_best[method]["final_loss"]:
                small_best[method] = r
        curves = {f"{table[k].label}, {_fmt_settings(_row(r, None, ''))} ({r['final_loss']:.3f})":
                  (r["eval_windows"], r["holdout_loss"]) for k, r in small_best.items()}
        plot(out_dir / f"{stem}_small.png", curves, f"larger model ({small[0]['parameters']:,} parameters), "
             f"K={PEERS}, equal tokens, best of each method", xlabel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 windows, the grid's centre of each method, "
                        "every overlap mode")
    parser.add_argument("--windows", type=int, default=None, help=f"outer steps per run (default {WINDOWS})")
    parser.add_argument("--eval-every", type=int, default=None, help="windows between held-out evaluations")
    parser.add_argument("--inner-steps", type=int, default=4, help="H of the inner-step methods")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {STAGES}")
    parser.add_argument("--only", action="append", default=None, help="run only this method (repeatable)")
    parser.add_argument("--point", action="append", default=[],
                        help="an extra run outside the plan, method:inner=..,outer=..,momentum=..,mode=..")
    parser.add_argument("--pages", type=int, default=None, help="P, pages per peer per window (the preset's 2)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (≤ 2 on the shared 2-core VM)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default 2 // jobs)")
    parser.add_argument("--cache", default=None, help="folder of finished runs (skipped when rerun)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--report-only", action="store_true", help="run nothing: the report (tables, goals, "
                        "JSON, plots) of the finished runs in --cache")
    args = parser.parse_args(argv)
    setup_torch()
    windows = args.windows or (3 if args.quick else WINDOWS)
    stem = "convergence_quick" if args.quick else "convergence"  # a quick run never overwrites the full figures
    if args.report_only:
        if not args.cache:
            parser.error("--report-only reads the runs of --cache")
        table = methods(args.inner_steps)
        results = [r for r in cached_runs(args.cache) if r["spec"]["method"] in table]
        print(f"{len(results)} finished runs in {args.cache}")
        report(results, args.inner_steps, windows, args.out or RESULTS_DIR, stem)
        return 0
    eval_every = args.eval_every or (windows if args.quick else 5)
    pages = args.pages or load_hparams("tiny").data.pages_per_window
    if pages * args.inner_steps > MAX_PAGES:
        parser.error(f"H × P must be at most {MAX_PAGES} pages (a plan slot)")
    stages = [s for s in args.stages.split(",") if s]
    if unknown := set(stages) - set(STAGES):
        parser.error(f"unknown stages {sorted(unknown)}")
    only = set(args.only) if args.only else None
    table = methods(args.inner_steps)

    def go(specs: list[Spec]) -> list[dict[str, Any]]:
        return run_all(specs, eval_every, args.jobs, args.cache, args.threads)

    results = go(sweep_specs(table, windows, pages, args.quick, only) if "sweep" in stages else [])
    results += go([parse_point(p, table, windows, pages) for p in args.point])
    if args.quick:
        results += go(overlap_specs(results, table, windows, pages, only, wall_clock=False))
    else:
        if "refine" in stages:
            for round_ in range(REFINE_ROUNDS):
                results += go(refine_specs(results, table, windows, pages, only, leaders_only=round_ > 0))
        # the last three stages start from the best after the refine, side by side (one pool, the
        # longest runs first): the overlap and the larger model do not wait for the variants
        later = [s for stage, make in (("variants", variant_specs), ("overlap", overlap_specs), ("small", small_specs))
                 if stage in stages for s in make(results, table, windows, pages, only)]
        results += go(sorted(later, key=lambda s: -s.sequences_per_peer * s.steps * (3 if s.model == "small" else 1)))
    report(results, args.inner_steps, windows, args.out or RESULTS_DIR, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
