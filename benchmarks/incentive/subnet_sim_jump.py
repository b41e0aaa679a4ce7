"""The "jump" scenario of `subnet_sim.py`: freak evaluations in a localnet-sized subnet.

    nice -n 19 python -m benchmarks.incentive.subnet_sim_jump      # 18 simulations, about 6 s

The 256-uid simulator's calm draws never let one evaluation push a peer across one validator's
tie band before the others'; a small subnet with rare freak evaluations does (benchmarks/LOG.md §5).
Each line compares the relative LossRating before (one relative LossScore clipped at 4, no cap)
and after (production: clipped at 2, `rating_cap` 2), on the same draws.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from benchmarks.incentive.subnet_sim import CHEATS, CHOSEN, SimConfig, simulate

JUMP_SEEDS = (0, 1, 2)


def jump_plan() -> list[tuple[str, SimConfig]]:
    """The "jump" scenario: a localnet-sized subnet (3 validators at stake 1000/500/333, 10 miners, each
    evaluated nearly every window) where 2 % of the evaluations are freaks at 3.66× (benchmarks/LOG.md
    §3 and §5), so one evaluation can push a peer out of one validator's band before the others'. Also
    the same without freaks (calm) and with the late localnet's noise (σ̂ about twice the fitted one).
    Before: the clip at 4 and no cap; after: production (clip 2, cap 2)."""
    small = replace(SimConfig(), uids=13, validators=3, per_class=1, fast_eval_uids=16, uids_per_window=10,
                    windows=60, join_window=20, freak_rate=0.02, **CHOSEN)
    jobs = []
    for name, variant in (("freaks", {}), ("calm", {"freak_rate": 0.0}), ("freaks, noise x2", {"noise": 2.0})):
        for seed in JUMP_SEEDS:
            cfg = replace(small, seed=seed, **variant)
            jobs += [(f"{name}, before, seed={seed}", replace(cfg, rating_cap=None, rating_clip_high=4.0)),
                     (f"{name}, after, seed={seed}", cfg)]
    return jobs


def jump_line(label: str, m: dict) -> str:
    return (f"  {label:<40} agreement worst window {m['agreement_worst_window']:.3f} mean "
            f"{m['agreement_mean']:.3f} | vtrust worst window {m['vtrust_worst_window']:.3f} | honest max/min "
            f"{m['honest_max_over_min']:.2f} | moredata/honest {m['moredata_over_honest']:.2f} | cheats "
            f"{sum(m['share'][c] for c in CHEATS):.4f}")


def main() -> int:
    for label, cfg in jump_plan():
        print(jump_line(label, simulate(cfg).metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
