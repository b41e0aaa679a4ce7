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
from templar.compress import Compressed
from templar.compress.methods import rule_of
from templar.core.log import context, short
from templar.miner.hooks import MinerHooks
from templar.runtime.consensus.outer import payload_reader
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


class Loud(MinerHooks):
    """Honest work, a little louder: values ×3, far below the `scale` check (1000×). Under a rule that
    applies magnitudes, a trial step of the payload as sent gains three times an honest one's; trial
    steps are held to the window's typical size, and where there is none yet (a run's first windows)
    no δ_rand rates above S_t's median, so a louder upload is paid as the honest work it carries
    (docs/scoring.md §3). Several (`--adversary loud:3`) are a group that, holding most of the peer
    list, once set the aggregate's typical size to its own: S_t's median holds its trial steps too."""

    name = "loud"

    def transform(self, miner, window, values):
        return {k: v * 3.0 for k, v in values.items()}


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
    peers' claims, an aggregated pumper would fast-forward everyone's learning-rate schedule. It
    commits to the pumped payload (a claim swapped in after the commitment is `uncommitted`)."""

    name = "steppump"

    async def before_commit(self, miner, window, payload):
        node, hp = miner.node, miner.hp
        g = payload_reader(node.shapes, hp, window, node.run)(node.hotkey, payload)
        return write_gradient(g.tensors, g.probes, window=window, hotkey=node.hotkey, hp=hp, run=node.run,
                              sign=node.chain.sign,
                              global_step=g.global_step + hp.windows.max_allowed_stale, warmup=g.warmup)


class Replay(MinerHooks):
    """Re-posts its own upload of `lag` windows ago as this window's: the same gradient tensors,
    re-signed with this window, the current global_step and fresh probes of its current model (so
    the step and sync checks pass), and committed to before the deadline, hoping to be paid again
    for old work. It trains as usual; what it trains is only sent `lag` windows later."""

    name = "replay"
    lag = 2

    def __init__(self) -> None:
        self.sent: dict[int, bytes] = {}

    async def before_commit(self, miner, window, payload):
        node, hp = miner.node, miner.hp
        for old in [w for w in self.sent if w < window - self.lag]:
            del self.sent[old]
        earlier = self.sent.get(window - self.lag)
        if earlier is not None:
            own = payload_reader(node.shapes, hp, window, node.run)(node.hotkey, payload)
            then = payload_reader(node.shapes, hp, window - self.lag, node.run)(node.hotkey, earlier)
            context(window=window, phase="replay").info(f"re-posting our upload of window {window - self.lag}")
            payload = write_gradient(then.tensors, own.probes, window=window, hotkey=node.hotkey, hp=hp, run=node.run,
                                     sign=node.chain.sign, global_step=own.global_step, warmup=own.warmup)
        self.sent[window] = payload  # what it sends (and commits to), not what it trained
        return payload


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
        miners = await node.miners()
        buckets = await node.peer_buckets([self.target] if self.target else None)
        candidates = [hk for hk in sorted(buckets) if hk in miners]
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


def _dense(c: Compressed) -> torch.Tensor:
    """A payload's coefficients at their positions, [n_chunks, chunk_numel], L2-normalised."""
    dense = torch.zeros(c.indices.shape[0], c.plan.chunk_numel, dtype=torch.float32)
    dense.scatter_(1, c.indices.cpu(), c.values.float().cpu())
    return dense / torch.linalg.vector_norm(dense).clamp_min(1e-12)


def _top_k(dense: torch.Tensor, like: Compressed) -> Compressed:
    """The `k` largest |coefficients| of each chunk of `dense`, indices ascending (as the wire wants)."""
    idx = dense.abs().topk(like.k, dim=1).indices.sort(dim=1).values
    return Compressed(indices=idx, values=dense.gather(1, idx), shape=like.shape, chunk=like.chunk)


