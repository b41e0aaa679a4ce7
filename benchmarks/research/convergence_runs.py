"""The convergence benchmark's runs: what one run is (`Method`, `Spec` and the `HParams` it resolves
to), how it trains (K simulated peers through production's inner steps, wire and outer step, or
AdamW data-parallel on the same tokens; `train`) and the folder of finished runs (`run_all`,
`cached_runs`). What is measured, and why, is `benchmarks.research.convergence`'s docstring."""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import time
from dataclasses import MISSING, asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import Tiny, emit, load_tiny
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
AGGREGATES = {"signed": ("wire", "vote"), "sparseloco": ("wire", "exact")}
RUN = Run(netuid=0, digest="0" * 64)  # the run the simulated payloads are signed for

BASELINE = "adamw_dp_h"
MODES = ("blocking", "delayed", "eager")
LANDING = 0.5
"""Eager: the share of a window's inner steps done before the previous window's aggregate lands.
Production's overlapped window: the payload of window w is committed at the end of w's compute; its
put window (24 s), gather (20 s) and outer step follow, about 40 s, while window w+1 computes for
about 76 s (90 % of 84 s): the aggregate lands about half-way through."""
MODELS: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {"hidden_size": 256, "intermediate_size": 1024},  # 8.4M parameters against tiny's 3.1M
}


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


