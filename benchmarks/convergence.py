"""Convergence on the tiny preset, measured two ways, every method through production's code paths.

    OMP_NUM_THREADS=1 python benchmarks/convergence.py --jobs 1 --threads 1 --cache /tmp/convergence
                                        # 30 windows, the LR sweep (about half an hour on one core)
    python benchmarks/convergence.py --quick              # 3 windows, one LR per method
    python benchmarks/convergence.py --point sparseloco_h:inner=1e-3,outer=1,topk=128   # one extra run

K = 4 simulated peers start from the same θ_0 (`build_model`) and stay in sync (G = 4); peer k
trains on `assigned_pages(k, window, P)` (P pages of 4 sequences of 128 tokens). A decentralised
method runs exactly what a miner and the aggregator run: `inner_steps` (each peer with its own inner
optimizer from `make_inner_optimizer`, at `inner_lr` of the window's α, and its own error feedback,
both kept across windows), `DeMo.step(grads, stats.scale)` with the method's compressor, the payload
written with `write_gradient` and read back with `read_gradient` (the wire's codec and its
quantisation), and `runtime.outer.outer_step`: the method's `aggregate` with weights 1/G and its
`apply` at α = `learning_rate(global_step, optimizer)`. Each method's settings are a validated
`HParams` built from a preset (`tiny`, `tiny-sparseloco`), so every measured point is a run a subnet
could configure.

Two comparisons, H inner steps (`--inner-steps`, 4):
- equal tokens (every method sees the same P = 2 pages per peer per window): the baseline, AdamW
  data-parallel taking H steps per window, step i on the union of the peers' i-th H-th of their
  pages (the same optimizer steps as H inner steps); AdamW DP with one step per window; the paper
  (signed, one SGD step, H = 1); signed with H inner AdamW steps; SparseLoCo with H inner steps.
- equal windows (equal wall-clock for the subnet): the paper's one step on P pages against H inner
  steps on H·P pages (signed and SparseLoCo), which is what inner steps buy a subnet.

Every run has warm-up `windows // 10` and a cosine to `min_lr_factor` (0.1) over the run's windows
(the inner rate follows the same shape; a DP run's H steps of a window all take that window's rate).
Each method sweeps its peak rates on a log grid (`methods`: inner × outer), then the equal-windows
runs take the best rates of their equal-tokens counterparts; the sweep table and the best of each method (lowest final held-out loss on the first 16 held-out pages) go into
`benchmarks/results/convergence.json` with all settings, and `convergence_tokens.png`,
`convergence_windows.png` plot the best runs. Bytes per token: the mean size of the payloads the
peers actually wrote (`write_gradient`) over the tokens each trained on in the window; the
reference ("dense") is the same window's pseudo-gradient sent as dense fp32, 4 bytes per parameter
per window, and a data-parallel run sends a dense fp32 gradient per optimizer step (H per window).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from _common import RESULTS_DIR, Tiny, emit, load_tiny, setup_torch, write_result
from templar.compress import DeMo
from templar.compress.methods import rule_of
from templar.core.config import HParams, load_hparams
from templar.core.model import build_model, parameter_shapes
from templar.core.schedule import learning_rate
from templar.data import PagePlan
from templar.runtime.outer import collect_probes, outer_step
from templar.runtime.state import NodeState
from templar.runtime.train import (
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
MAX_PAGES = 8  # a plan slot's size: P × H for the default H = 4 and P = 2
RUN = Run(netuid=0, digest="0" * 64)  # the run the simulated payloads are signed for

BASELINE = "adamw_dp_h"
PAPER = "signed_h1"


@dataclass(frozen=True)
class Method:
    """One way of training θ: how a window runs and which peak rates it sweeps."""

    key: str
    label: str
    kind: str               # "dp": AdamW data-parallel; "subnet": K peers, payloads, an outer step
    preset: str             # the hparams preset the settings start from
    steps: int              # optimizer steps per window (H; 1 for the paper and DP-1)
    pages_factor: int       # pages per peer per window = P × this
    inner: tuple[float, ...]  # inner (or DP) AdamW peak rates; () for the paper's SGD window
    outer: tuple[float, ...]  # outer α peaks; () for DP
    comparisons: tuple[str, ...]
    follows: str | None = None  # not swept: runs at this method's best rates (`follow_specs`)


def methods(h: int) -> dict[str, Method]:
    """The compared methods at H = `h` inner steps, with their LR grids: 2–3 rates a factor 1.5–3
    apart per swept axis (the whole sweep fits about half an hour on one shared core at 30 windows),
    around the presets (AdamW 1e-3 on tiny, the sign step 3e-3, SparseLoCo's outer SGD 1 as in its
    paper) and above them, since a run this short favours larger rates; a first pass of two rates
    per axis was extended where its best sat on an edge (the sign step, DP's rates). The
    equal-windows runs are not swept: each takes the best rates of its equal-tokens counterpart
    (same method and H, 1/H of the pages), which, if anything, favours the swept paper."""
    inner = (1e-3, 3e-3)
    sign = (3e-3, 6e-3, 1.2e-2)
    both = ("tokens", "windows")
    return {m.key: m for m in (
        Method(BASELINE, f"AdamW DP, {h} steps/window", "dp", "tiny", h, 1, (1e-3, 2e-3, 3e-3), (), ("tokens",)),
        Method("adamw_dp_1", "AdamW DP, 1 step/window", "dp", "tiny", 1, 1, (3e-3, 5e-3, 1e-2), (), ("tokens",)),
        Method(PAPER, "signed, 1 SGD step (paper)", "subnet", "tiny", 1, 1, (), sign, both),
        Method("signed_h", f"signed, {h} inner AdamW", "subnet", "tiny", h, 1, inner, sign, ("tokens",)),
        Method("sparseloco_h", f"SparseLoCo, {h} inner AdamW", "subnet", "tiny-sparseloco", h, 1, inner, (1.0,),
               ("tokens",)),
        Method("signed_h_wide", f"signed, {h} inner AdamW on {h}× pages", "subnet", "tiny", h, h, (), (),
               ("windows",), follows="signed_h"),
        Method("sparseloco_h_wide", f"SparseLoCo, {h} inner AdamW on {h}× pages", "subnet", "tiny-sparseloco", h, h,
               (), (), ("windows",), follows="sparseloco_h"),
    )}


@dataclass(frozen=True)
class Spec:
    """One training run: a method at one pair of peak rates (and optional compression overrides)."""

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
    tag: str = "sweep"          # "sweep" or "extra" (a targeted point outside the grid)

    def name(self) -> str:
        parts = [self.method]
        if self.inner_lr is not None:
            parts.append(f"in{self.inner_lr:g}")
        if self.outer_lr is not None:
            parts.append(f"out{self.outer_lr:g}")
        if self.topk is not None:
            parts.append(f"k{self.topk}")
        if self.decay is not None:
            parts.append(f"d{self.decay:g}")
        return "_".join(parts)


def hparams_for(spec: Spec) -> HParams:
    """The run's settings as a validated `HParams`: the method's preset with its schedule matched to
    the run's length, the swept rates, H and P (`model_validate`, so a setting no subnet could run
    fails here)."""
    base = load_hparams(spec.preset)
    warmup = max(1, spec.windows // 10)
    optimizer = {"warmup_steps": warmup, "total_steps": spec.windows}
    inner: dict[str, Any] = {"steps": spec.steps}
    if spec.inner_lr is None:  # the paper's window: H SGD steps at the outer rate, whatever the preset's inner
        inner["optimizer"] = "sgd"
    else:
        inner.update(optimizer="adamw", learning_rate=spec.inner_lr)
        if spec.preset == "tiny":
            # DP's AdamW owns weight decay (the preset's 0.1); under the signed rule the outer step
            # applies it (θ·(1 − α·wd)), so that run's inner AdamW has none.
            inner["weight_decay"] = base.optimizer.weight_decay if spec.kind == "dp" else 0.0
    if spec.outer_lr is not None:
        optimizer["learning_rate"] = spec.outer_lr
    elif spec.kind == "dp":  # the schedule's peak is the DP rate itself: inner_lr() is then the schedule
        optimizer["learning_rate"] = spec.inner_lr
    demo = {k: v for k, v in (("topk", spec.topk), ("momentum_decay", spec.decay)) if v is not None}
    body = base.model_dump()
    body["name"] = f"{base.name}-{spec.name()}"
    body["optimizer"].update(optimizer)
    body["inner"].update(inner)
    body["data"]["pages_per_window"] = spec.pages
    body["demo"].update(demo)
    return HParams.model_validate(body)


@lru_cache(maxsize=1)
def _data() -> tuple[Tiny, PagePlan, torch.Tensor]:
    """The corpus, a plan whose slots hold `MAX_PAGES` pages (each run takes the first P of its
    peer's slot, so the paper's pages are a subset of the wide runs'), the held-out batch."""
    tiny = load_tiny()
    plan = PagePlan.build(tiny.pages.num_pages, tiny.hp.data.holdout_fraction, tiny.hp.data.data_seed, MAX_PAGES)
    return tiny, plan, tiny.pages.batch(plan.holdout_pages()[:HOLDOUT_PAGES])


def _nosign(message: bytes) -> bytes:
    return b"\x00" * 64


class SubnetRun:
    """K peers around one θ_t, each with its own inner optimizer and error feedback, exchanging
    real payloads; the outer step is production's `outer_step`."""

    def __init__(self, hp: HParams) -> None:
        self.hp = hp
        self.model = build_model(hp)
        self.shapes = parameter_shapes(self.model)
        rule = rule_of(hp.optimizer.method)
        self.demos = [DeMo(self.model, compressor=rule.compressor(hp.demo.target_chunk, hp.demo.topk),
                           decay=hp.demo.momentum_decay) for _ in range(PEERS)]
        self.optimizers = [make_inner_optimizer(self.model, hp.inner) for _ in range(PEERS)]
        self.state = NodeState(window=-1, global_step=0)
        self.payload_bytes: list[int] = []

    def window(self, window: int, batches: list[torch.Tensor]) -> float:
        hp = self.hp
        lr = inner_lr(hp.inner, learning_rate(self.state.global_step, hp.optimizer), hp.optimizer)
        received, losses = [], []
        for k, (demo, optimizer, batch) in enumerate(zip(self.demos, self.optimizers, batches, strict=True)):
            stats = inner_steps(self.model, batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                                inner=hp.inner, optimizer=optimizer, lr=lr)
            compressed = demo.step(gradients(self.model), stats.scale)
            self.model.zero_grad(set_to_none=True)
            data = write_gradient(compressed, collect_probes(self.model, window, hp), window=window,
                                  global_step=self.state.global_step, hotkey=f"peer-{k}", hp=hp, run=RUN,
                                  sign=_nosign)
            self.payload_bytes.append(len(data))
            received.append(read_gradient(data, self.shapes, hp, run=RUN, verify=None, expected_window=window))
            losses.append(stats.loss)
        outer_step(self.model, received, self.state, hp)
        self.state.window = window
        return sum(losses) / len(losses)


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
        lr = inner_lr(hp.inner, learning_rate(self.global_step, hp.optimizer), hp.optimizer)
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


def train(spec: Spec, eval_every: int, threads: int) -> dict[str, Any]:
    """One run from θ_0; its held-out curve, train losses, time and bytes per token."""
    torch.set_num_threads(threads)
    hp = hparams_for(spec)
    tiny, plan, holdout = _data()
    run = DataParallelRun(hp) if spec.kind == "dp" else SubnetRun(hp)
    mbs = hp.optimizer.micro_batch_size
    evals, curve, train_loss, seconds = [0], [evaluate_loss(run.model, holdout, mbs)], [], 0.0
    for window in range(spec.windows):
        batches = [tiny.pages.batch(plan.assigned_pages(k, window, spec.pages)) for k in range(PEERS)]
        started = time.perf_counter()
        train_loss.append(run.window(window, batches))
        seconds += time.perf_counter() - started
        if (window + 1) % eval_every == 0 or window + 1 == spec.windows:
            evals.append(window + 1)
            curve.append(evaluate_loss(run.model, holdout, mbs))
    tokens = spec.pages * hp.data.sequences_per_page * hp.data.sequence_length  # per peer per window
    n_params = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    if isinstance(run, SubnetRun):
        sent = sum(run.payload_bytes) / len(run.payload_bytes)
    else:
        sent = 4.0 * n_params * spec.steps  # a dense fp32 gradient per step
    result = {
        "spec": asdict(spec), "name": spec.name(), "hparams_name": hp.name,
        "settings": {
            "method": hp.optimizer.method if spec.kind == "subnet" else "adamw-dp",
            "inner": hp.inner.model_dump(), "outer_lr_peak": hp.optimizer.learning_rate if spec.kind == "subnet"
            else None, "warmup_windows": hp.optimizer.warmup_steps, "total_windows": hp.optimizer.total_steps,
            "min_lr_factor": hp.optimizer.min_lr_factor, "outer_weight_decay": hp.optimizer.weight_decay
            if spec.kind == "subnet" else None, "topk": hp.demo.topk, "target_chunk": hp.demo.target_chunk,
            "momentum_decay": hp.demo.momentum_decay, "pages_per_window": spec.pages, "grad_clip":
            hp.optimizer.grad_clip, "micro_batch_size": mbs,
        },
        "eval_windows": evals, "holdout_loss": curve, "final_loss": curve[-1], "train_loss": train_loss,
        "seconds": seconds, "tokens_per_peer_window": tokens, "bytes_per_window": sent,
        "bytes_per_token": sent / tokens, "dense_bytes_per_token": 4.0 * n_params / tokens,
        "parameters": n_params,
    }
    emit({"case": "run", "name": spec.name(), "final_loss": curve[-1], "seconds": seconds,
          "bytes_per_token": sent / tokens})
    return result


def _job(args: tuple[Spec, int, int, str | None]) -> dict[str, Any]:
    spec, eval_every, threads, cache = args
    path = None
    if cache:
        key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:16]
        path = Path(cache) / f"{spec.name()}_{spec.windows}w_{key}.json"
        if path.exists():
            return json.loads(path.read_text())
    result = train(spec, eval_every, threads)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
    return result