class Partial(MinerHooks):
    """Trains on 1 of its assigned pages and fills the rest of its update with a mix of the other
    miners' same-window updates (read as they land in the put window), hoping to be paid for
    work it borrowed. Before the rules of docs/scoring.md §4 and §8 it out-earned every honest miner
    while the LossScore averaged the assigned pages and nothing bound a payload to work done before
    the window's payloads were readable."""

    name = "partial"
    own_share = 0.5
    """The own update's share of the mix (its 1 page of 2); the rest is the others' mean."""

    def pages(self, miner, window, pages):
        return pages[:1]

    async def before_upload(self, miner, window, payload):
        node, hp = miner.node, miner.hp
        await asyncio.sleep(min(2.0, hp.windows.put_window_seconds / 3))
        read = payload_reader(node.shapes, hp, window, node.run)
        own = read(node.hotkey, payload)
        miners = await node.miners()
        buckets = await node.peer_buckets()
        others = []
        for hotkey in sorted(buckets):
            if hotkey not in miners:
                continue
            try:
                data = await buckets[hotkey].get(gradient_key(window), max_bytes=miner.max_bytes, timeout=2.0)
                others.append(read(hotkey, data))
            except (StorageError, PayloadError):
                continue
        if not others:
            return payload
        mixed = {}
        for name, c in own.tensors.items():
            borrowed = sum(_dense(o.tensors[name]) for o in others) / len(others)
            mix = _top_k(self.own_share * _dense(c) + (1 - self.own_share) * borrowed, c)
            scale = float(torch.linalg.vector_norm(c.values.float())) / max(
                float(torch.linalg.vector_norm(mix.values)), 1e-12)  # its own loudness: no `scale` verdict
            wire = rule_of(hp.optimizer.method).wire_values  # what the run's codec can carry
            mixed[name] = Compressed(mix.indices, wire(mix.values * scale), mix.shape, mix.chunk)
        context(window=window, phase="partial").info(f"mixing in {len(others)} peers' updates")
        return write_gradient(mixed, own.probes, window=window, hotkey=node.hotkey, hp=hp, run=node.run,
                              sign=node.chain.sign, global_step=own.global_step, warmup=own.warmup)


class Thin(MinerHooks):
    """Trains on 1 of every 4 sequences of each assigned page and uploads the result as its whole
    window: a quarter of the compute, hoping the proof of computation (is the assigned page's loss
    lower than a random page's?) and a rating that forgave the gap to the median pay it like an
    honest miner. It did, before the credit followed the size of the gap (docs/scoring.md §4)."""

    name = "thin"
    keep_every = 4

    def batch(self, miner, window, batch):
        return batch[:: self.keep_every]


