"""The convergence benchmark's plan: the runs each stage adds from the results so far (`sweep_specs`,
`refine_specs`, `variant_specs`, `overlap_specs`, `small_specs`, `--point`'s `parse_point`), and
which finished run stands for a method (`best_runs`, `searched_best`, `family_best`, `configurable`).
The stages are described in `benchmarks.research.convergence`'s docstring."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from benchmarks.research.convergence_runs import BASELINE, FAMILY_VARIANTS, MODES, Method, Spec, methods

WALL_CLOCK = (7, 14)
"""(H, sequences per peer) of an overlapped window at equal wall-clock on tiny: 1.75× blocking's (4, 8)."""
OVERLAP_TARGETS = ("sparseloco", "signed_h")
"""Where the overlap stage runs: a family's best (`Method.family`) or a method's best; the first
one also at equal wall-clock."""
SMALL_TARGETS = ("sparseloco", "signed_h")
"""The small stage's decentralised runs, as `OVERLAP_TARGETS`: a family's best or a method's best."""
SEARCH = ("sweep", "refine")  # the tags of the rate search (the variants change other settings)


def _centre(grid: tuple[float, ...]) -> float | None:
    return grid[len(grid) // 2] if grid else None


def make_spec(m: Method, inner: float | None, outer: float | None, windows: int, pages: int, **extra: Any) -> Spec:
    """A run of method `m` at these peak rates, with its momentum and α schedule; `extra` sets other
    `Spec` fields (the tag, a variant's setting)."""
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
        specs += [make_spec(m, i, o, windows, pages) for i in inner for o in outer]
    return specs


def _wanted(m: Method, only: set[str] | None) -> bool:
    return m.key in only if only else m.in_plan


def equal_tokens(r: dict[str, Any], windows: int, model: str = "tiny") -> bool:
    """A run on `model` at equal tokens: blocking, the whole horizon, whole pages."""
    s = r["spec"]
    return s["mode"] == "blocking" and s["model"] == model and s["sequences"] is None and s["windows"] == windows


def is_main(r: dict[str, Any], windows: int) -> bool:
    """A run of the equal-tokens comparison: on the preset's own draw (another draw's runs are
    compared only with each other, `draws`)."""
    return equal_tokens(r, windows) and r["spec"].get("seed") is None


def searched_best(results: list[dict[str, Any]], windows: int) -> dict[str, dict[str, Any]]:
    """Each method's best of its grid and refine points: where the overlap and small stages start."""
    return best_runs([r for r in results if r["spec"]["tag"] in SEARCH], windows)


def configurable(run: dict[str, Any]) -> bool:
    """Whether a run (its spec, or a report row) may stand for its method: it sent the wire's
    payloads (not exact values or the signed vote, which no rule offers and the benchmark computes
    itself), and it has an outer momentum only if its method is defined by one (`sparseloco_m`).
    The others are measured and listed, never a method's best nor the verdict's run."""
    own = methods(1)[run["method"]].momentum
    return run["aggregate"] == "wire" and (run["momentum"] is None) == (own is None)


def best_runs(results: list[dict[str, Any]], windows: int, *, targeted: bool = False) -> dict[str, dict[str, Any]]:
    """Each method's best run of the equal-tokens comparison (lowest final held-out loss): over its
    grid, refine and variant points; a targeted extra point stands for its method only when
    `targeted` (the tuned comparison: each side at the best of every setting tried, β2 and weight
    decay included, which the plan's grids do not search)."""
    best: dict[str, dict[str, Any]] = {}
    for r in results:
        if not is_main(r, windows) or (r["spec"]["tag"] == "extra" and not targeted) or not configurable(r["spec"]):
            continue
        key = r["spec"]["method"]
        if key not in best or r["final_loss"] < best[key]["final_loss"]:
            best[key] = r
    return best


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
        runs = [r for r in searched if is_main(r, windows) and r["spec"]["method"] == m.key]
        for axis, grid in (("inner_lr", m.inner), ("outer_lr", m.outer)):
            if len(grid) < 2:
                continue  # an axis the method does not sweep
            other = "outer_lr" if axis == "inner_lr" else "inner_lr"
            loss_of = {r["spec"][axis]: r["final_loss"] for r in runs if r["spec"][other] == b[other]}
            value = _axis_value(tuple(sorted(loss_of)), b[axis], loss_of)
            if value is not None and not any(math.isclose(value, v, rel_tol=0.02) for v in loss_of):
                rates = {"inner_lr": b["inner_lr"], "outer_lr": b["outer_lr"], axis: value}
                specs.append(make_spec(m, rates["inner_lr"], rates["outer_lr"], windows, pages, tag="refine"))
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
    spec = make_spec(m, parsed.pop("inner", None), parsed.pop("outer", None), windows, pages, tag="extra")
    return replace(spec, **parsed)


