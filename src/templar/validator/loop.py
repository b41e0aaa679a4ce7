"""The validator: every window, gather, fast-evaluate many, primary-evaluate a few, score, step.

`Validator.run` is the whole life of a validator; `run_window` is one window (Algorithm 1 of the
paper) as named phases:

    sync check → registry and peer list → gather → fast evaluation → primary evaluation
    → scoring (`templar.gauntlet.score_window`) → outer step → lead's publications
    → held-out loss → weights → checkpoint → records → save (the commit point)

Who leads a window is the succession's rule (`templar.runtime.consensus.succession`): a validator among the
first `lead_slots` of the order publishes the window's inputs in its own slot, once those before it
are confirmed absent (`Validator.candidate`). Then every validator takes the window's decision, and
the window runs in one `Role`: `LeadRole` when its own inputs are the ones that apply (it steps with
them and publishes the window's aggregate, progress, next peer list and checkpoint; under SparseLoCo
the aggregate, the payloads themselves, already went out with the inputs), `FollowerRole` otherwise
(it takes the lead's step and publishes nothing).

The scoring rule is `score_window`, shared with the subnet simulator; the commitment reader runs
beside the windows (`templar.validator.commits`); the records are `templar.validator.report`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from collections.abc import Mapping
from dataclasses import replace

from templar.comms import GatherResult, GatherStatus, RecordError, get_start_window, put_start_window
from templar.comms.keys import folder_of, inputs_key, start_window_key
from templar.compress.methods import rule_of
from templar.core.log import context
from templar.core.schedule import learning_rate
from templar.gauntlet import (
    FastVerdict,
    PrimaryResult,
    ScoreBook,
    declared_work,
    draw_window,
    eval_sequences_read,
    evaluated_pages,
    score_window,
    select_eval_sequences,
)
from templar.runtime.compute import PeerScorer
from templar.runtime.consensus.follow import FollowError, inputs_of, window_inputs
from templar.runtime.consensus.outer import OuterStep, gather_gradients
from templar.runtime.consensus.peers import aggregate_payloads, peers_in_effect
from templar.runtime.consensus.succession import POLL_SECONDS, decide_window, window_order
from templar.runtime.consensus.windows import WindowTimes
from templar.runtime.node import Node
from templar.runtime.records import drop_uncommitted_records
from templar.runtime.restore import Phase, ResyncError, published_start, restore, restore_when_possible
from templar.runtime.state import NodeState
from templar.runtime.sync import SyncCheck, catch_up, resync
from templar.storage import StorageError
from templar.validator.base import Base, BaseKeeper
from templar.validator.commits import CommitWatcher
from templar.validator.evaluate import Evaluator, LossScores, evaluator_rules, read_sequences
from templar.validator.fast_eval import PoolBaselines, TypicalPayloads, fast_evaluate, trial_size
from templar.validator.files import SECRET_FILE
from templar.validator.lead import CheckpointPublisher, LeadError, WindowPublisher, publish_start_window
from templar.validator.public_work import PublicWork
from templar.validator.replays import ReplayMemory, Sighting
from templar.validator.report import WINDOW_RECORDS, WindowSummary, record_window
from templar.validator.roles import PUBLISH_MIN_SECONDS, FollowerRole, LeadRole, Role
from templar.validator.state import load_book, load_or_create_secret, load_replays, save_book_copy, with_book
from templar.validator.trial_steps import TrialSteps, trial_device
from templar.validator.weights import WeightSetter
from templar.validator.window import ValidatorWindow
from templar.wire import Gradient

LATE_GATHER_SECONDS = 5.0
"""A validator that reaches a window's gather late still gives it at least this long (at most
`gather_seconds`), so it scores what arrived instead of finding every peer `timeout`."""


class Validator:
    """One validator: its score book, memories and publishers, and the role it plays this window
    (`LeadRole` or `FollowerRole`, chosen by stake at every window)."""

    def __init__(self, node: Node):
        self.node = node
        self.hp = node.hp
        self.state = NodeState(window=-1, global_step=0)
        self.book = ScoreBook()
        self.replays = ReplayMemory(self.hp.gauntlet.replay_windows)
        self.compute = node.compute  # θ: one process, or torchrun's ranks
        self.evaluator = self.compute.evaluator or Evaluator(
            node.model, self.hp.optimizer.micro_batch_size, **evaluator_rules(self.hp))
        self.holdout = node.pages.empty  # filled in start(): pages come from the data bucket
        self.publisher = WindowPublisher(node)
        self.checkpoints = CheckpointPublisher(node)
        self.leading, self.following = LeadRole(self), FollowerRole(self)
        self.role: Role = self.following
        self.slot: int | None = None
        """Our slot in the succession this window (`check_slot`)."""
        self._start_copied = False
        self._behind_at_start = False
        """Whether `start` left the validator behind the run (its "Active" line waits for the gap to close)."""
        self.secret = load_or_create_secret(node.state_dir / SECRET_FILE)
        self.commits = CommitWatcher(node)
        self.sync = SyncCheck(node)
        self.weights = WeightSetter(node)
        self.public = PublicWork(self.hp.gauntlet.public_windows)  # aggregated uploads, for the borrowed-work check
        self.pair_baseline = PoolBaselines.of(self.hp.gauntlet)  # earlier windows' typical pairs, for the pool check
        # what each window's updates are computed from, and how far each step moved θ where it probes
        self.bases = BaseKeeper(self.compute, self.hp.inner,
                                measure_steps=not rule_of(self.hp.optimizer.method).moves_every_coordinate)
        self._base_evaluator: Evaluator | None = None

    @property
    def is_lead(self) -> bool:
        """Whether this validator led the last window it ran."""
        return self.role.is_lead

    def eval_seed(self, window: int) -> int:
        digest = hashlib.blake2b(window.to_bytes(8, "little"), key=self.secret, digest_size=8).digest()
        return int.from_bytes(digest, "little")

    # ------------------------------------------------------------------ life
    async def run(self, max_windows: int = 0) -> None:
        """Start, then validate windows until stopped (or `max_windows` windows, if not 0)."""
        await self.start()
        watcher = asyncio.create_task(self.commits.run(), name="commits")
        watcher.add_done_callback(self.commits.report_stop)
        try:
            await self._validate(max_windows)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await self.weights.close()
            await self.publisher.flush_at_stop(self.state.window, self.node.clock.now() + PUBLISH_MIN_SECONDS)
        await self.checkpoints.wait()
        context(phase="stopped").info("validator stopped cleanly")

    async def _validate(self, max_windows: int) -> None:
        node = self.node
        done = 0
        while not node.stop.is_set():
            window = self.state.window + 1
            behind = node.clock.current_window() - window
            if behind > self.hp.windows.max_allowed_stale:
                stuck_at = self.state.window
                self.state = await catch_up(node, self.state, node.clock.current_window() - 1, republish=self.republish)
                if self.state.window == stuck_at and not node.stop.is_set():
                    # a window whose update cannot be had (its payloads deleted, its history gone): a later
                    # checkpoint passes it, as a follower's step and a miner re-sync
                    try:
                        self.state = await resync(node, newer_than=stuck_at)
                    except ResyncError as exc:
                        context(window=window, phase=Phase.CATCHUP).warning(
                            f"[SYNC] {behind} windows behind and no re-sync past window {stuck_at} yet ({exc})")
                await self.sync.record(self.state.window, self.state.global_step)
                continue
            await self.run_window(window, evaluate=behind <= 1)
            if self._behind_at_start and self.state.window >= node.clock.current_window() - 1:
                self._behind_at_start = False  # the gap the start found is closed: now say it
                context(phase=Phase.ACTIVE).info(f"[SYNC] Active as validator from window {self.state.window + 1}")
            done += 1
            if max_windows and done >= max_windows:
                break

    async def start(self) -> None:
        """Load the score book and state, then join: the first of the succession starts the run
        when nothing of it was ever published; every other validator, and a lead coming back,
        catches up on the run's published history (never rebuilt by gathering again)."""
        node = self.node
        current = node.clock.current_window()
        await self.check_slot(current)
        try:
            self.state, own = await restore(node)
        except ResyncError as exc:
            if self.slot == 0:
                fix = exc.fix or ("put an intact checkpoint back into a candidate's bucket (or this validator's "
                                  "state.safetensors into its state directory), then start again")
                raise LeadError(f"cannot restore the run's state: {exc}; refusing to rebuild published history. "
                                f"Fix: {fix}") from exc
            context(phase=Phase.DOWNLOAD).warning(f"[SYNC] Cannot restore the run's state yet ({exc})")
            self.state, own = await restore_when_possible(node)
        self.book = load_book(node.state_dir, self.state, own, lead=self.slot == 0)
        self.replays = load_replays(self.state, self.hp.gauntlet.replay_windows)
        drop_uncommitted_records(node.state_dir, list(WINDOW_RECORDS), self.state.window)
        self.publisher.load_outbox()
        self.holdout = (await node.pages.fetch(node.plan.holdout_pages()[:self.hp.data.holdout_eval_pages])).batch
        current = node.clock.current_window()
        # only a validator that may start a new run waits to know its slot: a lead restarting on its own
        # state runs the window before itself, and waiting for that window's slots would give it away
        may_start = not own and self.state.global_step == 0
        await self.check_slot(current, wait=may_start)
        if node.clock.current_window() != current:  # the wait reached the next window: its slots, then
            current = node.clock.current_window()
            await self.check_slot(current, wait=may_start)
        target = await self.join(current, own=own)
        await self.sync.record(self.state.window, self.state.global_step)
        behind = target - self.state.window
        self._behind_at_start = behind > 0
        if behind > 0:
            context(phase=Phase.CATCHUP).warning(
                f"[SYNC] Still {behind} windows behind the run (at window {self.state.window}, the run at "
                f"{target}): catching up before validating")
        else:
            context(phase=Phase.ACTIVE).info(
                f"[SYNC] Active as validator{'' if self.slot is None else f' (slot {self.slot} of the windows)'} "
                f"from window {self.state.window + 1}")

    async def join(self, current: int, *, own: bool) -> int:
        """Bring `state` to the last window that can no longer be run live (the one before
        `current`, or the one before that while its gather has not started: then it is run, and
        possibly led, as usual): a new run when nothing of it exists, else catch-up on the published
        history. Returns the window it was to reach."""
        node = self.node
        if self.slot == 0 and not own and self.state.global_step == 0 and await self._new_run():
            self.state.window = current - 1
            await publish_start_window(node, current)
            return current - 1
        target = current - 1
        if node.clock.now() < node.clock.times(target).gather_start:
            target -= 1
        self.state = await catch_up(node, self.state, target, republish=self.republish)
        return target

    async def republish(self, window: int, step: OuterStep | None, applied: list[Gradient], global_step: int) -> None:
        """A window we led and left without its aggregate (stopped between our inputs and it), stepped
        again in catch-up from the payloads our inputs name: publish what the live step would have, while
        the miners still hold those payloads (`catch_up`'s `republish`). Create-only, as every record. A
        shadow on the hotkey publishes nothing: the window is the live validator's."""
        if self.node.shadow:
            return
        context(window=window, phase="lead").warning(
            f"[LEAD] publishing our aggregate of window {window}: we stopped before it went out, and every node "
            "replaying the window later needs it")
        self.checkpoints.led(window)
        await self.publisher.publish(window, step, None, global_step, applied=applied,
                                     deadline=self.node.clock.now() + PUBLISH_MIN_SECONDS)

    async def _new_run(self) -> bool:
        """Whether the run has not started: no candidate published a start window (every bucket says
        so: an unreadable copy is never "no run") and our own bucket holds no inputs of any window.
        What cannot be told stops the validator with one line naming the object and the fix."""
        node = self.node
        try:
            if await published_start(node) is not None:
                return False
            history = await node.bucket.list(folder_of(inputs_key), limit=1)
        except ResyncError as exc:
            raise LeadError(f"{exc}. Fix: {exc.fix}") from exc
        except StorageError as exc:
            raise LeadError(f"cannot tell whether our bucket holds the run's history ({exc}). Fix: check the "
                            "bucket's endpoint and keys, then start again; a new run is never started blind") from exc
        if history:
            context(phase=Phase.STARTUP).warning(
                f"[SYNC] no readable start window, but our bucket holds published inputs ({history[0].key}): "
                "the run exists; catching up on it instead of starting a new one")
            return False
        return True

    async def check_slot(self, window: int, *, wait: bool = False) -> int | None:
        """Our slot in this window (`templar.runtime.consensus.succession.window_order`; None: not among its
        slots, or they cannot be told): stake can move, and a candidate takes its slot at once. One
        line when it changes.

        The first slot of a window is the one who led the window before, which is told only once that
        window's slots have settled (in production up to about 70 s into this window). `wait` (a
        validator starting that may start a new run) waits until then when it cannot be told yet: the
        first validator of a new run, taking itself for no slot holder, would never publish the run's
        start window, and every node joining before the first checkpoint would start from θ_0 at its
        own window."""
        order = await window_order(self.node, window)
        if isinstance(order, str) and wait and window > 0:
            before = self.node.clock.times(window - 1)
            settled = before.slot_settled(self.hp.windows.lead_slots - 1)
            if self.node.clock.now() < settled:
                context(window=window, phase=Phase.STARTUP).info(
                    f"[SYNC] who holds the first slot of window {window} is told once window {window - 1}'s slots "
                    f"settle: waiting {settled - self.node.clock.now():.1f}s")
                await decide_window(self.node, window - 1, deadline=settled + POLL_SECONDS)
                order = await window_order(self.node, window)
        hotkeys = [] if isinstance(order, str) or self.node.shadow else [lead.hotkey for lead in order]
        slot = hotkeys.index(self.node.hotkey) if self.node.hotkey in hotkeys else None  # a shadow: never one
        if slot != self.slot:
            if slot == 0:
                said = "now holds the first slot: it leads every window it publishes inputs for in time"
            elif slot is not None:
                said = f"now holds slot {slot}: it publishes a window's inputs when every slot before it published none"
            else:
                said = "holds no slot of the windows: it follows every window"
            context(window=window, phase="lead").info(f"this validator {said}")
            self.slot = slot
        return slot

    # ------------------------------------------------------------------ one window
    async def run_window(self, window: int, *, evaluate: bool = True) -> None:
        """One window as the phases of the module docstring. `evaluate=False` (a window reached more
        than one window late) steps it without scoring anyone."""
        node = self.node
        times = node.clock.times(window)
        await self.flush_publications(window, times)  # first: held-back publications wait for nothing
        await node.window_checks()
        times = await node.clock.ended(window, node.stop)  # the end as the chain made it (a missed slot moves it)
        if times is None or not await node.clock.sleep_until(times.gather_start, node.stop):
            return
        started = time.perf_counter()
        deadline = max(times.gather_deadline,
                       node.clock.now() + min(self.hp.windows.gather_seconds, LATE_GATHER_SECONDS))
        # A window reached after its gather deadline is a replay: it is stepped, never scored.
        evaluate = evaluate and node.clock.now() < times.gather_deadline
        await self.check_slot(window)
        in_sync = await self.in_sync(window)
        if in_sync is None:
            return  # re-synced instead of this window
        work = ValidatorWindow(window, times, started, evaluate=evaluate and in_sync)
        await self.registry(work)
        await self.gather(work, deadline)
        await self.candidate(work, in_sync=in_sync)
        await self.evaluate(work)
        self.score(work)
        if not await self.step(work):
            return  # stopped before the model held the window: the state file keeps the window before
        await self.role.publish(work)
        work.holdout_loss = await asyncio.to_thread(self.compute.evaluate_loss, self.holdout)
        await self.set_weights(work)
        await self.role.checkpoint(work)
        if work.early_aggregate is not None and not work.early_aggregate.done():
            work.early_aggregate.cancel()  # another slot's inputs applied: ours is nobody's step
        self.finish(work)
        # The commit point: model, window and book change together here, after the window's records
        # (a crash before it redoes the window; its uncommitted records are dropped at the restart).
        await asyncio.to_thread(self._save)
        context(window=window, phase="validate").info(work.done_line(self.state.global_step))

    async def ensure_start_window(self, window: int) -> None:
        """A validator that leads keeps a copy of the run's start window in its bucket (create-only,
        looked at once per start), so the run's start stays readable whichever candidate's bucket
        goes away. A copy of ours that cannot be read is said once, with the fix."""
        if self._start_copied:
            return
        node, log = self.node, context(window=window, phase="lead")
        self._start_copied = True
        try:
            if await get_start_window(node.bucket, run=node.run) is not None:
                return
        except RecordError as exc:
            log.warning(f"our {start_window_key()} is unreadable ({str(exc)[:160]}): joiners take the run's start "
                        "window from another candidate's bucket. Fix: delete it; this validator then publishes a "
                        "readable copy the next time it starts and leads")
            return
        except StorageError:
            self._start_copied = False
            return
        try:
            start = await published_start(node)
        except ResyncError:
            self._start_copied = False
            return
        if start is not None:
            with contextlib.suppress(StorageError):  # ObjectExists: another start wrote it meanwhile
                await put_start_window(node.bucket, start, run=node.run)

    async def flush_publications(self, window: int, times: WindowTimes) -> None:
        """What a stalled bucket held back of windows we led goes out first."""
        if self.publisher.queued:
            clock = self.node.clock
            await self.publisher.flush(window, deadline=max(times.gather_start, clock.now() + PUBLISH_MIN_SECONDS))

    async def in_sync(self, window: int) -> bool | None:
        """The proof that it holds the run's model. True: in sync (or nothing to check against);
        None: it was not and has re-synced instead of this window (a forked validator would score
        every honest miner desync); False: it is not and cannot re-sync now, so the window runs
        without evaluating anyone (and without publishing inputs)."""
        if await self.sync.check(window, self.state):
            return True
        try:
            self.state = await resync(self.node)
        except ResyncError as exc:
            context(window=window, phase="validate").warning(
                f"[SYNC] Re-sync not possible now ({exc}); not evaluating this window")
            return False
        await self.sync.record(self.state.window, self.state.global_step)
        await asyncio.to_thread(self._save)
        return None

    async def candidate(self, work: ValidatorWindow, *, in_sync: bool) -> None:
        """A validator of the succession's slots publishes the window's inputs, chosen from its own
        gather, in its slot: at once in slot 0, else once every slot before it is confirmed absent.
        Only while it holds the run's model (the window before applied, in sync) and before its
        slot closes: late inputs would count for nobody. A set it already published for this window
        (a restart) stands. The inputs carry its ceiling on the step's clip level (`step_ceiling`)."""
        slot, window, times = self.slot, work.window, work.times
        if slot is None or not in_sync or self.state.window != window - 1:
            return
        clock = self.node.clock
        if slot > 0:
            before = await decide_window(self.node, window, deadline=times.slot_deadline(slot), slots=slot)
            if not before.settled or before.lead is not None:
                return  # a slot before ours leads the window, or we cannot tell: never publish over it
        if clock.now() >= times.slot_deadline(slot):
            return
        eligible, ceiling = work.aggregated(self.hp), await asyncio.to_thread(work.step_ceiling, self.hp, self.book)
        self.checkpoints.led(window)  # our bucket holds this window's records, to be cleaned in time
        ours = inputs_of(window, self.state.global_step, eligible, ceiling)
        if await self.publisher.publish_inputs(ours, deadline=times.slot_deadline(slot)) is ours:
            # the aggregate goes out while we evaluate: no peer can keep the others from the step
            work.early_aggregate = asyncio.create_task(self.publisher.publish_bundle_early(
                ours, eligible, deadline=self.node.clock.times(window + 1).gather_start), name=f"aggregate-{window}")

    async def registry(self, work: ValidatorWindow) -> None:
        """The subnet's miners (the book follows the registry), the peer list in effect and the
        window's learning rate."""
        work.miners = await self.node.miners()
        self.book.sync_registry(work.miners)
        work.peer_list = await peers_in_effect(self.node, work.window)
        work.learning_rate = learning_rate(self.state.global_step, self.hp.optimizer)

    async def gather(self, work: ValidatorWindow, deadline: float) -> None:
        """F_t (drawn with this validator's secret) and the peers in effect, each with a status;
        what re-posts an earlier upload is noted."""
        window = work.window
        work.draw = draw_window(self.book, self.hp.gauntlet, self.eval_seed(window), window, work.miners,
                                work.peer_list)
        gather_started = time.perf_counter()
        work.results = await self._gather(window, sorted(set(work.draw.fast) | set(work.peer_list)), deadline)
        work.gather_seconds = time.perf_counter() - gather_started
        work.replayed = self.replays.observe(window, work.results)

    async def evaluate(self, work: ValidatorWindow) -> None:
        """Fast evaluation of F_t, then primary evaluation of S_t (when this window is scored), both
        against the base of the window's updates (`templar.validator.base`)."""
        if not work.evaluate:
            return
        window, draw = work.window, work.draw
        assert draw is not None
        base = self.bases.of(window, self.state)
        if base is None:
            work.evaluate = False
            context(window=window, phase="validate").info(
                f"not scoring window {window}: its updates are computed from θ after window {window - 2} "
                "(inner.overlap delayed), which this validator did not hold (it started or caught up since)")
            return
        work.learning_rate = learning_rate(base.global_step, self.hp.optimizer)
        work.sizes = work.typical_sizes(self.hp, self.book)
        work.verdicts = await self._fast_evaluate(window, {hk: work.results[hk] for hk in draw.fast},
                                                  work.learning_rate, work.replayed, base, work.sizes)
        work.losses = await self._primary(window, work.miners, draw.primary(work.verdicts), work.results,
                                          work.learning_rate, base, sizes=work.sizes)

    def score(self, work: ValidatorWindow) -> None:
        """The Gauntlet's window (`score_window`); the aggregated uploads are remembered for the
        borrowed-work check of later windows."""
        self.public.remember(work.window, aggregate_payloads(work.peer_list, work.results))
        work.primaries = {hk: PrimaryResult(s.delta_assigned, s.delta_rand, s.page_deltas, s.sequence_deltas,
                                            work=declared_work(self.hp.data, work.results[hk].value.extra_pages),
                                            declared_units=s.declared_units, random_units=s.random_deltas)
                          for hk, s in work.losses.items()}
        work.scores = score_window(self.book, self.hp.gauntlet, work.window, work.miners, work.verdicts,
                                   work.primaries, premium=work.premium(self.hp.gauntlet), seed=self.eval_seed(work.window))

    async def step(self, work: ValidatorWindow) -> bool:
        """The outer step: every node, the lead included, takes exactly the window's applied inputs
        (`window_inputs`). The window's role follows from who led it: ours (`LeadRole`) or not.
        False when stopped before the model held the window: claiming it then skipped its step."""
        try:
            work.decision = await window_inputs(self.node, work.window, deadline=work.times.apply_deadline)
        except FollowError as exc:
            context(window=work.window, phase="sync").warning(
                f"[SYNC] {exc}: not guessing the window's step; catching up on its published update")
        led = work.decision is not None and work.decision.lead is not None \
            and work.decision.lead.hotkey == self.node.hotkey and not self.node.shadow  # a shadow's hotkey: the live one's
        self.role = self.leading if led else self.following
        await asyncio.to_thread(self.bases.before_step, self.state, work.window)
        if (taken := await self.role.step(work)) is None:
            return False
        work.step, work.applied = taken
        self.state.window = max(self.state.window, work.window)
        await asyncio.to_thread(self.bases.after_step, self.state)
        await self.sync.record(self.state.window, self.state.global_step)
        return True

    async def set_weights(self, work: ValidatorWindow) -> None:
        """When the cadence says (every `windows_per_weights` windows, counted back from each epoch:
        `validator.weights.WeightsCadence`): first attempt now; refusals are told and retried in the
        background (`validator.weights`)."""
        if work.evaluate and await self.weights.due(work.window):
            assert work.scores is not None
            work.weights_set = await self.weights.submit(work.window, work.scores.weights, dict(work.miners))

    def finish(self, work: ValidatorWindow) -> None:
        """The window's records (`templar.validator.report`)."""
        assert work.scores is not None
        step = work.step
        work.wall_seconds = time.perf_counter() - work.started
        record_window(self.node.state_dir, work.window, self.book, self.hp.gauntlet, work.verdicts, work.losses,
                      work.scores,
                      WindowSummary(
                          global_step=self.state.global_step,
                          learning_rate=step.learning_rate if step else learning_rate(self.state.global_step,
                                                                                      self.hp.optimizer),
                          holdout_loss=work.holdout_loss, peers_aggregated=step.peers if step else 0,
                          gathered=len(work.results), wall_seconds=work.wall_seconds,
                          weights_set=work.weights_set, gather_seconds=work.gather_seconds,
                          lead=self.is_lead, clip_norm=step.clip_norm if step else None),
                      primaries=work.primaries if self.node.record_evaluations else None)

    async def _gather(self, window: int, wanted: list[str], deadline: float) -> dict[str, GatherResult[Gradient]]:
        """Every wanted peer's payload, with a status for each (no usable locator on chain:
        `unreachable` if it is broken, else `missing`)."""
        node = self.node
        results = await gather_gradients(await node.peer_buckets(wanted), window, clock=node.clock, hp=self.hp,
                                         shapes=node.shapes, run=node.run, deadline=deadline)
        for hotkey in wanted:
            fault = node.bucket_faults.get(hotkey)
            results.setdefault(hotkey, GatherResult(GatherStatus.UNREACHABLE, reason=fault) if fault
                               else GatherResult(GatherStatus.MISSING, reason="no bucket committed"))
        return results

    async def _fast_evaluate(self, window: int, results: dict[str, GatherResult[Gradient]],
                             lr: float, replayed: Mapping[str, Sighting], base: Base,
                             sizes: TypicalPayloads | None) -> dict[str, FastVerdict]:
        unit, ulp_slack = base.sync_unit(lr, moves_every_coordinate=not self.bases.measure_steps,
                                         ulp_slack=self.hp.sync.ulp_slack)
        if self.bases.measure_steps and base.step_unit is None:
            context(window=window, phase="validate").info(
                f"sync score of window {window} in units of α: this validator did not take the step that made its "
                "base itself (it started or caught up since), so it has not measured that step's movement")
        other = base.other
        if base.kept:  # the kept model is the base, the live θ the other candidate
            own_probes = await asyncio.to_thread(self.compute.base_probes, window)
            other = replace(other, probes=await asyncio.to_thread(self.compute.probes, window)) if other else None
        else:
            own_probes = await asyncio.to_thread(self.compute.probes, window)
        return await asyncio.to_thread(
            fast_evaluate, results, own_probes, unit, rules=self.hp.gauntlet, salt=self.eval_seed(window),
            expected_step=base.global_step, commitments=self.commits.pop(window, results), replayed=replayed,
            earlier=self.public.before(window), baseline=self.pair_baseline, other_base=other,
            ulp_slack=ulp_slack, sizes=sizes)

    def _evaluator(self, base: Base) -> PeerScorer:
        """LossScores against the base: the node's own evaluator on θ, or on the kept model."""
        if not base.kept:
            return self.evaluator
        scorer = self.compute.base_evaluator
        if scorer is not None:
            return scorer
        if self._base_evaluator is None:
            self._base_evaluator = Evaluator(self.compute.base_model, self.hp.optimizer.micro_batch_size,
                                             **evaluator_rules(self.hp))
        return self._base_evaluator

    async def _primary(self, window: int, miners: Mapping[str, int], chosen: list[str],
                       results: Mapping[str, GatherResult[Gradient]], lr: float, base: Base, *,
                       sizes: TypicalPayloads | None = None) -> dict[str, LossScores]:
        """LossScore on assigned vs unassigned data for S_t (`chosen`, paper §3.1): each peer's
        evaluated pages among its assigned and declared ones (`PagePlan.declared_pages`) and the
        random pages, drawn with our secret.
        `sizes`: the typical sizes of the window's aggregate; under a rule that applies magnitudes a
        trial step is tried at the smaller of them and of S_t's own typical size, or at S_t's alone where the
        window has no aggregate (`fast_eval.trial_size`; `OuterRule.trial`: held, or lifted by up to `trial_max_lift`)."""
        hp, node = self.hp, self.node
        seed = self.eval_seed(window)
        if not chosen:
            return {}
        shapes, rule = node.shapes, rule_of(hp.optimizer.method)  # each peer's update as the outer step applies it alone
        typical, as_sent = trial_size(sizes, {hk: results[hk].value for hk in chosen}, hp.gauntlet.max_norm_ratio)
        reference = await asyncio.to_thread(rule.trial_reference, [typical.tensors]) if typical else None
        trial = functools.partial(rule.trial, max_lift=hp.gauntlet.trial_max_lift)
        device = trial_device(self._evaluator(base))
        signs = TrialSteps(chosen, lambda hk: trial({n: c.to(device) for n, c in results[hk].value.tensors.items()},
                                                    shapes, reference=None if hk in as_sent else reference))
        planned, extra = {}, {}
        for hk in chosen:
            own = node.plan.assigned_pages(miners[hk], window, hp.data.pages_per_window)
            extra[hk] = node.plan.declared_pages(miners[hk], window, results[hk].value.extra_pages)
            planned[hk] = evaluated_pages(seed, window, miners[hk], own, extra[hk], hp.data.eval_pages,
                                          hp.gauntlet.declared_pages_evaluated)
        # Every read at once, under one deadline (one after another, a stalled data bucket held the window for
        # each); each peer's sequences drawn on the pages that came (a page missing shifted the others' rows).
        *fetched, randoms = await asyncio.gather(*(node.pages.fetch(pages) for pages in planned.values()), node.pages.fetch(
            node.plan.random_pages(window, hp.data.eval_pages, salt=seed % node.plan.pool),  # the next window's read ahead
            prefetch=node.plan.random_pages(window + 1, hp.data.eval_pages, salt=self.eval_seed(window + 1) % node.plan.pool)))
        evaluated = {hk: got.pages for hk, got in zip(planned, fetched, strict=True)}
        declared = {hk: sum(page in extra[hk] for page in pages) for hk, pages in evaluated.items()}  # listed last
        per_page, random_batch = hp.data.sequences_per_page, randoms.batch
        assigned = {hk: read_sequences(got.batch, [
            select_eval_sequences(seed, window, miners[hk], page, per_page, hp.gauntlet.proof_sequences)
            for page in got.pages]) for hk, got in zip(planned, fetched, strict=True)}
        beta = hp.gauntlet.eval_lr_factor * lr
        read = eval_sequences_read(per_page, hp.gauntlet.proof_sequences)
        scores = await asyncio.to_thread(self._evaluator(base).score_peers, signs, assigned, random_batch, beta,
                                         read)
        return {hk: replace(s, declared_units=len(s.sequence_deltas) * declared[hk] // max(1, len(evaluated[hk])))
                for hk, s in scores.items()}

    def _save(self) -> None:
        """Held-back publications; then state, model, book and replays in one atomic file (scorebook.json: a copy)."""
        self.publisher.save_outbox()
        if self.node.save_state(with_book(self.state, self.book, self.replays)):
            save_book_copy(self.node.state_dir, self.book, self.state.window)
