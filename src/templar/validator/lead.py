"""What the validator that leads a window publishes, so that everyone else can follow: its inputs (in
its slot of the succession, `templar.runtime.consensus.succession`), then the window's aggregate (for
catch-up), progress with the model's fingerprint, the top-G peer list of the next window and, when
due, a checkpoint; and the run's start window. Every history object is written create-only."""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from safetensors import SafetensorError

from templar.chain import verify_signature
from templar.comms import (
    cleanup_checkpoints,
    get_inputs,
    put_aggregate,
    put_new,
    put_peers,
    put_start_window,
    save_checkpoint,
)
from templar.comms.keys import aggregate_key, folder_of, inputs_key, peers_key, progress_key, window_of
from templar.comms.progress import progress_bytes
from templar.core.atomic import atomic_write
from templar.core.log import context
from templar.core.schedule import learning_rate
from templar.runtime.consensus.outer import OuterStep, aggregation_weights
from templar.runtime.consensus.windows import retained_windows
from templar.runtime.flags import EXIT_HISTORY
from templar.runtime.node import Node, NodeError
from templar.runtime.restore import MODEL_FILE
from templar.storage import Bucket, ObjectExists, StorageError
from templar.wire import (
    Gradient,
    PayloadError,
    StepInputs,
    max_inputs_bytes,
    read_inputs,
    write_aggregate,
    write_bundle,
    write_inputs,
)


class LeadError(NodeError):
    """The run's published history is in a state this validator must not write over, or cannot
    restore: it stops, with one line naming the object and the fix (exit 8)."""

    exit_code = EXIT_HISTORY


async def publish_start_window(node: Node, window: int) -> None:
    """The run's start window, create-only. A bucket that already holds one means a run exists that
    our start-up read did not see: never a second start over it."""
    try:
        await put_start_window(node.bucket, window, run=node.run)
        context(window=window, phase="lead").info(f"published the run's start window {window}")
    except ObjectExists as exc:
        raise LeadError(f"{exc}: a run already started in our bucket. Fix: start again (the validator then "
                        "catches up on that run)") from exc
    except StorageError as exc:
        context(window=window, phase="lead").warning(f"could not publish the start window: {exc}")


OUTBOX_DIR = "outbox"
"""The state directory's folder of publications held back by a slow bucket, one subfolder per run."""
_OUTBOX_NAME = re.compile(r"^(aggregate|peers|progress)-(\d{1,12})$")


