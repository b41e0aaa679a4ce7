"""The validator: every window, gather, fast-evaluate many, primary-evaluate a few, score, step.

`run_window` is Algorithm 1 of the paper as named phases:
gather → fast eval → primary eval → scores and weights → outer step (+ lead publishing) → save.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

from templar.chain import ChainError
from templar.comms import GatherResult, GatherStatus, RecordError, get_peers, get_start_window
from templar.comms.commit import read_commits
from templar.compress import aggregate
from templar.core.atomic import atomic_write
from templar.core.log import context, short
from templar.core.schedule import learning_rate
from templar.gauntlet import PrimaryResult, ScoreBook, ScoreBookError, select_eval_pages, select_eval_peers
from templar.runtime.compute import compute_of
from templar.runtime.node import Node
from templar.runtime.outer import OuterStep, gather_gradients
from templar.runtime.records import (
    SCORES_FILE,
    VALIDATOR_WINDOWS_FILE,
    PeerScoreRecord,
    ValidatorWindowRecord,
    append_record,
    drop_uncommitted_records,
)
from templar.runtime.state import NodeState
from templar.runtime.sync import STATE_FILE, Phase, ResyncError, SyncCheck, catch_up, restore, resync
from templar.storage import StorageError
from templar.validator.evaluate import Evaluator, LossScores
from templar.validator.fast_eval import FastVerdict, fast_evaluate
from templar.validator.lead import CheckpointPublisher, WindowPublisher, publish_start_window
from templar.validator.weights import WeightSetter

BOOK_FILE = "scorebook.json"
SECRET_FILE = "eval_secret"
HOLDOUT_PAGES = 4
PUBLISH_MIN_SECONDS = 5.0
"""A lead already behind still gets this long to publish a window before it moves on."""


def load_or_create_secret(path: Path) -> bytes:
    """This validator's private randomness for D_rand, S_t and fingerprints, kept across restarts.

    Miners know the public seeds, so anything derived from them alone (say, next window's random
    pages) could be trained on in advance; a per-validator secret makes those choices unpredictable.
    """
    if path.exists():
        secret = path.read_bytes()
        if len(secret) == 32:
            return secret
    secret = os.urandom(32)
    atomic_write(path, secret, mode=0o600)
    return secret


def _report_watcher(task: asyncio.Task) -> None:
    """A commitment reader that died must not go unnoticed: from then on no upload is judged on
    its commitment (fast evaluation skips the check for windows with nothing read)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        context(phase="commit").opt(exception=exc).error(
            f"commitment reader stopped: uploads are no longer checked against commitments ({exc!r})")


