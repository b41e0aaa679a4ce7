"""Windows weighed by their own noise: production's equal-weight relative mean vs a candidate.

    nice -n 19 python -m benchmarks.incentive.subnet_sim_windows      # 12 simulations, about a minute on 2 cores

The 256-uid simulator draws every evaluation from one pool, so every window is as noisy as the
next; a localnet's are not (σ̂ 0.03 early in training, 0.3–0.9 late: benchmarks/LOG.md §6). Each
line runs `CHOSEN` at seeds 0–2 with i.i.d. windows and with windows whose spread is scaled by
exp(N(0, 0.94)) per validator and window (`window_noise`, the log-spread of σ̂ measured in six
localnets, 341 windows), with production's rule (every window counts alike, standard error = running
spread/√n_eff) and with the simulator-only candidate `WeighedWindowsBook` (a window noisier than
the running spread counts 1/σ̂², standard error √Q/W). Not adopted: benchmarks/LOG.md §6.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from benchmarks.incentive.subnet_sim import CHEATS, CHOSEN, SimConfig, hours, simulate

SEEDS = (0, 1, 2)
WINDOW_NOISE = 0.94


def windows_plan() -> list[tuple[str, SimConfig]]:
    chosen = replace(SimConfig(), **CHOSEN)
    jobs = []
    for name, variant in (("i.i.d. windows", {}), (f"window_noise={WINDOW_NOISE}", {"window_noise": WINDOW_NOISE})):
        for seed in SEEDS:
            cfg = replace(chosen, seed=seed, **variant)
            jobs += [(f"{name}, production, seed={seed}", cfg),
                     (f"{name}, weighed, seed={seed}", replace(cfg, weighed_windows=True))]
    return jobs


def windows_line(label: str, m: dict) -> str:
    return (f"  {label:<36} honest max/min {m['honest_max_over_min']:5.2f} p90/p10 {m['honest_p90_over_p10']:4.2f} | "
            f"agreement {m['agreement_mean']:.3f} (worst window {m['agreement_worst_window']:.3f}) | vtrust min "
            f"{m['vtrust_min']:.3f} | newcomer at median {hours(m['newcomer_honest_median_windows']):.2f} h | cheats "
            f"{sum(m['share'][c] for c in CHEATS):.4f} | moredata/honest {m['moredata_over_honest']:.2f}")


def main() -> int:
    for label, cfg in windows_plan():
        print(windows_line(label, simulate(cfg).metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
