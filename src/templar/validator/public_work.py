"""Earlier windows' public work that a validator keeps for the borrowed-work check
(docs/scoring.md §8).

Every upload a window aggregated (the peers in effect whose payloads arrived valid) stays readable
in its miner's bucket, and their mean is the window's update: anyone can re-post either in a later
window, committed in time, since it existed before that window began. The validator already holds
those payloads after its gather, so it keeps the last `public_windows` windows' of them in memory
(at most the peer list's size per window: the payloads themselves, because the next window samples
them with its own private salt) and hands them to fast evaluation. A restarted validator keeps
none, and judges borrowed work again from the window after its first.
"""

from __future__ import annotations

from collections.abc import Iterable

from templar.wire import Gradient


class PublicWork:
    """The aggregated payloads of the last `windows` windows, by window and hotkey (`windows`: the
    rules' `gauntlet.public_windows`, 2 in production: copying the aggregate two windows old is as
    free as copying last window's, and honest uploads stay as far from both, §8)."""

    def __init__(self, windows: int, max_per_window: int = 256) -> None:
        self.windows = windows
        self.max_per_window = max_per_window
        self._kept: dict[int, dict[str, Gradient]] = {}

    def remember(self, window: int, payloads: Iterable[Gradient]) -> None:
        """Keep `window`'s aggregated payloads (warm-up ones are no work: left out), dropping
        windows older than the last `windows`."""
        kept = {}
        for g in payloads:
            if not g.warmup and len(kept) < self.max_per_window:
                kept[g.hotkey] = g
        self._kept[window] = kept
        for old in [w for w in self._kept if w <= window - self.windows]:
            del self._kept[old]

    def before(self, window: int) -> dict[int, dict[str, Gradient]]:
        """What was public before `window`: the kept windows w - `windows` … w - 1."""
        return {w: dict(p) for w, p in self._kept.items() if window - self.windows <= w < window and p}
