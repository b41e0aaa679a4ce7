"""Fault injection (docs/architecture.md §5): every honest node ends with the same model, and no window is
lost or doubled in any record, whatever fails. On virtual time with in-process nodes: a "kill -9" is a node's
task cancelled with no cleanup at all, then a new node started from its state dir."""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict

import pytest
import torch
from loguru import logger
from tests.faults import Fault, FaultPlan, between

from templar.chain import verify_signature
from templar.comms.keys import gradient_key
from templar.core.clock import run_virtual
from templar.core.config import load_hparams, overlapped
from templar.core.schedule import learning_rate
from templar.miner.hooks import MinerHooks
from templar.miner.loop import Miner
from templar.runtime.node import Node
from templar.runtime.records import (
    MINER_WINDOWS_FILE,
    SCORES_FILE,
    VALIDATOR_WINDOWS_FILE,
    add_listener,
    read_records,
    remove_listener,
)
from templar.runtime.state import STATE_FILE
from templar.validator.files import BOOK_FILE
from templar.validator.loop import Validator
from templar.wire import read_gradient

from .harness import Subnet, parameters, same_parameters, untrained_windows

# `slow` only orders the suite (long tests first, one per xdist worker; tests/conftest.py): both run always.
pytestmark = [pytest.mark.slow(seconds=8), pytest.mark.timeout(240)]

LIGHT = {"data": {"pages_per_window": 1, "eval_pages": 1}}
"""One page to train on and one to evaluate per window: these tests are about the mechanics."""


class LogLines(list):
    """Loguru messages at WARNING and above while the context is open."""

    def __enter__(self) -> LogLines:
        self.handler = logger.add(lambda m: self.append(m.record["message"]), level="WARNING")
        return self

    def __exit__(self, *exc) -> None:
        logger.remove(self.handler)


async def _windows(lead: Validator, miners: list[Miner], count: int) -> None:
    for _ in range(count):
        w = lead.state.window + 1
        await asyncio.gather(lead.run_window(w), *(m.run_window(w) for m in miners))


# ------------------------------------------------------------------ kill -9 at every phase

class Killed(Exception):
    """What a kill -9 leaves of a node's task: it stops where it is, nothing is saved or closed."""


class KillAt(MinerHooks):
    """Kills its miner once, in `phase` of `window`: "ahead" (its inner steps begin: an overlapped
    miner's while the window before is uploaded, gathered and stepped), "train" (after training, the
    error feedback already spent; overlapped: the window before already saved), "upload" (the put
    window open, nothing uploaded; overlapped: the next window training) or "step" (the outer step
    applied in memory, neither recorded nor saved; overlapped: the next window training)."""

    def __init__(self, phase: str, window: int) -> None:
        self.phase, self.window = phase, window

    def _maybe(self, phase: str, window: int) -> None:
        if (phase, window) == (self.phase, self.window):
            raise Killed(f"{phase} of window {window}")

    def batch(self, miner, window, batch):
        self._maybe("ahead", window)
        return batch

    def transform(self, miner, window, values):
        self._maybe("train", window)
        return values

    async def before_upload(self, miner, window, payload):
        self._maybe("upload", window)
        return payload

    def after_step(self, miner, window):
        self._maybe("step", window)


