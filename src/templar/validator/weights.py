"""Setting weights until the chain takes them, and saying so: every refusal named once, retried.

A validator's weights reach the chain only if the chain accepts the extrinsic, and the chain has
many ways to say no. Each has a different cure, so each is a typed refusal from `templar.chain`
(`Refused.reason`) and its own line of what the node does next:

| refusal (reason)                       | what it means                                    | next                     |
|----------------------------------------|--------------------------------------------------|--------------------------|
| rate limit (`rate_limited`)            | our last weights are fewer blocks old than the    | wait the blocks the chain|
|                                        | subnet's `WeightsSetRateLimit`                    | names (or we compute)    |
| "Priority is too low" (`priority_too_low`) | an extrinsic of ours with the same nonce is   | back off 1, 2, 4… blocks |
|                                        | still in the node's pool; nothing landed          |                          |
| commit-reveal (`commit_reveal`)        | a commit of ours still waits for its reveal, or   | back off                 |
|                                        | the subnet's setting changed under the SDK        |                          |
| not enough stake (`stake`)             | below the stake floor, or no validator permit     | back off; stake more     |
| stale metagraph (`stale_metagraph`)    | uids changed since our read                       | re-read, resolve again   |
| unreachable or unknown (`error`)       | no answer, or an error we do not classify         | back off                 |

Weights are kept by hotkey and resolved to uids at each attempt (a retry re-reads the metagraph),
so a neuron replaced between two attempts never receives another's weight. A round of attempts
ends when the chain accepts, when the next weights window brings fresh weights (its deadline), or
when the hotkey is no longer registered. The first attempt runs in the window that computed the
weights; the retries run in the background, so a refusal never delays a window.

Each refusal is logged once per round (later ones at debug), and every attempt is a `WeightsRecord`
in `weights.jsonl`, which the dashboard shows and `/metrics` counts (`templar_weights_refusals`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from templar.chain import ChainError, NotRegistered, RateLimited
from templar.chain.types import Refused, next_epoch_block
from templar.core.log import context
from templar.runtime.node import Node
from templar.runtime.records import WEIGHTS_FILE, WeightsRecord, append_record

FIRST_BACKOFF_BLOCKS = {"priority_too_low": 1, "commit_reveal": 2, "stake": 4, "stale_metagraph": 1, "error": 1}
"""Blocks before the second attempt, by refusal; each later attempt doubles it (up to `max_delay`)."""

NEXT_STEP = {
    "rate_limited": "waiting out the subnet's weights rate limit",
    "priority_too_low": "an earlier extrinsic of this hotkey is still in the transaction pool; backing off",
    "commit_reveal": "a weights commit is still waiting for its reveal; backing off",
    "stake": "stake more on this hotkey (btcli stake add) to set weights; backing off",
    "stale_metagraph": "re-reading the metagraph and resolving hotkeys to uids again",
    "error": "backing off",
}


SUBMIT_LAG_WINDOWS = 2
"""A window's weights are computed after its gather and evaluation, so they reach the chain during the
next window: they surely count in an epoch whose block lies at least two windows on."""


@dataclass(frozen=True)
class WeightsCadence:
    """When a validator submits its weights: every `every` windows (`windows_per_weights`, which the
    subnet's rate limit bounds), counted back from each Yuma epoch.

    An epoch reads the weights each validator last submitted, so what the chain pays until the next
    epoch is the book as it stood at that submission. Counted from window 0 (the rule before), the
    submission an epoch reads was up to `every` windows old when the epoch ran: a newcomer evaluated
    in those windows, or a copycat caught in them, waited a whole tempo more. Counted back from the
    epoch, the last submission before it carries the book of `SUBMIT_LAG_WINDOWS` windows earlier.
    The submissions in between stay `every` windows apart, and the first after an epoch is at least
    `every` windows after the last before it, so the rate limit is met as before. Without a tempo
    (0: the chain runs no epochs) or with epochs closer than `every` windows there is nothing to aim
    at, and weights go every `every` windows from window 0.

    Only the timing of a submission changes, never the weights: this is no consensus rule.
    """

    every: int
    blocks_per_window: int
    netuid: int
    tempo: int

    def due(self, window: int) -> bool:
        """Whether the weights computed in `window` are submitted."""
        bounds = self._aim(window)
        if bounds is None:
            return window % self.every == 0
        last, previous = bounds  # last − previous ≥ every: epochs are at least `every` windows apart (`_aim`)
        return (last - window) % self.every == 0 and window - previous >= self.every

    def next_due(self, window: int) -> int:
        """The first window after `window` whose weights are submitted (a retry's deadline)."""
        horizon = window + self.every + (self.tempo + 1) // max(1, self.blocks_per_window) + SUBMIT_LAG_WINDOWS + 1
        return next((w for w in range(window + 1, horizon + 1) if self.due(w)), window + self.every)

    def _aim(self, window: int) -> tuple[int, int] | None:
        """(the last window whose weights reach the first epoch they can, the same window of the epoch
        before), or None when there is no epoch to aim at."""
        per_window = max(1, self.blocks_per_window)
        if self.tempo <= 0 or self.tempo + 1 < self.every * per_window:
            return None
        epoch = next_epoch_block((window + SUBMIT_LAG_WINDOWS) * per_window, self.netuid, self.tempo)
        assert epoch is not None
        last = epoch // per_window - SUBMIT_LAG_WINDOWS
        previous = (epoch - self.tempo - 1) // per_window - SUBMIT_LAG_WINDOWS
        return last, previous


def refusal_reason(exc: ChainError) -> str:
    """The stable code of a refusal (`Refused.reason`), or "error" for anything else the chain says."""
    return exc.reason if isinstance(exc, Refused) else "error"


@dataclass
class _Round:
    """One weights window's weights and the attempts to set them."""

    window: int
    weights: dict[str, float]
    deadline: float
    uids: dict[str, int]
    attempts: int = 0
    landed: bool = False
    told: set[str] = field(default_factory=set)
    delays: dict[str, int] = field(default_factory=dict)


class WeightSetter:
    """Sets a validator's weights on chain and keeps trying, within limits, until they land."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.task: asyncio.Task | None = None
        self.last_set_window: int | None = None
        self._ended_by = ""
        self._tempo: int | None = None
        """The subnet's tempo as last read (`cadence`); None until a read succeeds."""
        self._tempo_window: int | None = None
        """The window of that read."""
        self._tempo_told = False

    async def cadence(self, window: int | None = None) -> WeightsCadence:
        """When weights are due (`WeightsCadence`), from the subnet's tempo: read from the chain at the
        first call and again once every `windows_per_weights` windows (`window`: the caller's), since the
        subnet's owner may change it. A failed read keeps the tempo read before; with none yet, weights go
        every `windows_per_weights` windows from window 0, as with no epochs, and the next call asks again."""
        windows = self.node.hp.windows
        every = windows.windows_per_weights
        if self._tempo is None or (window is not None and (self._tempo_window is None
                                                           or window - self._tempo_window >= every)):
            try:
                self._tempo = (await asyncio.to_thread(self.node.chain.weights_settings)).tempo
                self._tempo_window = window
            except ChainError as exc:
                if not self._tempo_told:
                    self._tempo_told = True
                    context(phase="weights").warning(f"could not read the subnet's tempo ({exc}); "
                                                     + ("keeping the last one read" if self._tempo is not None
                                                        else "weights go every windows_per_weights windows "
                                                        "until it is read"))
        return WeightsCadence(every=every, blocks_per_window=windows.blocks_per_window,
                              netuid=self.node.chain.netuid, tempo=self._tempo or 0)

    async def due(self, window: int) -> bool:
        """Whether the weights computed in `window` are submitted (`WeightsCadence.due`)."""
        return (await self.cadence(window)).due(window)

    # -- the validator's side -----------------------------------------------------------------

    async def submit(self, window: int, weights: dict[str, float], uids: dict[str, int]) -> bool:
        """Set `weights` (by hotkey) computed in weights window `window`; `uids` is the hotkey → uid
        map the window read. True when the first attempt landed; on a refusal that can pass, the
        retries go on in the background until the next weights window (and a newer `submit` replaces
        them)."""
        await self._supersede(window)
        positive = {hk: w for hk, w in weights.items() if w > 0 and hk in uids}
        log = context(window=window, phase="weights")
        if not positive:
            log.info("no positive weights yet; not setting weights")
            return False
        if self.node.shadow:  # the one switch of shadow mode: everything up to here ran as usual
            current = _Round(window=window, weights=positive, deadline=0.0, uids=dict(uids))
            self._record(current, "shadow", "", await self._block(), "", "shadow mode: weights computed, not set",
                         uids=len(positive))
            top = sorted(positive.items(), key=lambda kv: -kv[1])[:3]
            log.info(f"shadow mode: weights for {len(positive)} uids computed, not set (top: "
                     + ", ".join(f"uid {uids[hk]} {w:.3f}" for hk, w in top) + ")")
            return False
        next_weights = (await self.cadence(window)).next_due(window)
        deadline = self.node.clock.times(next_weights).gather_start
        current = _Round(window=window, weights=positive, deadline=deadline, uids=dict(uids))
        delay = await self._attempt(current)
        if delay is None:
            return current.landed
        self.task = asyncio.create_task(self._retry(current, delay), name=f"weights-{window}")
        return False

    async def close(self) -> None:
        """Stop retrying (the validator is stopping): the chain keeps the weights it last accepted."""
        await self._supersede(None)

    # -- the rounds -----------------------------------------------------------------------------

    async def _supersede(self, window: int | None) -> None:
        """End the round still retrying: newer weights replace it (`window`), or the node stops (None)."""
        task, self.task = self.task, None
        if task is None or task.done():
            return
        self._ended_by = "replaced by newer weights" if window is not None else "the validator stopped"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if window is not None:
            context(window=window, phase="weights").info(
                "the previous round's weights never landed; this window's weights replace them")

    async def _retry(self, current: _Round, delay: float) -> None:
        node = self.node
        try:
            while delay is not None:
                wake = node.clock.now() + delay
                if wake >= current.deadline:
                    self._give_up(current, "the next weights window sets fresh weights")
                    return
                if not await node.clock.sleep_until(wake, node.stop):
                    return
                delay = await self._attempt(current, refresh=True)
        except asyncio.CancelledError:
            self._record(current, "superseded", "", -1, self._ended_by, "none for these weights")
            raise

    async def _attempt(self, current: _Round, *, refresh: bool = False) -> float | None:
        """One try (`refresh`: resolve hotkeys to uids against the chain as it is now, as every retry
        does). None when the round is over (set, or hopeless); else seconds until the next try."""
        node = self.node
        log = context(window=current.window, phase="weights")
        current.attempts += 1
        block = await self._block()
        try:
            if refresh:
                current.uids = {n.hotkey: n.uid for n in await node.neurons()}
            by_uid = {current.uids[hk]: w for hk, w in current.weights.items() if hk in current.uids}
            if not by_uid:
                self._give_up(current, "none of the weighted hotkeys is registered any more")
                return None
            await asyncio.to_thread(node.chain.set_weights, by_uid)
        except NotRegistered as exc:
            self._record(current, "gave_up", "not_registered", block, str(exc), "none: register the hotkey again")
            log.error(f"weights refused: this hotkey is not registered on the subnet ({exc}); not retrying")
            return None
        except ChainError as exc:
            reason = refusal_reason(exc)
            delay = await self._delay(current, reason, exc)
            retry_at = node.clock.now() + delay
            if retry_at >= current.deadline:
                self._record(current, "refused", reason, block, str(exc), "giving up: the next weights window "
                             "sets fresh weights")
                self._tell(current, reason, exc, "the next weights window sets fresh weights")
                self._give_up(current, "the next weights window sets fresh weights")
                return None
            step = f"{NEXT_STEP[reason]}; retrying in {delay:.0f}s (attempt {current.attempts + 1})"
            self._record(current, "refused", reason, block, str(exc), step)
            self._tell(current, reason, exc, step)
            return delay
        self.last_set_window, current.landed = current.window, True
        self._record(current, "set", "", block, "", "", uids=len(by_uid))
        tried = f" after {current.attempts} attempts" if current.attempts > 1 else ""
        log.info(f"set weights on chain for {len(by_uid)} uids{tried}")
        return None

    async def _delay(self, current: _Round, reason: str, exc: ChainError) -> float:
        """Seconds until the next attempt: the rate limit's own count, else doubling backoff."""
        try:
            block_time = await asyncio.to_thread(lambda: self.node.chain.block_time)
        except ChainError:
            block_time = self.node.hp.windows.block_time
        if reason == "rate_limited":
            blocks = exc.blocks_to_wait if isinstance(exc, RateLimited) else 0
            if blocks <= 0:
                blocks = await self._rate_limit_blocks()
            return (blocks + 1) * block_time
        blocks = current.delays.get(reason, FIRST_BACKOFF_BLOCKS[reason])
        current.delays[reason] = blocks * 2
        window = self.node.hp.windows
        max_delay = window.windows_per_weights * window.blocks_per_window * block_time / 4
        return min(blocks * block_time, max(block_time, max_delay))

    async def _rate_limit_blocks(self) -> int:
        """Blocks until our weights may be set again, from the subnet's limit and our last update
        (when the chain's refusal did not say)."""
        chain = self.node.chain
        try:
            settings = await asyncio.to_thread(chain.weights_settings)
            neurons = await self.node.neurons()
            head = await asyncio.to_thread(chain.block)
        except ChainError:
            return FIRST_BACKOFF_BLOCKS["error"]
        last = next((n.last_update for n in neurons if n.hotkey == chain.hotkey), 0)
        return max(1, settings.rate_limit - (head - last))

    async def _block(self) -> int:
        try:
            return int(await asyncio.to_thread(self.node.chain.block))
        except ChainError:
            return -1

    # -- telling the operator -----------------------------------------------------------------

    def _tell(self, current: _Round, reason: str, exc: ChainError, step: str) -> None:
        """One warning per refusal kind per round; repeats go to debug (the records keep them all)."""
        log = context(window=current.window, phase="weights")
        line = f"weights refused ({reason}): {str(exc)[:300]} | next: {step}"
        if reason in current.told:
            log.debug(line)
        else:
            current.told.add(reason)
            log.warning(line)

    def _give_up(self, current: _Round, why: str) -> None:
        context(window=current.window, phase="weights").warning(
            f"weights not set for window {current.window} after {current.attempts} attempts; {why}")
        self._record(current, "gave_up", "", -1, why, "waiting for the next weights window")

    def _record(self, current: _Round, outcome: str, reason: str, block: int, detail: str, step: str, *,
                uids: int | None = None) -> None:
        append_record(self.node.state_dir / WEIGHTS_FILE, WeightsRecord(
            window=current.window, attempt=current.attempts, outcome=outcome, reason=reason,
            uids=len(current.weights) if uids is None else uids, block=block,
            detail=" ".join(detail.split())[:200], next=step))
