"""The validator: every window, gather, fast-evaluate many, primary-evaluate a few, score, step.

`Validator.run` is the whole life of a validator; `run_window` is one window (Algorithm 1 of the
paper) as named phases:

    sync check → registry and peer list → gather → fast evaluation → primary evaluation
    → scoring (`templar.gauntlet.score_window`) → outer step → lead's publications
    → held-out loss → weights → checkpoint → records → save (the commit point)

What differs between the lead and a follower is one `Role` each (`LeadRole`, `FollowerRole`):
how the validator joins, proves it holds the run's model, obtains the window's step, and what it
publishes. The phases call the role in force; which one is in force is decided by stake at every
window (`Validator.check_lead`).

The scoring rule is `score_window`, shared with the subnet simulator; the commitment reader runs
beside the windows (`templar.validator.commits`); the records are `templar.validator.report`'s.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from templar.comms import GatherResult, GatherStatus, RecordError, get_start_window
from templar.comms.progress import get_progress
from templar.compress.methods import rule_of
from templar.core.log import context, short
from templar.core.schedule import learning_rate
from templar.gauntlet import (
    FastVerdict,
    PrimaryResult,
    ScoreBook,
    WindowDraw,
    WindowScores,
    draw_window,
    score_window,
    select_eval_pages,
)
from templar.runtime.compute import PeerScorer
from templar.runtime.follow import FollowError, apply_inputs, follow_step, inputs_of
from templar.runtime.node import Node
from templar.runtime.outer import OuterStep, aggregation_weights, gather_gradients
from templar.runtime.peers import aggregate_payloads, peers_in_effect
from templar.runtime.records import SCORES_FILE, VALIDATOR_WINDOWS_FILE, drop_uncommitted_records
from templar.runtime.state import NodeState
from templar.runtime.sync import (
    RETRY_SECONDS,
    Phase,
    ResyncError,
    SyncCheck,
    catch_up,
    fingerprint_problem,
    restore,
    restore_when_possible,
    resync,
)
from templar.runtime.windows import WindowTimes
from templar.storage import StorageError
from templar.validator.base import Base, BaseKeeper
from templar.validator.commits import CommitWatcher
from templar.validator.evaluate import Evaluator, LossScores
from templar.validator.fast_eval import PoolBaselines, fast_evaluate
from templar.validator.lead import CheckpointPublisher, LeadError, WindowPublisher, publish_start_window
from templar.validator.public_work import PublicWork
from templar.validator.replays import ReplayMemory, Sighting
from templar.validator.report import WindowSummary, record_window
from templar.validator.state import (
    BOOK_FILE,
    SECRET_FILE,
    load_book,
    load_or_create_secret,
    load_replays,
    with_book,
)
from templar.validator.weights import WeightSetter
from templar.wire import Gradient, StepInputs

PUBLISH_MIN_SECONDS = 5.0
"""A lead already behind still gets this long to publish a window before it moves on."""
LATE_GATHER_SECONDS = 5.0
"""A validator that reaches a window's gather late still gives it at least this long (at most
`gather_seconds`), so it scores what arrived instead of finding every peer `timeout`."""


@dataclass
class ValidatorWindow:
    """What one window's phases hand to the next."""

    window: int
    times: WindowTimes
    started: float
    """`time.perf_counter()` when the gather could start (the window's wall time is counted from it)."""
    evaluate: bool
    """Whether peers are scored this window (a replayed or out-of-sync window is only stepped)."""
    miners: dict[str, int] = field(default_factory=dict)
    peer_list: list[str] = field(default_factory=list)
    learning_rate: float = 0.0
    draw: WindowDraw | None = None
    """F_t, and S_t once F_t is judged (`templar.gauntlet.draw_window`)."""
    results: dict[str, GatherResult[Gradient]] = field(default_factory=dict)
    gather_seconds: float = 0.0
    replayed: Mapping[str, Sighting] = field(default_factory=dict)
    verdicts: dict[str, FastVerdict] = field(default_factory=dict)
    losses: dict[str, LossScores] = field(default_factory=dict)
    scores: WindowScores | None = None
    step: OuterStep | None = None
    applied: list[Gradient] = field(default_factory=list)
    holdout_loss: float = 0.0
    weights_set: bool = False
    wall_seconds: float = 0.0


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
        self.evaluator = self.compute.evaluator or Evaluator(node.model, self.hp.optimizer.micro_batch_size,
                                                             position_ranges=self.hp.gauntlet.position_ranges)
        self.holdout = node.pages.empty  # filled in start(): pages come from the data bucket
        self.publisher = WindowPublisher(node)
        self.checkpoints = CheckpointPublisher(node)
        self.role: Role = FollowerRole(self)
        self.secret = load_or_create_secret(node.state_dir / SECRET_FILE)
        self.commits = CommitWatcher(node)
        self.sync = SyncCheck(node)
        self.weights = WeightSetter(node)
        self.public = PublicWork(self.hp.gauntlet.public_windows)  # aggregated uploads, for the borrowed-work check
        self.pair_baseline = PoolBaselines.of(self.hp.gauntlet)  # earlier windows' typical pairs, for the pool check
        self.bases = BaseKeeper(self.compute, self.hp.inner)  # what each window's updates are computed from
        self._base_evaluator: Evaluator | None = None

    @property
    def is_lead(self) -> bool:
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
        await self.checkpoints.wait()
        context(phase="stopped").info("validator stopped cleanly")

    async def _validate(self, max_windows: int) -> None:
        node = self.node
        done = 0
        while not node.stop.is_set():
            window = self.state.window + 1
            behind = node.clock.current_window() - window
            if behind > self.hp.windows.max_allowed_stale and await self.role.catch_up_when_behind():
                continue
            await self.run_window(window, evaluate=behind <= 1)
            done += 1
            if max_windows and done >= max_windows:
                break

    async def start(self) -> None:
        """Load the score book and state; the role in force joins (the lead publishes the start
        window or replays its own published history, a follower catches up)."""
        node = self.node
        await self.check_lead(node.clock.current_window())
        try:
            self.state, own = await restore(node)
        except ResyncError as exc:
            self.role.cannot_restore(exc)
            context(phase=Phase.DOWNLOAD).warning(f"[SYNC] Cannot restore the run's state yet ({exc})")
            self.state, own = await restore_when_possible(node)
        self.book = load_book(node.state_dir, self.state, own, lead=self.is_lead)
        self.replays = load_replays(self.state, own, self.hp.gauntlet.replay_windows)
        drop_uncommitted_records(node.state_dir, [SCORES_FILE, VALIDATOR_WINDOWS_FILE], self.state.window)
        self.holdout = (await node.pages.fetch(node.plan.holdout_pages()[:self.hp.data.holdout_eval_pages])).batch
        current = node.clock.current_window()
        await self.check_lead(current)
        await self.role.join(current)
        self.sync.record(self.state.window, self.state.global_step)
        context(phase=Phase.ACTIVE).info(
            f"[SYNC] Active as {'lead ' if self.is_lead else ''}validator from window {self.state.window + 1}")

    async def check_lead(self, window: int) -> bool:
        """Whether we are the lead now, and the role to match: stake can move, and the new lead must
        take over at once."""
        lead = await self.node.lead()
        is_lead = lead is not None and lead.hotkey == self.node.hotkey
        if is_lead != self.is_lead:
            context(window=window, phase="lead").info(
                "this validator is now the lead: publishing peer lists, aggregates and checkpoints"
                if is_lead else "this validator is no longer the lead: following the lead's peer lists")
            self.role = LeadRole(self) if is_lead else FollowerRole(self)
        return is_lead

    # ------------------------------------------------------------------ one window
    async def run_window(self, window: int, *, evaluate: bool = True) -> None:
        """One window as the phases of the module docstring. `evaluate=False` (a window reached more
        than one window late) steps it without scoring anyone."""
        node = self.node
        times = node.clock.times(window)
        await asyncio.to_thread(node.clock.check_skew)
        await self.role.before_gather(window, times)
        if not await node.clock.sleep_until(times.gather_start, node.stop):
            return
        started = time.perf_counter()
        deadline = max(times.gather_deadline,
                       node.clock.now() + min(self.hp.windows.gather_seconds, LATE_GATHER_SECONDS))
        # A window reached after its gather deadline is a replay: it is stepped, never scored.
        evaluate = evaluate and node.clock.now() < times.gather_deadline
        await self.check_lead(window)
        in_sync = await self.role.in_sync(window)
        if in_sync is None:
            return  # re-synced instead of this window
        work = ValidatorWindow(window, times, started, evaluate=evaluate and in_sync)
        await self.registry(work)
        await self.gather(work, deadline)
        await self.role.decide(work)
        await self.evaluate(work)
        self.score(work)
        await self.step(work)
        await self.role.publish(work)
        work.holdout_loss = await asyncio.to_thread(self.compute.evaluate_loss, self.holdout)
        await self.set_weights(work)
        await self.role.checkpoint(work)
        self.finish(work)
        # The commit point: model, window and book change together here, after the window's records
        # (a crash before it redoes the window; its uncommitted records are dropped at the restart).
        await asyncio.to_thread(self._save)
        self._log_done(work)

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
        work.verdicts = await self._fast_evaluate(window, {hk: work.results[hk] for hk in draw.fast},
                                                  work.learning_rate, work.replayed, base)
        work.losses = await self._primary(window, work.miners, draw.primary(work.verdicts), work.results,
                                          work.learning_rate, base)

    def score(self, work: ValidatorWindow) -> None:
        """The Gauntlet's window (`score_window`); the aggregated uploads are remembered for the
        borrowed-work check of later windows."""
        self.public.remember(work.window, aggregate_payloads(work.peer_list, work.results))
        work.scores = score_window(
            self.book, self.hp.gauntlet, work.window, work.miners, work.verdicts,
            {hk: PrimaryResult(s.delta_assigned, s.delta_rand, s.page_deltas, s.sequence_deltas)
             for hk, s in work.losses.items()})

    async def step(self, work: ValidatorWindow) -> None:
        """The outer step: every node, the lead included, takes exactly the inputs the lead published."""
        await asyncio.to_thread(self.bases.before_step, self.state)
        work.step, work.applied = await self.role.step(work)
        self.state.window = max(self.state.window, work.window)
        self.sync.record(self.state.window, self.state.global_step)

    async def set_weights(self, work: ValidatorWindow) -> None:
        """Every `windows_per_weights` scored windows: first attempt now; refusals are told and
        retried in the background (`validator.weights`)."""
        if work.evaluate and work.window % self.hp.windows.windows_per_weights == 0:
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
                          weights_set=work.weights_set, gather_seconds=work.gather_seconds))

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
                             lr: float, replayed: Mapping[str, Sighting], base: Base) -> dict[str, FastVerdict]:
        other = base.other
        if base.kept:  # the kept model is the base, the live θ the other candidate
            own_probes = await asyncio.to_thread(self.compute.base_probes, window)
            other = replace(other, probes=await asyncio.to_thread(self.compute.probes, window)) if other else None
        else:
            own_probes = await asyncio.to_thread(self.compute.probes, window)
        return await asyncio.to_thread(
            fast_evaluate, results, own_probes, lr, rules=self.hp.gauntlet, salt=self.eval_seed(window),
            expected_step=base.global_step, commitments=self.commits.pop(window), replayed=replayed,
            earlier=self.public.before(window), baseline=self.pair_baseline, other_base=other)

    def _evaluator(self, base: Base) -> PeerScorer:
        """LossScores against the base: the node's own evaluator on θ, or on the kept model."""
        if not base.kept:
            return self.evaluator
        scorer = self.compute.base_evaluator
        if scorer is not None:
            return scorer
        if self._base_evaluator is None:
            self._base_evaluator = Evaluator(self.compute.base_model, self.hp.optimizer.micro_batch_size,
                                             position_ranges=self.hp.gauntlet.position_ranges)
        return self._base_evaluator

    async def _primary(self, window: int, miners: Mapping[str, int], chosen: list[str],
                       results: Mapping[str, GatherResult[Gradient]], lr: float, base: Base) -> dict[str, LossScores]:
        """LossScore on assigned vs unassigned data for S_t (`chosen`, paper §3.1): each peer's
        evaluated pages among its assigned ones and the random pages, drawn with our secret."""
        hp, node = self.hp, self.node
        seed = self.eval_seed(window)
        if not chosen:
            return {}
        shapes = node.shapes
        rule = rule_of(hp.optimizer.method)  # each peer's update as the outer step would apply it alone
        signs: dict[str, dict[str, torch.Tensor]] = {
            hk: await asyncio.to_thread(rule.trial, results[hk].value.tensors, shapes) for hk in chosen}
        assigned = {
            hk: (await node.pages.fetch(select_eval_pages(
                seed, window, miners[hk], node.plan.assigned_pages(miners[hk], window, hp.data.pages_per_window),
                hp.data.eval_pages))).batch
            for hk in chosen
        }
        salt = seed % node.plan.pool
        random_batch = (await node.pages.fetch(  # the next window's random pages are read ahead
            node.plan.random_pages(window, hp.data.eval_pages, salt=salt),
            prefetch=node.plan.random_pages(window + 1, hp.data.eval_pages,
                                            salt=self.eval_seed(window + 1) % node.plan.pool))).batch
        beta = hp.gauntlet.eval_lr_factor * lr
        return await asyncio.to_thread(self._evaluator(base).score_peers, signs, assigned, random_batch, beta,
                                       hp.data.sequences_per_page)

    def _save(self) -> None:
        """State, model, score book and replay memory in one atomic file; scorebook.json is a readable copy."""
        if self.node.save_state(with_book(self.state, self.book, self.replays)):
            try:
                self.book.save(self.node.state_dir / BOOK_FILE)
            except OSError as exc:
                context(window=self.state.window, phase="save").warning(
                    f"readable copy {BOOK_FILE} not written ({exc}); the book is safe in the state file")

    def _log_done(self, work: ValidatorWindow) -> None:
        results, step = work.results, work.step
        assert work.scores is not None
        context(window=work.window, phase="validate").info(
            f"window done in {work.wall_seconds:.1f}s | held-out loss {work.holdout_loss:.4f} | gathered "
            f"{sum(r.ok for r in results.values())}/{len(results)} | evaluated {len(work.losses)} | "
            f"aggregated {step.peers if step else 0} | step {self.state.global_step} | top-G "
            + ",".join(short(h) for h in work.scores.top_g))