def model_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Swarm:
    """One subnet's nodes as tasks running their real `run` loops on virtual time. `kill` is a
    kill -9: every task of the node stops where it is (no save, no close); `start` again builds
    a new node from the same flags and state dir. Every window record any node appends is
    paired with the sha256 of that node's model at that instant (the window's committed θ)."""

    def __init__(self, subnet: Subnet) -> None:
        self.subnet = subnet
        self.roles: dict[str, Miner | Validator] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.digests: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
        self.dead: list[Node] = []
        self.lines: list[str] = []
        """Every log message at INFO and above while the swarm runs (starting a node resets the log's
        handlers: ours is put back after each start)."""

    def on_record(self, path, record) -> None:
        if path.name in (MINER_WINDOWS_FILE, VALIDATOR_WINDOWS_FILE):
            name = path.parent.name
            self.digests[name][record.window].append(model_digest(self.roles[name].node.model))

    async def start(self, name: str, *, hooks: MinerHooks | None = None) -> Miner | Validator:
        node = await self.subnet.node(name)
        logger.add(lambda m: self.lines.append(m.record["message"]), level="INFO")
        role = Validator(node) if self.subnet.stakes[name] > 0 else Miner(node, hooks=hooks)
        self.roles[name] = role
        self.tasks[name] = asyncio.create_task(role.run(), name=name)
        return role

    async def kill(self, name: str) -> None:
        role, task = self.roles[name], self.tasks.pop(name)
        tasks = [task] + ([role.checkpoints.task] if isinstance(role, Validator) and role.checkpoints.task else [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if role.node.state_lock is not None:
            role.node.state_lock.release()  # what the kernel does for a process killed with -9
        self.dead.append(role.node)

    async def wait_dead(self, name: str) -> None:
        """Until a hook or bucket has killed `name`."""
        result = (await asyncio.gather(self.tasks[name], return_exceptions=True))[0]
        assert isinstance(result, Killed), result
        await self.kill(name)

    async def stop(self) -> None:
        for role in self.roles.values():
            role.node.stop.set()
        results = await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        assert not [r for r in results if isinstance(r, BaseException)], results
        for node in [*(r.node for r in self.roles.values()), *self.dead]:
            await node.aclose()


def _windows_without_a_step(digests: dict[str, dict[int, list[str]]], since: int, last: int) -> list[int]:
    """Windows in (since, last] whose committed θ equals the window before's."""
    by_window: dict[int, set[str]] = defaultdict(set)
    for windows in digests.values():
        for window, seen in windows.items():
            by_window[window].update(seen)
    return [w for w in sorted(by_window) if since < w <= last and w - 1 in by_window and by_window[w] == by_window[w - 1]]


def test_the_lead_killed_at_every_phase_hands_over_within_its_window_and_forks_nothing(tmp_path, faults: FaultPlan):
    """Three validators (lead 100, v1 50, v2 20 of stake) and two miners, on their real loops; the succession's
    own order resumes every 4 windows (`lead_cadence`), in between whoever led a window keeps the first slot.
    A miner is killed -9 after training, in the put window, after its outer step and as its inner steps begin
    (on the overlapped protocol: while the window before is in flight, or just saved). The lead is killed -9
    before its inputs (v1, slot 1, leads the window, then keeps the first slot); between its inputs and its
    aggregate while v1 is killed before the next window's inputs (the window goes to slot 2, v2); with v2 gone
    for good (two validators left), during a checkpoint upload. Each time it comes back it catches up on what
    the others published, rewrites nothing, and leads again from the first window whose slot it meets (the
    next boundary, or slot 1 once the keeper is gone). Then a partition at a boundary: its inputs land in its
    bucket after its slot closed: they count for nobody, v1 leads, the lead follows.
    Throughout: every window any node committed holds the same θ on all of them, no record has a window
    twice, every window had its outer step (a kill costs at most one without: here none), each window's
    inputs are those of the lowest slot stored within its slot, and every node says in one `[LEAD]` line
    who leads instead, and why."""
    from templar.chain import verify_signature
    from templar.comms.keys import aggregate_key, checkpoint_prefix, inputs_key
    from templar.runtime.consensus.follow import inputs_of
    from templar.runtime.sync import read_published
    from templar.wire import read_inputs

    # 9.6-second windows: with two slots dead, the third's step (by slot_deadline(2), 6.75 s after a window)
    # still lands before the next commitment (8.35 s), as production's (75.25 s, against 78 s) does; an eager
    # miner forms its next update against that step, and one that came later would leave a window empty.
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "v1": 50.0, "v2": 20.0, "m0": 0.0, "m1": 0.0}, LIGHT,
                           blocks_per_window=16, max_allowed_stale=6)
    swarm = Swarm(subnet)
    add_listener(swarm.on_record)
    base = ("lead", "v1", "v2")
    expect: dict[int, tuple[tuple[str, ...], str]] = {}
    """Window → (its slots, who leads it), from the rule: the keeper first until a multiple of 4."""
    stamps: dict[int, dict[str, float | None]] = {}
    """When each validator's inputs of a window were stored (None: never), read before they are pruned."""

    def snapshot(clock) -> None:
        for window in expect:
            if window not in stamps and clock.now() > clock.times(window).slot_settled(2):
                files = {v: subnet.root / "buckets" / v / f"v4/inputs/{window}.safetensors" for v in base}
                stamps[window] = {v: f.stat().st_mtime if f.exists() else None for v, f in files.items()}

    async def until(clock, instant: float) -> None:
        await clock.sleep_until(instant)
        snapshot(clock)

    async def scenario():
        for name in base:
            await swarm.start(name)
        await asyncio.sleep(0.5)
        await swarm.start("m0")
        first = (await swarm.start("m1")).node.clock.current_window() + 1
        clock = swarm.roles["lead"].node.clock
        uid = {name: swarm.roles[name].node.uid for name in base}
        swarm.roles["m1"].hooks = KillAt("train", first)
        await swarm.wait_dead("m1")
        await swarm.start("m1", hooks=KillAt("upload", first + 1))
        await swarm.wait_dead("m1")
        await swarm.start("m1", hooks=KillAt("step", first + 2))
        await swarm.wait_dead("m1")
        # ... and as its next window's inner steps begin (overlapped: with the window before in flight, its
        # upload, gather and step to come)
        await swarm.start("m1", hooks=KillAt("ahead", first + 5))
        await swarm.wait_dead("m1")
        await swarm.start("m1")
        steady = first + 3
        now = clock.current_window()
        a = now + 1 + (1 - now - 1) % 4  # just after a boundary (a % 4 == 1)
        v1_keeps, v2_keeps = ("v1", "lead", "v2"), ("v2", "lead", "v1")

        # 1. the lead, killed as it is about to store its inputs; back during the next window's exchange
        lead = swarm.roles["lead"]
        lead.node.bucket = faults.wrap(lead.node.bucket)
        faults.add(Fault.ERROR, ops={"put"}, keys=inputs_key(a), error=Killed, message="killed before its inputs")
        await swarm.wait_dead("lead")
        expect.update({a: (base, "v1"), a + 1: (v1_keeps, "v1"), a + 2: (v1_keeps, "v1")})
        await until(clock, clock.times(a + 1).gather_start + 1.0)
        await swarm.start("lead")  # catches up on a and a + 1; v1 keeps the first slot until the boundary

        # 2. at the boundary it leads again, and is killed between its inputs and its aggregate; v1 before the
        # next window's inputs: slot 2 leads, and keeps the first slot
        b = a + 3
        lead = swarm.roles["lead"]
        lead.node.bucket = faults.wrap(lead.node.bucket)
        faults.add(Fault.ERROR, ops={"put"}, keys=aggregate_key(b), error=Killed, message="killed before its aggregate")
        await swarm.wait_dead("lead")
        await until(clock, clock.times(b + 1).gather_start + 0.2)
        await swarm.kill("v1")
        expect.update({b: (base, "lead"), b + 1: (base, "v2"), b + 2: (v2_keeps, "v2"), b + 3: (v2_keeps, "lead")})
        await until(clock, clock.times(b + 2).gather_start + 1.0)
        lead = await swarm.start("lead")
        await swarm.start("v1")
        await until(clock, clock.times(b + 3).gather_start - 0.2)  # v2 led b + 2 and keeps its slot: gone
        # back, the lead published the aggregate of b it never sent, while the miners still held b's payloads:
        # a node replaying b later (from an older checkpoint) reads it, signed by the lead, as any other
        published = subnet.root / "buckets" / "lead" / aggregate_key(b)
        assert published.exists(), "the lead never published the aggregate of the window it was killed in"
        inputs = read_inputs((subnet.root / "buckets" / "lead" / inputs_key(b)).read_bytes(), run=lead.node.run,
                             verify=verify_signature, expected_hotkey=lead.node.hotkey, expected_window=b)
        replayed = read_published(lead.node, published.read_bytes(), lead.node.hotkey, b)
        assert replayed.global_step == inputs.global_step and replayed.update, "not the step its inputs made"
        await swarm.kill("v2")

        # 3. two validators left: the lead, leading the boundary, killed during its checkpoint upload (its
        # file transfer hangs) before the next window's gather: v1 leads that window
        c = b + 4
        lead = swarm.roles["lead"]
        lead.node.bucket = faults.wrap(lead.node.bucket)
        upload = faults.add(Fault.HANG, ops={"put"}, keys=f"{checkpoint_prefix()}{c}/")
        await until(clock, clock.times(c + 1).gather_start - 0.3)
        assert upload.fired, "the checkpoint upload never started"
        await swarm.kill("lead")
        faults.remove(upload)
        expect.update({c: (base, "lead"), c + 1: (base, "v1"), c + 2: (v1_keeps, "v1"), c + 3: (v1_keeps, "v1")})
        await until(clock, clock.times(c + 2).gather_start + 1.0)
        lead = await swarm.start("lead")

        # 4. a partition at the boundary: the lead's write of its inputs does not get through in its slot, and
        # lands in its bucket after the slot closed (its bucket's server took it late)
        d = c + 4
        lead.node.bucket = faults.wrap(lead.node.bucket)
        faults.add(Fault.ERROR, ops={"put"}, keys=inputs_key(d), times=1, message="connection reset (partition)")
        t = clock.times(d)
        await until(clock, t.slot_deadline(0) + t.skew + 0.5)
        assert await lead.publisher.publish_inputs(inputs_of(d, lead.state.global_step, []), deadline=clock.now() + 5)
        expect.update({d: (base, "v1"), d + 1: (v1_keeps, "v1"), d + 2: (v1_keeps, "v1"), d + 3: (v1_keeps, "v1"),
                       d + 4: (base, "lead")})
        await until(clock, clock.times(d + 5).end)
        await swarm.stop()
        return steady, d, uid, {w: clock.times(w) for w in expect}

    try:
        steady, partitioned, uid, times = run_virtual(scenario())
    finally:
        remove_listener(swarm.on_record)
    lines = swarm.lines
    nodes = subnet.root / "nodes"
    for name, file in (("m0", MINER_WINDOWS_FILE), ("m1", MINER_WINDOWS_FILE), ("lead", VALIDATOR_WINDOWS_FILE),
                       ("v1", VALIDATOR_WINDOWS_FILE), ("v2", VALIDATOR_WINDOWS_FILE)):
        windows = [r["window"] for r in read_records(nodes / name / file)]
        assert windows == sorted(set(windows)), (name, windows)
    honest_windows = set().union(*(swarm.digests[n] for n in swarm.digests))
    for window in sorted(honest_windows):
        seen = {d for n in swarm.digests for d in swarm.digests[n].get(window, [])}
        assert len(seen) == 1, f"window {window}: {len(seen)} different models " + str(
            {n: swarm.digests[n].get(window) for n in swarm.digests})
    assert max(honest_windows) >= max(expect)
    assert _windows_without_a_step(swarm.digests, steady, max(expect)) == [], "a kill cost a window without a step"
    for window, (order, name) in sorted(expect.items()):  # the rule, read off the buckets
        stored, t = stamps[window], times[window]
        in_slot = [v for slot, v in enumerate(order) if stored[v] is not None
                   and t.slot_opens(slot) - t.skew < stored[v] <= t.slot_deadline(slot) + t.skew]
        assert in_slot[:1] == [name], (window, order, name, in_slot, stored)
        if window == partitioned:  # the lead published, after its slot closed
            assert stored["lead"] is not None and "lead" not in in_slot, (window, stored)
        before = expect.get(window - 1, (base, "lead"))[1]
        if before == name:
            continue
        says = [line for line in lines if line.startswith(f"[LEAD] window {window} is led by uid {uid[name]} ")]
        assert len(says) >= 3, (window, name, says)  # every node that applied it live says it
        slot = order.index(name)
        if slot:
            assert f"uid {uid[order[0]]} (slot 0): not published by its deadline" in says[0], says
        else:
            assert "the succession's own order resumes" in says[0], says