def _centre(grid: tuple[float, ...]) -> tuple[float | None, ...]:
    return (grid[len(grid) // 2],) if grid else (None,)


def sweep_specs(h: int, windows: int, pages: int, quick: bool, only: set[str] | None) -> list[Spec]:
    """Every (inner, outer) grid point of every swept method; `quick`: the grid's centre only, and
    a following method at its leader's centre (no second stage)."""
    table = methods(h)
    specs = []
    for m in table.values():
        if only and m.key not in only:
            continue
        if m.follows is not None:
            if quick:
                lead = table[m.follows]
                specs.append(Spec(m.key, m.kind, m.preset, _centre(lead.inner)[0], _centre(lead.outer)[0], m.steps,
                                  pages * m.pages_factor, windows))
            continue
        inner: tuple[float | None, ...] = m.inner or (None,)
        outer: tuple[float | None, ...] = m.outer or (None,)
        if quick:
            inner, outer = _centre(m.inner), _centre(m.outer)
        specs += [Spec(m.key, m.kind, m.preset, i, o, m.steps, pages * m.pages_factor, windows)
                  for i in inner for o in outer]
    return specs


def follow_specs(results: list[dict[str, Any]], h: int, windows: int, pages: int,
                 only: set[str] | None) -> list[Spec]:
    """The second stage: each following method at the best (inner, outer) of its leader's sweep
    (the leader's grid centre when the leader did not run)."""
    table = methods(h)
    best = summarise(results, h).best
    specs = []
    for m in table.values():
        if m.follows is None or (only and m.key not in only):
            continue
        lead = table[m.follows]
        if m.follows in best:
            inner, outer = best[m.follows]["spec"]["inner_lr"], best[m.follows]["spec"]["outer_lr"]
        else:
            inner, outer = _centre(lead.inner)[0], _centre(lead.outer)[0]
        specs.append(Spec(m.key, m.kind, m.preset, inner, outer, m.steps, pages * m.pages_factor, windows))
    return specs


def parse_point(text: str, h: int, windows: int, pages: int) -> Spec:
    """`method:inner=1e-3,outer=1,topk=128,decay=0.95` → an extra Spec."""
    key, _, rest = text.partition(":")
    m = methods(h)[key]
    values = dict(item.split("=", 1) for item in rest.split(",") if item)
    return Spec(key, m.kind, m.preset, float(values["inner"]) if "inner" in values else None,
                float(values["outer"]) if "outer" in values else None, m.steps, pages * m.pages_factor, windows,
                topk=int(values["topk"]) if "topk" in values else None,
                decay=float(values["decay"]) if "decay" in values else None, tag="extra")


def run_all(specs: list[Spec], eval_every: int, jobs: int, cache: str | None,
            threads: int | None = None) -> list[dict[str, Any]]:
    threads = threads or max(1, 2 // jobs)
    work = [(s, eval_every, threads, cache) for s in specs]
    if jobs <= 1:
        return [_job(w) for w in work]
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        return pool.map(_job, work, chunksize=1)


@dataclass
class Summary:
    best: dict[str, dict[str, Any]] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def summarise(results: list[dict[str, Any]], h: int) -> Summary:
    """The sweep table of each method and its best run (lowest final held-out loss, grid points only)."""
    out = Summary()
    for key in methods(h):
        rows = [r for r in results if r["spec"]["method"] == key]
        if not rows:
            continue
        out.tables[key] = [{"name": r["name"], "inner_lr": r["spec"]["inner_lr"], "outer_lr": r["spec"]["outer_lr"],
                            "topk": r["settings"]["topk"], "decay": r["settings"]["momentum_decay"],
                            "tag": r["spec"]["tag"], "final_loss": r["final_loss"], "seconds": r["seconds"]}
                           for r in rows]
        grid = [r for r in rows if r["spec"]["tag"] == "sweep"] or rows
        out.best[key] = min(grid, key=lambda r: r["final_loss"])
    return out


def plot(path: Path, curves: dict[str, tuple[list[int], list[float]]], title: str, xlabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
    for label, (x, y) in curves.items():
        ax.plot(x, y, marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out loss (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    lows = [min(y) for _, y in curves.values()]
    if lows:
        ax.set_ylim(min(lows) - 0.1, min(lows) + 2.0)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(results: list[dict[str, Any]], h: int, windows: int, out_dir: Path, stem: str) -> dict[str, Any]:
    """Print the sweep and comparison tables; write the JSON and both plots; return the JSON body."""
    table = methods(h)
    s = summarise(results, h)
    print(f"\nLR sweep, {windows} windows, K = {PEERS} peers, final held-out loss ({HOLDOUT_PAGES} pages):")
    for key, rows in s.tables.items():
        print(f"  {table[key].label}")
        for row in sorted(rows, key=lambda r: (r["tag"], r["inner_lr"] or 0, r["outer_lr"] or 0)):
            mark = " *" if row["name"] == s.best[key]["name"] else ""
            extra = f" topk {row['topk']} decay {row['decay']:g}" if row["tag"] == "extra" else ""
            print(f"    inner {row['inner_lr'] if row['inner_lr'] is not None else '-':>7} "
                  f"outer {row['outer_lr'] if row['outer_lr'] is not None else '-':>7}{extra}  "
                  f"{row['final_loss']:.4f}  ({row['seconds']:.0f} s){mark}")

    comparisons: dict[str, Any] = {}
    for comp, reference in (("tokens", BASELINE), ("windows", PAPER)):
        keys = [k for k, m in table.items() if comp in m.comparisons and k in s.best]
        if reference not in s.best:
            continue
        ref = s.best[reference]["final_loss"]
        rows = []
        print(f"\nEqual {comp}: final held-out loss, ratio to {table[reference].label}, bytes per token")
        for key in keys:
            b = s.best[key]
            row = {"method": key, "label": table[key].label, "final_loss": b["final_loss"],
                   "ratio": b["final_loss"] / ref, "inner_lr": b["spec"]["inner_lr"], "outer_lr": b["spec"]["outer_lr"],
                   "steps": b["spec"]["steps"], "pages": b["spec"]["pages"], "bytes_per_token": b["bytes_per_token"],
                   "dense_over_sent": b["dense_bytes_per_token"] / b["bytes_per_token"]
                   if table[key].kind == "subnet" else None, "seconds": b["seconds"]}
            rows.append(row)
            below = f"{row['dense_over_sent']:.0f}× below dense" if row["dense_over_sent"] else "dense fp32 per step"
            print(f"  {table[key].label:<40} {row['final_loss']:.4f}  {row['ratio']:.4f}  "
                  f"{row['bytes_per_token']:9.2f} B/token ({below})  "
                  f"inner {row['inner_lr']}, outer {row['outer_lr']}")
        comparisons[comp] = {"reference": reference, "rows": rows}

    goals = {}
    if "tokens" in comparisons:
        subnet = [r for r in comparisons["tokens"]["rows"] if table[r["method"]].kind == "subnet"]
        if subnet:
            best = min(subnet, key=lambda r: r["ratio"])
            goals["equal_tokens_best"] = {"method": best["method"], "ratio": best["ratio"], "met": best["ratio"] <= 1.03}
    if "windows" in comparisons:
        wide = [r for r in comparisons["windows"]["rows"] if r["method"] != PAPER]
        if wide:
            best = min(wide, key=lambda r: r["ratio"])
            goals["equal_windows_best"] = {"method": best["method"], "ratio": best["ratio"]}
    sent = [r["dense_over_sent"] for c in comparisons.values() for r in c["rows"] if r["dense_over_sent"]]
    if sent:
        goals["fewer_bytes_than_dense"] = {"min": min(sent), "met": min(sent) >= 100}
    print(f"\nGoals: {json.dumps(goals)}")

    body = {"case": "summary", "windows": windows, "peers": PEERS, "top_g": PEERS, "inner_steps": h,
            "holdout_pages": HOLDOUT_PAGES, "goals": goals, "comparisons": comparisons,
            "sweep": s.tables, "best": s.best,
            "grids": {k: {"inner": list(m.inner), "outer": list(m.outer), "preset": m.preset, "follows": m.follows}
                      for k, m in table.items()}}
    write_result(f"{stem}.json", body, out_dir)
    for comp, xlabel in (("tokens", "window (same tokens for every method)"),
                         ("windows", "window (outer step)")):
        if comp not in comparisons:
            continue
        curves = {}
        for row in comparisons[comp]["rows"]:
            b = s.best[row["method"]]
            curves[f"{row['label']} ({row['final_loss']:.3f})"] = (b["eval_windows"], b["holdout_loss"])
        plot(out_dir / f"{stem}_{comp}.png", curves,
             f"tiny, K={PEERS} peers, equal {comp}, best of each LR sweep (final held-out loss)", xlabel)
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 windows, the grid's centre of each method")
    parser.add_argument("--windows", type=int, default=None, help="outer steps per run (default 30)")
    parser.add_argument("--eval-every", type=int, default=None, help="windows between held-out evaluations")
    parser.add_argument("--inner-steps", type=int, default=4, help="H of the inner-step methods")
    parser.add_argument("--only", action="append", default=None, help="run only this method (repeatable)")
    parser.add_argument("--point", action="append", default=[],
                        help="an extra run outside the grid, method:inner=..,outer=..,topk=..,decay=..")
    parser.add_argument("--pages", type=int, default=None, help="P, pages per peer per window (the preset's 2)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (≤ 2 on the shared 2-core VM)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (default 2 // jobs)")
    parser.add_argument("--cache", default=None, help="folder of finished runs (skipped when rerun)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    setup_torch()
    windows = args.windows or (3 if args.quick else 30)
    eval_every = args.eval_every or (windows if args.quick else 5)
    pages = args.pages or load_hparams("tiny").data.pages_per_window
    if pages * args.inner_steps > MAX_PAGES:
        parser.error(f"H × P must be at most {MAX_PAGES} pages (a plan slot)")
    only = set(args.only) if args.only else None
    specs = sweep_specs(args.inner_steps, windows, pages, args.quick, only)
    specs += [parse_point(p, args.inner_steps, windows, pages) for p in args.point]
    results = run_all(specs, eval_every, args.jobs, args.cache, args.threads)
    if not args.quick:  # the second stage needs the first one's best rates
        results += run_all(follow_specs(results, args.inner_steps, windows, pages, only), eval_every, args.jobs,
                           args.cache, args.threads)
    stem = "convergence_quick" if args.quick else "convergence"  # a quick run never overwrites the full figures
    report(results, args.inner_steps, windows, args.out or RESULTS_DIR, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
