"""The validator: every window, gather, fast-evaluate many, primary-evaluate a few, score, step.

`Validator.run` is the whole life of a validator; `run_window` is one window (Algorithm 1 of the
paper) as named phases:

    sync check → registry and peer list → gather → fast evaluation → primary evaluation
    → scoring (`templar.gauntlet.score_window`) → outer step → lead's publications
    → held-out loss → weights → checkpoint → records → save (the commit point)

The scoring rule is `score_window`, shared with the subnet simulator; the commitment reader runs
beside the windows (`templar.validator.commits`); the records are `templar.validator.report`'s.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping

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
    WindowScores,
    score_window,
    select_eval_pages,
    select_eval_peers,
)
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
from templar.storage import StorageError
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

HOLDOUT_PAGES = 4
PUBLISH_MIN_SECONDS = 5.0
"""A lead already behind still gets this long to publish a window before it moves on."""
LATE_GATHER_SECONDS = 5.0
"""A validator that reaches a window's gather late still gives it at least this long (at most
`gather_seconds`), so it scores what arrived instead of finding every peer `timeout`."""


class Validator:
    def __init__(self, node: Node):
        self.node = node
        self.hp = node.hp
        self.state = NodeState(window=-1, global_step=0)
        self.book = ScoreBook()
        self.replays = ReplayMemory()
        self.compute = node.compute  # θ: one process, or torchrun's ranks
        self.evaluator = self.compute.evaluator or Evaluator(node.model, self.hp.optimizer.micro_batch_size)
        self.holdout = node.pages.empty  # filled in start(): pages come from the data bucket
        self.is_lead = False
        self.publisher = WindowPublisher(node)
        self.checkpoints = CheckpointPublisher(node)
        self.secret = load_or_create_secret(node.state_dir / SECRET_FILE)
        self.commits = CommitWatcher(node)
        self.sync = SyncCheck(node)
        self.weights = WeightSetter(node)
        self.public = PublicWork()  # earlier windows' aggregated uploads, for the borrowed-work check
        self.pair_baseline = PoolBaselines()  # earlier windows' typical pairs, for the pool check

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
            if behind > self.hp.windows.max_allowed_stale and not self.is_lead:
                self.state = await catch_up(node, self.state, node.clock.current_window() - 1)
                self.sync.record(self.state.window, self.state.global_step)
                continue
            await self.run_window(window, evaluate=behind <= 1)
            done += 1
            if max_windows and done >= max_windows:
                break

    async def start(self) -> None:
        """Load the score book and state; the lead publishes the start window or replays its own
        published history, others catch up."""
        node = self.node
        is_lead = await self._check_lead(node.clock.current_window())
        try:
            self.state, own = await restore(node)
        except ResyncError as exc:
            if is_lead:
                raise LeadError(f"cannot restore the run's state: {exc}; refusing to rebuild published history "
                                "(restore a checkpoint into the bucket or the state directory)") from exc
            context(phase=Phase.DOWNLOAD).warning(f"[SYNC] Cannot restore the run's state yet ({exc})")
            self.state, own = await restore_when_possible(node)
        self.book = load_book(node.state_dir, self.state, own, lead=is_lead)
        self.book.configure(self.hp.gauntlet)
        self.replays = load_replays(self.state, own)
        drop_uncommitted_records(node.state_dir, [SCORES_FILE, VALIDATOR_WINDOWS_FILE], self.state.window)
        self.holdout = (await node.pages.fetch(node.plan.holdout_pages()[:HOLDOUT_PAGES])).batch
        current = node.clock.current_window()
        if await self._check_lead(current):
            await self._replay_own_history(current)
        else:
            self.state = await catch_up(node, self.state, current - 1)
        self.sync.record(self.state.window, self.state.global_step)
        context(phase=Phase.ACTIVE).info(
            f"[SYNC] Active as {'lead ' if self.is_lead else ''}validator from window {self.state.window + 1}")

    async def _replay_own_history(self, current: int) -> None:
        """The lead's start: a new run publishes its start window; a run with published history is
        replayed from it (its own inputs and aggregates up to its last published progress), never
        rebuilt by gathering again, and must land on its own published fingerprint."""
        node = self.node
        start = await self._published_start()
        if start is None:
            self.state.window = current - 1
            await publish_start_window(node, current)
            return
        try:
            progress = await get_progress(node.bucket, run=node.run)
        except (StorageError, RecordError) as exc:
            raise LeadError(f"cannot read our own published progress ({exc}): not resuming the run blind") from exc
        self.publisher.published_progress = progress.window if progress is not None else -1
        if progress is None or progress.window <= self.state.window:
            return
        self.state = await catch_up(node, self.state, progress.window, verify=False)
        if self.state.window < progress.window:
            raise LeadError(f"cannot replay our own published history to window {progress.window} (stopped at "
                            f"{self.state.window}; see the [SYNC] line above)")
        problem = await fingerprint_problem(node, self.state)
        if problem is not None:
            raise LeadError(f"our replayed history differs from our own published fingerprint at window "
                            f"{self.state.window} ({problem})")

    async def _published_start(self) -> int | None:
        try:
            return await get_start_window(self.node.bucket, run=self.node.run)
        except (StorageError, RecordError):
            return None

    async def _check_lead(self, window: int) -> bool:
        """Whether we are the lead now: stake can move, and the new lead must take over at once."""
        lead = await self.node.lead()
        is_lead = lead is not None and lead[0].hotkey == self.node.hotkey
        if is_lead != self.is_lead:
            context(window=window, phase="lead").info(
                "this validator is now the lead: publishing peer lists, aggregates and checkpoints"
                if is_lead else "this validator is no longer the lead: following the lead's peer lists")
        self.is_lead = is_lead
        return is_lead

    # ------------------------------------------------------------------ one window
    async def run_window(self, window: int, *, evaluate: bool = True) -> None:
        node, hp = self.node, self.hp
        times = node.clock.times(window)
        await asyncio.to_thread(node.clock.check_skew)
        if self.is_lead and self.publisher.queued:  # what a stalled bucket held back goes out first
            await self.publisher.flush(window, deadline=max(times.gather_start, node.clock.now() + PUBLISH_MIN_SECONDS))
        if not await node.clock.sleep_until(times.gather_start, node.stop):
            return
        started = time.perf_counter()
        deadline = max(times.gather_deadline, node.clock.now() + min(hp.windows.gather_seconds, LATE_GATHER_SECONDS))

        # A window reached after its gather deadline is a replay: it is stepped, never scored.
        evaluate = evaluate and node.clock.now() < times.gather_deadline
        await self._check_lead(window)
        if not self.is_lead:
            in_sync = await self._check_sync(window)
            if in_sync is None:
                return  # re-synced instead of this window
            evaluate = evaluate and in_sync
        miners = await node.miners()
        self.book.sync_registry(miners)
        peer_list = await peers_in_effect(node, window)
        lr = learning_rate(self.state.global_step, hp.optimizer)

        fast_set = self._fast_set(window, miners, peer_list)
        gather_started = time.perf_counter()
        results = await self._gather(window, sorted(set(fast_set) | set(peer_list)), deadline)
        gather_seconds = time.perf_counter() - gather_started
        replayed = self.replays.observe(window, results)
        inputs = await self._lead_inputs(window, peer_list, results) if self.is_lead else None
        verdicts: dict[str, FastVerdict] = {}
        losses: dict[str, LossScores] = {}
        if evaluate:
            verdicts = await self._fast_evaluate(window, {hk: results[hk] for hk in fast_set}, lr, replayed)
            losses = await self._primary(window, miners, verdicts, results, lr)
        self.public.remember(window, aggregate_payloads(peer_list, results))
        scores = score_window(self.book, hp.gauntlet, window, miners, verdicts,
                              {hk: PrimaryResult(s.delta_assigned, s.delta_rand, s.page_deltas, s.sequence_deltas)
                               for hk, s in losses.items()})

        # The outer step: every node, the lead included, takes exactly the inputs the lead published.
        applied: list[Gradient] = []
        if inputs is not None:
            step, applied = await apply_inputs(node, window, inputs, self.state, results, keep_signs=True,
                                               deadline=max(times.apply_deadline, node.clock.now() + PUBLISH_MIN_SECONDS))
        else:
            step = await self._follow(window, results)
        self.state.window = max(self.state.window, window)
        self.sync.record(self.state.window, self.state.global_step)
        if self.is_lead:
            await self._publish(window, step, applied, scores.top_g, peer_list)
        holdout_loss = await asyncio.to_thread(self.compute.evaluate_loss, self.holdout)

        weights_set = False
        if evaluate and window % hp.windows.windows_per_weights == 0:
            weights_set = await self._set_weights(window, scores.weights, miners)
        if self.is_lead and window % hp.windows.checkpoint_frequency == 0:
            await self.checkpoints.publish(window, self.state.global_step)
        wall = time.perf_counter() - started
        record_window(node.state_dir, window, self.book, verdicts, losses, scores, WindowSummary(
            global_step=self.state.global_step,
            learning_rate=step.learning_rate if step else learning_rate(self.state.global_step, hp.optimizer),
            holdout_loss=holdout_loss, peers_aggregated=step.peers if step else 0, gathered=len(results),
            wall_seconds=wall, weights_set=weights_set, gather_seconds=gather_seconds, lead=self.is_lead))
        # The commit point: model, window and book change together here, after the window's records
        # (a crash before it redoes the window; its uncommitted records are dropped at the restart).
        await asyncio.to_thread(self._save)
        self._log_done(window, wall, holdout_loss, results, losses, step, scores)

    async def _check_sync(self, window: int) -> bool | None:
        """A follower's proof that it holds the run's model. True: in sync (or nothing to check
        against); None: it was not and has re-synced instead of this window (a forked validator
        would score every honest miner desync); False: it is not and cannot re-sync now, so the
        window runs without evaluating anyone."""
        if await self.sync.check(window, self.state):
            return True
        try:
            self.state = await resync(self.node)
        except ResyncError as exc:
            context(window=window, phase="validate").warning(
                f"[SYNC] Re-sync not possible now ({exc}); not evaluating this window")
            return False
        self.sync.record(self.state.window, self.state.global_step)
        await asyncio.to_thread(self._save)
        return None

    async def _lead_inputs(self, window: int, peer_list: list[str], results: Mapping[str, GatherResult[Gradient]],
                           ) -> StepInputs:
        """The lead decides the window's step from its own gather: the peers in effect whose payloads
        arrived valid and may be aggregated. It publishes that set at once, ahead of scoring, so
        followers can take the step; a set it already published for this window (a restart) stands."""
        eligible, _ = aggregation_weights(aggregate_payloads(peer_list, results), self.hp)
        chosen = inputs_of(window, self.state.global_step, eligible)
        return await self.publisher.publish_inputs(chosen, deadline=self.node.clock.times(window).apply_deadline)

    async def _follow(self, window: int, results: Mapping[str, GatherResult[Gradient]]) -> OuterStep | None:
        """A follower's step: the lead's inputs (`follow_step`). When they cannot be had in time the
        follower does not guess: it waits for the lead's published update of this window (catch-up),
        re-syncing from the lead's newest checkpoint once it is `max_allowed_stale` windows behind,
        so the model it saves always holds this window's update."""
        node = self.node
        try:
            return await follow_step(node, window, self.state, results)
        except FollowError as exc:
            context(window=window, phase="sync").warning(
                f"[SYNC] {exc}: not guessing the window's step; catching up on the lead's published update")
        while self.state.window < window and not node.stop.is_set():
            if node.clock.current_window() - window > self.hp.windows.max_allowed_stale:
                try:
                    self.state = await resync(node)
                except ResyncError as exc:
                    context(window=window, phase="sync").warning(f"[SYNC] Re-sync not possible now ({exc}); retrying")
                    await node.clock.sleep_until(node.clock.now() + RETRY_SECONDS, node.stop)
                continue
            self.state = await catch_up(node, self.state, window)
        return None

    def _fast_set(self, window: int, miners: Mapping[str, int], peer_list: list[str]) -> list[str]:
        """F_t: `fast_eval_uids` miners drawn with this validator's secret, the top-G always in."""
        return select_eval_peers(self.eval_seed(window), window, sorted(miners), self.hp.gauntlet.fast_eval_uids,
                                 always=[p for p in peer_list if p in miners], purpose="fast",
                                 **self._stale_first(window))

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
                             lr: float, replayed: Mapping[str, Sighting]) -> dict[str, FastVerdict]:
        g = self.hp.gauntlet
        own_probes = await asyncio.to_thread(self.compute.probes, window)
        return await asyncio.to_thread(
            fast_evaluate, results, own_probes, lr, sync_max_steps=g.sync_max_steps,
            duplicate_threshold=g.duplicate_threshold, salt=self.eval_seed(window),
            shared_positions_threshold=g.shared_positions_threshold, max_norm_ratio=g.max_norm_ratio,
            expected_step=self.state.global_step, commitments=self.commits.pop(window), replayed=replayed,
            earlier=self.public.before(window), baseline=self.pair_baseline)

    async def _primary(self, window: int, miners: Mapping[str, int], verdicts: Mapping[str, FastVerdict],
                       results: Mapping[str, GatherResult[Gradient]], lr: float) -> dict[str, LossScores]:
        """LossScore on assigned vs unassigned data for a random subset S_t (paper §3.1) of the
        uploads that may earn."""
        hp, node = self.hp, self.node
        eligible = sorted(hk for hk, v in verdicts.items() if v.status.earns)
        seed = self.eval_seed(window)
        chosen = select_eval_peers(seed, window, eligible, hp.gauntlet.uids_per_window, purpose="primary",
                                   **self._stale_first(window))
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
        return await asyncio.to_thread(self.evaluator.score_peers, signs, assigned, random_batch, beta,
                                       hp.data.sequences_per_page)

    def _stale_first(self, window: int) -> dict:
        """The stale-first tilt of F_t and S_t (docs/scoring.md §1); {} keeps the uniform draw."""
        g = self.hp.gauntlet
        if g.selection_sharpness <= 0:
            return {}
        return {"staleness": self.book.staleness(window, g.newcomer_evals), "sharpness": g.selection_sharpness}

    async def _publish(self, window: int, step: OuterStep | None, applied: list[Gradient], top: list[str],
                       peer_list: list[str]) -> None:
        """The lead's publications of the window: aggregate, progress and the peer list in effect
        from the next window: the top-G when a replacement is due (or none is in effect), else the
        list in effect named again, so every reader finds its window's list with one GET, never a
        LIST. Replaying windows it missed, the lead never names peers for a window whose gather has
        begun: the miners gathered it with the list in effect then."""
        node, hp = self.node, self.hp
        in_time = node.clock.now() < node.clock.times(window + 1).gather_start
        due = in_time and (window % hp.windows.peer_replacement_frequency == 0 or not peer_list)
        again = peer_list if in_time and peer_list else None
        await self.publisher.publish(window, step, top if due else again, self.state.global_step, applied=applied,
                                     deadline=max(node.clock.times(window + 1).gather_start,
                                                  node.clock.now() + PUBLISH_MIN_SECONDS))

    async def _set_weights(self, window: int, weights: dict[str, float], miners: Mapping[str, int]) -> bool:
        """First attempt now; refusals are told and retried in the background (`validator.weights`)."""
        return await self.weights.submit(window, weights, dict(miners))

    def _save(self) -> None:
        """State, model, score book and replay memory in one atomic file; scorebook.json is a readable copy."""
        if self.node.save_state(with_book(self.state, self.book, self.replays)):
            try:
                self.book.save(self.node.state_dir / BOOK_FILE)
            except OSError as exc:
                context(window=self.state.window, phase="save").warning(
                    f"readable copy {BOOK_FILE} not written ({exc}); the book is safe in the state file")

    def _log_done(self, window: int, wall: float, holdout_loss: float, results: Mapping[str, GatherResult],
                  losses: Mapping[str, LossScores], step: OuterStep | None, scores: WindowScores) -> None:
        context(window=window, phase="validate").info(
            f"window done in {wall:.1f}s | held-out loss {holdout_loss:.4f} | gathered "
            f"{sum(r.ok for r in results.values())}/{len(results)} | evaluated {len(losses)} | "
            f"aggregated {step.peers if step else 0} | step {self.state.global_step} | top-G "
            + ",".join(short(h) for h in scores.top_g))