class Short(MinerHooks):
    """Trains on the first quarter of every assigned sequence's tokens: a quarter of the compute,
    spread so that every sequence shows a gap. Clipping whole sequences (against `thin`) paid it
    1.45× an honest miner per unit of compute; the proof now measures each quarter of a sequence's
    positions on its own (docs/scoring.md §4)."""

    name = "short"
    keep = 4

    def batch(self, miner, window, batch):
        return batch[:, : max(2, batch.size(1) // self.keep)].contiguous()


class Overfit(MinerHooks):
    """Honest pages, honest compute, a hotter inner learning rate (× `factor`): fits its assigned
    sequences harder than the run's rate does, hoping every one of them clears the typical gap and
    earns the proof's full credit, whatever the update does to the held-out loss."""

    name = "overfit"
    factor = 4.0

    def learning_rate(self, miner, window, lr):
        return lr * self.factor


class Pooled(MinerHooks):
    """One operator, several hotkeys (`uids`): each trains on the union of all members' assigned
    pages (the same batch from the same model and the same error feedback, so the same update a
    single GPU would compute once) and posts it with its own per-coefficient noise, hoping each
    member is paid like a peer with the whole group's data. The operator's sharing of pages happens
    here, on the localnet's side: the production miner knows nothing of it."""

    name = "pooled"
    noise = 0.33
    """Relative per-coefficient noise: pairs of members land at cosine about 1/(1 + 0.33²) = 0.9."""

    def __init__(self, uids: list[int] | None = None) -> None:
        self.uids = sorted(uids or [])

    def pages(self, miner, window, pages):
        n = miner.hp.data.pages_per_window
        members = self.uids or [miner.node.uid]
        return [p for uid in members for p in miner.node.plan.assigned_pages(uid, window, n)]

    def transform(self, miner, window, values):
        g = torch.Generator().manual_seed(window * 1_000_003 + miner.node.uid)
        return {k: v * (1 + self.noise * torch.randn(v.shape, generator=g)) for k, v in values.items()}


class Flood(Pooled):
    """One operator, many hotkeys (`behaviours.FLOOD_SIZE`), one piece of work: a `pooled` group large enough
    to hold most of a window's uploads, each member posting the same update with a little noise.
    Judged against its own window's typical pair, such a group *is* the typical pair and would
    hide itself; the pool check's baseline (docs/scoring.md §8) does not move with it."""

    name = "flood"
    noise = 0.1


class Faint(MinerHooks):
    """One operator, several hotkeys (`behaviours.FAINT_SIZE`), no work: each posts random values a
    millionth of an update's size, on its own positions. Nothing in such an upload is wrong (it is in
    sync, committed, no copy, no pool), and it costs nothing. Counted in a window's typical payload
    norm, enough of them would make every honest upload look shouted (`scale`) and shrink every trial
    step to rounding noise; the norm that judges a window is its aggregate's, whose peers the run
    chose by their work (docs/scoring.md §2, the scale check)."""

    name = "faint"
    size = 1e-6
    """The values' size as a share of the mean magnitude of the update's own top-k values."""

    def transform(self, miner, window, values):
        g = torch.Generator().manual_seed(window * 1_000_003 + miner.node.uid)
        return {k: torch.randn(v.shape, generator=g) * v.abs().mean().clamp_min(1e-8) * self.size
                for k, v in values.items()}


class Overclaim(MinerHooks):
    """Declares the run's most extra pages (`--extra-pages`, `data.max_extra_pages`) and trains only
    its assigned ones: hoping to be paid for the declared work on the strength of its assigned work's
    proof. Validators draw the proof across assigned and declared pages alike, and credit each class
    on its own (docs/scoring.md §4, "Extra pages")."""

    name = "overclaim"

    def pages(self, miner, window, pages):
        return pages[: miner.hp.data.pages_per_window]  # the assigned ones come first


ADVERSARIES: dict[str, type[MinerHooks]] = {cls.name: cls for cls in (
    Lazy, Scaled, Loud, SignFlip, Noise, FreeRider, Late, Desync, Copycat, Duplicate, StepPump, Partial, Pooled, Thin,
    Replay, Flood, Faint, Overfit, Short, Overclaim,
)}
"""Every adversary by name (`templar.localnet.behaviours.ADVERSARY_NAMES`, the roster's table, names the
same). `duplicate` is started by the localnet as an honest twin plus this copier, `pooled`, `flood` and
`faint` as groups of hotkeys (`behaviours.GROUP_SIZES`); `moredata` (the localnet's extra-work miner) is the production
miner with `--extra-pages`."""


def make_adversary(name: str, *, target: str | None = None, pool: list[int] | None = None) -> MinerHooks:
    """The hooks of adversary `name` (`target`: the hotkey a copier copies; `pool`: the uids of a
    `pooled` group, this miner's included)."""
    if name not in ADVERSARIES:
        raise ValueError(f"unknown adversary {name!r}; choose from {', '.join(sorted(ADVERSARIES))}")
    cls = ADVERSARIES[name]
    if issubclass(cls, Copycat):
        return cls(target)
    if issubclass(cls, Pooled):
        return cls(pool)
    return cls()