class Role:
    """What differs between the lead validator and a follower, behind one interface: how it joins
    the run, proves it holds the run's model, obtains each window's step, and what it publishes.
    The window's phases (`Validator.run_window`) call the role in force at the named points."""

    is_lead = False

    def __init__(self, validator: Validator) -> None:
        self.v = validator

    def cannot_restore(self, exc: ResyncError) -> None:
        """The run's state could not be restored at start; returning means: wait until it can."""

    async def join(self, current: int) -> None:
        """Bring `state` to the window before `current` (start-up, after the state was restored)."""
        raise NotImplementedError

    async def catch_up_when_behind(self) -> bool:
        """More than `max_allowed_stale` windows behind: True when the role caught up instead of
        running the next window."""
        return False

    async def before_gather(self, window: int, times: WindowTimes) -> None:
        """Anything due before the window's gather starts."""

    async def in_sync(self, window: int) -> bool | None:
        """True: evaluate as usual; False: run the window without evaluating anyone; None: the
        window was replaced by a re-sync (skip it)."""
        return True

    async def decide(self, work: ValidatorWindow) -> None:
        """Called once the gather is done, before evaluation."""

    async def step(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]]:
        """The window's outer step (None when it had none) and the payloads it aggregated."""
        raise NotImplementedError

    async def publish(self, work: ValidatorWindow) -> None:
        """Publications right after the step."""

    async def checkpoint(self, work: ValidatorWindow) -> None:
        """Publications once the window's weights are set."""