class WindowPublisher:
    """The lead's per-window publications (inputs; then aggregate, peer list, progress with the
    model's fingerprint, `templar.runtime.consensus.fingerprint`), each upload bounded by a deadline so a slow
    or stalled bucket never delays the next window. What misses its deadline (but the inputs) stays
    queued, is logged, and goes out first at the next window (oldest first). Followers wait for a late
    aggregate until its publish deadline (one window after its own), so a publication retried one
    window later still serves them.

    The queue is history the run needs (a window's aggregate is how every later node replays it), and
    the window that made it is committed with the state file. So the queue goes to disk before each
    commit (`save_outbox`) and is read back at start (`load_outbox`): a lead killed with publications
    held back sends them when it starts again, not never."""

    MAX_QUEUED = 32

    def __init__(self, node: Node) -> None:
        self.node = node
        self.queued: dict[str, bytes] = {}
        """name ("aggregate/12") -> the object's bytes (a peer list's: its hotkeys, one per line)."""

    @property
    def outbox(self) -> Path:
        return self.node.state_dir / OUTBOX_DIR / self.node.run.digest[:16]

    def save_outbox(self) -> None:
        """The queue on disk (before the window's commit point): what is queued and not yet there is
        written, what is no longer queued is removed, and so are other runs' folders. A failed write is
        logged; the queue is still retried in memory."""
        folder, wanted = self.outbox, {name.replace("/", "-") for name in self.queued}
        try:
            if not wanted and not folder.parent.exists():
                return
            for other in folder.parent.iterdir() if folder.parent.exists() else ():
                if other != folder:
                    shutil.rmtree(other, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in self.queued.items():
                path = folder / name.replace("/", "-")
                if not path.exists():
                    atomic_write(path, data)
            for path in folder.iterdir():
                if path.name not in wanted:
                    path.unlink()
        except OSError as exc:
            context(phase="save").warning(f"held-back publications not saved to {folder} ({exc}); they are "
                                          "retried from memory, and lost if this validator stops first")

    def load_outbox(self) -> None:
        """Queue what a previous run of this validator held back (oldest first); anything in the
        folder that is not a publication's name is removed."""
        folder = self.outbox
        if self.node.shadow or not folder.is_dir():  # a shadow publishes nothing
            return
        found = []
        for path in folder.iterdir():
            match = _OUTBOX_NAME.match(path.name)
            if match is None:  # a dead writer's temporary file
                path.unlink(missing_ok=True)
                continue
            found.append((int(match[2]), match[1], path))
        for window, kind, path in sorted(found):
            self.queued[f"{kind}/{window}"] = path.read_bytes()
        if found:
            context(phase="lead").warning(f"[LEAD] {len(found)} publications held back when this validator last "
                                          f"stopped ({', '.join(self.queued)}): publishing them first")

    async def flush_at_stop(self, window: int, deadline: float) -> None:
        """Stopping: what a slow bucket held back goes out now if it can, and the outbox says what is left."""
        if self.queued:
            await self.flush(window, deadline)
            self.save_outbox()

    async def _put(self, name: str, data: bytes) -> None:
        kind, window = name.split("/")
        bucket = self.node.bucket
        if kind == "aggregate":
            await put_aggregate(bucket, int(window), data)
        elif kind == "peers":
            await put_peers(bucket, int(window), data.decode().split(), run=self.node.run)
        else:
            await put_new(bucket, progress_key(int(window)), data)

    async def publish_inputs(self, inputs: StepInputs, *, deadline: float) -> StepInputs | None:
        """The inputs of this window's step, published create-only ahead of everything else (every
        node waits for them to take the step), by `deadline` (our slot's). A restarted validator that
        already published inputs for the window keeps those, never another set (published history
        is append-only): returns the inputs in our bucket. None when they could not be written in
        time: they are never retried, as inputs stored after our slot count for nobody; the window
        then goes to the next slot (or has no step), and we follow it like everyone."""
        node, window = self.node, inputs.window
        log = context(window=window, phase="lead")
        data = write_inputs(inputs, hotkey=node.hotkey, run=node.run, sign=node.chain.sign)
        try:
            async with asyncio.timeout(max(0.1, deadline - node.clock.now())):
                if await put_new(node.bucket, inputs_key(window), data):
                    return inputs
                published = await get_inputs(node.bucket, window, max_bytes=max_inputs_bytes())
        except (TimeoutError, StorageError) as exc:
            log.warning(f"publishing the inputs of window {window} failed ({type(exc).__name__}: {str(exc)[:160]}): "
                        "the window goes to the next slot of the succession")
            return None
        try:
            if published is None:
                raise PayloadError("not_safetensors", "deleted between our check and our read")
            kept = read_inputs(published, run=node.run, verify=verify_signature, expected_hotkey=node.hotkey,
                               expected_window=window)
        except PayloadError as exc:
            raise LeadError(f"our published {inputs_key(window)} is malformed ({exc.reason}): no node can apply it, "
                            "and published history is never written over. Fix: check that this bucket's copy is "
                            f"torn (not a transfer fault), delete {inputs_key(window)} from it (window {window} then "
                            "has no outer step for anyone), then start again") from exc
        if kept != inputs:
            log.warning(f"inputs of window {window} were already published ({len(kept.peers)} payloads): applying "
                        "those (published history is append-only)")
        return kept

    async def publish(self, window: int, step: OuterStep | None, next_peers: list[str] | None,
                      global_step: int, *, deadline: float, applied: Sequence[Gradient] = ()) -> bool:
        """Queue this window's objects and upload the queue until `deadline` (unix seconds by the
        node's clock). True when nothing is left queued. Objects of a window already published stay
        as they are (`put_new`: history is append-only)."""
        node, run = self.node, self.node.run
        if step is not None:
            if node.hp.optimizer.method == "signed":
                data = write_aggregate(step.signs, window=window, global_step=step.global_step,
                                       learning_rate=step.learning_rate, hotkey=node.hotkey, run=run,
                                       sign=node.chain.sign)
            else:  # the method's update has no compact exact form: the payloads that make it
                data = self.bundle(window, applied, step.global_step, step.clip_norm)
            self.queued[f"aggregate/{window}"] = data
        if next_peers is not None:
            self.queued[f"peers/{window + 1}"] = "\n".join(next_peers).encode()
        # θ after this window's step, so every node can check that it holds the run's model.
        fingerprint = node.compute.fingerprint(window)
        self.queued[f"progress/{window}"] = progress_bytes(window, global_step, run=run, fingerprint=fingerprint)
        while len(self.queued) > self.MAX_QUEUED:
            dropped = next(iter(self.queued))
            del self.queued[dropped]
            context(window=window, phase="lead").warning(f"dropping {dropped}: never published in time")
        return await self.flush(window, deadline)

    def bundle(self, window: int, applied: Sequence[Gradient], global_step: int, clip_norm: float | None) -> bytes:
        """The aggregate of a method whose update has no compact exact form (SparseLoCo): the payloads
        that make the step, signed, with the step, learning rate and ceiling on the clip level they are
        applied at."""
        node = self.node
        return write_bundle([(g.hotkey, g.tensors) for g in aggregation_weights(applied, node.hp)[0]],
                            window=window, global_step=global_step,
                            learning_rate=learning_rate(global_step, node.hp.optimizer), hotkey=node.hotkey,
                            hp=node.hp, run=node.run, sign=node.chain.sign, clip_norm=clip_norm)

    async def publish_bundle_early(self, inputs: StepInputs, payloads: Sequence[Gradient], *, deadline: float) -> bool:
        """The aggregate of a window whose inputs we just published, before we evaluate anyone, when it
        is the payloads themselves (`bundle`; the signed rule's signs come from the step). Every node
        takes the step from the payloads the inputs name, fetched from their owners; a peer that serves
        its payload to validators and refuses miners would leave them no step until our aggregate, and
        published after our evaluation that came too late for their next window. True once it is in
        our bucket (written now, or already there); False when it could not be written by `deadline`
        (the window's publication writes it then)."""
        node, window = self.node, inputs.window
        if node.hp.optimizer.method == "signed" or not payloads:
            return False
        data = await asyncio.to_thread(self.bundle, window, payloads, inputs.global_step, inputs.clip_norm)
        try:
            async with asyncio.timeout(max(0.1, deadline - node.clock.now())):
                await put_aggregate(node.bucket, window, data)
        except (TimeoutError, StorageError) as exc:
            context(window=window, phase="lead").debug(f"the early aggregate of window {window} is not out "
                                                       f"({type(exc).__name__}); it goes with the window's records")
            return False
        return True

    async def flush(self, window: int, deadline: float) -> bool:
        """Upload what is queued, oldest first, until `deadline`; True when nothing is left."""
        log = context(window=window, phase="lead")
        for name in list(self.queued):
            left = deadline - self.node.clock.now()
            try:
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    await self._put(name, self.queued[name])
            except TimeoutError:
                log.warning(f"publishing is late ({len(self.queued)} objects queued, next: {name}); "
                            "retrying next window")
                return False
            except StorageError as exc:
                log.warning(f"publishing {name} failed ({exc}); retrying next window")
                return False
            del self.queued[name]
            if name.startswith("peers/"):
                log.info(f"published peer list for window {name.split('/')[1]}")
        return True


class CheckpointPublisher:
    """θ after a window's aggregate, snapshotted to disk between windows (never mid-update) and
    uploaded in the background, so a large model or a slow bucket never delays a window. One
    upload at a time, bounded by `checkpoint_frequency` windows; a checkpoint falling due while
    the previous one is still uploading is skipped with a log line (the next one will do).

    Each upload is followed by the cleanup of the history no node replays any more. A validator that
    follows a checkpoint's window instead runs that cleanup alone (`clean_history`) while its own
    bucket may still hold history: once after it starts (a restart does not know what it published
    before) and after it led a window, until its last such window is out of the kept range."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.task: asyncio.Task | None = None
        self.cleaning: asyncio.Task | None = None  # a follower's history cleanup
        self.last_led: int | None = None  # the newest window whose records we published, since we started
        self.history_clean = False  # our bucket holds none of them before the kept range (a sweep found so)

    def led(self, window: int) -> None:
        """We published `window`'s records: our bucket holds history the kept range will leave behind."""
        self.last_led = window if self.last_led is None else max(self.last_led, window)
        self.history_clean = False

    def clean_history(self, window: int) -> None:
        """At a checkpoint's window another validator led: delete our own history older than the kept
        range in the background, as the lead does after its upload, while some may be left."""
        busy = [task for task in (self.task, self.cleaning) if task is not None and not task.done()]
        if self.history_clean or busy:
            return
        self.cleaning = asyncio.create_task(self._clean(window), name=f"history-{window}")

    async def _clean(self, window: int) -> None:
        hp = self.node.hp
        oldest_needed = window - retained_windows(hp)
        try:
            async with asyncio.timeout(hp.windows.checkpoint_frequency * hp.windows.window_seconds):
                done = await delete_history_before(self.node.bucket, oldest_needed)
        except TimeoutError:
            return
        if done.newest is not None and (self.last_led is None or done.newest > self.last_led):
            self.last_led = done.newest  # records of windows we led before a restart count as ours too
        if done.complete and (self.last_led is None or self.last_led < oldest_needed):
            self.history_clean = True  # every record we published is of a window before the kept range

    async def publish(self, window: int, global_step: int) -> None:
        log = context(window=window, phase="checkpoint")
        if self.task is not None and not self.task.done():
            log.warning("the previous checkpoint is still uploading: skipping this one")
            return
        folder = self.node.state_dir / "checkpoint"
        # the last one, and any a writer killed mid-file left as `.<name>.<pid>.<hex>.tmp` (the model's size each)
        for old in [*folder.glob("*.safetensors"), *folder.glob(".*.tmp")] if folder.exists() else ():
            old.unlink(missing_ok=True)
        path = folder / f"{window}-{MODEL_FILE}"
        try:
            await asyncio.to_thread(self.node.compute.write_model_file, path)  # θ from all ranks, one file
        except (OSError, SafetensorError) as exc:
            log.warning(f"checkpoint {window} not written locally ({str(exc)[:160]}); the next one will be tried")
            path.unlink(missing_ok=True)
            return
        hp = self.node.hp
        budget = hp.windows.checkpoint_frequency * hp.windows.window_seconds
        self.task = asyncio.create_task(self._upload(window, global_step, path, budget), name=f"checkpoint-{window}")

    async def _upload(self, window: int, global_step: int, path: Path, budget: float) -> None:
        node, log = self.node, context(window=window, phase="checkpoint")
        try:
            async with asyncio.timeout(budget):
                await save_checkpoint(node.bucket, window, {MODEL_FILE: path},
                                      {"global_step": global_step, "hparams": node.hp.name}, run=node.run)
                await cleanup_checkpoints(node.bucket, keep=node.hp.windows.retained_checkpoints)
        except TimeoutError:
            log.warning(f"checkpoint upload did not finish within {budget:.0f}s; the next one will be tried")
            return
        except StorageError as exc:
            log.warning(f"checkpoint upload failed: {exc}")
            return
        finally:
            path.unlink(missing_ok=True)
        await delete_history_before(node.bucket, window - retained_windows(node.hp))

    async def wait(self) -> None:
        """Let an upload or a cleanup under way finish (or time out): called when the validator stops."""
        await asyncio.gather(*(task for task in (self.task, self.cleaning) if task is not None), return_exceptions=True)


class HistoryCleanup(NamedTuple):
    """What `delete_history_before` did: whether every LIST and DELETE succeeded, and the newest
    window whose aggregate, inputs or progress record our bucket holds (kept or deleted; None: none)."""

    complete: bool
    newest: int | None


async def delete_history_before(bucket: Bucket, oldest_needed: int) -> HistoryCleanup:
    """Aggregates (and the inputs and progress records beside them) older than the history every
    candidate keeps (`retained_windows`: the oldest kept checkpoint's) can no longer be replayed by
    anyone: every node replays from a kept checkpoint on, and no reader takes a missing record of
    such a window for absent. Peer lists go too, but the newest of those older ones: it may still be
    the list in effect at `oldest_needed` and after (`comms.exchange.get_peers` reads the newest list
    at or before a window), so every window a node may ask about keeps the answer it had. A failed
    LIST or DELETE is logged and left for the next time."""
    complete, newest = True, None
    for key_of, suffix in ((aggregate_key, ".safetensors"), (inputs_key, ".safetensors"), (progress_key, ".json"),
                           (peers_key, ".json")):
        prefix = folder_of(key_of)
        try:
            windows = sorted((window, obj.key) for obj in await bucket.list(prefix)
                             if (window := window_of(obj.key, prefix, suffix)) is not None)
            if windows and key_of is not peers_key:
                newest = max(windows[-1][0], newest if newest is not None else windows[-1][0])
            old = [(window, key) for window, key in windows if window < oldest_needed]
            if key_of is peers_key:
                old = old[:-1]  # kept: it may be the list in effect at oldest_needed
            for _, key in old:
                await bucket.delete(key)
        except StorageError as exc:
            context(phase="cleanup").debug(f"cleanup of {prefix} incomplete: {exc}")
            complete = False
    return HistoryCleanup(complete, newest)