# ------------------------------------------------------------------ storage, torn files, forks, hostile peers

class Digests:
    """sha256 of each node's model whenever it appends a window record (its committed θ)."""

    def __init__(self, roles: dict[str, Miner | Validator]) -> None:
        self.roles = roles
        self.seen: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))

    def __call__(self, path, record) -> None:
        if path.name in (MINER_WINDOWS_FILE, VALIDATOR_WINDOWS_FILE):
            name = path.parent.name
            self.seen[record.window][name].append(model_digest(self.roles[name].node.model))

    def check(self, forked: frozenset[tuple[str, int]] = frozenset()) -> None:
        """`forked`: (node, window) records made on a model the test forked, before the node could tell."""
        for window, by_node in sorted(self.seen.items()):
            models = {d for name, ds in by_node.items() if (name, window) not in forked for d in ds}
            assert len(models) == 1, f"window {window}: models differ {by_node}"


def foreign_update(role: Miner | Validator) -> None:
    """θ moved by one update the run never made: ±α on every coordinate."""
    lr = learning_rate(role.state.global_step, role.hp.optimizer)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in role.node.model.parameters():
            p.add_(lr * (torch.randint(0, 2, p.shape, generator=g).float() * 2 - 1))


def _committed_windows(path) -> list[int]:
    return [r["window"] for r in read_records(path)]