class LeadRole(Role):
    """The highest-stake validator: decides each window's step from its own gather and publishes
    the run's records (inputs at once, then aggregate, progress, peer list and checkpoints)."""

    is_lead = True

    def __init__(self, validator: Validator) -> None:
        super().__init__(validator)
        self.inputs: StepInputs | None = None

    def cannot_restore(self, exc: ResyncError) -> None:
        raise LeadError(f"cannot restore the run's state: {exc}; refusing to rebuild published history "
                        "(restore a checkpoint into the bucket or the state directory)") from exc

    async def join(self, current: int) -> None:
        """A new run publishes its start window; a run with published history is replayed from it
        (its own inputs and aggregates up to its last published progress), never rebuilt by
        gathering again, and must land on its own published fingerprint."""
        v, node = self.v, self.v.node
        start = await self._published_start()
        if start is None:
            v.state.window = current - 1
            await publish_start_window(node, current)
            return
        try:
            progress = await get_progress(node.bucket, run=node.run)
        except (StorageError, RecordError) as exc:
            raise LeadError(f"cannot read our own published progress ({exc}): not resuming the run blind") from exc
        v.publisher.published_progress = progress.window if progress is not None else -1
        if progress is None or progress.window <= v.state.window:
            return
        v.state = await catch_up(node, v.state, progress.window, verify=False)
        if v.state.window < progress.window:
            raise LeadError(f"cannot replay our own published history to window {progress.window} (stopped at "
                            f"{v.state.window}; see the [SYNC] line above)")
        problem = await fingerprint_problem(node, v.state)
        if problem is not None:
            raise LeadError(f"our replayed history differs from our own published fingerprint at window "
                            f"{v.state.window} ({problem})")

    async def _published_start(self) -> int | None:
        try:
            return await get_start_window(self.v.node.bucket, run=self.v.node.run)
        except (StorageError, RecordError):
            return None

    async def before_gather(self, window: int, times: WindowTimes) -> None:
        """What a stalled bucket held back goes out first."""
        v, clock = self.v, self.v.node.clock
        if v.publisher.queued:
            await v.publisher.flush(window, deadline=max(times.gather_start, clock.now() + PUBLISH_MIN_SECONDS))

    async def decide(self, work: ValidatorWindow) -> None:
        """The lead decides the window's step from its own gather: the peers in effect whose payloads
        arrived valid and may be aggregated. It publishes that set at once, ahead of scoring, so
        followers can take the step; a set it already published for this window (a restart) stands."""
        v = self.v
        eligible, _ = aggregation_weights(aggregate_payloads(work.peer_list, work.results), v.hp)
        chosen = inputs_of(work.window, v.state.global_step, eligible)
        self.inputs = await v.publisher.publish_inputs(
            chosen, deadline=v.node.clock.times(work.window).apply_deadline)

    async def step(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]]:
        v, clock = self.v, self.v.node.clock
        inputs, self.inputs = self.inputs, None
        assert inputs is not None and inputs.window == work.window, "the lead decides a window before stepping it"
        return await apply_inputs(v.node, work.window, inputs, v.state, work.results, keep_signs=True,
                                  deadline=max(work.times.apply_deadline, clock.now() + PUBLISH_MIN_SECONDS))

    async def publish(self, work: ValidatorWindow) -> None:
        """The window's aggregate, progress and the peer list in effect from the next window: the
        top-G when a replacement is due (or none is in effect), else the list in effect named again,
        so every reader finds its window's list with one GET, never a LIST. Replaying windows it
        missed, the lead never names peers for a window whose gather has begun: the miners gathered
        it with the list in effect then."""
        v, window, peer_list = self.v, work.window, work.peer_list
        clock, hp = v.node.clock, v.hp
        assert work.scores is not None
        in_time = clock.now() < clock.times(window + 1).gather_start
        due = in_time and (window % hp.windows.peer_replacement_frequency == 0 or not peer_list)
        again = peer_list if in_time and peer_list else None
        await v.publisher.publish(window, work.step, work.scores.top_g if due else again, v.state.global_step,
                                  applied=work.applied,
                                  deadline=max(clock.times(window + 1).gather_start, clock.now() + PUBLISH_MIN_SECONDS))

    async def checkpoint(self, work: ValidatorWindow) -> None:
        v = self.v
        if work.window % v.hp.windows.checkpoint_frequency == 0:
            await v.checkpoints.publish(work.window, v.state.global_step)