class Validator:
    def __init__(self, node: Node):
        self.node = node
        self.hp = node.hp
        self.state = NodeState(window=-1, global_step=0)
        self.book = ScoreBook()
        self.compute = compute_of(node)  # θ: one process, or torchrun's ranks
        self.evaluator = self.compute.evaluator or Evaluator(node.model, self.hp.optimizer.micro_batch_size)
        self.holdout = node.pages.empty  # filled in start(): pages come from the data bucket
        self.is_lead = False
        self.publisher = WindowPublisher(node)
        self.checkpoints = CheckpointPublisher(node)
        self.secret = load_or_create_secret(node.state_dir / SECRET_FILE)
        self.commits: dict[int, dict[str, bytes]] = {}
        """Window → the commitments read in its `commit_read` span (`templar.comms.commit`)."""
        self.sync = SyncCheck(node)
        self.weights = WeightSetter(node)

    def eval_seed(self, window: int) -> int:
        digest = hashlib.blake2b(window.to_bytes(8, "little"), key=self.secret, digest_size=8).digest()
        return int.from_bytes(digest, "little")

    # ------------------------------------------------------------------ life
    async def run(self, max_windows: int = 0) -> None:
        """Start, then validate windows until stopped (or `max_windows` windows, if not 0)."""
        await self.start()
        watcher = asyncio.create_task(self.watch_commits(), name="commits")
        watcher.add_done_callback(_report_watcher)
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

    async def watch_commits(self) -> None:
        """Read every miner's commitment of each window inside its `commit_read` span, before any
        gradient of the window can count (issue 14): what was not read there was not committed."""
        node = self.node
        window = node.clock.current_window()
        while not node.stop.is_set():
            times = node.clock.times(window)
            opens, closes = times.commit_read
            if node.clock.now() >= closes - 0.5:
                window += 1  # too late for this window's span: its gradients are not judged on it
                continue
            if not await node.clock.sleep_until(opens, node.stop):
                return
            log = context(window=window, phase="commit")
            try:
                neurons = await node.neurons()
                miners = [n.hotkey for n in neurons if not (n.validator_permit and n.stake > 0)
                          and n.hotkey != node.hotkey]
                buckets = await node.peer_buckets(miners)
                read = await read_commits(buckets, window, run=node.run, deadline=closes, now=node.clock.now)
                self.commits[window] = read
                log.debug(f"read {sum(bool(d) for d in read.values())}/{len(miners)} commitments "
                          f"({len(miners) - len(read)} without a bucket or not read in time: not judged on them)")
            except (ChainError, StorageError) as exc:
                log.warning(f"commitments unavailable: {exc}")
            for old in [w for w in self.commits if w < window - 2 * self.hp.windows.max_allowed_stale]:
                del self.commits[old]
            window += 1

    async def start(self) -> None:
        """Load the score book and state; the lead publishes the start window, others catch up."""
        node = self.node
        self.state, own = await restore(node)
        self.book = self._load_book(self.state, own)
        self.book.configure(self.hp.gauntlet)
        drop_uncommitted_records(node.state_dir, [SCORES_FILE, VALIDATOR_WINDOWS_FILE], self.state.window)
        self.holdout = (await node.pages.fetch(node.plan.holdout_pages()[:HOLDOUT_PAGES])).batch
        current = node.clock.current_window()
        if await self._check_lead(current):
            if await self._published_start() is None:
                self.state.window = current - 1
                await publish_start_window(node, current)
        else:
            self.state = await catch_up(node, self.state, current - 1)
            self.sync.record(self.state.window, self.state.global_step)
        context(phase=Phase.ACTIVE).info(
            f"[SYNC] Active as {'lead ' if self.is_lead else ''}validator from window {self.state.window + 1}")

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

    def _load_book(self, state: NodeState, own: bool) -> ScoreBook:
        """The book saved atomically with our state (never a window apart from it).

        `scorebook.json` is only a readable copy: it may be a window ahead of or behind any state
        we could restore, so it is read only for an own state saved without a book (older versions).
        A state that is not our own (the lead's checkpoint) starts an empty book rather than one
        that would count some windows twice."""
        log = context(phase="startup")
        saved = state.extra.get("scorebook")
        if isinstance(saved, str):
            try:
                return ScoreBook.from_json(saved)
            except ScoreBookError as exc:
                log.error(f"score book in the state file unreadable: {exc}")
        path = self.node.state_dir / BOOK_FILE
        if not own:
            if path.exists():
                log.warning(f"[SYNC] no own state to take the score book from: starting an empty one "
                            f"({path.name} is a readable copy that may be windows ahead of or behind this state)")
            return ScoreBook()
        try:
            return ScoreBook.load(path)
        except ScoreBookError as exc:
            backup = path.with_suffix(".corrupt")
            path.replace(backup)
            context(phase="startup").error(f"score book unreadable ({exc}); moved to {backup.name}, starting empty")
            return ScoreBook()

    # ------------------------------------------------------------------ one window
    async def run_window(self, window: int, *, evaluate: bool = True) -> None:
        node, hp = self.node, self.hp
        times = node.clock.times(window)
        log = context(window=window, phase="validate")
        if not await node.clock.sleep_until(times.gather_start, node.stop):
            return
        started = time.perf_counter()
        deadline = max(times.gather_deadline, node.clock.now() + min(hp.windows.gather_seconds, 5.0))

        await self._check_lead(window)
        if not self.is_lead and not await self.sync.check(window, self.state):
            # A forked validator would score every honest miner desync: re-sync instead of this window.
            try:
                self.state = await resync(node)
            except ResyncError as exc:
                log.warning(f"[SYNC] Re-sync not possible now ({exc}); not evaluating this window")
                evaluate = False
            else:
                self.sync.record(self.state.window, self.state.global_step)
                await asyncio.to_thread(self._save)
                return
        neurons = await node.neurons()
        miners = {n.hotkey: n.uid for n in neurons if not (n.validator_permit and n.stake > 0)
                  and n.hotkey != node.hotkey}
        self.book.sync_registry(miners)
        peer_list = await self._peer_list(window)
        lr = learning_rate(self.state.global_step, hp.optimizer)

        fast_set = select_eval_peers(self.eval_seed(window), window, sorted(miners), hp.gauntlet.fast_eval_uids,
                                     always=[p for p in peer_list if p in miners], purpose="fast",
                                     **self._stale_first(window))
        wanted = sorted(set(fast_set) | set(peer_list))
        gather_started = time.perf_counter()
        results = await gather_gradients(await node.peer_buckets(wanted), window, clock=node.clock, hp=hp,
                                         shapes=node.shapes, run=node.run, deadline=deadline)
        gather_seconds = time.perf_counter() - gather_started
        for hotkey in wanted:  # no usable locator on chain: unreachable if it is broken, else missing
            fault = node.bucket_faults.get(hotkey)
            results.setdefault(hotkey, GatherResult(GatherStatus.UNREACHABLE, reason=fault) if fault
                               else GatherResult(GatherStatus.MISSING, reason="no bucket committed"))

        own_probes = await asyncio.to_thread(self.compute.probes, window)
        verdicts = {}
        losses: dict[str, LossScores] = {}
        if evaluate:
            fast_results = {hk: results[hk] for hk in fast_set}
            verdicts = await asyncio.to_thread(
                fast_evaluate, fast_results, own_probes, lr, sync_max_steps=hp.gauntlet.sync_max_steps,
                duplicate_threshold=hp.gauntlet.duplicate_threshold, salt=self.eval_seed(window),
                shared_positions_threshold=hp.gauntlet.shared_positions_threshold,
                max_norm_ratio=hp.gauntlet.max_norm_ratio, expected_step=self.state.global_step,
                commitments=self.commits.pop(window, None))
            for hotkey, verdict in verdicts.items():
                self.book.get_or_create(hotkey, miners[hotkey], window)
                self.book.record_fast_eval(hotkey, verdict.passed or verdict.status == "warmup", verdict.status,
                                           hp.gauntlet.fast_eval_penalty, sync_steps=verdict.sync_steps)
            for pool in {v.pool for v in verdicts.values() if v.pool}:
                self.book.record_pool(pool, window)
            self.book.expire_pools(window)
            losses = await self._primary(window, miners, verdicts, results, lr)
        weights = self.book.weights(hp.gauntlet.power)
        top = self.book.top_g(hp.gauntlet.top_g)

        # The outer step with exactly the peer list miners use (consensus: no validator-only filter
        # here; a bad peer leaves the list through its score, at the next replacement).
        chosen = [results[hk].value for hk in peer_list if hk in results and results[hk].ok]
        step = await asyncio.to_thread(self.compute.outer_step, [g for g in chosen if g is not None],
                                       self.state, keep_signs=self.is_lead)
        self.state.window = window
        self.sync.record(window, self.state.global_step)
        if self.is_lead:
            due = window % hp.windows.peer_replacement_frequency == 0 or not peer_list
            # Replaying windows it missed, the lead never names peers for a window whose gather has
            # begun: the miners aggregated it with the list in effect then (another list is a fork).
            in_time = node.clock.now() < node.clock.times(window + 1).gather_start
            due = due and in_time
            # Between replacements the list in effect is named again for the next window (in time
            # only, like any list), so a reader finds its window's list with one GET, never a LIST.
            again = peer_list if in_time and peer_list else None
            await self.publisher.publish(window, step, top if due else again, self.state.global_step,
                                         deadline=max(node.clock.times(window + 1).gather_start,
                                                      node.clock.now() + PUBLISH_MIN_SECONDS))
        holdout_loss = await asyncio.to_thread(self.compute.evaluate_loss, self.holdout)

        weights_set = False
        if window % hp.windows.windows_per_weights == 0:
            weights_set = await self._set_weights(window, weights, miners)
        if self.is_lead and window % hp.windows.checkpoint_frequency == 0:
            await self.checkpoints.publish(window, self.state.global_step)
        wall = time.perf_counter() - started
        self._log_window(window, verdicts, losses, weights, top, miners, step, holdout_loss, len(results), wall,
                         weights_set, gather_seconds)
        # The commit point: model, window and book change together here, after the window's records
        # (a crash before it redoes the window; its uncommitted records are dropped at the restart).
        await asyncio.to_thread(self._save)
        log.info(f"window done in {wall:.1f}s | held-out loss {holdout_loss:.4f} | gathered "
                 f"{sum(r.ok for r in results.values())}/{len(results)} | evaluated {len(losses)} | "
                 f"aggregated {step.peers if step else 0} | step {self.state.global_step} | top-G "
                 + ",".join(short(h) for h in top))

    async def _peer_list(self, window: int) -> list[str]:
        lead = await self.node.lead()
        if lead is None:
            return []
        try:
            found = await get_peers(lead[1], window, run=self.node.run, timeout=5.0)
        except (StorageError, RecordError) as exc:
            context(window=window, phase="validate").warning(f"peer list unavailable: {exc}")
            return []
        return found[1] if found else []

    async def _primary(self, window: int, miners: dict[str, int], verdicts: dict[str, FastVerdict],
                       results: dict[str, GatherResult], lr: float) -> dict[str, LossScores]:
        """LossScore on assigned vs unassigned data for a random subset S_t (paper §3.1)."""
        hp, node = self.hp, self.node
        eligible = sorted(hk for hk, v in verdicts.items() if v.passed and v.status == "ok")
        seed = self.eval_seed(window)
        chosen = select_eval_peers(seed, window, eligible, hp.gauntlet.uids_per_window, purpose="primary",
                                   **self._stale_first(window))
        if not chosen:
            return {}
        shapes = node.shapes
        signs = {hk: await asyncio.to_thread(aggregate, [results[hk].value.tensors], [1.0], shapes) for hk in chosen}
        assigned = {
            hk: (await node.pages.fetch(select_eval_pages(
                seed, window, miners[hk], node.plan.assigned_pages(miners[hk], window, hp.data.pages_per_window),
                hp.data.eval_pages))).batch
            for hk in chosen
        }
        salt = seed % node.plan.pool
        random_batch = (await node.pages.fetch(  # data (#16): next window's random pages read ahead
            node.plan.random_pages(window, hp.data.eval_pages, salt=salt),
            prefetch=node.plan.random_pages(window + 1, hp.data.eval_pages,
                                            salt=self.eval_seed(window + 1) % node.plan.pool))).batch
        beta = hp.gauntlet.eval_lr_factor * lr
        scores = await asyncio.to_thread(self.evaluator.score_peers, signs, assigned, random_batch, beta,
                                         hp.data.sequences_per_page)
        self.book.record_primary({hk: PrimaryResult(s.delta_assigned, s.delta_rand, s.page_deltas)
                                  for hk, s in scores.items()},
                                 gamma=hp.gauntlet.mu_gamma, beta=hp.gauntlet.openskill_beta,
                                 tau=hp.gauntlet.openskill_tau, margin=hp.gauntlet.proof_margin, window=window)
        return scores

    def _stale_first(self, window: int) -> dict:
        """The stale-first tilt of F_t and S_t (issue 19; docs/scoring.md §1); {} keeps the uniform draw."""
        g = self.hp.gauntlet
        if g.selection_sharpness <= 0:
            return {}
        return {"staleness": self.book.staleness(window, g.newcomer_evals), "sharpness": g.selection_sharpness}

    async def _set_weights(self, window: int, weights: dict[str, float], miners: dict[str, int]) -> bool:
        """First attempt now; refusals are told and retried in the background (`validator.weights`)."""
        return await self.weights.submit(window, weights, miners)

    def _save(self) -> None:
        """State, model and score book in one atomic file; scorebook.json is a readable copy."""
        self.state.extra = {"scorebook": self.book.to_json()}
        self.compute.save_state(self.node.state_dir / STATE_FILE, self.state)
        self.book.save(self.node.state_dir / BOOK_FILE)

    def _log_window(self, window, verdicts, losses, weights, top, miners, step: OuterStep | None,
                    holdout_loss: float, gathered: int, wall: float, weights_set: bool,
                    gather_seconds: float) -> None:
        state_dir: Path = self.node.state_dir
        log = context(window=window, phase="score")
        for hotkey in sorted(self.book):
            rec = self.book.peers[hotkey]
            verdict = verdicts.get(hotkey)
            loss = losses.get(hotkey)
            status = verdict.status if verdict else "not-sampled"
            if verdict or loss:
                log.info(f"peer {short(hotkey)} uid {rec.uid}: {status} | sync "
                         f"{'-' if rec.last_sync_steps is None else f'{rec.last_sync_steps:.2f}'} | "
                         f"δa {'-' if not loss else f'{loss.delta_assigned:+.5f}'} δr "
                         f"{'-' if not loss else f'{loss.delta_rand:+.5f}'} | μ {rec.mu:+.3f} | rating "
                         f"{self.book.loss_rating(hotkey):.2f} | score {rec.score:.3f} | weight {weights.get(hotkey, 0):.3f}")
            append_record(state_dir / SCORES_FILE, PeerScoreRecord(
                window=window, hotkey=hotkey, uid=rec.uid, status=status, evaluated=loss is not None,
                sync_steps=verdict.sync_steps if verdict else None,
                delta_assigned=loss.delta_assigned if loss else None,
                delta_rand=loss.delta_rand if loss else None, mu=rec.mu, rating=self.book.loss_rating(hotkey),
                score=rec.score, weight=weights.get(hotkey, 0.0), in_top_g=hotkey in top))
        append_record(state_dir / VALIDATOR_WINDOWS_FILE, ValidatorWindowRecord(
            window=window, global_step=self.state.global_step,
            learning_rate=step.learning_rate if step else learning_rate(self.state.global_step, self.hp.optimizer),
            holdout_loss=holdout_loss, peers_aggregated=step.peers if step else 0, gathered=gathered,
            evaluated=len(losses), wall_seconds=wall, weights_set=weights_set, gather_seconds=gather_seconds))

