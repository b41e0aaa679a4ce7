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
schedule), so a gap that widens as the run matures shows, and by its token cost there: the tokens
it needed to reach the held-out loss DP had at that window, over DP's (`token_cost`; a loss ratio
of 1.05 can hide a token cost of 1.5).

The plan (`--stages`, each stage needs the ones before it; `--cache` keeps finished runs):
- `sweep`: each method's coarse log grid of peak rates (`Method.inner`, `Method.outer`) on the
  whole horizon (no early stopping);
- `refine`: one point per swept axis around each method's best: half a step towards the better
  neighbour when the best is inside the rates run along that axis, one step beyond it when it is
  on an edge; a second round for the baseline and each family's best member;
- `variants`: at each method's best so far, one setting changed at a time (`Method.variants`:
  outer momentum, error-feedback decay, density, value bits, the schedule's floor); a variant
  that beats the best becomes the method's best (what works is kept) if a subnet could configure it;
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
carries them): an upper bound on what more value bits could buy, not a configurable run; with
top-4096 (every coordinate) it is exact averaging of the peers' models, the floor of the local steps
themselves. Exact values, the signed vote and an outer momentum on a method not defined by one are
listed with their method's points, never its best (`convergence_plan.configurable`).
`aggregate=vote` (signed only) averages the peers' signs (each peer's own signed update, the rule's
`trial`): a coordinate moves α where every peer agrees and less where they disagree, an outer step
that shrinks as the peers' updates turn to noise late in a run.

The code: this module is the report and the command line; `convergence_runs` is what a run is and
how it trains (and the cache of finished runs), `convergence_plan` which runs each stage adds.

Results: `benchmarks/results/convergence.json` (every run's curve and settings, the tables, the
goals), `convergence_tokens.png` (held-out loss of each method's best), `convergence_ratio.png`
(ratio to AdamW DP over the windows; a method's tuned best, where it differs, over DP's tuned
best), `convergence_overlap.png` and `convergence_small.png`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import RESULTS_DIR, setup_torch, write_result
from benchmarks.research import convergence_runs
from benchmarks.research.convergence_plan import (
    WALL_CLOCK,
    best_runs,
    configurable,
    equal_tokens,
    is_main,
    overlap_specs,
    overlap_targets,
    parse_point,
    refine_specs,
    searched_best,
    small_specs,
    sweep_specs,
    variant_specs,
)
from benchmarks.research.convergence_runs import (
    BASELINE,
    LANDING,
    MAX_PAGES,
    MODELS,
    MODES,
    PEERS,
    Method,
    Spec,
    cached_runs,
    methods,
    run_all,
)
from templar.core.config import load_hparams

WINDOWS = 90
RATIO_AT = (30, 60, 90)
STAGES = ("sweep", "refine", "variants", "overlap", "small")
REFINE_ROUNDS = 2


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


def windows_to_reach(run: dict[str, Any], loss: float) -> float | None:
    """The windows `run` took to bring its held-out loss down to `loss`: the first crossing of its
    measured curve, linear between two measurements; None when it never got there."""
    windows, curve = run["eval_windows"], run["holdout_loss"]
    for i in range(1, len(curve)):
        if curve[i] <= loss:
            above, below = curve[i - 1], curve[i]
            share = (above - loss) / (above - below) if above > below else 1.0
            return windows[i - 1] + share * (windows[i] - windows[i - 1])
    return None


def token_cost(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, float | None]:
    """At each of `RATIO_AT`: the tokens `run` needed to reach the held-out loss the reference had
    there, over the reference's (windows over windows: both train the same tokens per window).
    What a loss ratio near 1 hides: 1.5 means each token taught two thirds of what a data-parallel
    one did. None where the reference was not measured or the run never got there."""
    out = {}
    for w in RATIO_AT:
        theirs = loss_at(reference, w)
        took = windows_to_reach(run, theirs) if theirs is not None else None
        out[str(w)] = took / w if took is not None else None
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
            "inner_wd": inner.get("weight_decay"), "warmup": s.get("warmup"),
            "sequences": r["settings"]["sequences_per_peer"], "model": s["model"],
            "equal": "wall-clock" if s["sequences"] is not None else "tokens", "final_loss": r["final_loss"],
            "ratio": ratios(r, reference) if reference is not None else None,
            "token_cost": token_cost(r, reference) if reference is not None else None,
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
             f"warm-up {row['warmup']}" if row.get("warmup") is not None else "",
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


def draws(results: list[dict[str, Any]], windows: int, table: dict[str, Method],
          model: str = "tiny") -> dict[str, list[dict[str, Any]]]:
    """Each other draw's equal-tokens runs on `model` (`Spec.seed`: another θ_0, page plan and
    holdout), best first, against AdamW DP's best at the same draw: whether a ratio read on the
    preset's draw, and its trend from 30 to 90 windows, hold on another."""
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        if equal_tokens(r, windows, model) and r["spec"].get("seed") is not None:
            by_seed.setdefault(r["spec"]["seed"], []).append(r)
    out = {}
    for seed, runs in sorted(by_seed.items()):
        dp = [r for r in runs if r["spec"]["method"] == BASELINE]
        reference = min(dp, key=lambda r: r["final_loss"]) if dp else None
        out[str(seed)] = [_row(r, reference, table[r["spec"]["method"]].label)
                          for r in sorted(runs, key=lambda r: r["final_loss"])]
    return out


def report(results: list[dict[str, Any]], h: int, windows: int, out_dir: Path, stem: str) -> dict[str, Any]:
    """Print the tables; write the JSON and the plots; return the JSON body."""
    table = methods(h)
    best = best_runs(results, windows)
    reference = best.get(BASELINE)

    sweeps = {}
    for key in table:
        runs = sorted((r for r in results if is_main(r, windows) and r["spec"]["method"] == key),
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

    small = [r for r in results if equal_tokens(r, windows, "small") and r["spec"].get("seed") is None]
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
            "holdout_pages": convergence_runs.HOLDOUT_PAGES, "ratio_at": list(RATIO_AT), "landing": LANDING,
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


def _bytes_goal(row: dict[str, Any]) -> dict[str, Any]:
    """A verdict run's bytes: dense fp32 over what it sent, and whether that is the goal's 100x."""
    return {"dense_over_sent": row["dense_over_sent"], "fewer_bytes_100x": (row["dense_over_sent"] or 0) >= 100}


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
    return {"method": top["method"], "name": top["name"], "ratio": top["ratio"], "token_cost": top.get("token_cost"),
            "within_1.05": top["ratio"][last] <= 1.05, "within_1.03": top["ratio"][last] <= 1.03,
            "not_widening": first is not None and top["ratio"][last] <= first,
            **_bytes_goal(top),
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
        others = [r for r in small if r["method"] != BASELINE and configurable(r)]
        if dp and others:
            top = min(others, key=lambda r: r["final_loss"])
            goals["small_best"] = {"method": top["method"], "name": top["name"], "ratio": top["ratio"],
                                   "token_cost": top.get("token_cost"), **_bytes_goal(top),
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
            if not configurable(r["spec"]):
                continue
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