class FollowerRole(Role):
    """Any other validator: proves it holds the run's model, takes the lead's published step, and
    publishes nothing (only its weights, like every validator)."""

    async def join(self, current: int) -> None:
        v = self.v
        v.state = await catch_up(v.node, v.state, current - 1)

    async def catch_up_when_behind(self) -> bool:
        v = self.v
        v.state = await catch_up(v.node, v.state, v.node.clock.current_window() - 1)
        v.sync.record(v.state.window, v.state.global_step)
        return True

    async def in_sync(self, window: int) -> bool | None:
        """The proof that it holds the run's model. True: in sync (or nothing to check against);
        None: it was not and has re-synced instead of this window (a forked validator would score
        every honest miner desync); False: it is not and cannot re-sync now, so the window runs
        without evaluating anyone."""
        v = self.v
        if await v.sync.check(window, v.state):
            return True
        try:
            v.state = await resync(v.node)
        except ResyncError as exc:
            context(window=window, phase="validate").warning(
                f"[SYNC] Re-sync not possible now ({exc}); not evaluating this window")
            return False
        v.sync.record(v.state.window, v.state.global_step)
        await asyncio.to_thread(v._save)
        return None

    async def step(self, work: ValidatorWindow) -> tuple[OuterStep | None, list[Gradient]]:
        """The lead's inputs (`follow_step`). When they cannot be had in time the follower does not
        guess: it waits for the lead's published update of this window (catch-up), re-syncing from
        the lead's newest checkpoint once it is `max_allowed_stale` windows behind, so the model it
        saves always holds this window's update."""
        v, node, window = self.v, self.v.node, work.window
        try:
            return await follow_step(node, window, v.state, work.results), []
        except FollowError as exc:
            context(window=window, phase="sync").warning(
                f"[SYNC] {exc}: not guessing the window's step; catching up on the lead's published update")
        while v.state.window < window and not node.stop.is_set():
            if node.clock.current_window() - window > v.hp.windows.max_allowed_stale:
                try:
                    v.state = await resync(node)
                except ResyncError as exc:
                    context(window=window, phase="sync").warning(f"[SYNC] Re-sync not possible now ({exc}); retrying")
                    await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
                continue
            v.state = await catch_up(node, v.state, window)
        return None, []