def test_storage_outages_torn_files_a_foreign_model_and_a_hostile_peer_fork_nothing(tmp_path, faults: FaultPlan):
    """One subnet through a run of faults, each healing before the next:
    1. a peer commits `local:/etc/passwd` as its bucket (once crashed every node's gather);
    2. a miner's θ is changed by one foreign update between two windows: at the next window its
       check fails, it uploads a warm-up payload (weight 0, never scored as a desynced active
       one), logs one `[SYNC]` line and re-syncs from the lead's checkpoint; a follower
       validator's too: it re-syncs instead of scoring that window;
    3. the storage server is stopped (SIGSTOP) across a window's uploads, gathers and
       publications, then killed across the next window's gather;
    4. the miner's state file is truncated, the lead's scorebook.json too, and the other miner's
       state holds a foreign model (whole and valid: a disk that kept the wrong file); all three
       restart, the last a window later: its catch-up finds the replayed model is not the lead's
       and re-syncs from the checkpoint.
    After each window, every honest node's committed θ is the same, and no record has a
    window twice or (the lead's) misses one."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "follower": 10.0, "m0": 0.0, "victim": 0.0, "hostile": 0.0},
                           LIGHT)
    subnet.open_bucket = faults.open_bucket  # one storage server under every bucket of the subnet
    roles: dict[str, Miner | Validator] = {}
    digests = Digests(roles)
    add_listener(digests)

    async def windows(count: int) -> None:
        for _ in range(count):
            w = roles["lead"].state.window + 1
            await asyncio.gather(*(r.run_window(w) for r in roles.values()))

    async def scenario():
        hostile = await subnet.node("hostile")
        await asyncio.to_thread(hostile.chain.commit_bucket, "local:/etc/passwd")
        roles["lead"] = Validator(await subnet.node("lead"))
        roles["m0"], roles["victim"] = Miner(await subnet.node("m0")), Miner(await subnet.node("victim"))
        for role in roles.values():
            await role.start()
        await windows(2)
        lead, victim = roles["lead"], roles["victim"]
        roles["follower"] = follower = Validator(await subnet.node("follower"))  # for this one window
        await follower.start()

        # 2. a foreign update in the victim's θ, and in the follower validator's
        foreign_update(victim)
        foreign_update(follower)
        hit = lead.state.window + 1
        # An overlapped miner had encoded its next payload before the fork (its compute half runs while
        # the window before is exchanged): the payload after it is the first its check can refuse.
        shown = hit + (1 if overlapped(victim.hp.inner) else 0)
        with LogLines() as lines:
            await windows(1 + shown - hit)
        assert len([line for line in lines if "[SYNC] Our model differs from the run's" in line]) == 2, lines
        assert hit not in _committed_windows(follower.node.state_dir / VALIDATOR_WINDOWS_FILE), \
            "a forked validator scored a window"
        assert same_parameters(parameters(follower.node), parameters(lead.node)), "the follower did not re-sync"
        dead = [roles.pop("follower").node]
        payload = (subnet.root / "buckets" / "victim" / gradient_key(shown)).read_bytes()
        gradient = read_gradient(payload, victim.node.shapes, victim.hp, run=victim.node.run,
                                 verify=verify_signature, expected_hotkey=victim.node.hotkey, expected_window=shown)
        assert gradient.warmup, "an out-of-sync miner uploaded as active"
        assert same_parameters(parameters(victim.node), parameters(lead.node)), "not re-synced"

        # 3. the storage server stopped, then killed, mid-window
        clock, w = lead.node.clock, lead.state.window + 1
        stopped = faults.add(Fault.HANG, when=between(clock.now, clock.times(w).end - 0.1,
                                                      clock.times(w + 1).start + 0.5))
        await windows(1)
        await clock.sleep_until(clock.times(w + 1).start + 0.5)
        killed = faults.add(Fault.REFUSE, when=between(clock.now, clock.times(w + 1).gather_start - 0.1,
                                                       clock.times(w + 1).gather_deadline + 0.5))
        await windows(1)
        await clock.sleep_until(clock.times(w + 1).gather_deadline + 0.5)
        assert stopped.fired and killed.fired, "the outages were not felt"
        await windows(1)

        # 4. torn files (and a whole but foreign one), then restarts from them
        state = victim.node.state_dir / STATE_FILE
        state.write_bytes(state.read_bytes()[:1000])
        book = lead.node.state_dir / BOOK_FILE
        book.write_bytes(book.read_bytes()[:10])
        foreign_update(roles["m0"])
        roles["m0"].save()
        dead += [lead.node, victim.node, roles.pop("m0").node]
        for node in dead[-3:]:
            node.state_lock.release()  # these processes are gone: the kernel drops their locks
        roles["lead"], roles["victim"] = Validator(await subnet.node("lead")), Miner(await subnet.node("victim"))
        await roles["lead"].start()
        await roles["victim"].start()
        await windows(1)  # m0 is down for this one: at its restart, catch-up replays it
        roles["m0"] = Miner(await subnet.node("m0"))  # (starting a node resets the log handlers)
        with LogLines() as lines:
            await roles["m0"].start()
        assert [line for line in lines if "[SYNC] The replayed model differs from the run's" in line], lines
        await windows(1)
        models = [parameters(r.node) for r in roles.values()]
        assert all(same_parameters(models[0], m) for m in models[1:])
        for node in [*(r.node for r in roles.values()), *dead, hostile]:
            await node.aclose()
        return shown, hostile.uid

    try:
        shown, hostile_uid = run_virtual(scenario())
        shown_late = overlapped(load_hparams(subnet.hparams).inner)
    finally:
        remove_listener(digests)
    # an overlapped victim committed the window of the foreign update before its next check could tell
    digests.check(forked=frozenset({("victim", w) for w in range(shown - 1, shown) if shown_late}))
    nodes = subnet.root / "nodes"
    lead_windows = _committed_windows(nodes / "lead" / VALIDATOR_WINDOWS_FILE)
    assert lead_windows == list(range(lead_windows[0], lead_windows[-1] + 1)), lead_windows
    for name, file in (("m0", MINER_WINDOWS_FILE), ("victim", MINER_WINDOWS_FILE), ("follower", VALIDATOR_WINDOWS_FILE)):
        recorded = _committed_windows(nodes / name / file)
        assert recorded == sorted(set(recorded)), (name, recorded)
    victim_records = {r["window"]: r for r in read_records(nodes / "victim" / MINER_WINDOWS_FILE)}
    # trained again, as active, once re-synced (a delayed run steps the window after a re-sync untrained:
    # θ is past that window's base)
    after = [r for w, r in sorted(victim_records.items()) if w > shown]
    assert all(r["phase"] == "catchup" and not r["uploaded"] for r in after if r["loss"] is None)
    assert victim_records[shown]["phase"] == "catchup" and next(r for r in after if r["loss"] is not None)["phase"] == "active"
    assert victim_records[shown]["uploaded"]
    assert len(digests.seen) >= 8
    hostile = {r["status"] for r in read_records(nodes / "lead" / SCORES_FILE) if r["uid"] == hostile_uid}
    # never a crash, never another's fault (a delayed run's lead scores nobody in its first window after its
    # restart: `not-sampled`)
    unscored = {"not-sampled"} if untrained_windows(load_hparams(subnet.hparams)) else set()
    assert hostile and hostile - {"missing", "unreachable"} <= unscored, hostile
