"""The figures of `subnet_sim`'s full run: incentive over time for the paper's settings and the chosen
levers, validator agreement, each sweep's trade-off, and the LossRating candidates' trade-off curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.incentive.subnet_sim import WINDOW_SECONDS, Outcome, hours, worst_cheat


def plot(path: Path, baseline: Outcome, improved: Outcome, sweeps: dict[str, list[tuple[float, dict]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    def time_axis(n: int) -> np.ndarray:
        return np.arange(n) * WINDOW_SECONDS / 3600

    for ax, outcome, title in ((axes[0, 0], baseline, "baseline (paper settings)"),
                               (axes[0, 1], improved, "with the chosen levers")):
        s = outcome.series
        t = time_axis(len(s["honest_median"]))
        ax.fill_between(t, s["honest_p10"], s["honest_p90"], alpha=0.3, label="honest p10–p90")
        ax.plot(t, s["honest_median"], label="honest median")
        ax.plot(t, s["newcomer_mean"], label="newcomers (mean)")
        ax.plot(t, s["moredata_mean"], label="moredata (mean)")
        ax.axvline(outcome.config["join_window"] * WINDOW_SECONDS / 3600, color="grey", linestyle=":")
        ax.set(title=title, xlabel="hours (84 s windows)", ylabel="Yuma incentive per uid")
        ax.legend(fontsize=7)
    ax = axes[0, 2]
    for outcome, label in ((baseline, "baseline"), (improved, "levers")):
        s = outcome.series
        ax.plot(time_axis(len(s["agreement"])), s["agreement"], label=label)
    ax.set(title="validator agreement (1 − TV)", xlabel="hours", ylim=(0, 1.02))
    ax.legend(fontsize=7)
    for ax, (name, points) in zip(axes[1], list(sweeps.items())[:3], strict=False):
        xs = [p[0] for p in points]
        ax.plot(xs, [hours(p[1]["newcomer_honest_median_windows"]) for p in points], "o-",
                label="newcomer → honest median (h)")
        ax.plot(xs, [min(p[1]["honest_p90_over_p10"], 10) for p in points], "s-", label="honest p90/p10 (cap 10)")
        ax.plot(xs, [p[1]["agreement_mean"] * 5 for p in points], "^-", label="agreement × 5")
        ax.plot(xs, [100 * worst_cheat(p[1])[1] for p in points], "x-", label="worst cheat class (%)")
        ax.plot(xs, [min(p[1]["moredata_over_honest"], 10) for p in points], "d-", label="moredata / honest (cap 10)")
        ax.axhline(1.0, color="grey", linewidth=0.5)
        ax.set(title=f"trade-off: {name}", xlabel=name.split(", ")[-1])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)



def plot_tradeoff(path: Path, outcomes: dict[str, Outcome]) -> None:
    """Honest max/min and validator agreement against `moredata`'s premium, per LossRating candidate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[tuple[str, dict]]] = {}
    for label, outcome in outcomes.items():
        if label.startswith("candidate: "):
            rest = label.removeprefix("candidate: ")
            family = rest.split(", k=")[0] if rest.startswith("relative") else rest.split(",")[0]
            families.setdefault(family, []).append((rest, outcome.metrics))
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for ax, key, target, title in ((axes[0], "honest_max_over_min", 1.5, "identical honest peers: max/min incentive"),
                                   (axes[1], "agreement_mean", 0.95, "two validators' agreement (1 − TV)")):
        for family, points in sorted(families.items()):
            points = sorted(points, key=lambda p: p[1]["moredata_over_honest"])
            xs = [p[1]["moredata_over_honest"] for p in points]
            ys = [min(p[1][key], 20.0) for p in points]
            ax.plot(xs, ys, "o-", label=family)
        chosen = outcomes["chosen"].metrics
        ax.plot([chosen["moredata_over_honest"]], [chosen[key]], "*", color="black", markersize=16, label="chosen")
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        ax.axvline(1.0, color="grey", linewidth=0.5)
        ax.set(xscale="log", xlabel="moredata / honest incentive (premium for 2× data)", title=title)
        if key == "honest_max_over_min":
            ax.set(yscale="log", ylabel="max/min over 206 identical peers (cap 20)")
        else:
            ax.set(ylabel="agreement")
        ax.legend(fontsize=7)
    fig.suptitle("LossRating candidates at 256 uids, 2 validators, 720 windows (target: left ≤ 1.5, right ≥ 0.95)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
