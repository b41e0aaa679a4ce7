"""Adversarial miners for the localnet and the tests: each changes exactly one behaviour of the
honest miner through one hook of `templar.miner.hooks.MinerHooks`.

They exist to show that the incentive pays honest work and nothing else; each is caught by a
named check (docs/scoring.md). They are not part of the production miner: the localnet starts
them through `python -m templar.localnet.adversary`, never through `neurons/miner.py`.
`moredata` is no adversary at all: it is the production miner's own `--extra-pages`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import torch

from templar.comms.keys import gradient_key
from templar.core.log import context, short
from templar.miner.hooks import MinerHooks
from templar.runtime.outer import payload_reader
from templar.storage import StorageError
from templar.wire import PayloadError, write_gradient

if TYPE_CHECKING:
    from templar.miner.loop import Miner


class Lazy(MinerHooks):
    """Trains on random pages instead of its assigned ones."""

    name = "lazy"

    def pages(self, miner: Miner, window: int, pages: list[int]) -> list[int]:
        return miner.node.plan.random_pages(window, len(pages), salt=5000 + miner.node.uid)


class Scaled(MinerHooks):
    """Honest work, shouted: values ×1e4 (normalisation must make it harmless)."""

    name = "scaled"

    def transform(self, miner, window, values):
        return {k: v * 1e4 for k, v in values.items()}


class SignFlip(MinerHooks):
    """Sends the negated update: pushes the model uphill."""

    name = "signflip"

    def transform(self, miner, window, values):
        return {k: -v for k, v in values.items()}


def _noise(values: dict[str, torch.Tensor], window: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(window)
    return {k: torch.randn(v.shape, generator=g) * v.abs().mean().clamp_min(1e-8) for k, v in values.items()}


class Noise(MinerHooks):
    """Sends random values with the right shapes."""

    name = "noise"

    def transform(self, miner, window, values):
        return _noise(values, window)


class FreeRider(MinerHooks):
    """Zero update for a while, random afterwards: no training at all."""

    name = "freerider"

    def transform(self, miner, window, values):
        if window % 4 < 2:
            return {k: torch.zeros_like(v) for k, v in values.items()}
        return _noise(values, window)


class Late(MinerHooks):
    """Honest work uploaded after the put window closes."""

    name = "late"

    async def before_upload(self, miner, window, payload):
        # well past the 2 s clock-skew allowance of every gather
        await asyncio.sleep(miner.hp.windows.put_window_seconds + 4.0)
        return payload


class StepPump(MinerHooks):
    """Honest work, signed with a global_step `max_allowed_stale` ahead: if any node adopted
    peers' claims, an aggregated pumper would fast-forward everyone's learning-rate schedule."""

    name = "steppump"

    async def before_upload(self, miner, window, payload):
        node, hp = miner.node, miner.hp
        g = payload_reader(node.shapes, hp, window, node.run)(node.hotkey, payload)
        return write_gradient(g.tensors, g.probes, window=window, hotkey=node.hotkey, hp=hp, run=node.run,
                              sign=node.chain.sign,
                              global_step=g.global_step + hp.windows.max_allowed_stale, warmup=g.warmup)


class Desync(MinerHooks):
    """Applies the first two aggregates, then stops: trains on an ever staler model (its step
    count still moves with the swarm)."""

    name = "desync"
    checks_sync = False  # it forks on purpose: the honest self-check would re-sync it every other window

    def __init__(self) -> None:
        self._frozen: dict[str, torch.Tensor] | None = None

    def after_step(self, miner, window):
        params = dict(miner.node.model.named_parameters())
        if window - miner.start_window < 2 or self._frozen is None:
            self._frozen = {n: p.detach().clone() for n, p in params.items()}
            return
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(self._frozen[name])


class Copycat(MinerHooks):
    """Re-posts another miner's gradient of the same window under its own hotkey.

    `target`: the hotkey to copy (the `duplicate` pair: two hotkeys of one operator posting one
    payload at the same moment); None copies whichever miner uploads first."""

    name = "copycat"

    def __init__(self, target: str | None = None, delay: float | None = None) -> None:
        self.target = target
        self.delay = delay

    async def before_upload(self, miner, window, payload):
        put_window = miner.hp.windows.put_window_seconds
        await asyncio.sleep(min(2.0, put_window / 3) if self.delay is None else self.delay)
        copied = await self._copy(miner, window, miner.node.clock.times(window).put_close)
        return copied or payload

    async def _copy(self, miner: Miner, window: int, until: float) -> bytes | None:
        node, hp = miner.node, miner.hp
        log = context(window=window, phase="copy")
        validators = {n.hotkey for n in await node.neurons() if n.validator_permit}
        buckets = await node.peer_buckets([self.target] if self.target else None)
        candidates = [hk for hk in sorted(buckets) if hk != node.hotkey and hk not in validators]
        read = payload_reader(node.shapes, hp, window, node.run)
        while node.clock.now() < until - 1.0:
            for hotkey in candidates:
                try:
                    data = await buckets[hotkey].get(gradient_key(window), max_bytes=miner.max_bytes, timeout=2.0)
                    g = read(hotkey, data)
                except (StorageError, PayloadError):
                    continue
                log.info(f"re-posting {short(hotkey)}'s gradient")
                return write_gradient(g.tensors, g.probes, window=window, global_step=g.global_step,
                                      hotkey=node.hotkey, hp=hp, run=node.run, sign=node.chain.sign,
                                      warmup=g.warmup)
            await asyncio.sleep(0.3)
        return None


class Duplicate(Copycat):
    """Two hotkeys of one operator posting one payload: re-posts its twin's at the same moment,
    hoping to be paid twice."""

    name = "duplicate"

    def __init__(self, target: str | None = None) -> None:
        super().__init__(target, delay=0.0)


ADVERSARIES: dict[str, type[MinerHooks]] = {
    "lazy": Lazy, "scaled": Scaled, "signflip": SignFlip, "noise": Noise, "freerider": FreeRider,
    "late": Late, "desync": Desync, "copycat": Copycat, "duplicate": Duplicate, "steppump": StepPump,
}
"""Every adversary by name. `duplicate` is started by the localnet as an honest twin plus this
copier; `moredata` (the localnet's extra-work miner) is the production miner with `--extra-pages`."""

LOCALNET_BEHAVIOURS = frozenset({*ADVERSARIES, "moredata"})
"""What `templar localnet --adversary NAME` accepts."""


def make_adversary(name: str, *, target: str | None = None) -> MinerHooks:
    """The hooks of adversary `name` (`target`: the hotkey a copier copies)."""
    if name not in ADVERSARIES:
        raise ValueError(f"unknown adversary {name!r}; choose from {', '.join(sorted(ADVERSARIES))}")
    cls = ADVERSARIES[name]
    return cls(target) if issubclass(cls, Copycat) else cls()
