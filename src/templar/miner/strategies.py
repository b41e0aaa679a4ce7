"""Miner strategies: the honest miner and adversaries that change exactly one behaviour.

The localnet runs these against real validators to show that the incentive pays honest work
and nothing else. Each strategy overrides one hook of `Strategy`; the miner calls every hook.
Adversaries exist to test the subnet; they are not a recipe, and each one is caught by a named
check (see docs/scoring.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from templar.data import PagePlan


@dataclass(frozen=True)
class Strategy:
    """The honest miner. Subclasses change one hook."""

    name: str = "honest"
    extra_pages: int = 0

    def pages(self, plan: PagePlan, uid: int, window: int, n: int) -> list[int]:
        """Pages to train on: the assigned ones, plus optional extra work."""
        pages = plan.assigned_pages(uid, window, n)
        if self.extra_pages:
            pages += plan.random_pages(window, self.extra_pages, salt=1000 + uid, exclude=pages)
        return pages

    def transform(self, values: dict[str, torch.Tensor], window: int) -> dict[str, torch.Tensor]:
        """Rewrite the top-k values before they are encoded (honest: unchanged)."""
        return values

    copies: bool = False
    """Re-post another hotkey's payload of the same window instead of our own (re-signed)."""

    def upload_delay(self, put_window_seconds: float) -> float:
        """Seconds after the put window opens before uploading (honest: at once)."""
        return 0.0

    def applies_aggregate(self, window: int, start_window: int) -> bool:
        """Whether to apply the window's aggregate (honest: always)."""
        return True


class MoreData(Strategy):
    """Honest, with twice the pages: should earn more (the paper's Figure 2)."""


class Lazy(Strategy):
    """Trains on random pages instead of its assigned ones."""

    def pages(self, plan: PagePlan, uid: int, window: int, n: int) -> list[int]:
        return plan.random_pages(window, n, salt=5000 + uid)


class Scaled(Strategy):
    """Honest work, shouted: values ×1e4 (normalisation must make it harmless)."""

    def transform(self, values, window):
        return {k: v * 1e4 for k, v in values.items()}


class SignFlip(Strategy):
    """Sends the negated update: pushes the model uphill."""

    def transform(self, values, window):
        return {k: -v for k, v in values.items()}


class Noise(Strategy):
    """Sends random values with the right shapes."""

    def transform(self, values, window):
        g = torch.Generator().manual_seed(window)
        return {k: torch.randn(v.shape, generator=g) * v.abs().mean().clamp_min(1e-8) for k, v in values.items()}


class FreeRider(Strategy):
    """Zero update for a while, random afterwards: no training at all."""

    def transform(self, values, window):
        if window % 4 < 2:
            return {k: torch.zeros_like(v) for k, v in values.items()}
        return Noise.transform(self, values, window)


class Late(Strategy):
    """Honest work uploaded after the put window closes."""

    def upload_delay(self, put_window_seconds: float) -> float:
        return put_window_seconds + 4.0  # well past the 2 s clock-skew allowance of every gather


class Desync(Strategy):
    """Applies the first two aggregates, then stops: trains on an ever staler model."""

    def applies_aggregate(self, window: int, start_window: int) -> bool:
        return window - start_window < 2


@dataclass(frozen=True)
class Copycat(Strategy):
    """Re-posts another miner's gradient of the same window under its own hotkey."""

    copies: bool = True

    def upload_delay(self, put_window_seconds: float) -> float:
        return min(2.0, put_window_seconds / 3)


@dataclass(frozen=True)
class Duplicate(Strategy):
    """Two hotkeys of one operator posting one payload: this one re-posts its twin's
    (`--copy.hotkey`) at the same moment, hoping to be paid twice."""

    copies: bool = True


STRATEGIES: dict[str, type[Strategy]] = {
    "honest": Strategy, "moredata": MoreData, "lazy": Lazy, "scaled": Scaled, "signflip": SignFlip,
    "noise": Noise, "freerider": FreeRider, "late": Late, "desync": Desync, "copycat": Copycat,
    "duplicate": Duplicate,
}
"""`duplicate` pairs are started by the localnet as an honest twin plus this copier."""


def make_strategy(name: str, pages_per_window: int, extra_pages: int = 0) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown miner strategy {name!r}; choose from {', '.join(sorted(STRATEGIES))}")
    if name == "moredata":
        extra_pages = max(extra_pages, pages_per_window)
    return STRATEGIES[name](name=name, extra_pages=extra_pages)
