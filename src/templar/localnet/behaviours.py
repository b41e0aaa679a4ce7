"""What a localnet miner can be told to do, by name: the table the localnet plans its roster from.

The behaviours themselves (`templar.localnet.adversaries`) are miner hooks and load torch, the
model code and the miner. The process that supervises a real-process localnet only names them on
command lines, so it plans from this table and stays a small process beside the neurons it starts
(no torch: 1.4 s of CPU and 140 MB at most over a 2-window run, against 2.4 s and 324 MB when it loaded
the hooks). `tests/localnet/test_behaviours.py` checks that this table and the hooks name the same
adversaries.
"""

from __future__ import annotations

from templar.core.config import DataConfig

ADVERSARY_NAMES = frozenset({
    "lazy", "scaled", "loud", "signflip", "noise", "freerider", "late", "desync", "copycat", "duplicate", "steppump",
    "partial", "pooled", "thin", "replay", "flood", "faint", "overfit", "short", "overclaim",
})
"""Every adversary the adversary entry point (`python -m templar.localnet.adversary`) runs."""

POOL_SIZE = 3
"""Hotkeys in each `pooled` group the localnet starts."""
FLOOD_SIZE = 6
"""Hotkeys in each `flood` group the localnet starts."""
FAINT_SIZE = 4
"""Hotkeys in each `faint` group the localnet starts (near-zero uploads, no work)."""
GROUP_SIZES = {"pooled": POOL_SIZE, "flood": FLOOD_SIZE, "faint": FAINT_SIZE}
"""The adversaries the localnet starts as one operator's group of hotkeys, and each group's size."""

LOCALNET_BEHAVIOURS = frozenset({*ADVERSARY_NAMES, "moredata"})
"""What `templar localnet --adversary NAME` accepts: every adversary, and `moredata`, the production
miner with `--extra-pages` (honest work on twice the pages)."""


def declared_extra_pages(strategy: str, data: DataConfig) -> int:
    """The pages a localnet miner of `strategy` declares beyond its assigned ones: twice the work for
    `moredata` (the production miner's `--extra-pages`), the run's most for `overclaim`, else none."""
    return {"moredata": data.pages_per_window, "overclaim": data.max_extra_pages}.get(strategy, 0)
